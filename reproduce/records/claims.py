"""Which worker trains which run: one claim per run, safe for many workers on one sweep.

A worker claims a run by holding an exclusive lock (``flock``) on ``runs/<table>/<run_id>/claim``.
The kernel drops the lock when the process dies, however it dies (``kill -9``, OOM, a node lost
by SLURM whose file system then releases its locks), so a dead worker's run is free for the next
worker, which resumes it from its last checkpoint. The file's content (who, where, since when) is
for people and ``status``; the lock is the truth. ``flock`` locks belong to one open file, so a
process that looks (``holder``) never disturbs a claim it holds itself; on NFS Linux maps them to
byte-range locks, which work across nodes (as on Lustre mounted with ``-o flock``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reproduce.util.files import try_lock

CLAIM_FILE = "claim"


def worker_id() -> str:
    job = os.environ.get("SLURM_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    where = f"slurm job {job}" + (f"_{task}" if task else "") if job else "local"
    return f"{socket.gethostname()}:{os.getpid()} ({where})"


def rank() -> int:
    """This process's global rank in a multi-device run (0 when alone)."""
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


@contextmanager
def claim(work: Path) -> Iterator[bool]:
    """Hold the run in ``work`` for this process while the block runs; yields False (and holds
    nothing) if another live worker has it."""
    if rank() != 0:
        # A multi-device run's other processes (Lightning's DDP children, SLURM tasks) follow
        # their rank 0, which holds the claim for all of them.
        yield True
        return
    work.mkdir(parents=True, exist_ok=True)
    fd = os.open(work / CLAIM_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not try_lock(fd):
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"worker": worker_id(), "since": time.time()}).encode(), 0)
        os.fsync(fd)
        yield True
    finally:
        os.close(fd)  # releases the lock


def holder(work: Path) -> dict[str, Any] | None:
    """Who holds the run in ``work`` now (None when no live worker does). Does not take it."""
    path = work / CLAIM_FILE
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        if not try_lock(fd):
            try:
                return json.loads(os.pread(fd, 4096, 0) or b"{}")
            except json.JSONDecodeError:
                return {"worker": "unknown"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
