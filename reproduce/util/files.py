"""Durable file writes (a reader sees the old file or the whole new one, never a part), files set
aside instead of deleted, and a lock for one builder among many processes."""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

DAMAGED = "damaged"  # the folder beside damaged records and checkpoints that holds them
# A full disk, a quota, a read-only file system: what a run cannot write through.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})


def writable(folder: Path) -> OSError | None:
    """Whether a file can be made in ``folder`` (made as needed): None, or the error that says why
    not. Checked before training, so a read-only results folder is found before hours of work,
    not after."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".writable-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        return e
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds its old content or all of ``data``, whatever happens during the write."""
    with atomic_file(path) as f:
        f.write(data)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write ``path``'s new content to: ``path`` holds its old content or all of what
    was written once the block ends, whatever happens meanwhile (an exception inside the block
    leaves the old content). Streams: nothing is held in memory (a checkpoint of GBs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file in the same folder (a rename is atomic within one file system), named
    # uniquely so that concurrent writers never share one.
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)


def timestamp() -> str:
    """UTC now as ``YYYYMMDDTHHMMSS``: the suffix of files and folders set aside (superseded,
    damaged), so they sort by when it happened."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")


def move_aside(path: Path, to: Path) -> Path:
    """Move ``path`` (a file or a folder) to ``to``, where ``{time}`` stands for now
    (``timestamp``), making its folder as needed: set aside, never deleted, nor put over what
    was set aside there within the same second (``{time}_2``, ``_3``, ...: they sort after it).
    Returns where it went; FileNotFoundError when ``path`` has gone (another process moved it
    first)."""
    stamp = timestamp()
    for n in itertools.count(1):
        moved = Path(str(to).replace("{time}", stamp if n == 1 else f"{stamp}_{n}"))
        if not os.path.lexists(moved):  # a dangling link is something there too
            break
    moved.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, moved)
    return moved


@contextmanager
def exclusive(path: Path, waiting: str = "") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created as needed) while the block runs, waiting
    for whoever holds it; ``waiting`` is logged (one line) if there is a wait. The kernel releases the
    lock when its process dies, however it dies, and NFS and Lustre (``-o flock``) carry it across
    nodes, so one process of many, on one machine or several, builds what they all need."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not try_lock(fd):
            if waiting:
                log.info("%s", waiting)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


def try_lock(fd: int) -> bool:
    """Take an exclusive ``flock`` on the open file ``fd`` without waiting: False when another
    open file holds it; any other failure raises."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        return False
    return True
