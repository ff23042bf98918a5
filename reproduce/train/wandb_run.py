"""A run's W&B run: offline unless an API key is set, grouped by table and row, its config
flattened; finished with the record's metrics (``train.runner``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from reproduce.config import Config
from reproduce.runs.records import wandb_folder
from reproduce.runs.sweep import PlannedRun
from reproduce.util.tracking import init_run, wandb_mode


def wandb_logger(run: PlannedRun, work: Path, precision: str):
    """W&B, offline unless an API key is set (sync later with `wandb sync`); False (no logger)
    with ``WANDB_MODE=disabled`` (``tracking.wandb_mode``)."""
    from pytorch_lightning.loggers import WandbLogger  # imports wandb: 1.3 s, only when training

    mode = wandb_mode()
    if mode == "disabled":
        return False  # Lightning's "no logger"; the record says W&B was off
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")
    experiment = init_run(
        run.run_id, project=os.environ.get("WANDB_PROJECT", "reproduce"), name=run.run_id,
        id=run.run_id.replace(".", "_"), group=f"{run.table}/{run.row}", job_type=run.variant,
        tags=[run.table, f"row:{run.row}", f"scale:{run.scale}", f"seed:{run.seed}"],
        dir=str(work), resume="allow",
        config={**_flat(run.config), "table": run.table, "row": run.row,
                "variant": run.variant, "scale": run.scale, "precision": precision})
    return WandbLogger(experiment=experiment, save_dir=str(work))


def _flat(config: Config) -> dict[str, Any]:
    return {f"{section}.{k}": v for section, values in asdict(config).items()
            for k, v in values.items()}


def finish_wandb(logger, metrics: Mapping[str, Any]) -> dict[str, Any]:
    if not logger:  # WANDB_MODE=disabled
        return {"id": None, "mode": "disabled", "dir": None, "url": None}
    experiment = logger.experiment
    for key, value in metrics.items():
        experiment.summary[f"final/{key}"] = value
    info = {"id": experiment.id, "mode": "offline" if experiment.offline else "online",
            "dir": wandb_folder(Path(experiment.dir)),
            "url": None if experiment.offline else experiment.url}
    experiment.finish()
    return info
