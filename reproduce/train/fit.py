"""Training one run with Lightning: its data module and the Trainer, assembled with the callbacks
of ``train.callbacks``, resumed from the newest readable checkpoint."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities.exceptions import SIGTERMException

from reproduce.config import Config
from reproduce.data import is_treebank, local_files
from reproduce.data.module import TranslationData
from reproduce.data.source import CorpusSource
from reproduce.data.vocabulary import corpus_tokenizer
from reproduce.errors import Stopped
from reproduce.paths import cache_dir
from reproduce.records import checkpoints, disk
from reproduce.records.sweep import PlannedRun
from reproduce.train import devices, stops
from reproduce.train.callbacks import (
    LOG_EVERY,
    AtomicCheckpointIO,
    SaveOnStop,
    ShareCores,
    StepCheckpoint,
    StopOnDivergence,
    TrainClock,
)
from reproduce.train.devices import ONE_DEVICE, Layout
from reproduce.train.lit import TranslationModule
from reproduce.train.step_census import StepCensus
from reproduce.util import machine

log = logging.getLogger("reproduce")


def build_data(c: Config):
    """The run's tokenizer (trained once per corpus content and size, cached) and its data module
    (which maps the corpus encoded once with that tokenizer: ``reproduce.data.encoded_cache``)."""
    d = c.data
    source = CorpusSource(d.corpus, d.data_dir or None, d.extra_trees or None, d.linearization)
    tokenizer = corpus_tokenizer(source, c.model.vocab_size, kind=d.vocabulary)
    data = TranslationData(c, tokenizer, cache_dir=cache_dir(), source=source)
    return tokenizer, data


def local_data(corpus: str, data_dir: str | None) -> dict[str, Any]:
    """Where a run's files are and what they hold (path, size, SHA-256 per split; a Hub
    download's repository, revision and shards), so its table names them instead of the corpus
    the spec called them. ``data_dir``: the corpus source's (the spec's, or the Hub's snapshot)."""
    if not data_dir or is_treebank(corpus):
        return {}
    return {"data_dir": data_dir, "files": local_files(corpus, data_dir)}


def validate(trainer: pl.Trainer, module, **kwargs) -> Mapping[str, float]:
    """``trainer.validate``'s first result; a Ctrl-C during it is a KeyboardInterrupt (one line,
    exit 130), not Lightning's ``exit(1)`` without a word."""
    try:
        return trainer.validate(module, verbose=False, **kwargs)[0]
    except SystemExit as e:
        if stops.interrupted_by_ctrl_c(e):
            raise KeyboardInterrupt from None
        raise


def fit(run: PlannedRun, work: Path, data, logger, precision: str, callbacks=(),
        layout: Layout = ONE_DEVICE, curve_every: int | None = None,
        resume_from: Path | None = None, compiled: bool | None = None):
    """Fit with Lightning on ``layout`` (resuming from the last checkpoint if there is one).
    ``resume_from``: another run's final checkpoint of the same training (``sharing``), restored
    as it is; nothing is trained and nothing is saved here. ``compiled``: whether the training
    loss goes through ``torch.compile`` (``train.compiling``'s answer; None: as the config says
    without ``auto``)."""
    c = run.config
    devices.attention_kernels()  # decoding after fit, in this process, keeps them too
    module = TranslationModule(c.to_dict())
    if compiled is not None:
        module.use_compiled(compiled)
    clock = TrainClock(every=0 if sys.stderr.isatty() else 50, curve_every=curve_every,
                       align=LOG_EVERY if module.fast else 1)
    diverged = StopOnDivergence(run.run_id)
    census = StepCensus(c.train.train_steps)  # what a steady step asks of the host
    stop = SaveOnStop(work / "checkpoints", diverged, c.train.val_every_steps,
                      every=LOG_EVERY if module.fast else 1)
    if os.environ.get(machine.SHARE_ENV):  # a --workers worker on a CPU
        callbacks = [*callbacks, ShareCores()]
    unit, n = c.train.save_interval()
    every = ({"train_time_interval": timedelta(minutes=n)} if unit == "minutes" else
             {"every_n_train_steps": int(n)})
    ckpt = StepCheckpoint(
        val_every_steps=c.train.val_every_steps, steps_weights_only=disk.weights_only(c),
        dirpath=work / "checkpoints", filename="step{step}", auto_insert_metric_name=False,
        save_last=True, save_top_k=c.train.kept_checkpoints(), monitor="step", mode="max", **every)
    trainer = pl.Trainer(
        max_steps=c.train.train_steps, max_epochs=-1, precision=precision,  # type: ignore[arg-type]
        accelerator=layout.accelerator, devices=layout.devices, num_nodes=layout.nodes,
        strategy=_strategy(layout), logger=logger,
        callbacks=[diverged, ckpt, clock, stop, census, *callbacks],
        plugins=[AtomicCheckpointIO(), *devices.cluster_plugins()],
        num_sanity_val_steps=0, log_every_n_steps=LOG_EVERY, enable_model_summary=False,
        enable_progress_bar=sys.stderr.isatty(),
        **({"val_check_interval": c.train.val_every_steps, "check_val_every_n_epoch": None}
           if c.train.val_every_steps else {"limit_val_batches": 0}),
    )
    accumulate, _ = c.train.split_batch(trainer.world_size)
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
                      f"{c.train.train_steps}; {where}", stop.signal or signal.SIGTERM,
                      trainer.global_step, work) from None
    except SystemExit as e:
        if not stops.interrupted_by_ctrl_c(e):
            raise
        # Lightning's exit(1) after a KeyboardInterrupt (Ctrl-C twice, or once before training);
        # it leaves SIGINT ignored where the Ctrl-C came before its handlers were saved: the
        # process ends on this Stopped
        raise Stopped(f"{run.run_id}: interrupted at step {trainer.global_step} of "
                      f"{c.train.train_steps}; run the command again to resume it from its last "
                      "checkpoint", signal.SIGINT, trainer.global_step, work) from None
    if trainer.interrupted or trainer.global_step < c.train.train_steps:
        raise RuntimeError(f"{run.run_id}: training stopped at step {trainer.global_step} of "
                           f"{c.train.train_steps}; run the command again to resume")
    diverged.check(trainer)  # the last steps since the last read
    module.step_census = census.result
    if resume_from is None:  # the final weights, so a crash below resumes at evaluation
        trainer.save_checkpoint(work / "checkpoints" / checkpoints.LAST)
    if stop.signal is not None:  # it came after the last step's decision: stop before evaluating
        name = signal.Signals(stop.signal).name
        raise Stopped(f"{run.run_id}: stopped by {name} after its last step ({trainer.global_step}"
                      "), its final weights saved; run the command again to evaluate and record "
                      "it", stop.signal, None, work)
    return trainer, module, clock, resumed, accumulate


def _strategy(layout: Layout):
    if layout.world == 1:
        return "auto"

    return DDPStrategy(process_group_backend=layout.backend,
                       timeout=timedelta(seconds=devices.timeout_seconds()))
