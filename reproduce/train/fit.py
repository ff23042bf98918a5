"""Training one run with Lightning: its data module, the Trainer and its callbacks (checkpoints at
optimizer steps, the training clock and curve, cores shared between workers), and its W&B run."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities.exceptions import SIGTERMException

from reproduce.config import Config
from reproduce.data import is_treebank, local_files
from reproduce.data.module import TranslationData
from reproduce.data.source import CorpusSource
from reproduce.data.vocabulary import corpus_tokenizer
from reproduce.errors import Diverged, Stopped
from reproduce.paper.optim import accumulation
from reproduce.paths import cache_dir
from reproduce.runs import checkpoints, disk
from reproduce.runs.records import wandb_folder
from reproduce.runs.sweep import PlannedRun
from reproduce.train import devices
from reproduce.train.devices import ONE_DEVICE, Layout
from reproduce.train.lit import TranslationModule
from reproduce.util import machine
from reproduce.util.files import atomic_file
from reproduce.util.tracking import init_run, wandb_mode

log = logging.getLogger("reproduce")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, saving through ``atomic_file``: streamed to a temporary
    file renamed into place, so no copy of a checkpoint (2.6 GB for the paper's big) is made in
    memory and a save cut short leaves the previous file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        with atomic_file(Path(path)) as f:
            torch.save(checkpoint, f)


def build_data(c: Config):
    """The run's tokenizer (trained once per corpus content and size, cached) and its data module
    (which maps the corpus encoded once with that tokenizer: ``reproduce.data.encoded_cache``)."""
    d = c.data
    source = CorpusSource(d.corpus, d.data_dir or None, d.extra_trees or None, d.linearization)
    tokenizer = corpus_tokenizer(source, c.model.vocab_size)
    data = TranslationData(d.corpus, tokenizer, c.train.batch_tokens,
                           c.train.max_tokens_per_sentence, d.max_train_pairs or None,
                           d.max_eval_pairs or None, d.data_dir or None, c.train.seed,
                           extra_trees=d.extra_trees or None, linearization=d.linearization,
                           device_batch_tokens=c.train.device_batch_tokens,
                           train_every=d.train_every, cache_dir=cache_dir(), source=source)
    return tokenizer, data


def local_data(c: Config) -> dict[str, Any]:
    """Where a run's own parallel files are and what they hold (path, size, SHA-256 per split),
    so its table names them instead of the corpus the spec called them."""
    if not c.data.data_dir or is_treebank(c.data.corpus):
        return {}
    return {"data_dir": c.data.data_dir, "files": local_files(c.data.corpus, c.data.data_dir)}


def fit(run: PlannedRun, work: Path, data, logger, precision: str, callbacks=(),
        layout: Layout = ONE_DEVICE, curve_every: int | None = None,
        resume_from: Path | None = None, compiled: bool | None = None):
    """Fit with Lightning on ``layout`` (resuming from the last checkpoint if there is one).
    ``resume_from``: another run's final checkpoint of the same training (``sharing``), restored
    as it is; nothing is trained and nothing is saved here. ``compiled``: whether the training
    loss goes through ``torch.compile`` (``train.compiling``'s answer; None: as the config says
    without ``auto``)."""
    c = run.config
    module = TranslationModule(c.to_dict())
    if compiled is not None:
        module.use_compiled(compiled)
    clock = TrainClock(every=0 if sys.stderr.isatty() else 50, curve_every=curve_every)
    diverged = StopOnDivergence(run.run_id)
    stop = SaveOnStop(work / "checkpoints", diverged, c.train.val_every_steps)
    if os.environ.get(machine.SHARE_ENV):  # a --workers worker on a CPU
        callbacks = [*callbacks, ShareCores()]
    every = ({"train_time_interval": timedelta(minutes=c.train.ckpt_every_minutes)}
             if c.train.ckpt_every_minutes else
             {"every_n_train_steps": c.train.ckpt_every_steps or max(1, c.train.train_steps // 10)})
    ckpt = StepCheckpoint(
        val_every_steps=c.train.val_every_steps, steps_weights_only=disk.weights_only(c),
        dirpath=work / "checkpoints", filename="step{step}", auto_insert_metric_name=False,
        save_last=True, save_top_k=c.train.average_last, monitor="step", mode="max", **every)
    trainer = pl.Trainer(
        max_steps=c.train.train_steps, max_epochs=-1, precision=precision,  # type: ignore[arg-type]
        accelerator=layout.accelerator, devices=layout.devices, num_nodes=layout.nodes,
        strategy=_strategy(layout), logger=logger, callbacks=[diverged, ckpt, clock, stop, *callbacks],
        plugins=[AtomicCheckpointIO(), *devices.cluster_plugins()],
        num_sanity_val_steps=0, log_every_n_steps=10, enable_model_summary=False,
        enable_progress_bar=sys.stderr.isatty(),
        **({"val_check_interval": c.train.val_every_steps, "check_val_every_n_epoch": None}
           if c.train.val_every_steps else {"limit_val_batches": 0}),
    )
    accumulate, _ = accumulation(c.train.batch_tokens, c.train.device_batch_tokens,
                                 trainer.world_size)
    trainer.accumulate_grad_batches = accumulate
    if c.train.val_every_steps:  # Lightning counts micro-batches; the config, optimizer steps
        trainer.val_check_interval = c.train.val_every_steps * accumulate
    last = resume_from or checkpoints.newest_readable(work / "checkpoints")
    resumed = last is not None
    if resumed and resume_from is None:
        log.info("%s: resuming from %s", run.run_id, last)

    try:
        trainer.fit(module, datamodule=data, ckpt_path=last)
    except SIGTERMException:  # Lightning's: a SystemExit with status 0, as if the run had ended
        where = (f"saved at that step ({stop.saved}); run the command again to resume from it"
                 if stop.saved else "run the command again to resume it from its last checkpoint")
        name = signal.Signals(stop.signal or signal.SIGTERM).name
        raise Stopped(f"{run.run_id}: stopped by {name} at step {trainer.global_step} of "
                      f"{c.train.train_steps}; {where}", stop.signal or signal.SIGTERM) from None
    if trainer.interrupted or trainer.global_step < c.train.train_steps:
        raise RuntimeError(f"{run.run_id}: training stopped at step {trainer.global_step} of "
                           f"{c.train.train_steps}; run the command again to resume")
    diverged.check(trainer)  # the last steps since the last read
    if resume_from is None:  # the final weights, so a crash below resumes at evaluation
        trainer.save_checkpoint(work / "checkpoints" / checkpoints.LAST)
    return trainer, module, clock, resumed, accumulate


def _strategy(layout: Layout):
    if layout.world == 1:
        return "auto"

    return DDPStrategy(process_group_backend=layout.backend,
                       timeout=timedelta(seconds=devices.timeout_seconds()))


class StepEnd:
    """Where a training batch ended, for the callbacks that act only at the end of an optimizer
    step, after that step's dev evaluation if one follows it (``StepCheckpoint``, ``SaveOnStop``):
    ``begin`` at each batch's start, then ``where`` at its end."""

    INSIDE, BEFORE_VALIDATION, END = "inside", "before validation", "end"

    def __init__(self, val_every_steps: int = 0) -> None:
        self.val_every_steps = val_every_steps
        self._before: int | None = None

    def begin(self, trainer) -> None:
        self._before = trainer.global_step

    def where(self, trainer) -> str:
        step = trainer.global_step
        if step == self._before:
            return self.INSIDE  # an accumulated step goes on
        if self.val_every_steps and step % self.val_every_steps == 0:
            return self.BEFORE_VALIDATION
        return self.END


class StepCheckpoint(pl.callbacks.ModelCheckpoint):
    """Lightning's ModelCheckpoint, saving only right after an optimizer step, and after the dev
    evaluation that follows that step when there is one.

    A time-based save in the middle of an accumulated step would lose its micro-batches'
    gradients and move the accumulation boundary; a save taken just before a dev evaluation is
    resumed after it, losing that point of the learning curve.

    ``steps_weights_only``: the ``step<N>.ckpt`` files hold the weights alone (kept only for
    averaging: ``runs.disk``); ``last.ckpt``, saved with each, stays full for resuming."""

    def __init__(self, val_every_steps: int = 0, steps_weights_only: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.steps_weights_only = steps_weights_only
        self.step_end = StepEnd(val_every_steps)
        self._after_validation: tuple | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_end.begin(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        where = self.step_end.where(trainer)
        if where == StepEnd.INSIDE:
            return
        if where == StepEnd.BEFORE_VALIDATION:
            self._after_validation = (outputs, batch, batch_idx)
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        for callback in trainer.callbacks:  # never a checkpoint of a diverged model
            if isinstance(callback, StopOnDivergence):
                callback.check(trainer)
        # Lightning's one switch for both kinds of file, set per file (it is not in the callback's
        # state); Lightning sets last_model_path before it saves last.ckpt
        self.save_weights_only = self.steps_weights_only and filepath != self.last_model_path
        super()._save_checkpoint(trainer, filepath)

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._after_validation is not None and trainer.state.fn == "fit":
            args, self._after_validation = self._after_validation, None
            super().on_train_batch_end(trainer, pl_module, *args)


class SaveOnStop(pl.Callback):
    """On a stop signal (SIGTERM: a preemption, ``kill``, ``scancel``; USR2: SLURM's warning
    before the time limit, which ``plan.launch`` also requeues on), end the run at the end of the
    step in flight, saving a checkpoint there (``checkpoints.PREEMPTED``): the next start resumes
    from it, and averaging never counts it, so the record is the one an uninterrupted run writes.

    While fitting, these handlers replace Lightning's (restored with the others when fit ends),
    which stop a dev evaluation mid-way (its point of the learning curve lost on resume) and run a
    collective inside the signal handler on each rank, so ranks signalled a step apart stop at
    different places and wait on each other forever. Here a handler only notes the signal; the
    ranks decide together at the end of each optimizer step, after its dev evaluation if it has
    one (one all-reduce of a flag, on several devices only), then Lightning's own flag makes every
    rank leave at that step's end, and ``on_exception`` saves."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR2)

    def __init__(self, folder: Path, diverged: StopOnDivergence, val_every_steps: int = 0) -> None:
        self.folder, self.diverged = folder, diverged
        self.step_end = StepEnd(val_every_steps)
        self.saved: Path | None = None
        self.signal: int | None = None  # the stop signal that came, if any

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python takes signals in the main thread only; Lightning's stay in place
        if trainer.received_sigterm:  # came before training started, through Lightning's handler
            self.signal = signal.SIGTERM
            trainer._signal_connector.received_sigterm = False
        for signum in self.SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum, frame) -> None:
        self.signal = signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_end.begin(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.step_end.where(trainer) == StepEnd.END:  # else decided after the dev evaluation
            self._decide(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._decide(trainer, pl_module)

    def _decide(self, trainer, pl_module) -> None:
        stop = self.signal is not None
        if trainer.world_size > 1:  # every rank stops at the same step, or none does
            flag = torch.tensor([float(stop)], device=pl_module.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
            if stop and self.signal is None:
                self.signal = signal.SIGTERM  # another rank's
        if stop:  # Lightning's flag: every rank raises SIGTERMException at this step's end
            trainer._signal_connector.received_sigterm = True  # no public setter

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        self.diverged.check(trainer)  # never save a diverged model
        path = self.folder / checkpoints.PREEMPTED
        trainer.save_checkpoint(path)
        self.saved = path


class StopOnDivergence(pl.Callback):
    """Raise ``Diverged`` within ``every`` optimizer steps of a non-finite training loss, and
    before any checkpoint save (``StepCheckpoint``), so no checkpoint holds a diverged model.
    The flags stay on the device and are read every ``every`` steps, not every step: on a GPU a
    read is a host synchronization (``runs.diverged`` keeps the marker that follows)."""

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
            self._last = torch.where(finite, loss, self._last)  # type: ignore[arg-type]  # set with _bad
        if trainer.global_step % self.every == 0:
            self.check(trainer)

    def check(self, trainer) -> None:
        """Read the flags (a host synchronization); raise ``Diverged`` if a loss was not finite."""
        if self._bad is not None and bool(self._bad) and self._last is not None:
            last = float(self._last)
            raise Diverged(self.run_id, trainer.global_step, last if last >= 0 else None)


class ShareCores(pl.Callback):
    """In a ``--workers`` worker on a CPU: every ``every`` steps, take the cores of workers that
    have ended (``machine.share_cores``)."""

    def __init__(self, every: int = 10) -> None:
        self.every = every

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0 and (threads := machine.share_cores()):
            log.info("step %d: %d thread(s) now (a worker has ended)", trainer.global_step, threads)


class TrainClock(pl.Callback):
    """Training wall time, summed over resumed sessions (kept inside the checkpoints); prints a
    progress line every `every` steps where there is no progress bar (logs, nohup, CI)."""

    def __init__(self, every: int = 0, curve_every: int | None = None) -> None:
        self.curve_every = curve_every  # default: about 20 points or more over the run
        self.before = 0.0
        self.start: float | None = None
        self.cpu_before = 0.0
        self.cpu_start: float | None = None
        self.every = every
        # The learning curve kept in the record: (step, seconds, train loss or dev PPL).
        self.curve: dict[str, list[list[float]]] = {"train_loss": [], "dev_ppl": []}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        curve_every = self.curve_every or max(1, min(50, trainer.max_steps // 20))
        if step % curve_every or not (loss := trainer.callback_metrics.get("train/loss")):
            return
        if self.curve["train_loss"] and self.curve["train_loss"][-1][0] == step:
            return  # the same optimizer step seen again (gradient accumulation)
        self.curve["train_loss"].append([step, round(self.seconds, 1), round(float(loss), 4)])
        if self.every and step % self.every == 0:
            log.info("step %d/%d  loss %.3f  %.0f s", step, trainer.max_steps, float(loss),
                     self.seconds)

    def on_validation_end(self, trainer, pl_module) -> None:
        ppl = trainer.callback_metrics.get("dev/ppl")
        if ppl is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.curve["dev_ppl"].append([trainer.global_step, round(self.seconds, 1),
                                      round(float(ppl), 3)])
        if self.every:
            log.info("step %d/%d  dev PPL %.2f  %.0f s", trainer.global_step, trainer.max_steps,
                     float(ppl), self.seconds)

    @property
    def seconds(self) -> float:
        return self.before + (time.time() - self.start if self.start else 0.0)

    @property
    def cpu_seconds(self) -> float:
        """CPU time of this process (all its threads) while training: on a shared machine, wall
        time grows with the load and this does not (divide by the cores for an unloaded wall)."""
        now = time.process_time() - self.cpu_start if self.cpu_start is not None else 0.0
        return self.cpu_before + now

    def on_train_start(self, trainer, pl_module) -> None:
        self.start, self.cpu_start = time.time(), time.process_time()

    def on_train_end(self, trainer, pl_module) -> None:
        self.before, self.cpu_before = self.seconds, self.cpu_seconds
        self.start = self.cpu_start = None

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "curve": self.curve}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.before = state["seconds"]
        self.cpu_before = state.get("cpu_seconds", 0.0)
        self.curve = state.get("curve", self.curve)


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
