"""Encode once, map everywhere: a corpus encoded with a tokenizer is written once under
``<cache>/encoded/<name>/`` as numpy arrays, and every later run of every table that uses that
corpus and vocabulary, and every rank of a run, memory-maps them: the pages are shared between
processes, and no later run reads or encodes the text again (as fairseq's ``fairseq-preprocess``
binarizes once and its datasets map the result).

The folder's key is the corpus's content (``CorpusSource.fingerprint``), the tokenizer's (its
model file's SHA-256) and which pairs are kept (``train_every``, ``max_train_pairs``,
``max_eval_pairs``). One process builds it under a lock (``util.files.exclusive``) into a
temporary folder renamed into place when complete; the others wait, then map it. A folder whose
files do not match its ``meta.json`` (truncated, half deleted) is removed and rebuilt, never read;
a temporary folder left by a killed build is removed by the next build.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reproduce.data.batching import Encoded, Packed
from reproduce.data.corpora import first_pairs, pairs_sha256
from reproduce.data.source import FORMAT, CorpusSource
from reproduce.util import machine
from reproduce.util.cache_folders import META, SUBDIR, USED, folder_bytes
from reproduce.util.files import exclusive, write_atomic
from reproduce.util.machine import return_free_memory

if TYPE_CHECKING:
    from reproduce.paper.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

EVAL = "eval.json"  # the dev and test pairs as text (BLEU's references)
ARRAYS = tuple(f"{split}.{side}.{part}" for split in ("train", "dev") for side in ("src", "tgt")
               for part in ("tokens", "starts", "lengths"))


@dataclass(frozen=True)
class EncodedCorpus:
    """A corpus's training and dev pairs encoded, its dev and test pairs as text, and the
    SHA-256 of each split's pairs (``pairs_sha256``)."""

    train: Encoded
    dev: Encoded
    dev_pairs: list[tuple[str, str]]
    test_pairs: list[tuple[str, str]]
    sha256: dict[str, str]
    folder: Path | None = None  # where it is mapped from; None when encoded in memory

    def remember(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, kept in the cache folder as ``<name>.json`` for every later run (a
        statistic over the whole training set); computed each time when not cached."""
        if self.folder is None:
            return compute()
        path = self.folder / f"{name}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            value = compute()
            try:
                write_atomic(path, json.dumps(value).encode())
            except OSError as exc:  # a read-only cache still serves its arrays
                logger.warning("%s: not kept (%s)", path, exc)
            return value


def cache_key(source: CorpusSource, tokenizer: Tokenizer, train_every: int = 1,
              max_train_pairs: int | None = None, max_eval_pairs: int | None = None) -> str:
    """The folder name of ``source`` encoded with ``tokenizer``: the corpus, then a hash."""
    parts = {"format": FORMAT, "corpus": source.fingerprint, "tokenizer": tokenizer.sha256,
             "train_every": train_every, "max_train_pairs": max_train_pairs,
             "max_eval_pairs": max_eval_pairs}
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return f"{source.corpus}-{digest[:20]}"


def encoded_corpus(source: CorpusSource, tokenizer: Tokenizer, train_every: int = 1,
                   max_train_pairs: int | None = None, max_eval_pairs: int | None = None,
                   cache_dir: str | Path | None = None) -> EncodedCorpus:
    """``source`` encoded with ``tokenizer``: mapped from ``cache_dir`` (built there first if
    needed), or encoded in memory when ``cache_dir`` is None. Training keeps every
    ``train_every``-th pair, then the first ``max_train_pairs``; dev and test their first
    ``max_eval_pairs``."""
    if cache_dir is None:
        return _encode(source, tokenizer, train_every, max_train_pairs, max_eval_pairs)
    key = cache_key(source, tokenizer, train_every, max_train_pairs, max_eval_pairs)
    folder = Path(cache_dir) / SUBDIR / key
    waiting = f"{source.corpus}: waiting for another process to build {folder}"
    with exclusive(folder.parent / f"{key}.lock", waiting=waiting):
        corpus = read_cache(folder)
        if corpus is None:
            started = time.perf_counter()
            built = _encode(source, tokenizer, train_every, max_train_pairs, max_eval_pairs)
            _write(built, folder, source, time.perf_counter() - started)
            del built
            source.forget("train")  # mapped from here on: the text is not held while training
            return_free_memory()
            corpus = read_cache(folder)
            if corpus is None:
                raise RuntimeError(f"{folder}: written, yet it does not read back")
    logger.info("%s: %d training pairs mapped from %s (%.0f MB)", source.corpus,
                len(corpus.train), folder, folder_bytes(folder) / 1e6)
    return corpus


def read_cache(folder: Path) -> EncodedCorpus | None:
    """The encoded corpus in ``folder``, memory-mapped; None if there is none. A folder that does
    not match its ``meta.json`` is removed (with one line saying why), and None returned."""
    if not folder.exists():
        return None
    try:
        meta = json.loads((folder / META).read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')}, not {FORMAT}")
        for name, size in meta["files"].items():
            if (folder / name).stat().st_size != size:
                raise ValueError(f"{name} holds {(folder / name).stat().st_size} bytes, not {size}")
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        text = json.loads((folder / EVAL).read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("%s: damaged or unfinished encoded corpus (%s); it is removed and rebuilt",
                       folder, exc)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    try:
        (folder / USED).touch()
    except OSError:
        pass  # a read-only cache is read all the same

    def encoded(split: str) -> Encoded:
        def packed(side: str) -> Packed:
            return Packed(*(arrays[f"{split}.{side}.{part}"]
                            for part in ("tokens", "starts", "lengths")))
        return Encoded(packed("src"), packed("tgt"))

    return EncodedCorpus(encoded("train"), encoded("dev"), _pairs(text["dev"]),
                         _pairs(text["test"]), meta["sha256"], folder)


def _pairs(rows: list[list[str]]) -> list[tuple[str, str]]:
    return [(source, target) for source, target in rows]


def _encode(source: CorpusSource, tokenizer: Tokenizer, train_every: int,
            max_train_pairs: int | None, max_eval_pairs: int | None) -> EncodedCorpus:
    all_train = source.pairs("train")
    train = first_pairs(all_train[::train_every], max_train_pairs)
    if len(train) < len(all_train):
        logger.info("%s train: training on %d of the %d pairs (train_every=%d,"
                    " max_train_pairs=%s)", source.corpus, len(train), len(all_train),
                    train_every, max_train_pairs)
    dev = first_pairs(source.pairs("dev"), max_eval_pairs)
    test = first_pairs(source.pairs("test"), max_eval_pairs)
    sha256 = {"train": pairs_sha256(train), "dev": pairs_sha256(dev), "test": pairs_sha256(test)}
    return EncodedCorpus(Encoded.encode(tokenizer, train, progress=_Progress(source.corpus,
                                                                             2 * len(train))),
                         Encoded.encode(tokenizer, dev), dev, test, sha256)


class _Progress:
    """One line every ``every`` seconds while a large split is encoded: how far, how fast."""

    def __init__(self, corpus: str, total: int, every: float = 15.0):
        self.corpus, self.total, self.every = corpus, total, every
        self.started = self.last = time.perf_counter()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every or (done == self.total and now - self.started > 2):
            self.last = now
            logger.info("%s train: encoded %d of %d sentences (%.0f/s)", self.corpus, done,
                        self.total, done / max(now - self.started, 1e-9))


def _write(corpus: EncodedCorpus, folder: Path, source: CorpusSource, seconds: float) -> None:
    """Write ``corpus`` into a temporary folder beside ``folder``, then rename it into place."""
    for stale in folder.parent.glob(f"{folder.name}.tmp-*"):  # a killed build's: we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    tmp = folder.parent / f"{folder.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    arrays = {}
    for split, encoded in (("train", corpus.train), ("dev", corpus.dev)):
        for side, packed in (("src", encoded.src), ("tgt", encoded.tgt)):
            for part in ("tokens", "starts", "lengths"):
                arrays[f"{split}.{side}.{part}"] = getattr(packed, part)
    files = {}
    for name, array in arrays.items():
        with open(tmp / f"{name}.npy", "wb") as f:
            np.save(f, np.ascontiguousarray(array))
            f.flush()
            os.fsync(f.fileno())
        files[f"{name}.npy"] = (tmp / f"{name}.npy").stat().st_size
    write_atomic(tmp / EVAL, json.dumps({"dev": corpus.dev_pairs, "test": corpus.test_pairs},
                                        ensure_ascii=False).encode())
    files[EVAL] = (tmp / EVAL).stat().st_size
    meta = {"format": FORMAT, "corpus": source.corpus, "fingerprint": source.fingerprint,
            "data_dir": source.data_dir, "pairs": {"train": len(corpus.train),
                                                   "dev": len(corpus.dev_pairs),
                                                   "test": len(corpus.test_pairs)},
            "sha256": corpus.sha256, "files": files, "encode_seconds": round(seconds, 1),
            "cores": machine.cores(),  # the rate a plan prices a first run at (runs.footprint)
            "built_by": f"{socket.gethostname()}:{os.getpid()}",
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_atomic(tmp / META, json.dumps(meta, indent=1).encode())
    os.replace(tmp, folder)
    logger.info("%s: encoded %d training pairs in %.0f s, cached in %s (%.0f MB)", source.corpus,
                len(corpus.train), seconds, folder, folder_bytes(folder) / 1e6)

