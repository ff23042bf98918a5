"""A run whose training loss turns non-finite stops within a few steps, with nothing evaluated or
recorded, and says so; the same command does not train it again blindly.

The check keeps its flags on the device and reads them every ``every`` steps and before each
checkpoint save (so no saved checkpoint holds a diverged model), not every step: on a GPU a read
is a host synchronization. The run's folder keeps a marker (``diverged.json``: the step, the
last finite loss, the config): the next command refuses that run while its config is the same,
and trains it from the start once a setting changed (``--set``) or the marker is removed;
``status`` shows it as diverged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from reproduce.errors import Diverged
from reproduce.runs.records import same_config
from reproduce.util.files import move_aside, write_atomic

MARKER = "diverged.json"


class StopOnDivergence(pl.Callback):
    """Raise ``Diverged`` within ``every`` optimizer steps of a non-finite training loss."""

    def __init__(self, run_id: str, every: int = 10) -> None:
        self.run_id, self.every = run_id, every
        self._bad: torch.Tensor | None = None  # any non-finite loss since the last read
        self._last: torch.Tensor | None = None  # the last finite loss

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        loss = loss.detach().float()
        finite = torch.isfinite(loss)
        if self._bad is None:
            self._bad, self._last = ~finite, torch.where(finite, loss, torch.full_like(loss, -1))
        else:
            self._bad = self._bad | ~finite
            self._last = torch.where(finite, loss, self._last)
        if trainer.global_step % self.every == 0:
            self.check(trainer)

    def check(self, trainer) -> None:
        """Read the flags (a host synchronization); raise ``Diverged`` if a loss was not finite."""
        if self._bad is not None and bool(self._bad):
            last = float(self._last)
            raise Diverged(self.run_id, trainer.global_step, last if last >= 0 else None)


def write_marker(work: Path, error: Diverged, config: dict[str, Any]) -> Path:
    path = work / MARKER
    write_atomic(path, (json.dumps({"run_id": error.run_id, "step": error.step,
                                    "last_finite_loss": error.last_finite, "config": config},
                                   indent=1) + "\n").encode())
    return path


def read_marker(work: Path) -> dict[str, Any] | None:
    try:
        return json.loads((work / MARKER).read_text())
    except (OSError, ValueError):
        return None


def diverged_with(work: Path, config) -> bool:
    """Whether ``work``'s run diverged with ``config`` (its marker says so); changes nothing."""
    marker = read_marker(work)
    return marker is not None and same_config(marker.get("config"), config)


def refusal(work: Path, config) -> str | None:
    """Why ``work``'s run is not trained again: it diverged with this very config. A marker
    left by another config is set aside (``diverged-<time>.json``): that run trains anew."""
    marker = read_marker(work)
    if marker is None:
        return None
    if not same_config(marker.get("config"), config):
        move_aside(work / MARKER, work / "diverged-{time}.json")
        return None
    last = marker.get("last_finite_loss")
    return (f"diverged at step {marker.get('step')} (last finite loss "
            f"{'none' if last is None else f'{last:.4g}'}) with this config: not trained again. "
            "Change a nuisance setting (e.g. --results DIR --set train.lr_scale=...) or remove "
            f"{work / MARKER} to train it from the start")
