"""A run's W&B run: offline unless an API key is set, grouped by table and row (or
``WANDB_RUN_GROUP``), in ``WANDB_PROJECT`` (default ``reproduce``) and W&B's own
``WANDB_ENTITY``, its folder under ``WANDB_DIR`` where set, else the run's folder; an id of its own
(``run_id``), its config flattened; finished with the record's metrics (``train.runner``)."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reproduce.errors import one_line
from reproduce.paths import results_dir
from reproduce.records.store import wandb_folder
from reproduce.records.sweep import PlannedRun
from reproduce.util.files import write_atomic
from reproduce.util.tracking import init_run, wandb_dir, wandb_mode

log = logging.getLogger("reproduce")


ID_FILE = "wandb-id"  # in a run's checkpoints folder: set aside with them when the run is redone


def wandb_logger(run: PlannedRun, work: Path, precision: str,
                 trained_by: dict[str, Any] | None = None):
    """W&B, offline unless an API key is set (sync later with `wandb sync`); False (no logger)
    with ``WANDB_MODE=disabled`` (``tracking.wandb_mode``). Its id is the run's (``run_id``):
    a resumed run continues its W&B run, a redone one is a new W&B run. ``trained_by``: the
    record whose training this run evaluates (``records.sharing``), tagged and linked."""
    mode = wandb_mode()
    if mode == "disabled":
        return False  # Lightning's "no logger"; the record says W&B was off
    shared = shared_training(trained_by)
    wid, earlier = run_id(run, work)
    if earlier:  # its checkpoints go on under another config (decoding, more steps)
        shared = {"tags": [*shared["tags"], "continued"],
                  "config": {**shared["config"], "earlier_wandb_id": earlier}}
    experiment = init_run(
        run.run_id, work, f"{run.table}/{run.row}", name=run.run_id, id=wid,
        job_type=run.variant, resume="allow",
        tags=[run.table, f"row:{run.row}", f"scale:{run.scale}", f"seed:{run.seed}",
              *shared["tags"]],
        config={**flat_config(run.config.to_dict()), "table": run.table, "row": run.row,
                "variant": run.variant, "scale": run.scale, "precision": precision,
                **shared["config"]})
    return _logger_class()(experiment=experiment, save_dir=str(wandb_dir(work)))


def run_id(run: PlannedRun, work: Path) -> tuple[str, str | None]:
    """The W&B id of ``run`` (``wandb_id`` with a random part), kept in its checkpoints folder
    with its config's hash: a run resumed from a checkpoint with the same config continues its W&B
    run; any other start is a new one: from nothing (also after a failure before the first
    checkpoint, whose steps W&B would drop), or from checkpoints kept under another config (its
    decoding changed, or more steps), when the earlier id comes second, else None."""
    folder = work / "checkpoints"
    path = folder / ID_FILE
    config = hashlib.sha256(json.dumps(run.config.to_dict(), sort_keys=True).encode()).hexdigest()
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    resumable = any(folder.glob("*.ckpt"))
    if resumable and kept.get("config") == config[:16]:
        return kept["id"], kept.get("earlier")
    made = wandb_id(run.run_id, results_dir(), run.config.to_dict(), secrets.token_hex(4))
    earlier = kept.get("id") if resumable else None
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"id": made, "config": config[:16], "earlier": earlier}).encode())
    return made, earlier


def wandb_id(run: str, results: Path, config: Mapping[str, Any], salt: str = "") -> str:
    """A W&B id unique to the results folder, the run and its config (and ``salt``): the run's
    id (up to 48 characters), then 10 hex digits of their SHA-256. Two results folders, or a
    config changed, never share one."""
    key = json.dumps([str(Path(results).resolve()), run, config, salt], sort_keys=True)
    return f"{run[:48]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}".replace(".", "_")


def shared_training(trained_by: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tag and config of a run evaluated from another run's training: whose, and its W&B run
    (id, and link where it is online), where its curve is."""
    if not trained_by:
        return {"tags": [], "config": {}}
    w = trained_by.get("wandb") or {}
    return {"tags": ["shared-training", f"trained-by:{trained_by['run_id']}"[:64]],
            "config": {"trained_by": trained_by["run_id"], "trained_by_wandb_id": w.get("id"),
                       "trained_by_wandb_url": w.get("url")}}


def _logger_class():
    """Lightning's WandbLogger, except that W&B failing mid-run (its service process killed with
    a SLURM task's other processes, a full disk under its folder) stops the logging with one
    warning instead of the training: the run goes on to its checkpoint and record."""
    from pytorch_lightning.loggers import WandbLogger

    class KeepTraining(WandbLogger):
        lost: str | None = None

        def log_metrics(self, metrics, step=None):
            self._guarded(super().log_metrics, metrics, step)

        def log_hyperparams(self, params, *args, **kwargs):
            self._guarded(super().log_hyperparams, params, *args, **kwargs)

        def _guarded(self, call, *args, **kwargs):
            if self.lost is not None:
                return
            try:
                call(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - W&B's failure is not the run's
                self.lost = one_line(e, 160)
                log.warning("W&B stopped logging (%s); training goes on, and the record is "
                            "written as usual", self.lost)

    return KeepTraining


def flat_config(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A config as W&B keeps it: ``{"model.h": 8, ...}`` from ``Config.to_dict()`` (or a
    record's ``config``)."""
    return {f"{section}.{k}": v for section, values in config.items() for k, v in values.items()}


def finish_wandb(logger, metrics: Mapping[str, Any]) -> dict[str, Any]:
    if not logger:  # WANDB_MODE=disabled
        return {"id": None, "mode": "disabled", "dir": None, "url": None}
    experiment = logger.experiment
    info = {"id": experiment.id, "mode": "offline" if experiment.offline else "online",
            "dir": wandb_folder(Path(experiment.dir)),
            "url": None if experiment.offline else experiment.url}
    if getattr(logger, "lost", None) is None:
        try:
            for key, value in metrics.items():
                experiment.summary[f"final/{key}"] = value
            experiment.finish()
            return info
        except Exception as e:  # noqa: BLE001 - W&B's failure is not the run's
            logger.lost = one_line(e, 160)
    end_failed(logger)
    return {**info, "lost": logger.lost}  # the record says W&B's log is incomplete, and why


def end_failed(logger) -> None:
    """End the W&B run of a run that failed or stopped (SIGTERM, SLURM's USR2) as failed, not left
    open for the next one. SLURM signals every process of a task, W&B's service process too: then
    there is nothing left to end, and W&B's exit hook is disarmed, or the task's log would end with
    its ``ConnectionResetError: Connection lost`` traceback. What was logged stays in the run's
    W&B folder (offline: ``wandb sync``), and the resumed run continues the same W&B run."""
    if not logger:
        return
    import wandb

    try:
        logger.experiment.finish(exit_code=1)
    except Exception as e:  # noqa: BLE001 - its service is gone with the task
        log.info("W&B's service process stopped with the run (%s); its files so far stay in %s",
                 one_line(e, 120), logger.save_dir)
    try:  # W&B's exit hook unhooked (teardown does that first), then its service closed
        wandb.teardown(exit_code=1)
    except Exception:  # noqa: BLE001, S110 - the same lost service
        pass
