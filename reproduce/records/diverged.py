"""A run whose training loss turned non-finite (``train.callbacks.StopOnDivergence`` stops it): its
folder keeps a marker (``diverged.json``: the step, the last finite loss, the config), so the
next command refuses that run while its config is the same and trains it from the start once a
setting changed (``--set``) or the marker is removed; ``status`` shows it as diverged. Reading
and writing markers needs no Lightning, so the commands that only read runs start without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reproduce.errors import Diverged
from reproduce.records.store import same_config
from reproduce.util.files import move_aside, write_atomic

MARKER = "diverged.json"


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
