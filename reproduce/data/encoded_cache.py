"""Encode once, map everywhere: a corpus encoded with a tokenizer is written once under
``<cache>/encoded/<name>/`` as numpy arrays, and every later run of every table that uses that
corpus and vocabulary, and every rank of a run, reads them (lengths mapped, tokens read a batch
at a time): the pages are shared between processes in the kernel's page cache, and no later run
reads or encodes the text again (as fairseq's ``fairseq-preprocess`` binarizes once and its
datasets map the result).

The folder's key is the corpus's content (``CorpusSource.fingerprint``), the tokenizer's (its
model file's SHA-256) and which pairs are kept (``train_every``, ``max_train_pairs``,
``max_eval_pairs``). One process builds it under a lock (``util.files.exclusive``) into a
temporary folder renamed into place when complete; the others wait, then map it. A folder whose
files do not match its ``meta.json`` (truncated, half deleted) is removed and rebuilt, never read;
a temporary folder left by a killed build is removed by the next build.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reproduce.data.batching import Encoded, Packed
from reproduce.data.corpora import first_pairs, hash_pairs, pairs_sha256
from reproduce.data.source import FORMAT, CorpusSource
from reproduce.data.token_file import TokenFile
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
            _build(source, tokenizer, train_every, max_train_pairs, max_eval_pairs, folder)
            source.forget("train")  # mapped from here on: the text is not held while training
            return_free_memory()
            corpus = read_cache(folder)
            if corpus is None:
                raise RuntimeError(f"{folder}: written, yet it does not read back")
    logger.info("%s: %d training pairs mapped from %s (%.0f MB)", source.corpus,
                len(corpus.train), folder, folder_bytes(folder) / 1e6)
    return corpus


def read_cache(folder: Path) -> EncodedCorpus | None:
    """The encoded corpus in ``folder``: its starts and lengths memory-mapped, its tokens read a
    batch at a time (``TokenFile``); None if there is none. A folder that does not match its
    ``meta.json`` is removed (with one line saying why), and None returned."""
    if not folder.exists():
        return None
    try:
        meta = json.loads((folder / META).read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')}, not {FORMAT}")
        for name, size in meta["files"].items():
            if (folder / name).stat().st_size != size:
                raise ValueError(f"{name} holds {(folder / name).stat().st_size} bytes, not {size}")
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS
                  if not name.endswith(".tokens")}
        tokens = {name: TokenFile(folder / f"{name}.npy") for name in ARRAYS
                  if name.endswith(".tokens")}
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
            name = f"{split}.{side}"
            return Packed(tokens[f"{name}.tokens"], arrays[f"{name}.starts"],
                          arrays[f"{name}.lengths"])
        return Encoded(packed("src"), packed("tgt"))

    return EncodedCorpus(encoded("train"), encoded("dev"), _pairs(text["dev"]),
                         _pairs(text["test"]), meta["sha256"], folder)


def _pairs(rows: list[list[str]]) -> list[tuple[str, str]]:
    return [(source, target) for source, target in rows]


def _encode(source: CorpusSource, tokenizer: Tokenizer, train_every: int,
            max_train_pairs: int | None, max_eval_pairs: int | None) -> EncodedCorpus:
    """The corpus encoded in memory (no cache folder: small corpora, tests)."""
    train = [pair for batch in _training_pairs(source, train_every, max_train_pairs)
             for pair in batch]
    dev, test = _eval_pairs(source, max_eval_pairs)
    sha256 = {"train": pairs_sha256(train), "dev": pairs_sha256(dev), "test": pairs_sha256(test)}
    return EncodedCorpus(Encoded.encode(tokenizer, train), Encoded.encode(tokenizer, dev), dev,
                         test, sha256)


def _training_pairs(source: CorpusSource, train_every: int, max_train_pairs: int | None
                    ) -> Iterator[list[tuple[str, str]]]:
    """The training pairs a run keeps, in batches as read: every ``train_every``-th pair, then
    the first ``max_train_pairs`` of those (the reading stops there)."""
    seen = kept = 0
    for batch in source.train_batches():
        chosen = batch[(-seen) % train_every::train_every]
        seen += len(batch)
        if max_train_pairs is not None:
            chosen = chosen[:max_train_pairs - kept]
        kept += len(chosen)
        if chosen:
            yield chosen
        if max_train_pairs is not None and kept >= max_train_pairs:
            break
    if train_every > 1 or max_train_pairs is not None:
        logger.info("%s train: training on %d of the %d pairs read (train_every=%d,"
                    " max_train_pairs=%s)", source.corpus, kept, seen, train_every,
                    max_train_pairs)


def _eval_pairs(source: CorpusSource, max_eval_pairs: int | None
                ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return (first_pairs(source.pairs("dev"), max_eval_pairs),
            first_pairs(source.pairs("test"), max_eval_pairs))


class _Progress:
    """One line every ``every`` seconds while a large split is encoded: how far, how fast."""

    def __init__(self, corpus: str, every: float = 15.0):
        self.corpus, self.every = corpus, every
        self.started = self.last = time.perf_counter()

    def __call__(self, done: int, end: bool = False) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every or (end and now - self.started > 2):
            self.last = now
            logger.info("%s train: encoded %d pairs%s (%.0f/s)", self.corpus, done,
                        ", all" if end else "", done / max(now - self.started, 1e-9))


def _build(source: CorpusSource, tokenizer: Tokenizer, train_every: int,
           max_train_pairs: int | None, max_eval_pairs: int | None, folder: Path) -> None:
    """Encode ``source`` into a temporary folder beside ``folder``, then rename it into place.
    The training pairs stream through: read in batches, encoded (sentencepiece's threads, every
    core), appended to the arrays' files; only a batch is held at a time. A build that fails
    or is killed leaves no ``folder``, only its temporary one, which the next build removes."""
    for stale in folder.parent.glob(f"{folder.name}.tmp-*"):  # a killed build's: we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    tmp = folder.parent / f"{folder.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    try:
        started = time.perf_counter()
        train_count, train_sha = _stream_train(source, tokenizer, train_every, max_train_pairs,
                                               tmp)
        dev_pairs, test_pairs = _eval_pairs(source, max_eval_pairs)
        dev = Encoded.encode(tokenizer, dev_pairs)
        for side, packed in (("src", dev.src), ("tgt", dev.tgt)):
            for part in ("tokens", "starts", "lengths"):
                _save(tmp / f"dev.{side}.{part}.npy", getattr(packed, part))
        write_atomic(tmp / EVAL, json.dumps({"dev": dev_pairs, "test": test_pairs},
                                            ensure_ascii=False).encode())
        seconds = time.perf_counter() - started
        files = {f"{name}.npy": (tmp / f"{name}.npy").stat().st_size for name in ARRAYS}
        files[EVAL] = (tmp / EVAL).stat().st_size
        meta = {"format": FORMAT, "corpus": source.corpus, "fingerprint": source.fingerprint,
                "data_dir": source.data_dir,
                "pairs": {"train": train_count, "dev": len(dev_pairs), "test": len(test_pairs)},
                "sha256": {"train": train_sha, "dev": pairs_sha256(dev_pairs),
                           "test": pairs_sha256(test_pairs)},
                "files": files, "encode_seconds": round(seconds, 1),
                "cores": machine.cores(),  # the rate a plan prices a first run at (footprint)
                "built_by": f"{socket.gethostname()}:{os.getpid()}",
                "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_atomic(tmp / META, json.dumps(meta, indent=1).encode())
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("%s: encoded %d training pairs in %.0f s, cached in %s (%.0f MB)", source.corpus,
                train_count, seconds, folder, folder_bytes(folder) / 1e6)


def _stream_train(source: CorpusSource, tokenizer: Tokenizer, train_every: int,
                  max_train_pairs: int | None, folder: Path) -> tuple[int, str]:
    """The training pairs encoded into ``folder``'s six ``train.*.npy`` files as they are read;
    (how many, their ``pairs_sha256``). The files hold what ``np.save`` of the whole arrays
    would."""
    digest = hashlib.sha256()
    progress = _Progress(source.corpus)
    count = 0
    with contextlib.ExitStack() as stack:
        out = {name: stack.enter_context(_NpyAppender(folder / f"{name}.npy", dtype))
               for name, dtype in ((f"train.{side}.{part}", DTYPES[part])
                                   for side in ("src", "tgt") for part in DTYPES)}
        ends = {"src": 0, "tgt": 0}  # tokens written so far per side: the next start
        for batch in _training_pairs(source, train_every, max_train_pairs):
            encoded = Encoded.encode(tokenizer, batch)
            for side, packed in (("src", encoded.src), ("tgt", encoded.tgt)):
                assert isinstance(packed.tokens, np.ndarray)  # encoded here, in memory
                out[f"train.{side}.tokens"].append(packed.tokens)
                out[f"train.{side}.starts"].append(ends[side] + packed.starts)
                out[f"train.{side}.lengths"].append(packed.lengths)
                ends[side] += len(packed.tokens)
            hash_pairs(digest, batch)
            count += len(batch)
            progress(count)
        progress(count, end=True)
    return count, digest.hexdigest()


DTYPES = {"tokens": np.int32, "starts": np.int64, "lengths": np.int64}  # Packed.encode's


class _NpyAppender:
    """A one-dimensional ``.npy`` file written by appending: its header, written last, says how
    many items came, and the bytes are those ``np.save`` writes for the whole array."""

    HEADER = 128  # np.save's header for any one-dimensional array up to 10**20 items

    def __init__(self, path: Path, dtype: Any):
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0

    def __enter__(self) -> _NpyAppender:
        self.file = open(self.path, "wb")  # noqa: SIM115 - closed in __exit__
        self.file.seek(self.HEADER)
        return self

    def append(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.count += len(values)

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(header, {
                    "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                    "shape": (self.count,)})
                if len(header.getvalue()) != self.HEADER:
                    raise RuntimeError(f"{self.path}: a {len(header.getvalue())}-byte header")
                self.file.seek(0)
                self.file.write(header.getvalue())
                self.file.flush()
                os.fsync(self.file.fileno())
        finally:
            self.file.close()


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array))
        f.flush()
        os.fsync(f.fileno())
