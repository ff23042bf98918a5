"""One corpus as a run reads it: its sentence pairs, read at most once per process, and a
fingerprint of its content that names the caches built from it (the BPE model, the encoded
corpus), so that new text in the same files is never read through an old cache."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import version
from pathlib import Path

from reproduce.data import bible, corpora, loading
from reproduce.data.bible import bible_db_path
from reproduce.data.corpora import SPLITS, corpus_spec, nonempty_pairs, pairs_sha256, report_pairs
from reproduce.data.hub import hub_download, local_files, translation_batches, translation_dataset
from reproduce.data.loading import load_pairs
from reproduce.errors import DataError
from reproduce.paths import cache_dir
from reproduce.util.files import write_atomic

logger = logging.getLogger(__name__)

# Bumped when what a cache built from a corpus holds changes meaning (the reading or cleaning of
# pairs, the encoded layout): every fingerprint changes with it and old caches are not read.
FORMAT = 1

# Training pairs read (and encoded) at a time from a large corpus: a batch's text and ids in
# memory, ~50 MB at WMT's sentence lengths.
READ_ROWS = 65536


@dataclass
class CorpusSource:
    """A corpus (``corpus``, and its local files, extra trees and tree linearization)."""

    corpus: str
    data_dir: str | None = None
    extra_trees: str | None = None
    linearization: str = "xx"
    _pairs: dict[str, list[tuple[str, str]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # A Hub corpus is read from its snapshot on disk where there is one (``hub_download``):
        # the same corpus as that folder given as data_dir, fingerprinted by its shards.
        if self.data_dir is None and (folder := hub_download(self.corpus)) is not None:
            self.data_dir = str(folder)

    def pairs(self, split: str) -> list[tuple[str, str]]:
        """The (source, target) pairs of ``split``, read once (``load_pairs``) and kept."""
        if split not in self._pairs:
            started = time.perf_counter()
            self._pairs[split] = load_pairs(self.corpus, split, self.data_dir, self.extra_trees,
                                            self.linearization)
            seconds = time.perf_counter() - started
            if seconds > 2:
                logger.info("%s %s: read %d pairs in %.0f s (%.0f pairs/s)", self.corpus, split,
                            len(self._pairs[split]), seconds, len(self._pairs[split]) / seconds)
        return self._pairs[split]

    def train_batches(self, rows: int | None = None) -> Iterator[list[tuple[str, str]]]:
        """The training pairs of ``pairs("train")``, in the same order, about ``rows`` rows read at
        a time. A large corpus (WMT's millions of pairs) is streamed from its Arrow files and
        never held whole, so the first run's memory does not grow with it; the others, and a
        split already read, come from ``pairs``."""
        rows = rows or READ_ROWS
        if "train" in self._pairs or not self.large:
            pairs = self.pairs("train")
            for begin in range(0, len(pairs), rows):
                yield pairs[begin:begin + rows]
            return
        spec = corpus_spec(self.corpus)
        dataset, origin = translation_dataset(self.corpus, "train", self.data_dir)
        kept = dropped = 0
        for sources, targets in translation_batches(dataset, spec, origin, rows):
            pairs, gone = nonempty_pairs(sources, targets)
            kept, dropped = kept + len(pairs), dropped + gone
            if pairs:
                yield pairs
        report_pairs(self.corpus, "train", kept, dropped)
        if not kept:
            raise DataError(f"{origin}: no {spec.source}-{spec.target} pairs with text on both "
                            "sides")

    def forget(self, split: str) -> None:
        """Drop ``split``'s pairs read so far (at WMT's size, gigabytes of text that a run whose
        corpus is encoded and mapped no longer needs); a later ``pairs`` reads them again."""
        self._pairs.pop(split, None)

    @property
    def is_treebank(self) -> bool:
        return corpus_spec(self.corpus).treebank

    @property
    def large(self) -> bool:
        """Whether the corpus is fingerprinted by its files rather than by its pairs: local files
        and the Hub, which may hold millions of pairs (WMT14), are named without reading them."""
        spec = corpus_spec(self.corpus)
        return not spec.treebank and (self.data_dir is not None or spec.bible is None)

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 naming the corpus's content. Local files: their bytes (a Hub download, its
        shards', whether from the Hub's snapshot or a folder). The Hub without a snapshot on
        disk: the fingerprints ``datasets`` gives its Arrow files. The Bible and treebanks (a few
        seconds to read): the pairs of every split themselves, so their reading code is covered
        too; the Bible's is then kept (``_bible_memo``) for the next run that reads the same
        database with the same code."""
        parts: dict[str, object] = {"format": FORMAT, "corpus": self.corpus}
        memo = None
        if self.large and self.data_dir is not None:
            parts["files"] = {split: f["sha256"]
                              for split, f in local_files(self.corpus, self.data_dir).items()}
        elif self.large:
            parts["hub"] = {split: translation_dataset(self.corpus, split, None)[0]._fingerprint
                            for split in SPLITS}
        else:
            memo = self._bible_memo()
            if memo is not None and (kept := _memo_fingerprint(memo)):
                return kept
            parts["pairs"] = {split: pairs_sha256(self.pairs(split)) for split in SPLITS}
        fingerprint = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        if memo is not None:
            with contextlib.suppress(OSError):  # a cache that cannot be written: only slower
                write_atomic(memo, json.dumps({"corpus": self.corpus,
                                               "fingerprint": fingerprint}).encode())
        return fingerprint

    def _bible_memo(self) -> Path | None:
        """Where a Bible corpus's fingerprint is kept (``cache/fingerprints/``), named by what its
        pairs are read from: the database file (path, size, modification time), the source of
        the modules that read and clean them, and ``datasets``'s version. Hashing every verse
        takes a second or two in every run; with the memo, a run whose corpus is encoded already
        reads only its dev and test books. None for a treebank."""
        if corpus_spec(self.corpus).bible is None:
            return None
        db = bible_db_path().resolve()
        stat = db.stat()
        code = hashlib.sha256()
        for module in (bible, corpora, loading, sys.modules[__name__]):
            code.update(Path(inspect.getfile(module)).read_bytes())
        key = json.dumps({"format": FORMAT, "corpus": self.corpus, "db": str(db),
                          "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                          "code": code.hexdigest(), "datasets": version("datasets")},
                         sort_keys=True)
        return (cache_dir() / "fingerprints"
                / f"{self.corpus}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json")

    def tokenizer_name(self) -> str:
        """The BPE model's cache name: the corpus and its fingerprint (a treebank's linearization
        is in its pairs, so in the fingerprint)."""
        return f"{self.corpus}-{self.fingerprint[:16]}"


def _memo_fingerprint(memo: Path) -> str | None:
    """The fingerprint kept in ``memo``; None where there is none or it cannot be read."""
    try:
        kept = json.loads(memo.read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(kept, str) or len(kept) != 64 or set(kept) - set("0123456789abcdef"):
        return None
    return kept
