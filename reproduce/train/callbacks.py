"""What the Trainer of a run is given besides the model and data: checkpoints saved at optimizer
steps and written atomically, a save at the step a signal stops the run, the divergence watch,
the training clock and learning curve, and a worker's share of the cores (``train.fit`` assembles
them)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any
from weakref import proxy

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.utilities.exceptions import SIGTERMException

from reproduce.errors import Diverged
from reproduce.records import checkpoints
from reproduce.train import stops
from reproduce.util import machine
from reproduce.util.files import atomic_file

log = logging.getLogger("reproduce")
# A run's progress line (TrainClock), which benchmarks/gpu_window.py reads back from a stopped run
PROGRESS = "step %d/%d  loss %.3f  %.0f s"


# Steps between Lightning's hand-overs to the loggers (the Trainer's log_every_n_steps): where a
# run's host reads values back from the device (the divergence check, the learning curve on the
# fast path, the ranks' decision to stop), so that one wait serves them all
LOG_EVERY = 10


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, saving through ``atomic_file``: streamed to a temporary
    file renamed into place, so no copy of a checkpoint (2.6 GB for the paper's big) is made in
    memory and a save cut short leaves the previous file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        with atomic_file(Path(path)) as f:
            torch.save(checkpoint, f)


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
    averaging: ``records.disk``); ``last.ckpt``, saved with each, stays full for resuming. Where
    the step's file is full too, and was saved with this callback's ``last_model_path`` already
    ``last.ckpt`` (every save but a run's first), ``last.ckpt`` is a copy of its bytes: the same
    state, not gathered and serialized twice. (A copy of the first save would hold an empty
    ``last_model_path``: resumed from it, Lightning would write ``last-v1.ckpt`` beside it.)"""

    def __init__(self, val_every_steps: int = 0, steps_weights_only: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.steps_weights_only = steps_weights_only
        self.step_end = StepEnd(val_every_steps)
        self._after_validation: tuple | None = None
        # the last full save: its optimizer step, its path and the last_model_path it holds
        self._full: tuple[int, str, str] | None = None

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
        full = self._full
        if filepath == self.last_model_path and full and full[0] == trainer.global_step \
                and full[2] == filepath:
            self._copy(trainer, full[1], filepath)
            return
        super()._save_checkpoint(trainer, filepath)
        if not self.save_weights_only:
            self._full = (trainer.global_step, filepath, self.last_model_path)

    def _copy(self, trainer, source: str, filepath: str) -> None:
        """``filepath`` written as a copy of ``source``, saved at this step, as
        ``_save_checkpoint`` writes a file (by global rank 0, atomically, the ranks waiting)."""
        if trainer.is_global_zero:
            with open(source, "rb") as f, atomic_file(Path(filepath)) as out:
                shutil.copyfileobj(f, out, 16 << 20)
        trainer.strategy.barrier("Trainer.save_checkpoint")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._after_validation is not None and trainer.state.fn == "fit":
            args, self._after_validation = self._after_validation, None
            super().on_train_batch_end(trainer, pl_module, *args)


class SaveOnStop(pl.Callback):
    """On a stop signal (SIGTERM: a preemption, ``kill``, ``scancel``; USR2: SLURM's warning
    before the time limit, which ``launch.task`` also requeues on; SIGINT: Ctrl-C, where a second
    one stops at once), end the run at the end of the step in flight, saving a checkpoint there
    (``checkpoints.PREEMPTED``): the next start resumes from it, and averaging never counts it,
    so the record is the one an uninterrupted run writes.

    While fitting, these handlers replace Lightning's (restored with the others when fit ends),
    which stop a dev evaluation mid-way (its point of the learning curve lost on resume) and run a
    collective inside the signal handler on each rank, so ranks signalled a step apart stop at
    different places and wait on each other forever. Here a handler only notes the signal; the
    ranks decide together at the end of each optimizer step, after its dev evaluation if it has
    one (one all-reduce of a flag, on several devices only; on the fast path every ``every``
    steps, after dev evaluations and at the last step: its answer is a read the host waits for),
    then Lightning's own flag makes every rank leave at that step's end, and ``on_exception``
    saves."""

    SIGNALS = stops.STOP_SIGNALS

    def __init__(self, folder: Path, diverged: StopOnDivergence, val_every_steps: int = 0,
                 every: int = 1) -> None:
        self.folder, self.diverged = folder, diverged
        self.every = every  # steps between the ranks' decisions
        self.step_end = StepEnd(val_every_steps)
        self.saved: Path | None = None
        self.signal: int | None = None  # the stop signal that came, if any
        self.ctrl_c = stops.CtrlC()  # a second one stops at once

    def on_train_start(self, trainer, pl_module) -> None:
        if not stops.in_main_thread():
            return  # Python takes signals in the main thread only; Lightning's stay in place
        if stops.stop_requested(trainer):  # came before training, through Lightning's handler
            self.signal = signal.SIGTERM
            stops.stop_at_step_end(trainer, False)
        stops.take(self._note, self.SIGNALS)  # Lightning restores its own when the fit ends

    def _note(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self.ctrl_c.again():  # Ctrl-C again: now (Lightning's interrupt, no save)
                raise KeyboardInterrupt
            # straight to the file: a handler that prints may land inside another print
            os.write(sys.stderr.fileno(), b"Ctrl-C: stopping at the end of this step, saved there "
                     b"(Ctrl-C again stops at once, losing the steps since the last checkpoint)\n")
        if self.signal is None:  # the first names the stop (a Ctrl-C, then the sweep's SIGTERM)
            self.signal = signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_end.begin(trainer)
        # The loggers' step (W&B's axis) is Lightning's count of optimizer steps, which a resume
        # adds one to, taking every checkpoint for one saved before the step was counted (a dev
        # evaluation's): ours, saved at a step's end, is not. Between steps the two agree.
        loop = trainer.fit_loop.epoch_loop
        loop._batches_that_stepped = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.step_end.where(trainer) != StepEnd.END:  # else decided after the dev evaluation
            return
        step = trainer.global_step
        if trainer.world_size == 1 or step % self.every == 0 or step >= trainer.max_steps:
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
            stops.stop_at_step_end(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        self.diverged.check(trainer)  # never save a diverged model
        _at_next_epoch_start(trainer)
        # a Ctrl-C in the save would leave Lightning's teardown undone (its handlers not
        # restored); the save takes seconds at most
        stops.ignore_ctrl_c()
        path = self.folder / checkpoints.PREEMPTED
        trainer.save_checkpoint(path)
        self.saved = path


def _at_next_epoch_start(trainer) -> None:
    """A stop at an epoch's last step leaves Lightning's loops once it has counted that epoch
    done (the fit loop's end of epoch), with the epoch's batches still counted as the current
    ones: resumed as saved, it counts the epoch done a second time and skips the next. Count
    them as a new epoch's, none yet, as Lightning does for a checkpoint of an epoch's end."""
    epochs = trainer.fit_loop.epoch_progress.total
    if epochs.completed < epochs.started:
        return  # stopped within the epoch, at a step's end
    loop = trainer.fit_loop.epoch_loop
    loop.batch_progress.reset_on_run()
    loop.scheduler_progress.reset_on_run()
    loop.automatic_optimization.optim_progress.reset_on_run()
    loop.val_loop.batch_progress.total.reset()


class StopOnDivergence(pl.Callback):
    """Raise ``Diverged`` within ``every`` optimizer steps of a non-finite training loss, and
    before any checkpoint save (``StepCheckpoint``), so no checkpoint holds a diverged model.
    The flags stay on the device and are read every ``every`` steps, not every step: on a GPU a
    read is a host synchronization (``records.diverged`` keeps the marker that follows)."""

    def __init__(self, run_id: str, every: int = LOG_EVERY) -> None:
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
    progress line every `every` steps where there is no progress bar (logs, nohup, CI). The
    learning curve's points are read every `curve_every` steps, a multiple of `align` (the fast
    path's 10: its loggers' steps, where the host reads the device anyway)."""

    def __init__(self, every: int = 0, curve_every: int | None = None, align: int = 1) -> None:
        self.curve_every = curve_every  # default: about 20 points or more over the run
        self.align = align
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
        curve_every = -(-curve_every // self.align) * self.align
        if step % curve_every or not (loss := trainer.callback_metrics.get("train/loss")):
            return
        if self.curve["train_loss"] and self.curve["train_loss"][-1][0] == step:
            return  # the same optimizer step seen again (gradient accumulation)
        self.curve["train_loss"].append([step, round(self.seconds, 1), round(float(loss), 4)])
        if self.every and step % self.every == 0:
            log.info(PROGRESS, step, trainer.max_steps, float(loss), self.seconds)

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
