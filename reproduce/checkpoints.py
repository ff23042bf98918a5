"""Checkpoint files a run can always resume from.

Written atomically (a temporary file in the same folder, fsync, rename, fsync of the folder), so a
kill or a full disk during a save leaves the previous checkpoint whole. Before a run resumes,
``newest_readable`` checks its checkpoints (the zip's index and every member's CRC: a truncated
or corrupted file fails it) and sets aside the ones that fail, so the run resumes from the newest
readable one, or starts over when none is left.
"""

from __future__ import annotations

import io
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from .files import timestamp, write_atomic

log = logging.getLogger("reproduce")

LAST = "last.ckpt"
DAMAGED = "damaged"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, saving through ``write_atomic``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_atomic(Path(path), buffer.getvalue())


def unreadable(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be loaded, or None if it is whole."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"not a readable checkpoint ({e})"
    return f"member {bad} is corrupted" if bad else None


def _step(path: Path) -> int:
    match = re.fullmatch(r"step(\d+)\.ckpt", path.name)
    return int(match.group(1)) if match else -1


def newest_readable(directory: Path) -> Path | None:
    """The checkpoint to resume from in ``directory``: ``last.ckpt`` if it is whole, else the
    newest whole ``step<N>.ckpt``; None when there is none. Damaged files met on the way are
    moved to ``<directory>/damaged/`` (never deleted) with one warning line each."""
    candidates = [directory / LAST] + sorted(directory.glob("step*.ckpt"), key=_step, reverse=True)
    for path in candidates:
        if not path.is_file():
            continue
        why = unreadable(path)
        if why is None:
            return path
        stamp = timestamp()
        moved = directory / DAMAGED / f"{path.name}.{stamp}"
        moved.parent.mkdir(exist_ok=True)
        try:
            os.replace(path, moved)
        except FileNotFoundError:  # another rank of the same run moved it first
            continue
        log.warning("%s: %s; moved to %s, resuming from the newest readable checkpoint instead",
                    path, why, moved)
    return None
