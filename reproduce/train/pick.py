"""The weights a run is scored with, chosen on dev (``train.pick_on_dev``, Table 4's `cpu`
scale): each of the last N step checkpoints, and then their average, is decoded on the dev split
and scored by the task's dev metric (``evaluate.dev_score``: F1 for parsing, sacreBLEU for
translation); the best is loaded, the average only where dev says it beats every single
checkpoint. The test split is scored once, on the weights chosen. The record keeps every
candidate's dev score (``pick``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduce.records.averaging import average_checkpoints
from reproduce.records.checkpoints import STEP_NAME, last_checkpoints, readable

log = logging.getLogger(__name__)


def step_of(path: Path) -> int:
    """The training step in a step checkpoint's name (``step1200.ckpt``)."""
    match = STEP_NAME.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path}: not a step checkpoint")
    return int(match[1])


def choose(module, directory: Path, k: int, metric: str,
           dev_score: Callable[[], tuple[float, dict[str, Any]]]
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load into ``module`` the best of the last ``k`` checkpoints in ``directory`` and their
    average by ``dev_score`` (the model's dev ``metric`` as loaded now, and the dev entry it came
    from); returns the record's ``pick`` (every candidate, the one chosen, how) and the chosen
    weights' dev entry."""
    paths = readable(last_checkpoints(directory, k), directory,
                     f"weighs its last {k} checkpoints on dev")
    steps = [step_of(p) for p in paths]
    candidates = [(f"step {s}", [p]) for s, p in zip(steps, paths, strict=True)]
    if len(paths) > 1:
        candidates.append(("average of steps " + ", ".join(map(str, steps)), paths))
    tried: list[dict[str, Any]] = []
    best: tuple[float, str, list[Path], dict[str, Any]] | None = None
    for name, group in candidates:
        module.load_state_dict(average_checkpoints(group))
        value, entry = dev_score()
        log.info("dev %s of %s: %.2f", metric, name, value)
        tried.append({"weights": name, "checkpoints": [p.name for p in group],
                      f"dev_{metric}": value})
        # a tie: the later single checkpoint, never the average (it must beat them all)
        if best is None or value > best[0] or (value == best[0] and len(group) == 1):
            best = (value, name, group, entry)
    assert best is not None  # last_checkpoints returns one at least
    module.load_state_dict(average_checkpoints(best[2]))
    how = (f"the best {metric.upper()} on dev of the last {len(paths)} checkpoints (steps "
           f"{', '.join(map(str, steps))})" + (" and their average" if len(paths) > 1 else ""))
    return {"how": how, "metric": f"dev_{metric}", "chosen": best[1],
            "candidates": tried}, best[3]
