"""Checkpoint files a run can always resume from.

Written atomically (``train.callbacks.AtomicCheckpointIO``: a temporary file in the same folder, fsync,
rename, fsync of the folder), so a kill or a full disk during a save leaves the previous
checkpoint whole. Before a run resumes, ``newest_readable`` checks its checkpoints (the zip's
index and every member's CRC: a truncated or corrupted file fails it) and sets aside the ones that
fail, so the run resumes from the newest readable one, or starts over when none is left. Reading
and checking need no Lightning, so the commands that only read runs start without it.
"""

from __future__ import annotations

import logging
import re
import zipfile
from pathlib import Path

from reproduce.paths import runs_dir
from reproduce.util.files import DAMAGED, move_aside

log = logging.getLogger("reproduce")

LAST = "last.ckpt"
# Saved at the step a SIGTERM stopped the run (train.callbacks.SaveOnStop): resumed from, never averaged.
PREEMPTED = "preempted.ckpt"
# ModelCheckpoint(filename="step{step}") writes step1200.ckpt, and step1200-v1.ckpt when that name
# is taken (a resumed run saving the same step again).
STEP_NAME = re.compile(r"step(\d+)(?:-v(\d+))?\.ckpt")


def unreadable(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be loaded, or None if it is whole."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"not a readable checkpoint ({e})"
    return f"member {bad} is corrupted" if bad else None


class NoCheckpoints(ValueError):
    """A folder holds no ``step<N>.ckpt`` checkpoint (yet)."""


def _step(path: Path) -> int:
    match = STEP_NAME.fullmatch(path.name)
    return int(match[1]) if match else -1


def weights_only(path: Path) -> bool:
    """Whether a whole checkpoint holds a Lightning module's weights without the optimizer state
    a run resumes with (a step file kept only for averaging: ``records.disk``)."""
    import torch

    saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    return isinstance(saved, dict) and "state_dict" in saved and "optimizer_states" not in saved


def newest_readable(directory: Path) -> Path | None:
    """The checkpoint to resume from in ``directory``: the most recently written whole one of
    ``last.ckpt``, ``preempted.ckpt`` and ``step<N>.ckpt`` (``last.ckpt`` on a tie) that holds
    the optimizer state (step files kept only for averaging hold weights alone); None when there
    is none.
    Lightning writes ``step<N>.ckpt`` first and ``last.ckpt`` after it, so a process killed in
    between leaves ``last.ckpt`` a save behind. Damaged files met on the way are moved to
    ``<directory>/damaged/`` (never deleted) with one warning line each."""
    def written(path: Path) -> tuple[int, bool, int]:
        try:
            return path.stat().st_mtime_ns, path.name == LAST, _step(path)
        except FileNotFoundError:  # moved or removed meanwhile
            return -1, False, -1

    candidates = sorted([directory / LAST, directory / PREEMPTED, *directory.glob("step*.ckpt")],
                        key=written, reverse=True)
    for path in candidates:
        if not path.is_file():
            continue
        why = unreadable(path)
        if why is None:
            if weights_only(path):
                continue  # for averaging, not for resuming
            return path
        try:
            moved = move_aside(path, directory / DAMAGED / f"{path.name}.{{time}}")
        except FileNotFoundError:  # another rank of the same run moved it first
            continue
        log.warning("%s: %s; moved to %s, resuming from the newest readable checkpoint instead",
                    path, why, moved)
    return None


def checkpoint_step(path: Path) -> int:
    """The training step in a ``step<N>.ckpt`` file's name."""
    match = STEP_NAME.fullmatch(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: not a step<N>.ckpt checkpoint")
    return int(match[1])


def last_checkpoints(directory: Path, k: int) -> list[Path]:
    """The `k` checkpoints with the highest training step in their name (``step<N>.ckpt``), oldest
    first; ``last.ckpt`` and other names are ignored. Fewer than `k` when fewer exist (the caller
    records how many it averaged); ValueError when there is none."""
    if k < 1:
        raise ValueError(f"k = {k}: must be at least 1")
    by_step: dict[int, tuple[int, Path]] = {}
    for path in Path(directory).glob("step*.ckpt"):
        match = STEP_NAME.fullmatch(path.name)
        if match is None:
            continue
        step, copy = int(match[1]), int(match[2] or 0)
        # Two files for one step hold the same training state; counting both would weight it twice.
        if step not in by_step or copy > by_step[step][0]:
            by_step[step] = (copy, path)
    if not by_step:
        raise NoCheckpoints(f"{directory}: no step<N>.ckpt checkpoints to average")
    return [by_step[step][1] for step in sorted(by_step)[-k:]]


def steps_left(run, runs: Path | None = None) -> int:
    """Training steps a run still needs: all of them, less those of its latest checkpoint
    (``step<N>.ckpt`` under ``runs``, default ``runs_dir()``), which it resumes from."""
    steps = run.config.train.train_steps
    folder = (runs or runs_dir()) / run.table / run.run_id / "checkpoints"
    try:
        latest = last_checkpoints(folder, 1)[0]
    except NoCheckpoints:  # none yet
        return steps
    return max(0, steps - checkpoint_step(latest))


def readable(paths: list[Path], directory: Path, why: str) -> list[Path]:
    """``paths``, each readable; else one line (``DataError``) naming the first that is not,
    moved aside to ``directory/damaged/`` (damaged after it was written: saves are atomic).
    ``why``: what the run needs them for ("averages its last 5 checkpoints")."""
    from reproduce.errors import DataError
    from reproduce.util.files import DAMAGED, move_aside

    for path in paths:
        if problem := unreadable(path):
            moved = move_aside(path, directory / DAMAGED / f"{path.name}.{{time}}")
            raise DataError(f"{path}: {problem}; moved to {moved}. The run {why} and this one "
                            "cannot be rebuilt without training again: move "
                            f"{directory} aside to retrain the run from the start")
    return paths
