"""What a run's checkpoints take on disk, and a refusal to start a run the disk has no room for.

A run keeps ``average_last`` step checkpoints (``step<N>.ckpt``) to average, ``last.ckpt`` to
resume from and, after a stop signal, ``preempted.ckpt``. A full checkpoint holds the weights and
Adam's two moments: 3 x 4 bytes per parameter (the weights stay fp32 in bf16-mixed too). Step
checkpoints kept only for averaging (``average_last`` > 1) hold the weights alone
(``train.callbacks.StepCheckpoint``); with ``average_last`` 1 the one step file is full, a second
checkpoint to resume from. Saves are atomic (a temporary file beside the one it replaces), and a
new step file is written before the oldest goes, so at the peak there is one more of each.

At the paper's size big keeps 20 step files of 0.85 GB and a 2.6 GB ``last.ckpt``: 26 GB at
most, where 20 full checkpoints would take 51 GB. ``check`` refuses, in one line, to start a run
whose peak, less what its checkpoints folder already holds, exceeds the free space there;
``--skip-disk-check`` (``SKIP_ENV``, inherited by workers and ranks) starts it anyway.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from reproduce.config import Config
from reproduce.errors import NoRoom

SKIP_ENV = "REPRODUCE_SKIP_DISK_CHECK"
BYTES_PER_WEIGHT = 4  # fp32 (Lightning's bf16-mixed keeps fp32 weights)
OVERHEAD = 1 << 20  # the pickle, hyperparameters, loop and callback states: well under a MiB


@dataclass(frozen=True)
class Need:
    """A run's checkpoints: the bytes of a full one and of a step file, and how many step files."""

    full: int
    step: int
    kept: int

    @property
    def weights_only(self) -> bool:
        return self.step < self.full

    @property
    def peak(self) -> int:
        """Bytes at the worst moment: one step file more than ``kept`` (a new one written before
        the oldest goes), ``last.ckpt`` and its replacement being written, and ``preempted.ckpt``."""
        return (self.kept + 1) * self.step + 3 * self.full

    def describe(self) -> str:
        kind = "weights only" if self.weights_only else "full"
        return (f"checkpoints need up to {size(self.peak)} on disk ({self.kept} step file(s) of "
                f"{size(self.step)}, {kind}; last.ckpt of {size(self.full)})")


def need(config: Config) -> Need:
    """The checkpoints ``config``'s run keeps, counted from its model (built on the meta device:
    nothing allocated)."""
    from reproduce.paper.model import build_on_meta, count_parameters

    params = count_parameters(build_on_meta(config.model))
    weights = BYTES_PER_WEIGHT * params + OVERHEAD
    full = weights + 2 * BYTES_PER_WEIGHT * params  # Adam's exp_avg and exp_avg_sq
    k = config.train.kept_checkpoints()
    return Need(full=full, step=weights if weights_only(config) else full, kept=k)


def weights_only(config: Config) -> bool:
    """Whether the run's step checkpoints hold weights alone: kept only to be averaged or
    weighed on dev (``train.pick_on_dev``)."""
    return config.train.kept_checkpoints() > 1


def free(folder: Path) -> int:
    """Free bytes on the filesystem that holds (or will hold) ``folder``."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def used(folder: Path) -> int:
    """Bytes the files directly under ``folder`` take (0 when it does not exist)."""
    try:
        return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())
    except FileNotFoundError:
        return 0


def check(run_id: str, config: Config, folder: Path) -> Need:
    """Raise ``NoRoom`` where the run's checkpoints (in ``folder``) will not fit; the need."""
    n = need(config)
    if os.environ.get(SKIP_ENV):
        return n
    missing = n.peak - used(folder)
    room = free(folder)
    if missing > room:
        raise NoRoom(f"{run_id}: its {n.describe()}, and {folder} has {size(room)} free: not "
                     "started (nothing was trained). Make room, put the runs elsewhere "
                     "(REPRODUCE_RUNS=DIR), or start it anyway with --skip-disk-check")
    return n


def size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
