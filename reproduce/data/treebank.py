"""Table 4's corpora: the Penn Treebank WSJ (standard sections) or NLTK's free 10% WSJ sample
(split by file), read with NLTK's ``BracketParseCorpusReader``; sentence -> linearized parse tree
pairs (``paper.parsing``); and the tree symbols the tokenizer keeps whole."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from reproduce.data.corpora import check_split, missing_input, report_pairs
from reproduce.errors import DataError, ParsingDataError

if TYPE_CHECKING:
    from nltk.corpus.reader import BracketParseCorpusReader
    from nltk.tree import Tree

# NLTK (and paper.parsing, which reads its trees) is imported where trees are read: ~0.1 s of
# every process that trains or renders would otherwise go to a parser only Table 4 needs.

SPLITS = ("train", "dev", "test")

# Standard WSJ split for parsing (Collins 1997 onwards; the paper tunes on 22, reports on 23).
WSJ_SECTIONS = {"train": tuple(range(2, 22)), "dev": (22,), "test": (23,)}

# NLTK's sample holds wsj_0001.mrg .. wsj_0199.mrg (3,914 sentences). It is split by whole files,
# never by sentence, so that sentences of one article never straddle train and test; the blocks are
# contiguous like the PTB sections and sized about 80/10/10 by sentences.
SAMPLE_FILES = {"train": (1, 141), "dev": (142, 171), "test": (172, 199)}
SAMPLE_SENTENCES = {"train": 3098, "dev": 420, "test": 396}


def load_treebank(split: str, wsj_dir: str | None = None) -> list[Tree]:
    """Gold trees of one split: empty elements stripped (a tree left with no word is dropped), function
    tags kept.

    With ``wsj_dir`` (the PTB's ``parsed/mrg/wsj``, holding section folders ``00``..``24``):
    train = sections 02-21, dev = 22, test = 23. Without it: NLTK's WSJ sample, split by file as in
    ``SAMPLE_FILES``.
    """
    from reproduce.paper.parsing import strip_empty

    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    reader, fileids = _wsj_reader(split, wsj_dir) if wsj_dir else _sample_reader(split)
    stripped = (strip_empty(tree) for tree in reader.parsed_sents(fileids))
    return [tree for tree in stripped if tree is not None]


def _wsj_reader(split: str, wsj_dir: str) -> tuple[BracketParseCorpusReader, list[str]]:
    """A reader over the full PTB WSJ and the file ids of the split's sections."""
    if not os.path.isdir(wsj_dir):
        raise ParsingDataError(
            f"treebank {wsj_dir!r} is not a directory (expected the PTB's parsed/mrg/wsj, with section "
            "folders 02-23); without --treebank the NLTK sample is read from NLTK_DATA")
    wsj_dir = os.path.realpath(wsj_dir)
    sections = "|".join(f"{s:02d}" for s in WSJ_SECTIONS[split])
    reader = _reader(wsj_dir, rf"({sections})/wsj_\d{{4}}\.mrg")
    fileids = reader.fileids()
    if not fileids:
        raise ParsingDataError(
            f"no wsj_*.mrg files for sections {sections} under {wsj_dir!r} (expected the PTB's "
            "parsed/mrg/wsj; without --treebank the NLTK sample is read from NLTK_DATA)")
    return reader, fileids


def _reader(root: str, fileids: str) -> BracketParseCorpusReader:
    """NLTK's reader of the bracketed trees in ``root``'s files matching ``fileids``, a folder the
    user named: recent NLTK refuses corpus roots outside its data path, so ``root`` joins it."""
    import nltk
    from nltk.corpus.reader import BracketParseCorpusReader

    if root not in nltk.data.path:
        nltk.data.path.append(root)
    return BracketParseCorpusReader(root, fileids)


def _sample_reader(split: str) -> tuple[BracketParseCorpusReader, list[str]]:
    """A reader over NLTK's WSJ sample and the file ids of the split."""
    import nltk
    from nltk.corpus.reader import BracketParseCorpusReader

    try:
        # The trailing slash lets NLTK look inside corpora/treebank.zip as well as a folder.
        root = nltk.data.find("corpora/treebank/combined/")
    except LookupError:
        raise ParsingDataError(
            f"NLTK's WSJ sample corpora/treebank.zip is not under NLTK_DATA="
            f"{os.environ.get('NLTK_DATA', '(unset)')} nor in {', '.join(map(str, nltk.data.path))}: "
            "run `python -m nltk.downloader treebank` or set NLTK_DATA to a folder holding "
            "corpora/treebank.zip; --treebank takes a full Penn Treebank instead") from None
    first, last = SAMPLE_FILES[split]
    return BracketParseCorpusReader(root, r"wsj_\d{4}\.mrg"), sample_fileids(first, last)


def read_trees(path: str) -> Iterator[Tree]:
    """Bracketed trees from a file, or from every file under a folder, one after another (lazily:
    a semi-supervised corpus holds millions). Empty elements are stripped as in ``load_treebank``."""
    from reproduce.paper.parsing import strip_empty

    if not os.path.exists(path):
        raise ParsingDataError(f"extra trees {path!r}: no such file or folder (bracketed trees, e.g. "
                               "PTB .mrg files or one tree per line)")
    path = os.path.realpath(path)
    if os.path.isdir(path):
        root, fileids = path, r"(?!\.).*"
    else:
        root, fileids = os.path.dirname(path), re.escape(os.path.basename(path))
    reader = _reader(root, fileids)
    if not reader.fileids():
        raise ParsingDataError(f"extra trees {path!r}: the folder holds no files")
    for tree in reader.parsed_sents():
        stripped = strip_empty(tree)
        if stripped is not None:
            yield stripped


def treebank_description(wsj_dir: str | None = None, extra_trees: str | None = None) -> dict:
    """What a run's trees were, for its record and the rendered table."""
    info: dict[str, Any]
    if wsj_dir:
        info = {"kind": "wsj", "path": os.path.realpath(wsj_dir),
                "about": "Penn Treebank WSJ: train sections 02-21, dev 22, test 23 (as the paper)"}
    else:
        files = ", ".join(f"{split} wsj_{a:04d}-{b:04d} ({SAMPLE_SENTENCES[split]} sentences)"
                          for split, (a, b) in SAMPLE_FILES.items())
        info = {"kind": "nltk-sample", "path": None,
                "about": f"NLTK's 10% WSJ sample (3,914 sentences), split by file: {files}. Not "
                         "WSJ sections 02-21 / 22 / 23: F1 is not comparable with the paper's"}
    if extra_trees:
        info["extra_trees"] = os.path.realpath(extra_trees)
    return info


def sample_fileids(first: int, last: int) -> list[str]:
    """File ids ``wsj_FFFF.mrg`` .. ``wsj_LLLL.mrg`` of NLTK's sample, both ends included."""
    return [f"wsj_{number:04d}.mrg" for number in range(first, last + 1)]




@lru_cache(maxsize=8)
def treebank_trees(split: str, data_dir: str | None = None) -> tuple:
    """Gold trees of a treebank split (cached: dev and test are read again to score)."""
    check_split(split)
    trees = load_treebank(split, data_dir)  # ParsingDataError, a DataError, when unreadable
    if not trees:
        where = data_dir or f"NLTK's WSJ sample under NLTK_DATA={os.environ.get('NLTK_DATA', '(unset)')}"
        raise DataError(f"treebank {where}: no trees with words in the {split} split")
    return tuple(trees)


def treebank_pairs(corpus: str, split: str, data_dir: str | None,
                    extra_trees: str | None, linearization: str) -> list[tuple[str, str]]:
    from reproduce.paper.parsing import linearize, words

    why = missing_input(corpus, extra_trees)
    if why:
        raise DataError(why)
    trees = list(treebank_trees(split, data_dir))
    pairs = [(" ".join(words(tree)), " ".join(linearize(tree, linearization))) for tree in trees]
    if split == "train" and extra_trees:
        pairs += [(" ".join(words(t)), " ".join(linearize(t, linearization)))
                  for t in read_trees(extra_trees)]
    report_pairs(corpus, split, len(pairs), 0)
    return pairs


def tree_symbols(pairs: Sequence[tuple[str, str]], linearization: str = "xx") -> list[str]:
    """The tokens of linearized trees, each as one sentencepiece piece with its word boundary:
    ``▁(NP``, ``▁)NP``, ``▁XX``. Whole symbols keep an output tree one piece per token. With
    ``linearization="words"`` only the brackets: words are split into pieces as in the source."""
    from reproduce.paper.parsing import is_bracket

    tokens = {token for _, tree in pairs for token in tree.split()}
    if linearization == "words":
        tokens = {token for token in tokens if is_bracket(token)}
    return sorted("\u2581" + token for token in tokens)
