"""Run one planned run, idempotently, and write its record.

A finished run has a record (``results/<table>/<run_id>.json``, written atomically) and is never
redone. An interrupted run resumes from its last checkpoint under ``runs/<table>/<run_id>/``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytorch_lightning as pl
import torch

from reproduce.config import Config
from reproduce.data.module import TranslationData
from reproduce.errors import ConfigError, DiskError, Diverged, OutOfMemory
from reproduce.paper import slots
from reproduce.paper.flops import analytic_flops, gpu_tflops, paper_cost
from reproduce.paper.model import count_parameters
from reproduce.paper.tokenizer import word_coverage
from reproduce.paths import runs_dir
from reproduce.records import disk, diverged, footprint
from reproduce.records.averaging import average_checkpoints
from reproduce.records.checkpoints import last_checkpoints, readable, steps_left
from reproduce.records.claims import claim, rank, worker_id
from reproduce.records.schema import (
    SCHEMA_VERSION,
    Batch,
    Commit,
    Cost,
    DataSummary,
    Hardware,
    Metrics,
    Record,
    WandbRun,
)
from reproduce.records.sharing import Donor, reuse, take_training
from reproduce.records.store import finished, load_record, record_path, retire_stale, write_record
from reproduce.records.sweep import PlannedRun
from reproduce.train import devices, micro_batch, pick
from reproduce.train.compiling import choose_compile, cuda_graphs_refusal
from reproduce.train.devices import ONE_DEVICE, Layout
from reproduce.train.evaluate import dev_metric, dev_score, task_scores
from reproduce.train.fit import build_data, fit, local_data, validate
from reproduce.train.precision import choose_precision
from reproduce.train.step_time import compile_backend, compile_stats
from reproduce.train.wandb_run import end_failed, finish_wandb, wandb_logger
from reproduce.util.files import DISK_ERRNOS
from reproduce.util.machine import commit, gpu_share, hardware, measured_tflops, share_cores

log = logging.getLogger("reproduce")


Precision = tuple[str, dict[str, Any]]  # the precision a run trains in, and how it was chosen


@dataclass(frozen=True)
class Outcome:
    """What ``execute`` did with a run: its record (trained now or earlier), or why it has none.
    ``failed``: a failure the command's exit status reports (a diverged run), not a skip (another
    worker has it, it waits for a twin, this rank's part is done)."""

    record: Record | None = None
    why: str = ""
    failed: bool = False


def execute(run: PlannedRun, split: str, command: str, extra: dict[str, Any] | None = None,
            layout: Layout = ONE_DEVICE) -> Outcome:
    """Train, evaluate and record one run on ``layout``'s devices; its record (also if it had
    already finished), or why it is not run now: another live worker is on it (``claims``: many
    workers may share one sweep), or on a twin whose training it will evaluate once that has
    finished (``sharing``). More than one device: the run's own process group trains it
    (``devices``).

    ``extra`` entries are added to the record (e.g. ``tuning``: how the settings were chosen)."""
    work = runs_dir() / run.table / run.run_id
    if devices.external_ranks() and rank() != 0:  # one of a cluster's tasks: as rank 0 decides
        precision = devices.Decision(work).wait()
        if precision is None:
            return Outcome(why="rank 0 trains nothing now")
        run = micro_batch.resolve(run, layout, precision[0], work)  # rank 0's answer
        run_here(run, split, command, work, extra, layout, precision)
        return Outcome(why="this rank's part is done; rank 0 records it")
    decision = devices.Decision(work) if devices.external_ranks() else None
    try:
        return _execute(run, split, command, work, extra, layout, decision)
    finally:
        if decision is not None:
            decision.close()


def _execute(run: PlannedRun, split: str, command: str, work: Path, extra: dict[str, Any] | None,
             layout: Layout, decision: devices.Decision | None) -> Outcome:
    path = record_path(run)
    record = finished(run)
    if record is not None:
        log.info("%s: finished earlier (%s), skipped", run.run_id, path)
        return Outcome(record)
    with claim(work) as mine:
        if not mine:
            return Outcome(why="another worker is training it, skipped")
        record = finished(run)  # finished by another worker since we looked
        if record is not None:
            log.info("%s: finished by another worker (%s), skipped", run.run_id, path)
            return Outcome(record)
        retire_stale(run, work)
        if why := diverged.refusal(work, run.config):
            return Outcome(why=why, failed=True)
        reused = reuse(run) if steps_left(run) else None  # none once its own is done
        if isinstance(reused, Donor):  # its weights are trained: evaluate them here, on one device
            log.info("%s: the same training as %s (its checkpoints in %s); evaluating those",
                     run.run_id, reused.record["run_id"], reused.checkpoints)
            if decision is not None:  # a cluster's other tasks: nothing for them, end now (not
                decision.publish(None)  # after an evaluation longer than their wait)
            r = reused.record
            return Outcome(run_here(run, split, command, work, extra, replace(layout, devices=1),
                                    (r["precision"], r.get("precision_choice", {})),
                                    donor=reused))
        if reused is not None:
            return Outcome(why=f"the same training as {reused.run_id}, which a worker is training "
                           "now: left to evaluate that once it has finished (run this command "
                           "again then)")
        disk.check(run.run_id, run.config, work / "checkpoints")  # before hours of training
        footprint.room(run.run_id, run.config)  # and before its data is read
        precision = choose_precision(run, layout)
        run = micro_batch.resolve(run, layout, precision[0], work)  # before the ranks
        if why := cuda_graphs_refusal(run.config, run.config.train.compile != "off", layout):
            raise ConfigError(f"{run.run_id}: {why}")  # before its data, W&B and compiling
        if layout.devices > 1 or decision is not None:  # timed here, once, before the ranks
            choose_compile(run, precision[0], layout, say=False)  # start (they read the cache)
        if layout.devices > 1 and decision is None:
            devices.train_on_ranks(run, split, command, work, extra, layout, precision)
            record = load_record(path)
            return Outcome(record, "" if record else "its ranks ended without writing a record")
        if decision is not None:
            decision.publish(precision)
        try:
            record = run_here(run, split, command, work, extra, layout, precision)
        except OSError as e:  # full or read-only: one line; the claim is released on the way out
            if e.errno in DISK_ERRNOS:
                raise DiskError(run.run_id, e) from None
            raise
        except Diverged as e:  # nothing evaluated, nothing recorded; the marker stops a rerun
            marker = diverged.write_marker(work, e, run.config.to_dict())
            log.warning("%s; not evaluated, not recorded (%s)", e, marker)
            return Outcome(why=f"diverged at step {e.step}: not evaluated, not recorded; the same "
                           f"command will not train it again with this config ({marker})",
                           failed=True)
        return Outcome(record, "" if record else "this rank's part is done; rank 0 records it")


class Phases(dict[str, float]):
    """Seconds of each phase of this process's part of a run (the record's ``phases``)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.time()

    def lap(self, phase: str) -> None:
        """``phase`` took the seconds since the previous phase ended."""
        self[phase] = time.time() - self.started - sum(self.values())

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in self.items()}


def run_here(run: PlannedRun, split: str, command: str, work: Path,
             extra: dict[str, Any] | None, layout: Layout, precision: Precision,
             donor: Donor | None = None) -> Record | None:
    """This process's part of ``run``: alone, all of it; one rank of several (``devices``), its
    shard of training and of the dev perplexity, and on rank 0 the decoding and the record.
    ``donor``: the finished run whose training this is (``sharing``): its weights are evaluated."""
    phases = Phases()
    c = run.config
    zero = rank() == 0
    compiled = ((bool(donor.record.get("compile")), donor.record.get("compile_choice", {}))
                if donor is not None else choose_compile(run, precision[0], layout, say=zero))
    if c.train.compile == "auto":
        phases.lap("compile_choice")  # timing eager against compiled, unless cached
    pl.seed_everything(c.train.seed, workers=True, verbose=False)
    tokenizer, data = build_data(c)
    data.setup("fit")  # the corpus mapped (encoded first, if no run has): this phase, not fit's
    phases.lap("data")
    logger = wandb_logger(run, work, precision[0], getattr(donor, "record", None)) if zero else None
    try:
        try:
            graphs = compile_stats()  # the timing of `auto` compiled some too
            trainer, module, clock, resumed, accumulate = fit(
                run, work, data, logger or False, precision[0], layout=layout,
                resume_from=donor.last if donor is not None else None, compiled=compiled[0])
        except torch.OutOfMemoryError as e:  # one line: what to lower, and that it resumes
            raise OutOfMemory(run.run_id, _device_name(layout), data.micro_batch_tokens,
                              str(e)) from None
        work_done = module.total_work()  # a collective: every rank
        graphs = {k: round(v - graphs[k], 1) for k, v in compile_stats().items()}  # this fit
        phases.lap("fit")
        share_cores()  # decoding too uses the cores of workers that have ended
        scored, known = _scored_weights(
            module, donor.checkpoints if donor is not None else work / "checkpoints", c, partial(
                dev_score, module.model.to(trainer.strategy.root_device), tokenizer, data, c,
                precision[0]))
        phases.lap("pick" if "pick" in scored else "average")
        dev, sample = _perplexities(trainer, module, data)
        phases.lap("dev_ppl")
        if not zero:
            return None  # rank 0 decodes every sentence and writes the record
        # where it trained: Lightning hands it back on the CPU (on a GPU, 118 s for 600 there)
        scores, headline = task_scores(module.model.to(trainer.strategy.root_device), tokenizer,
                                       data, c, outputs=(record_path(run).parent, run.run_id),
                                       precision=precision[0], known=known)
        phases.lap("decode")
        metrics = _metrics(dev, sample, headline, count_parameters(module.model),
                           trainer.global_step, clock)
        wandb_run = finish_wandb(logger, metrics)
    except BaseException:
        end_failed(logger)  # as failed, not left open for the next one
        raise
    choice = _compile_entries(compiled, module, None if donor else graphs)
    record: Record = {
        "schema": SCHEMA_VERSION, "run_id": run.run_id, "table": run.table, "row": run.row,
        "variant": run.variant, "scale": run.scale, "seed": c.train.seed, "split": split,
        "config": c.to_dict(), "scale_overrode": run.overridden,
        "precision": precision[0], "precision_choice": precision[1],
        "compile": choice[0], "compile_choice": choice[1],
        "metrics": metrics, **_task_entries(scores), "paper": run.paper,
        "data": _data_summary(c, data, tokenizer),
        "batch": _batch_summary(layout, trainer, accumulate, data, work_done,
                                run.micro_batch_choice, module.step_census),
        **scored, "curve": clock.curve,
        "cost": _cost(c, work_done, clock.seconds, trainer.world_size),
        "resumed": resumed, "resumed_from": module.resumed_from, "commit": _commit(),
        "hardware": cast(Hardware, hardware()), "worker": worker_id(),
        "wall_seconds": round(time.time() - phases.started, 1), "command": command,
        "phases": phases.rounded(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wandb": cast(WandbRun, wandb_run),
    }
    if donor is not None:  # the training is the donor's: what it took is in its record
        take_training(record, donor)
        record["trained_by"], record["evaluated_on"] = donor.describe(), cast(Hardware, hardware())
    cast(dict[str, Any], record).update(_own_entries(run))
    cast(dict[str, Any], record).update(extra or {})  # e.g. tuning: keys of Record
    if trainer.is_global_zero:  # one record per run, however many processes trained it
        write_record(record_path(run), record)
        log.info("%s: recorded %s", run.run_id, record_path(run))
    return record


def _own_entries(run: PlannedRun) -> dict[str, Any]:
    """What the user put over the spec and scale: ``set``, the command line's ``--set`` values,
    and ``modules``, parts of their own (each file's SHA-256 and source)."""
    own: dict[str, Any] = {"set": run.sets} if run.sets else {}
    if run.config.model.modules:
        own["modules"] = slots.sources(run.config.model.modules)
    return own


def _perplexities(trainer: pl.Trainer, module, data) -> tuple[Mapping[str, float], Mapping[str, float]]:
    """The final weights' dev perplexity (every rank its shard, gathered) and their NLL on a sample
    of training pairs: fit against dev."""
    trainer.limit_val_batches = 1.0
    dev = validate(trainer, module, datamodule=data)
    module.eval_name = "train_sample"
    sample = validate(trainer, module, dataloaders=data.train_sample_dataloader())
    module.eval_name = "dev"
    return dev, sample


def _metrics(dev: Mapping[str, float], sample: Mapping[str, float], headline: dict[str, Any],
             params: int, steps: int, clock) -> Metrics:
    """The record's ``metrics``: perplexities, the task's headline scores (BLEU or F1:
    ``evaluate.task_scores``), size and training time."""
    return cast(Metrics, {
        "dev_ppl": round(float(dev["dev/ppl"]), 3),
        "dev_nll": round(float(dev["dev/nll"]), 4),
        "train_sample_nll": round(float(sample["train_sample/nll"]), 4),
        **headline,
        "params": params, "train_steps": steps,
        "train_seconds": round(clock.seconds, 1),
        "train_cpu_seconds": round(clock.cpu_seconds, 1),
    })


def _task_entries(scores: dict[str, Any]) -> Record:
    """The task's own entries of a record (``evaluate.task_scores``): ``bleu``, or ``evalb`` and
    ``treebank``."""
    return cast(Record, scores)


def _commit() -> Commit:
    return cast(Commit, commit())


def _data_summary(c: Config, data, tokenizer) -> DataSummary:
    """The record's ``data``: the corpus as trained on (pairs kept and dropped, hashes, the
    vocabulary, n-gram reference perplexities, a user's own files, the encoded cache)."""
    summary: DataSummary = {
        "corpus": c.data.corpus, "train_pairs": data.num_train_pairs,
        "dropped_train_pairs": data.dropped, "dev_pairs": len(data.dev_pairs),
        "train_sample_pairs": data.train_sample_pairs, "test_pairs": len(data.test_pairs),
        "vocab_size": tokenizer.vocab_size, "sha256": data.sha256,
        "vocab_sha256": tokenizer.sha256, "reference_ppl": data.reference_perplexities(),
        "vocabulary": word_coverage(tokenizer, [s for s, _ in data.dev_pairs], c.data.vocabulary)}
    if files := local_data(c.data.corpus, data.source.data_dir):
        summary["data_dir"], summary["files"] = files["data_dir"], files["files"]
    summary["fingerprint"] = data.source.fingerprint
    if data.cache_folder:
        summary["encoded"] = data.cache_folder.name
    summary["loader_workers"] = data.loader_workers
    return summary


def _compile_entries(compiled: tuple[bool, dict[str, Any]], module,
                     graphs: dict[str, float] | None) -> tuple[bool, dict[str, Any]]:
    """The record's ``compile`` (whether the run trained compiled) and ``compile_choice`` (how
    that was chosen; a failure in training, CUDA graphs that failed and were left, or the graphs
    and recompiles of a run compiled here: ``graphs`` None where the training is a donor's,
    whose choice is kept as it is)."""
    chosen, how = compiled
    if module.graphs_failed:
        how = {**how, "cuda_graphs_failed_in_training": module.graphs_failed}
    if module.compile_failed:
        return False, {**how, "failed_in_training": module.compile_failed}
    if not chosen or graphs is None:
        return chosen, how
    backend = compile_backend()  # another than inductor: a rehearsal, said so
    return chosen, {**how, "in_training": graphs if backend == "inductor"
                    else {**graphs, "backend": backend}}


def _batch_summary(layout: Layout, trainer: pl.Trainer, accumulate: int, data: TranslationData,
                   work: dict[str, int], choice: dict[str, Any], step: dict[str, Any]) -> Batch:
    """The record's ``batch``: the devices, how a step's tokens were split over them (and how
    ``auto`` chose the micro-batch), the target tokens a step computed (real, and padded as the
    tensors held them), an epoch's distinct batch shapes and padding share, both sides
    (``shape_census``, this rank's), and what one steady step asked of the host
    (``step_census``: ops, kernels, host waits)."""
    world_size, steps = trainer.world_size, trainer.global_step
    real, padded = work["real_tgt_tokens"], work["tgt_tokens"]
    micro, census = data.micro_batch_tokens, data.batch_shape_census()
    return {"accelerator": layout.accelerator, "strategy": layout.strategy,
            "devices": layout.devices, "nodes": layout.nodes, "world_size": world_size,
            "accumulate": accumulate, "device_batch_tokens": micro,
            "effective_tokens_per_step": micro * world_size * accumulate,
            "measured_tgt_tokens_per_step": round(real / max(steps, 1)),
            "padded_tgt_tokens_per_step": round(padded / max(steps, 1)),
            "tgt_padding_share": round(1 - real / padded, 4) if padded else 0.0,
            "shapes_per_epoch": int(census["shapes"]), "padding_share": census["padding_share"],
            **({"micro_batch_choice": choice} if choice else {}),
            **({"step_census": step} if step else {})}


def _device_name(layout: Layout) -> str:
    if layout.accelerator == "gpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "the CPU"


def _scored_weights(module, directory: Path, c: Config, score
                    ) -> tuple[Record, dict[str, dict[str, Any]]]:
    """The weights the run is scored with, loaded into ``module``: chosen on dev by ``score``
    (``train.pick_on_dev``; on every rank alike, as the dev perplexity after is a collective),
    else the final ones or their average. Returns the record's ``averaged_checkpoints`` (the
    checkpoints they came from) and ``pick``, and the dev entry already made on them
    (``task_scores``'s ``known``)."""
    if not c.train.pick_on_dev:
        return cast(Record, {"averaged_checkpoints": _final_weights(
            module, directory, c.train.average_last)}), {}
    picked, dev = pick.choose(module, directory, c.train.pick_on_dev, dev_metric(c), score)
    weights = next(p["checkpoints"] for p in picked["candidates"]
                   if p["weights"] == picked["chosen"])
    return cast(Record, {"averaged_checkpoints": weights, "pick": picked}), {"dev": dev}


def _final_weights(module, directory: Path, k: int) -> list[str]:
    """Table 2: average the last k checkpoints into the model; Table 3 (k = 1): final weights."""
    if k <= 1:
        return []

    paths = readable(last_checkpoints(directory, k), directory, f"averages its last {k} checkpoints")
    module.load_state_dict(average_checkpoints(paths))
    return [p.name for p in paths]


def _cost(c: Config, work: dict[str, int], seconds: float, devices: int) -> Cost:
    """Training cost two ways: the paper's (time x devices x sustained TFLOPS) and counted FLOPs."""
    share = 1
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        tflops, source = gpu_tflops(name), "GPU table (reproduce/paper/flops.py)"
        share = gpu_share()
        if share > 1:  # several runs side by side on one GPU: each had a share of it
            source += f"; the GPU shared by {share} workers, 1/{share} of it per run"
    else:
        name, tflops, source = hardware()["cpu"], measured_tflops(), "measured fp32 matmul peak"
    return {
        "paper_method_flops": None if tflops is None
        else paper_cost(seconds / 3600, devices, tflops) / share,
        "device": name, "devices": devices, "gpu_shared_by": share,
        "tflops_per_device": tflops, "tflops_source": source,
        "analytic_flops": analytic_flops(c.model, work["src_tokens"], work["tgt_tokens"],
                                         work["src_sq"], work["tgt_sq"], work["cross"]),
        "train_hours": round(seconds / 3600, 4),
    }
