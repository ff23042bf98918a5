"""Run one planned run, idempotently, and write its record.

A finished run has a record (``results/<table>/<run_id>.json``, written atomically) and is never
redone. An interrupted run resumes from its last checkpoint under ``runs/<table>/<run_id>/``.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from . import checkpoints, devices, files, machine, records, workers
from . import precision as precision_choice
from .claims import rank
from .config import Config
from .devices import ONE_DEVICE, Layout
from .errors import ConfigError
from .sweep import PlannedRun

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger("reproduce")


def results_dir() -> Path:
    return Path(os.environ.get("REPRODUCE_RESULTS", REPO / "results"))


def runs_dir() -> Path:
    return Path(os.environ.get("REPRODUCE_RUNS", REPO / "runs"))


def record_path(run: PlannedRun, results: Path | None = None) -> Path:
    return (results or results_dir()) / run.table / f"{run.run_id}.json"


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a reader sees the old file or the whole new one, never a part."""
    files.write_atomic(path, (json.dumps(data, indent=1, sort_keys=False) + "\n").encode())


# --- where a run happened --------------------------------------------------------------------


def commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()
    return {"sha": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def hardware() -> dict[str, Any]:
    info = {"cpu": machine.cpu_name(), "cpu_flags": machine.cpu_flags(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "gpus": [],
            # Other work on the machine slows a run: the load when the record was written.
            "load_average": [round(x, 2) for x in os.getloadavg()]}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def resolve_precision(precision: str, config: Config | None = None) -> str:
    """``auto``: bf16 mixed precision where it trains faster, else fp32. With ``config``, the
    answer ``precision.choose`` cached for its model on this machine, if any; a training run
    itself calls ``choose``, which times the step when nothing is cached. Without one (or nothing
    cached), a bf16 matmul no slower than fp32 counts as bf16: a guess, for estimates only."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    if config is not None:
        from .optim import accumulation

        micro = accumulation(config.train.batch_tokens, config.train.device_batch_tokens, 1)[1]
        cached = precision_choice.cached(config, micro, runs_dir() / "precision.json")
        if cached:
            return cached
    return "bf16-mixed" if precision_choice.bf16_matmul_not_slower() else "32-true"


def choose_precision(run: PlannedRun, layout: Layout = ONE_DEVICE) -> tuple[str, dict[str, Any]]:
    """The precision ``run`` trains with on ``layout`` and how it was chosen (``precision.choose``:
    for ``auto`` on a CPU, a timed fp32 and bf16-mixed step of its model at the micro-batch and
    threads of one rank, cached)."""
    from .optim import accumulation

    c = run.config
    micro = accumulation(c.train.batch_tokens, c.train.device_batch_tokens, layout.devices)[1]
    threads = torch.get_num_threads()
    if layout.accelerator == "cpu" and layout.devices > 1:
        torch.set_num_threads(max(1, threads // layout.devices))  # as each rank will have
    try:
        precision, chosen = precision_choice.choose(c, micro, runs_dir() / "precision.json")
    finally:
        torch.set_num_threads(threads)
    if c.train.precision == "auto":
        seconds = chosen.get("seconds_per_step")
        timed = (", ".join(f"{p} {s:.3f} s/step" for p, s in seconds.items()) if seconds else "")
        log.info("%s: precision auto -> %s (%s%s%s)", run.run_id, precision, chosen["how"],
                 f": {timed}" if timed else "", ", cached" if chosen.get("cached") else "")
    return precision, chosen


def default_scale() -> str:
    """The scale that fits this machine: the paper's on a GPU, `cpu` otherwise."""
    return "paper" if torch.cuda.is_available() else "cpu"


# --- one run -----------------------------------------------------------------------------------


def load_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or None when there is none or it is damaged (then set aside, in
    one line: the run is redone)."""
    try:
        return records.read_record(path)
    except records.DamagedRecord as e:
        try:
            moved = records.set_aside(path)
        except FileNotFoundError:
            return None
        log.warning("%s; moved to %s; the run will be redone", e, moved)
        return None


def plan_state(run: PlannedRun) -> str:
    """What the sweep command will do with ``run``, without changing anything: ``done`` (a
    record of its config), ``redo: ...`` (a record it will not trust, and why) or ``train``."""
    path = record_path(run)
    try:
        record = records.read_record(path)
    except records.DamagedRecord as e:
        return f"redo: {e}"
    if record is None:
        return "train"
    if same_config(record.get("config"), run.config):
        return "done"
    return f"redo: {path} was made with another config (it will move to superseded/)"


def same_config(stored: dict[str, Any] | None, config: Config, training_only: bool = False) -> bool:
    """Whether a config stored in a record or checkpoint is ``config``: the stored dict (through
    JSON, as a record holds it) is rebuilt with ``Config.from_dict`` and compared as a Config.

    A field added to the config since the record was written counts at its default, which is
    what that run did (new fields default to the old behaviour); a field since removed, or any
    stored value that no longer validates, makes the stored config a different one.
    ``training_only``: what a checkpoint of ``config`` may differ in and still be resumed as one:
    decoding settings (weights do not depend on them) and ``train_steps`` (the learning-rate
    schedule does not depend on it either, so a run given more steps continues exactly where it
    stopped; the caller checks that the checkpoint is not past the new step count).
    """
    if stored is None:
        return False
    try:
        rebuilt = Config.from_dict(json.loads(json.dumps(stored)))
    except (ConfigError, TypeError, AttributeError):
        return False
    if training_only:
        rebuilt = replace(rebuilt, decode=config.decode,
                          train=replace(rebuilt.train, train_steps=config.train.train_steps))
    return rebuilt == config


def finished(run: PlannedRun) -> dict[str, Any] | None:
    """The record of ``run`` if it finished with exactly ``run``'s resolved config, else None.

    A record made under other settings (a scale or spec edited since) is not this run: it is
    retired by ``execute`` when the run is redone, never shown as this run's result."""
    record = load_record(record_path(run))
    return record if record is not None and same_config(record.get("config"), run.config) else None


def retire_stale(run: PlannedRun, work: Path) -> None:
    """Move aside what an earlier config of ``run`` left: its record (to
    ``results/<table>/superseded/``) and its checkpoints (to ``<work>/superseded-<time>/``), so a
    changed config neither reuses nor resumes them, and nothing is deleted."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = record_path(run)
    record = load_record(path)
    if record is not None and not same_config(record.get("config"), run.config):
        moved = path.parent / "superseded" / f"{run.run_id}.{stamp}.json"
        moved.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, moved)
        log.warning("%s: its record was made with another config; moved to %s", run.run_id, moved)
    last = checkpoints.newest_readable(work / "checkpoints")
    if last is not None:
        saved = torch.load(last, map_location="cpu", weights_only=True)
        config = saved.get("hyper_parameters", {}).get("config")
        # Only what shaped the weights counts: a run whose decoding changed (beam, alpha, ...)
        # keeps its checkpoints and is evaluated again without retraining; one given more steps
        # trains on from its last checkpoint.
        behind = int(saved.get("global_step", 0)) <= run.config.train.train_steps
        if config is not None and not (behind and same_config(config, run.config,
                                                              training_only=True)):
            moved = work / f"superseded-{stamp}"
            moved.mkdir(parents=True, exist_ok=True)
            os.replace(work / "checkpoints", moved / "checkpoints")
            log.warning("%s: its checkpoints were made with another config; moved to %s",
                        run.run_id, moved)


def execute(run: PlannedRun, split: str, command: str, extra: dict[str, Any] | None = None,
            layout: Layout = ONE_DEVICE) -> dict[str, Any] | None:
    """Train, evaluate and record one run on ``layout``'s devices; return its record if it
    already finished, or None if another live worker is on it (``claims``: many workers may share
    one sweep). More than one device: the run's own process group trains it (``devices``).

    ``extra`` entries are added to the record (e.g. ``tuning``: how the settings were chosen)."""
    from .claims import claim

    path = record_path(run)
    record = finished(run)
    if record is not None:
        log.info("%s: finished earlier (%s), skipped", run.run_id, path)
        return record
    work = runs_dir() / run.table / run.run_id
    with claim(work) as mine:
        if not mine:
            log.info("%s: another worker is training it, skipped", run.run_id)
            return None
        record = finished(run)  # finished by another worker since we looked
        if record is not None:
            log.info("%s: finished by another worker (%s), skipped", run.run_id, path)
            return record
        retire_stale(run, work)
        precision = choose_precision(run, layout)
        if layout.devices > 1 and not devices.external_ranks():
            devices.train_on_ranks(run, split, command, work, extra, layout, precision)
            return load_record(path)
        return run_here(run, split, command, work, extra, layout, precision)


def run_here(run: PlannedRun, split: str, command: str, work: Path,
             extra: dict[str, Any] | None, layout: Layout,
             precision: tuple[str, dict[str, Any]]) -> dict[str, Any] | None:
    """This process's part of ``run``: alone, all of it; one rank of several (``devices``), its
    shard of training and of the dev perplexity, and on rank 0 the decoding and the record."""
    from .claims import worker_id

    started = time.time()
    c = run.config
    precision, chosen = precision
    pl.seed_everything(c.train.seed, workers=True, verbose=False)
    tokenizer, data = build_data(c)
    zero = rank() == 0
    logger = wandb_logger(run, work, precision) if zero else False
    trainer, module, clock, resumed, accumulate = fit(run, work, data, logger, precision,
                                                         layout=layout)
    work_done = module.total_work()  # a collective: every rank
    workers.share_cores()  # decoding too uses the cores of workers that have ended
    weights = _final_weights(module, work / "checkpoints", c.train.average_last)
    trainer.limit_val_batches = 1.0
    dev = trainer.validate(module, datamodule=data, verbose=False)[0]  # shards, gathered
    if not zero:
        return None  # rank 0 decodes every sentence and writes the record
    scores, headline = task_scores(module.model, tokenizer, data, c,
                                   outputs=(record_path(run).parent, run.run_id))
    from .model import count_parameters

    metrics = {
        "dev_ppl": round(float(dev["dev/ppl"]), 3),
        "dev_nll": round(float(dev["dev/nll"]), 4),
        **headline,
        "params": count_parameters(module.model),
        "train_steps": trainer.global_step,
        "train_seconds": round(clock.seconds, 1),
        "train_cpu_seconds": round(clock.cpu_seconds, 1),
    }
    micro = -(-c.train.batch_tokens // (trainer.world_size * accumulate))
    record = {
        "run_id": run.run_id, "table": run.table, "row": run.row, "variant": run.variant,
        "scale": run.scale, "seed": c.train.seed, "split": split,
        "config": c.to_dict(), "scale_overrode": run.overridden,
        "precision": precision, "precision_choice": chosen,
        "metrics": metrics, **scores, "paper": run.paper,
        "data": {"corpus": c.data.corpus, "train_pairs": data.num_train_pairs,
                 "dropped_train_pairs": data.dropped, "dev_pairs": len(data.dev_pairs),
                 "test_pairs": len(data.test_pairs), "vocab_size": tokenizer.vocab_size,
                 "sha256": data.sha256, "vocab_sha256": tokenizer.sha256,
                 "reference_ppl": data.reference_perplexities(), **_local_data(c)},
        "batch": {"accelerator": layout.accelerator, "strategy": layout.strategy,
                  "devices": layout.devices, "world_size": trainer.world_size,
                  "accumulate": accumulate,
                  "device_batch_tokens": micro,
                  "effective_tokens_per_step": micro * trainer.world_size * accumulate,
                  "measured_tgt_tokens_per_step": round(work_done["real_tgt_tokens"]
                                                        / max(trainer.global_step, 1))},
        "averaged_checkpoints": weights, "curve": clock.curve,
        "cost": _cost(c, work_done, clock.seconds, trainer.world_size),
        "resumed": resumed, "resumed_from": module.resumed_from, "commit": commit(),
        "hardware": hardware(), "worker": worker_id(),
        "wall_seconds": round(time.time() - started, 1), "command": command,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wandb": _finish_wandb(logger, metrics),
    }
    record.update(extra or {})
    path = record_path(run)
    if trainer.is_global_zero:  # one record per run, however many processes trained it
        write_atomic(path, record)
        log.info("%s: recorded %s", run.run_id, path)
    return record


def build_data(c: Config):
    from .data import TranslationData, is_treebank, load_pairs, tokenizer_name, tree_symbols
    from .tokenizer import cache_dir, train_tokenizer

    d = c.data
    train_pairs = load_pairs(d.corpus, "train", d.data_dir or None, d.extra_trees or None,
                             d.linearization)
    # Treebank corpora: tree tokens stay whole pieces; a small sample may not fill vocab_size.
    trees = is_treebank(d.corpus)
    symbols = tree_symbols(train_pairs, d.linearization) if trees else ()
    tokenizer = train_tokenizer(tokenizer_name(d.corpus, d.data_dir, d.extra_trees, d.linearization),
                                c.model.vocab_size, (s for pair in train_pairs for s in pair),
                                cache_dir(), symbols=symbols, hard_vocab_limit=not trees)
    data = TranslationData(d.corpus, tokenizer, c.train.batch_tokens,
                           c.train.max_tokens_per_sentence, d.max_train_pairs or None,
                           d.max_eval_pairs or None, d.data_dir or None, c.train.seed,
                           extra_trees=d.extra_trees or None, linearization=d.linearization)
    return tokenizer, data


def _local_data(c: Config) -> dict[str, Any]:
    """Where a run's own parallel files are and what they hold (path, size, SHA-256 per split),
    so its table names them instead of the corpus the spec called them."""
    from .data import is_treebank, local_files

    if not c.data.data_dir or is_treebank(c.data.corpus):
        return {}
    return {"data_dir": c.data.data_dir, "files": local_files(c.data.corpus, c.data.data_dir)}


def fit(run: PlannedRun, work: Path, data, logger, precision: str, callbacks=(),
           layout: Layout = ONE_DEVICE, curve_every: int | None = None):
    """Fit with Lightning on ``layout`` (resuming from the last checkpoint if there is one)."""
    from .lit import TranslationModule
    from .optim import accumulation

    c = run.config
    module = TranslationModule(c.to_dict())
    clock = TrainClock(every=0 if sys.stderr.isatty() else 50, curve_every=curve_every)
    if os.environ.get(workers.SHARE_ENV):  # a --workers worker on a CPU
        callbacks = [*callbacks, ShareCores()]
    every = ({"train_time_interval": timedelta(minutes=c.train.ckpt_every_minutes)}
             if c.train.ckpt_every_minutes else
             {"every_n_train_steps": c.train.ckpt_every_steps or max(1, c.train.train_steps // 10)})
    ckpt = StepCheckpoint(
        val_every_steps=c.train.val_every_steps,
        dirpath=work / "checkpoints", filename="step{step}", auto_insert_metric_name=False,
        save_last=True, save_top_k=c.train.average_last, monitor="step", mode="max", **every)
    trainer = pl.Trainer(
        max_steps=c.train.train_steps, max_epochs=-1, precision=precision,
        accelerator=layout.accelerator, devices=layout.devices, strategy=_strategy(layout),
        logger=logger, callbacks=[ckpt, clock, *callbacks], plugins=[checkpoints.AtomicCheckpointIO()],
        num_sanity_val_steps=0, log_every_n_steps=10, enable_model_summary=False,
        enable_progress_bar=sys.stderr.isatty(),
        **({"val_check_interval": c.train.val_every_steps, "check_val_every_n_epoch": None}
           if c.train.val_every_steps else {"limit_val_batches": 0}),
    )
    accumulate, micro = accumulation(c.train.batch_tokens, c.train.device_batch_tokens,
                                     trainer.world_size)
    trainer.accumulate_grad_batches = accumulate
    if c.train.val_every_steps:  # Lightning counts micro-batches; the config, optimizer steps
        trainer.val_check_interval = c.train.val_every_steps * accumulate
    data.batch_tokens = micro
    last = checkpoints.newest_readable(work / "checkpoints")
    resumed = last is not None
    if resumed:
        log.info("%s: resuming from %s", run.run_id, last)
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    try:
        trainer.fit(module, datamodule=data, ckpt_path=last if resumed else None)
    except SIGTERMException:  # Lightning's: a SystemExit with status 0, as if the run had ended
        raise SystemExit(f"{run.run_id}: stopped by SIGTERM at step {trainer.global_step} of "
                         f"{c.train.train_steps}; run the command again to resume it from its "
                         "last checkpoint") from None
    if trainer.interrupted or trainer.global_step < c.train.train_steps:
        raise RuntimeError(f"{run.run_id}: training stopped at step {trainer.global_step} of "
                           f"{c.train.train_steps}; run the command again to resume")
    # The final weights, so a crash below resumes at evaluation.
    trainer.save_checkpoint(work / "checkpoints" / checkpoints.LAST)
    return trainer, module, clock, resumed, accumulate


def _strategy(layout: Layout):
    if layout.devices == 1:
        return "auto"
    from pytorch_lightning.strategies import DDPStrategy

    return DDPStrategy(process_group_backend=layout.backend,
                       timeout=timedelta(seconds=devices.timeout_seconds()))


def _final_weights(module, directory: Path, k: int) -> list[str]:
    """Table 2: average the last k checkpoints into the model; Table 3 (k = 1): final weights."""
    if k <= 1:
        return []
    from .averaging import average_checkpoints, last_checkpoints

    paths = last_checkpoints(directory, k)
    module.load_state_dict(average_checkpoints(paths))
    return [p.name for p in paths]


def decode_batch_tokens(c: Config) -> int:
    """Source tokens per decoding batch. Parsing (treebank corpora): beam x (input +
    max_len_offset) cached positions per sentence, so fewer sentences per batch."""
    from .data import is_treebank

    if is_treebank(c.data.corpus):
        return max(64, c.train.batch_tokens // c.decode.beam)
    return c.train.batch_tokens


def _bleu(model, tokenizer, data, pairs, c: Config, lang: str) -> dict[str, Any]:
    """Both BLEU conventions, each labelled, and a few example outputs."""
    from .bleu import tokenized_bleu
    from .evaluate import sacre_bleu, translate

    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    hyps = translate(model, tokenizer, data.source_batches(sources, decode_batch_tokens(c)),
                     len(sources), c.decode)
    return {"sacrebleu": sacre_bleu(hyps, refs), "tokenized": tokenized_bleu(hyps, refs, lang),
            "examples": [{"source": s, "reference": t, "output": h}
                         for s, t, h in list(zip(sources, refs, hyps, strict=True))[:3]],
            "hypotheses": hyps, "references": refs}


def task_scores(model, tokenizer, data, c: Config, splits: tuple[str, ...] = ("dev", "test"),
                outputs: tuple[Path, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's evaluation: (record entries, headline metrics). Translation: both BLEUs of each
    split, and with ``outputs`` (the records folder, the run id) every hypothesis kept there.
    Parsing (treebank corpora, Table 4): EVALB precision, recall and F1 of each split."""
    from .data import is_treebank, treebank_trees

    pairs = {"dev": data.dev_pairs, "test": data.test_pairs}
    if not is_treebank(c.data.corpus):
        lang = c.data.corpus.rsplit("-", 1)[-1]
        bleu = {name: _bleu(model, tokenizer, data, pairs[name], c, lang) for name in splits}
        if outputs is not None:  # every output kept beside the record (records.write_outputs)
            for name, b in bleu.items():
                b["outputs"] = records.write_outputs(*outputs, name, b.pop("hypotheses"),
                                                     b.pop("references"))
        else:
            for b in bleu.values():
                del b["hypotheses"], b["references"]
        return {"bleu": bleu}, {
            **{f"{n}_bleu": bleu[n]["sacrebleu"]["score"] for n in splits},
            **{f"{n}_bleu_tokenized": bleu[n]["tokenized"]["score"] for n in splits}}
    from .evaluate import parse_scores
    from .parsing import treebank_description

    batch_tokens = decode_batch_tokens(c)

    def score(name: str, decode) -> dict[str, Any]:
        gold = treebank_trees(name, c.data.data_dir or None)[:len(pairs[name])]
        return parse_scores(model, tokenizer,
                            data.source_batches([s for s, _ in pairs[name]], batch_tokens),
                            pairs[name], gold, decode, c.data.linearization)

    evalb = {name: score(name, c.decode) for name in splits}
    headline = {f"{n}_{k}": evalb[n][k] for n in splits for k in ("f1", "precision", "recall")}
    if c.decode.constrained:  # the paper's protocol too: free decoding, repaired
        for name in splits:
            scores = score(name, replace(c.decode, constrained=False))
            evalb[name]["free"] = {k: scores[k] for k in scores if k != "examples"}
            headline[f"{name}_f1_free"] = scores["f1"]
    return {"evalb": evalb, "treebank": treebank_description(c.data.data_dir or None,
                                                             c.data.extra_trees or None)}, headline


def _cost(c: Config, work: dict[str, int], seconds: float, devices: int) -> dict[str, Any]:
    """Training cost two ways: the paper's (time x devices x sustained TFLOPS) and counted FLOPs."""
    from .flops import analytic_flops, gpu_tflops, paper_cost

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        tflops, source = gpu_tflops(name), "GPU table (reproduce/flops.py)"
    else:
        name, tflops, source = hardware()["cpu"], measured_tflops(), "measured fp32 matmul peak"
    return {
        "paper_method_flops": None if tflops is None else paper_cost(seconds / 3600, devices, tflops),
        "device": name, "devices": devices, "tflops_per_device": tflops, "tflops_source": source,
        "analytic_flops": analytic_flops(c.model, work["src_tokens"], work["tgt_tokens"],
                                         work["src_sq"], work["tgt_sq"], work["cross"]),
        "train_hours": round(seconds / 3600, 4),
    }


def measured_tflops(n: int = 1024, repeats: int = 8) -> float:
    """This CPU's sustained fp32 matmul rate, in TFLOPS (the paper's method needs one)."""
    a = torch.randn(n, n)
    a @ a
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return round(2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12, 4)


def planned_summary(run: PlannedRun, overrides: dict[str, Any]) -> str:
    m, t = run.config.model, run.config.train
    return (f"{run.run_id}: overrides {overrides or '{}'} -> N={m.N} d_model={m.d_model} "
            f"d_ff={m.d_ff} h={m.h} d_k={m.d_k} d_v={m.d_v} P_drop={m.p_drop} eps_ls={t.eps_ls} "
            f"positions={m.positions} steps={t.train_steps} batch_tokens={t.batch_tokens} "
            f"corpus={run.config.data.corpus}")


# --- Lightning helpers ---------------------------------------------------------------------------


class StepCheckpoint(pl.callbacks.ModelCheckpoint):
    """Lightning's ModelCheckpoint, saving only right after an optimizer step, and after the dev
    evaluation that follows that step when there is one.

    A time-based save in the middle of an accumulated step would lose its micro-batches'
    gradients and move the accumulation boundary; a save taken just before a dev evaluation is
    resumed after it, losing that point of the learning curve."""

    def __init__(self, val_every_steps: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.val_every_steps = val_every_steps
        self._step_before: int | None = None
        self._after_validation: tuple | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_before = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._step_before:
            return  # inside an accumulated step
        if self.val_every_steps and trainer.global_step % self.val_every_steps == 0:
            self._after_validation = (outputs, batch, batch_idx)
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._after_validation is not None and trainer.state.fn == "fit":
            args, self._after_validation = self._after_validation, None
            super().on_train_batch_end(trainer, pl_module, *args)


class ShareCores(pl.Callback):
    """In a ``--workers`` worker on a CPU: every ``every`` steps, take the cores of workers that
    have ended (``workers.share_cores``)."""

    def __init__(self, every: int = 10) -> None:
        self.every = every

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0 and (threads := workers.share_cores()):
            log.info("step %d: %d thread(s) now (a worker has ended)", trainer.global_step, threads)


class TrainClock(pl.Callback):
    """Training wall time, summed over resumed sessions (kept inside the checkpoints); prints a
    progress line every `every` steps where there is no progress bar (logs, nohup, CI)."""

    def __init__(self, every: int = 0, curve_every: int | None = None) -> None:
        self.curve_every = curve_every  # default: about 20 points or more over the run
        self.before = 0.0
        self.start: float | None = None
        self.cpu_before, self.cpu_start = 0.0, None
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
    """W&B, offline unless an API key is set (sync later with `wandb sync`)."""
    from pytorch_lightning.loggers import WandbLogger

    work.mkdir(parents=True, exist_ok=True)
    online = bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") != "offline"
    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbLogger(
        project=os.environ.get("WANDB_PROJECT", "reproduce"), name=run.run_id,
        id=run.run_id.replace(".", "_"), group=f"{run.table}/{run.row}", job_type=run.variant,
        tags=[run.table, f"row:{run.row}", f"scale:{run.scale}", f"seed:{run.seed}"],
        save_dir=str(work), offline=not online, resume="allow",
        config={**_flat(run.config), "table": run.table, "row": run.row,
                "variant": run.variant, "scale": run.scale, "precision": precision},
    )


def _flat(config: Config) -> dict[str, Any]:
    return {f"{section}.{k}": v for section, values in asdict(config).items()
            for k, v in values.items()}


def _finish_wandb(logger, metrics: dict[str, Any]) -> dict[str, Any]:
    experiment = logger.experiment
    for key, value in metrics.items():
        experiment.summary[f"final/{key}"] = value
    where = Path(experiment.dir).resolve()
    # Relative to the project when inside it: the record is read on other machines.
    info = {"id": experiment.id, "mode": "offline" if experiment.offline else "online",
            "dir": str(where.relative_to(REPO)) if where.is_relative_to(REPO) else str(where),
            "url": None if experiment.offline else experiment.url}
    experiment.finish()
    return info


def with_data(run: PlannedRun, data_dir: str | None = None,
              extra_trees: str | None = None) -> PlannedRun:
    """``run`` on the user's data (``--treebank``, ``--silver``). Local data gets its own run id
    (tag ``ptb``): a run on NLTK's sample is never taken for one on the full treebank."""
    overrides = {k: v for k, v in (("data_dir", data_dir), ("extra_trees", extra_trees)) if v}
    if not overrides:
        return run
    tag = "-".join(t for t in (run.tag, "ptb" if data_dir else "") if t)
    return replace(run, config=run.config.overrides(**overrides), tag=tag)
