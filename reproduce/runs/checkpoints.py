"""Checkpoint files a run can always resume from.

Written atomically (``training.AtomicCheckpointIO``: a temporary file in the same folder, fsync,
rename, fsync of the folder), so a kill or a full disk during a save leaves the previous
checkpoint whole. Before a run resumes, ``newest_readable`` checks its checkpoints (the zip's
index and every member's CRC: a truncated or corrupted file fails it) and sets aside the ones that
fail, so the run resumes from the newest readable one, or starts over when none is left. Reading
and checking need no Lightning, so the commands that only read runs start without it.
"""

from __future__ import annotations

import logging
import os
import re
import zipfile
from pathlib import Path

from reproduce.util.files import timestamp

log = logging.getLogger("reproduce")

LAST = "last.ckpt"
DAMAGED = "damaged"


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
    """The checkpoint to resume from in ``directory``: the most recently written whole one of
    ``last.ckpt`` and ``step<N>.ckpt`` (``last.ckpt`` on a tie); None when there is none.
    Lightning writes ``step<N>.ckpt`` first and ``last.ckpt`` after it, so a process killed in
    between leaves ``last.ckpt`` a save behind. Damaged files met on the way are moved to
    ``<directory>/damaged/`` (never deleted) with one warning line each."""
    def written(path: Path) -> tuple[int, bool, int]:
        try:
            return path.stat().st_mtime_ns, path.name == LAST, _step(path)
        except FileNotFoundError:  # moved or removed meanwhile
            return -1, False, -1

    candidates = sorted([directory / LAST, *directory.glob("step*.ckpt")], key=written,
                        reverse=True)
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
