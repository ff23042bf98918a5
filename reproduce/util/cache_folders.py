"""The cache root's encoded corpora as folders (``reproduce.data.encoded_cache`` writes them): listing
them with their size and last use, and pruning them. Torch-free, for ``status`` and ``cache``."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from reproduce.util.files import try_lock

SUBDIR = "encoded"  # under the cache root
META = "meta.json"  # written last: a folder without it was never finished
USED = "used"  # touched whenever the folder is mapped (``prune`` goes by it)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files in ``folder``."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


@dataclass(frozen=True)
class CacheEntry:
    """One encoded corpus in the cache: its folder, size, when it was last mapped, what it is."""

    folder: Path
    bytes: int
    last_used: float  # seconds since the epoch
    corpus: str
    train_pairs: int
    data_dir: str | None = None  # the local files it was encoded from (None: the Bible, the Hub)
    encode_seconds: float | None = None  # reading and encoding it took
    cores: int | None = None  # on this many cores (written since 2026-11-27)


def cache_entries(cache_dir: str | Path) -> list[CacheEntry]:
    """The encoded corpora under ``cache_dir``, most recently used first."""
    entries = []
    for folder in sorted((Path(cache_dir) / SUBDIR).glob("*")):
        if not folder.is_dir() or ".tmp-" in folder.name:
            continue
        try:
            meta = json.loads((folder / META).read_text())
            corpus, pairs = meta.get("corpus", "?"), int(meta.get("pairs", {}).get("train", 0))
        except (OSError, ValueError):
            meta, corpus, pairs = {}, "(unfinished)", 0
        used = folder / USED
        entries.append(CacheEntry(folder, folder_bytes(folder),
                                  (used if used.exists() else folder).stat().st_mtime,
                                  corpus, pairs, meta.get("data_dir"), meta.get("encode_seconds"),
                                  meta.get("cores")))
    return sorted(entries, key=lambda e: -e.last_used)


def prune(cache_dir: str | Path, unused_days: float = 0.0) -> list[CacheEntry]:
    """Remove the encoded corpora not mapped for ``unused_days`` (0: all), skipping one being
    built (its lock held); what was removed. A run that needs one again rebuilds it; a run
    mapping one now keeps reading it (the files live on until it unmaps them)."""
    removed = []
    cutoff = time.time() - unused_days * 86400
    for entry in cache_entries(cache_dir):
        if entry.last_used > cutoff:
            continue
        lock = entry.folder.parent / f"{entry.folder.name}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not try_lock(fd):
                continue  # being built or checked right now
            shutil.rmtree(entry.folder)
            removed.append(entry)
        finally:
            os.close(fd)
    return removed
