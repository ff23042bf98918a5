"""The timing cache of the `auto` choosers (precision, compile, micro-batch): ``runs/timings.json``,
its keys and the one protocol they share. Without torch's compiler: ``status``, ``--render`` and a
dry run price runs from it (``plan.estimates``) and never time a step (``step_time`` does)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduce.config import Config, model_identity
from reproduce.util.files import write_atomic


def shape_key(config: Config, tokens: int, kinds: tuple[str, ...] = ("shape",)) -> str:
    """The model's identity (its fields of ``kinds``, ``config.model_identity``) and the tokens of
    its timed micro-batch: what an entry of the timing cache (``TIMINGS``) is of, beside the
    chooser and the machine."""
    return f"{model_identity(config.model, kinds)}-tok{tokens}"


# runs/: the one timing cache of the `auto` choosers (precision, compile, micro-batch)
TIMINGS = "timings.json"


def measured(cache: Path | None, key: str, measure: Callable[[], dict[str, Any]]
             ) -> tuple[dict[str, Any], bool]:
    """The one protocol of the `auto` choosers: ``cache``'s entry for ``key`` (the chooser's name,
    the machine and torch, the model's identity, ``shape_key``, and what else it depends on),
    else ``measure()``'s, written there at once for the ranks, workers and runs after it. The
    entry, and whether it came from the cache."""
    known = read_timings(cache).get(key) if cache else None
    if known is not None:
        return known, True
    known = measure()
    if cache:
        write_atomic(cache, (json.dumps({**read_timings(cache), key: known}, indent=1)
                             + "\n").encode())
    return known, False


def read_timings(cache: Path) -> dict[str, Any]:
    """A timing cache's entries; none where it is missing or damaged (timed again)."""
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
