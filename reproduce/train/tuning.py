"""Tuning of nuisance settings on the dev split with optuna, for any table whose spec has `tune:`.

Section 6.3 tuned only dropout (attention and residual), learning rate and beam size of the parser,
on the development set; the spec lists those knobs and the dev metric. A study lives in a database
(SQLite under ``runs/`` by default, any optuna storage URL for workers that share one, or
``journal:PATH``, optuna's journal file, the default in SLURM tasks) and is
resumed by name, so ``--tune --trials N`` again adds N trials to the same study. Each trial trains
in the run folder its settings name (``<run_id>-tuned-<digest>``). A trial stopped by a signal
(SIGTERM, SLURM's USR2) has its settings queued again, and so has one whose process died
(SIGKILL, a node lost: found by its run folder's claim, or by an RDB's heartbeats): either way the
next trial resumes its run folder from its checkpoint. The
final run of the best settings reuses the best trial's trained model and only evaluates it. Bad
trials are pruned on their dev loss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from reproduce import paths
from reproduce.config import FIELDS
from reproduce.errors import ConfigError, Diverged, Stopped, one_line
from reproduce.paths import runs_dir
from reproduce.records.claims import claim, holder
from reproduce.records.sweep import Knob, PlannedRun, Tuning
from reproduce.train import evaluate, precision
from reproduce.train import fit as training
from reproduce.train.wandb_run import wandb_logger
from reproduce.util.secrets import mask

# optuna is imported where it is used: 0.5 s that only --tune needs.
log = logging.getLogger("reproduce")


def default_storage() -> str:
    """SQLite in the runs folder: one file holds every study of this checkout."""

    runs_dir().mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{runs_dir() / 'optuna.db'}"


def settings_tag(params: dict[str, Any]) -> str:
    """A short, stable name for one set of tuned settings."""
    digest = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    return f"tuned-{digest}"


def with_settings(run: PlannedRun, params: dict[str, Any]) -> PlannedRun:
    """``run`` with tuned settings applied; its run id names the settings."""
    tag = "-".join(t for t in (run.tag, settings_tag(params)) if t)
    return replace(run, config=run.config.overrides(**params), tag=tag)


def suggest(trial, knobs: dict[str, Knob]) -> dict[str, Any]:
    """One value per knob from the trial (optuna records them as the trial's params)."""
    params = {}
    for name, knob in knobs.items():
        if knob.choices:
            params[name] = trial.suggest_categorical(name, list(knob.choices))
        elif FIELDS[name][1] is int:  # e.g. warmup_steps
            assert knob.low is not None and knob.high is not None  # a range: checked by the spec
            params[name] = trial.suggest_int(name, int(knob.low), int(knob.high), log=knob.log)
        else:
            params[name] = trial.suggest_float(name, knob.low, knob.high, log=knob.log)
    return params


class PruneOnDevLoss(pl.Callback):
    """Reports the dev loss at every validation during training and stops trials that the
    study's pruner ranks as bad. Optuna compares reports in the study's direction, so for a
    maximised metric (F1) the negative NLL is reported."""

    def __init__(self, trial, direction: str) -> None:
        self.trial = trial
        self.sign = -1.0 if direction == "maximize" else 1.0

    def on_validation_end(self, trainer, pl_module) -> None:
        import optuna

        nll = trainer.callback_metrics.get("dev/nll")
        if trainer.sanity_checking or trainer.state.fn != "fit" or nll is None:
            return
        self.trial.report(self.sign * float(nll), step=trainer.global_step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"dev NLL {float(nll):.3f} at step {trainer.global_step}")


def train_and_score(run: PlannedRun, callbacks=()) -> dict[str, Any]:
    """Train ``run`` (resuming its checkpoint if any) and return its dev metrics, no test split."""
    import optuna

    work = paths.runs_dir() / run.table / run.run_id
    with claim(work) as held:  # two trials that drew the same settings (parallel SLURM tasks)
        if not held:
            raise optuna.TrialPruned(f"{run.run_id}: the same settings are training in another "
                                     f"process ({(holder(work) or {}).get('worker', 'unknown')})")
        return _train_and_score(run, work, callbacks)


def _train_and_score(run: PlannedRun, work: Path, callbacks) -> dict[str, Any]:
    import optuna

    c = run.config
    chosen, _ = precision.choose_precision(run)
    pl.seed_everything(c.train.seed, workers=True, verbose=False)
    tokenizer, data = training.build_data(c)
    logger = wandb_logger(run, work, chosen)
    try:
        try:
            trainer, module, *_ = training.fit(run, work, data, logger, chosen, callbacks)
        except optuna.TrialPruned:
            shutil.rmtree(work / "checkpoints", ignore_errors=True)  # never resumed nor reused
            raise
        except Diverged as e:  # a diverged trial is pruned; the study goes on
            shutil.rmtree(work / "checkpoints", ignore_errors=True)
            log.warning("%s; trial pruned", e)
            raise optuna.TrialPruned(str(e)) from None
        trainer.limit_val_batches = 1.0
        dev = training.validate(trainer, module, datamodule=data)
        # on the device it trained on: Lightning hands the module back on the CPU after validate
        _, headline = evaluate.task_scores(module.model.to(trainer.strategy.root_device),
                                           tokenizer, data, c, splits=("dev",))
    finally:
        if logger:  # False with WANDB_MODE=disabled
            logger.experiment.finish()
    return {"dev_ppl": float(dev["dev/ppl"]), "dev_nll": float(dev["dev/nll"]), **headline}


JOURNAL = "journal:"  # journal:PATH, optuna's journal file: for a filesystem several nodes share
STORAGE_ENV = "REPRODUCE_TUNE_STORAGE"  # how --storage reaches SLURM tasks: never in their files


def cluster_storage() -> str:
    """The storage of studies tuned in SLURM tasks without ``--storage``: optuna's journal file in
    the runs folder (SQLite's locking breaks on network filesystems)."""
    runs_dir().mkdir(parents=True, exist_ok=True)
    return f"{JOURNAL}{runs_dir() / 'optuna.journal'}"


def _storage(url: str):
    import optuna
    from optuna import storages

    if url.startswith(JOURNAL):  # no heartbeats: a trial whose process died is not retried
        from optuna.storages.journal import JournalFileBackend

        return storages.JournalStorage(JournalFileBackend(url[len(JOURNAL):]))

    # Heartbeats let a later invocation fail a trial whose process died, and retry it with the
    # same settings (so in the same run folder, resuming from its last checkpoint).
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if hasattr(storages, "RetryHeartbeatStaleTrialCallback"):  # optuna >= 4.9
                retry: dict[str, Any] = {"heartbeat_stale_trial_callback":
                         storages.RetryHeartbeatStaleTrialCallback(max_retry=2)}
            else:
                retry = {"failed_trial_callback": storages.RetryFailedTrialCallback(max_retry=2)}
            return storages.RDBStorage(url, heartbeat_interval=60, grace_period=180, **retry)
    except Exception as e:  # sqlalchemy's URL, driver and connection errors, as one line
        raise ConfigError(mask(f"--storage {url!r}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0]}")) from None


def requeue_trial(study, trial) -> None:
    """A trial stopped by a signal (optuna leaves it RUNNING: the stop is a SystemExit) is failed,
    and its settings are queued again in the study: the next trial, in this study's next
    invocation or SLURM's requeue of the task, takes them and resumes their run folder from the
    checkpoint saved at the step it stopped at, instead of drawing new settings and leaving it."""
    from optuna.trial import TrialState

    try:
        state = study.get_trials(deepcopy=False)[trial.number].state
        if state == TrialState.RUNNING:
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        elif state != TrialState.FAIL:  # FAIL: optuna's, for a KeyboardInterrupt; else ended
            return
        _queue_again(study, trial)
    except Exception as e:  # noqa: BLE001 - the storage's error must not hide the stop
        log.warning("%s: trial %d stopped, and could not be queued again (%s)", study.study_name,
                    trial.number, one_line(e))
        return
    log.warning("%s: trial %d stopped; its settings are queued again in the study, and its next "
                "trial resumes them from their checkpoint", study.study_name, trial.number)


def _queue_again(study, trial) -> None:
    """``trial``'s settings queued in ``study`` for its next trial, which resumes their run folder
    (the settings name it) from its checkpoint; ``resumes_trial`` says whose they were."""
    study.enqueue_trial(trial.params, user_attrs={"resumes_trial": trial.number})


# A RUNNING trial started this long ago whose run folder no live process claims has died with its
# process (SIGKILL, a node lost): optuna keeps it RUNNING for ever where the storage has no
# heartbeats (the journal file SLURM tasks share). The wait covers a trial's first moments, before
# its process claims the folder; REPRODUCE_TRIAL_STALE_SECONDS sets it.
STALE_SECONDS = 60.0
STALE_ENV = "REPRODUCE_TRIAL_STALE_SECONDS"


def requeue_dead_trials(study, table: str) -> None:
    """Fail each trial of ``study`` whose process is gone (``STALE_SECONDS``, no live claim on its
    run folder under ``runs/<table>/``) and queue its settings again, as ``requeue_trial`` does for
    a stopped one: the next trial resumes that folder from its last checkpoint."""
    import datetime

    from optuna.trial import TrialState

    stale = float(os.environ.get(STALE_ENV, STALE_SECONDS))
    now = datetime.datetime.now()  # optuna keeps naive local times
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        started = trial.datetime_start
        if started is None or (now - started).total_seconds() < stale:
            continue
        run_id = trial.user_attrs.get("run_id")
        if run_id and holder(runs_dir() / table / run_id) is not None:
            continue  # its process is alive, training
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        if trial.params:
            _queue_again(study, trial)
        log.warning("%s: trial %d was left running by a process that is gone (no claim on %s); "
                    "failed%s", study.study_name, trial.number, run_id or "its run folder",
                    ", and its settings queued again: the next trial resumes them from their "
                    "checkpoint" if trial.params else "")


def check_trials(trials: int) -> None:
    """``--trials``: each ``--tune`` adds at least one trial to its study."""
    if trials < 1:
        raise ConfigError(f"--trials {trials}: must be at least 1")


def tune(run: PlannedRun, tuning: Tuning, trials: int, storage: str | None = None,
         seed: int = 0, need_best: bool = True) -> tuple[PlannedRun, dict[str, Any]]:
    """Add ``trials`` trials to the study of ``run`` (created or resumed; 0: none, as the task
    that trains the best of trials run by other SLURM tasks), then return the run with the best
    settings found so far and a summary of the study for its record. With no finished trial: an
    error, or (``need_best`` False: a trial task, whose trial was pruned while others still
    run) ``run`` as it is, and a summary without a best."""
    import optuna

    if trials < 0:
        raise ConfigError(f"--trials {trials}: must be at least 0")
    url = storage or default_storage()
    study = optuna.create_study(
        study_name=run.run_id, storage=_storage(url),
        direction=tuning.direction,  # type: ignore[arg-type]  # minimize/maximize: the spec checks
        load_if_exists=True, pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
    # Seeded by the trials already run, so a resumed study does not repeat its first suggestions;
    # workers and SLURM tasks sharing a storage (an explicit --storage) draw apart.
    apart = (os.getpid(), os.environ.get("SLURM_ARRAY_TASK_ID")) if storage else 0
    study.sampler = optuna.samplers.TPESampler(
        seed=hash((seed, len(study.trials), apart)) % 2**32)
    requeue_dead_trials(study, run.table)
    done = len(study.trials)
    log.info("%s: study %r in %s, %d trial(s) so far, %d more", run.run_id, run.run_id,
             mask(url), done, trials)

    current: list = []  # the trial in progress

    def objective(trial) -> float:
        current[:] = [trial]
        candidate = with_settings(run, suggest(trial, tuning.knobs))
        trial.set_user_attr("run_id", candidate.run_id)
        metrics = train_and_score(candidate, [PruneOnDevLoss(trial, tuning.direction)])
        if tuning.metric not in metrics:
            raise ConfigError(f"tune.metric {tuning.metric!r} is not a dev metric of this run; "
                              f"choose one of {', '.join(metrics)}")
        for key, value in metrics.items():
            trial.set_user_attr(key, value)
        return float(metrics[tuning.metric])

    try:
        study.optimize(objective, n_trials=trials, catch=())
    except (Stopped, KeyboardInterrupt):  # SIGTERM, Ctrl-C, SLURM's USR2: not trained to the end
        if current:
            requeue_trial(study, current[0])
        raise
    states = [t.state for t in study.trials]
    complete = states.count(optuna.trial.TrialState.COMPLETE)
    if not complete and need_best:
        raise ConfigError(f"{run.run_id}: no finished trial in study {run.run_id!r} ({mask(url)}); "
                          "run --tune with more --trials")
    best = study.best_trial if complete else None
    summary = {
        "study": run.run_id, "storage": mask(url), "metric": tuning.metric,
        "direction": tuning.direction, "split": "dev",
        "best_trial": best and best.number, "best_value": best and best.value,
        "best_params": best and best.params, "n_trials": len(states), "complete": complete,
        "pruned": states.count(optuna.trial.TrialState.PRUNED),
        "knobs": {k: list(v.choices) if v.choices else {"low": v.low, "high": v.high, "log": v.log}
                  for k, v in tuning.knobs.items()},
    }
    return (run if best is None else with_settings(run, best.params)), summary
