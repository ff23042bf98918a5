"""Durable file writes: a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds its old content or all of ``data``, whatever happens during the write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file in the same folder (a rename is atomic within one file system), named
    # uniquely so that concurrent writers never share one.
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
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
