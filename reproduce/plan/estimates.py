"""What a run should take before it runs: a cost model, not a stopwatch.

A training step's cost is counted, not timed: its matmul FLOPs (``flops.analytic_flops`` at the
run's tokens per step and a typical sentence length) and its attention blocks (sentence x head x
layer: on a CPU torch's fused attention pays per block, whatever d_k). A device turns them into
seconds:

* this CPU: a short matmul probe (cached per CPU in ``runs/cost_probe.json``), scaled to the
  thread count the run will really use (``THREAD_EXPONENT``), times two coefficients fitted to
  the finished records of the same CPU and scale by least squares (seconds x probe rate = a x
  FLOPs + b x blocks). One fit per scale: a step's time away from its counted work (Python, the
  optimizer, the evaluations and saves inside ``train_seconds``) is most of a ``smoke`` step and
  little of a ``cpu`` one: fitted to a folder's five smoke records alone, one fit priced a ``cpu``
  step of row A at 5.6 s, where the ``cpu`` records of the same CPU took 0.7 to 1.9 s. With
  fewer than 2 records of the scale, the coefficients are a stated default. Records keep what
  their steps took when they ran: under older, slower code, or beside a test suite on a shared
  core, and
  "AMD EPYC" names more than one machine. So the fit gives the shape (what a config costs against
  another) and, where ``precision.choose`` has timed fp32 steps of the planned runs' models on
  this machine (at any thread count, each against the probe at its own), those timings give the
  level (``level_from_timings``);
* a GPU by name (``--on 8xH100``): ``plan.gpu_prices``, phase by phase from the GPU measured
  (``bench --gpu`` and a run through the CLI), scaled where it is another GPU.

Every line says where its figures come from, and which of them are guesses.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reproduce.config import Config
from reproduce.errors import ConfigError
from reproduce.paper.flops import analytic_flops, gpu_tflops
from reproduce.records.schema import Record
from reproduce.train.precision import step_ratio, timed
from reproduce.train.timings import TIMINGS
from reproduce.util import machine
from reproduce.util.files import write_atomic
from reproduce.util.machine import cpu_name, matmul_gflops

SENTENCE_TOKENS = 30  # typical padded sentence length, pieces (Bible verses and WMT sentences)
# Without records to fit: the share of the probe's matmul rate a training step reaches. A guess,
# said so on every line that uses it.
DEFAULT_CPU_UTILIZATION = 0.3


def step_work(config: Config, devices: int = 1) -> tuple[float, float]:
    """(training FLOPs, attention blocks) of one optimizer step, per device."""
    m, t = config.model, config.train
    tokens = t.batch_tokens / devices  # source and target tokens per device, padded
    sentences = tokens / SENTENCE_TOKENS
    pairs = sentences * SENTENCE_TOKENS ** 2
    flops = analytic_flops(m, int(tokens), int(tokens), int(pairs), int(pairs), int(pairs))
    blocks = 3 * 3 * sentences * m.h * m.N  # self, cross and decoder self; fwd + 2x bwd
    return flops, blocks


# Threads do not add up on small products: two 1-thread workers trained 1.3x the steps per second
# of one 2-thread process on the 2-core EPYC (docs/sweeps.md), so 2 threads are 2 / 1.3 = 1.54x one,
# 2 ** 0.62. A probe at 2 threads is also unreliable while anything else runs (a 2-thread matmul
# stalls on a busy core): the probe runs at 1 thread and other thread counts scale by this.
THREAD_EXPONENT = 0.62


def rate_at(threads: int, cache: Path | None = None) -> float:
    """GFLOP/s a run with ``threads`` threads gets here: the 1-thread probe, scaled."""
    return probe(1, cache) * max(1, threads) ** THREAD_EXPONENT


@functools.cache
def probe(threads: int, cache: Path | None = None) -> float:
    """This CPU's fp32 matmul rate at ``threads`` threads, GFLOP/s (512 x 512, best of ~0.3 s,
    cached per CPU and thread count in ``cache`` and, for this process, in memory)."""
    key = f"{cpu_name()}|{threads}"
    known = json.loads(cache.read_text()) if cache and cache.exists() else {}
    if key in known:
        return known[key]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rate = matmul_gflops(torch.float32, 512, budget=0.3)
    finally:
        torch.set_num_threads(before)
    if cache:
        write_atomic(cache, (json.dumps({**known, key: rate}, indent=1) + "\n").encode())
    return rate


@dataclass(frozen=True)
class CpuModel:
    """seconds per step = (a x FLOPs + b x blocks) / probe rate (GFLOP/s at the run's threads)."""

    a: float
    b: float
    fitted_on: int  # records; 0: the default
    level: float = 1.0  # the fit scaled by this to match steps timed here (level_from_timings)
    timed_on: int = 0  # distinct models timed; 0: not scaled

    def seconds(self, flops: float, blocks: float, rate: float) -> float:
        return self.level * (self.a * flops + self.b * blocks) / (rate * 1e9)

    scale: str | None = None  # the records' scale (None: records of every scale)

    @property
    def source(self) -> str:
        at = f" at `{self.scale}`" if self.scale else ""
        fit = (f"fitted to {self.fitted_on} record(s) of this CPU{at}" if self.fitted_on else
               f"GUESS: no record of this CPU{at} to fit; {DEFAULT_CPU_UTILIZATION:.0%} of the "
               "probe")
        return fit + (f", x{self.level:.2f} to match {self.timed_on} fp32 step time(s) measured "
                      "here" if self.timed_on else "")

    def against_guess(self, flops: float, blocks: float) -> float:
        """A step's price by this model over the default's (``DEFAULT_CPU_UTILIZATION`` of the
        probe, whatever the rate): how far the records moved the price from the probe's."""
        return self.seconds(flops, blocks, 1.0) * DEFAULT_CPU_UTILIZATION / flops * 1e9


def _record_work(record: Record) -> tuple[float, float, int] | None:
    """(FLOPs, blocks) per step as ``step_work`` counts them for the record's config, and its
    thread count; None for records this model cannot use (GPUs, several devices, no config)."""
    h = record.get("hardware", {})
    if h.get("gpus") or record.get("batch", {}).get("world_size", 1) != 1:
        return None
    try:
        config = Config.from_dict(record["config"])
    except (ConfigError, KeyError, TypeError):
        return None
    flops, blocks = step_work(config)
    return flops, blocks, int(h.get("torch_threads") or 1)


def fit_cpu(records: list[Record], rate_at, scale: str | None = None) -> CpuModel:
    """Least squares over this CPU's fp32 records (of ``scale`` where given): seconds/step x
    rate(threads) = a F + b A, a, b >= 0. ``rate_at(threads)`` is the probe. Falls back to the
    default with fewer than 2 records. A bf16-mixed run is estimated as fp32 times its timed
    ratio (``estimate``)."""
    rows, target, here = [], [], cpu_name()
    for r in records:
        if r.get("hardware", {}).get("cpu") != here or not r["metrics"].get("train_steps") \
                or r.get("trained_by"):  # another run's training, already counted
            continue
        if scale is not None and r.get("scale") != scale:
            continue
        if r.get("precision", "32-true") != "32-true":  # fp32 steps; bf16 is a ratio of them
            continue
        work = _record_work(r)
        if work is None:
            continue
        flops, blocks, threads = work
        rows.append([flops, blocks])
        target.append(r["metrics"]["train_seconds"] / r["metrics"]["train_steps"]
                      * rate_at(threads) * 1e9)
    if len(rows) < 2:
        return CpuModel(1 / DEFAULT_CPU_UTILIZATION, 0.0, 0, scale=scale)
    x, y = np.array(rows), np.array(target)
    norm = x.max(axis=0)  # columns of very different magnitude
    coef, *_ = np.linalg.lstsq(x / norm, y, rcond=None)
    coef = coef / norm
    if (coef < 0).any():  # one term alone, the better of the two
        fits = []
        for j in range(2):
            c = float(x[:, j] @ y / (x[:, j] @ x[:, j]))
            fits.append((float(((x[:, j] * c - y) ** 2).sum()), j, c))
        _, j, c = min(fits)
        coef = np.zeros(2)
        coef[j] = c
    return CpuModel(float(coef[0]), float(coef[1]), len(rows), scale=scale)


def level_from_timings(model: CpuModel, runs, rate_at, threads: Sequence[int],
                       cache: Path | None = None) -> CpuModel:
    """``model`` scaled to the fp32 steps ``precision.choose`` timed on this machine (``cache``,
    default ``runs/timings.json``) for the runs' reference models, at any of ``threads``: the
    median of timed / predicted (at ``rate_at`` that thread count) over the distinct timings.
    Unchanged where none was timed (a fixed precision, or nothing trained here yet)."""
    levels: dict[str, float] = {}
    unscaled = replace(model, level=1.0)
    for reference in {run.precision_from or run.config for run in runs}:  # a table's runs share one
        for k in threads:
            entry = timed(reference, k, cache) or {}
            seconds = (entry.get("seconds_per_step") or {}).get("32-true")
            if seconds:
                levels[json.dumps(entry, sort_keys=True)] = seconds / unscaled.seconds(
                    *step_work(reference), rate_at(k))
    if not levels:
        return model
    return replace(model, level=statistics.median(levels.values()), timed_on=len(levels))


@dataclass(frozen=True)
class Target:
    """Where runs are planned to train: this CPU (``kind="cpu"``) or ``devices`` GPUs by name,
    with their price (``gpu_prices.Gpu``)."""

    kind: str
    devices: int = 1
    name: str = "this CPU"
    gpu: Any = None

    @property
    def label(self) -> str:
        return self.name if self.kind == "cpu" else f"{self.devices}x {self.name}"


@dataclass(frozen=True)
class Estimate:
    run_id: str
    steps: int
    seconds_per_step: float
    devices: int
    flops: float  # counted, whole run
    source: str
    around: dict[str, float] = field(default_factory=dict)  # seconds of each phase around training

    @property
    def command_hours(self) -> float:
        """Training and every phase around it: the command's wall clock."""
        return self.hours + sum(self.around.values()) / 3600

    @property
    def hours(self) -> float:
        return self.seconds_per_step * self.steps / 3600

    @property
    def device_hours(self) -> float:
        return self.hours * self.devices


def cpu_step_ratio(run, threads: int, cache: Path | None = None,
                   settled: str | None = None) -> float:
    """A step of ``run`` in the precision ``auto`` took here over an fp32 step, from the timing
    cached (``cache``, default ``runs/timings.json``) for its table's base at ``threads`` (1.0
    when fp32 or not timed yet). ``settled``: the precision the records of its table and scale
    trained in (``records.precision_history.settled``), which ``auto`` follows: fp32 there is an fp32 step."""
    if run.config.train.precision != "auto" or settled == "32-true":
        return 1.0
    return step_ratio(timed(run.precision_from or run.config, threads, cache))


def estimate(run, target: Target, model: CpuModel | None = None, rate: float | None = None,
             steps: int | None = None, ratio: float = 1.0) -> Estimate:
    """The run's training time on this CPU (``target``: one process, or several for DDP) for
    ``steps`` left (default all of them), from ``model`` and ``rate`` (the probe at the thread
    count the run will use); ``ratio`` scales the fitted fp32 step to the run's precision
    (``cpu_step_ratio``). GPUs: ``gpu_prices.price``."""
    c = run.config
    steps = c.train.train_steps if steps is None else steps
    if target.kind != "cpu":
        raise ValueError(f"{target.label}: a GPU is priced by plan.gpu_prices.price")
    if model is None or rate is None:
        raise ValueError("a run on this CPU is priced from the fitted model and the probe")
    flops, blocks = step_work(c, target.devices)
    seconds = model.seconds(flops, blocks, rate) * ratio
    source = f"probe {rate:.0f} GFLOP/s, {model.source}" + (
        f"; bf16-mixed at {ratio:.2f}x an fp32 step, as timed" if ratio != 1.0 else "")
    return Estimate(run.run_id, steps, seconds, target.devices, flops * target.devices * steps,
                    source)


def paper_method_flops(e: Estimate, target: Target) -> float | None:
    """The paper's cost: hours x devices x sustained fp32 TFLOPS (None on a CPU)."""
    if target.kind == "cpu":
        return None
    tflops = gpu_tflops(target.name)
    return None if tflops is None else e.hours * 3600 * e.devices * tflops * 1e12


def check_against_records(runs, records: dict[str, Record], model_for,
                          rate_at) -> list[tuple[str, float, float]]:
    """(run id, estimated hours, recorded hours) for planned runs that have a record from this CPU
    on one device, the estimate taken at the record's own thread count with ``model_for(run)``."""
    out, here = [], cpu_name()
    for run in runs:
        r = records.get(run.run_id)
        if not r or r.get("hardware", {}).get("cpu") != here or _record_work(r) is None \
                or r.get("trained_by"):
            continue
        threads = int(r["hardware"].get("torch_threads") or 1)
        e = estimate(run, Target("cpu"), model_for(run), rate_at(threads),
                     steps=r["metrics"]["train_steps"], ratio=step_ratio(r.get("precision_choice")))
        out.append((run.run_id, e.hours, r["metrics"]["train_seconds"] / 3600))
    return out


def error_line(checked: list[tuple[str, float, float]]) -> str:
    """The median and worst relative error of the estimates against what the runs took."""
    if not checked:
        return "no recorded run of this plan on this CPU to check the estimates against"
    errors = [(abs(est - took) / took, run_id, est, took) for run_id, est, took in checked]
    median = statistics.median(e[0] for e in errors)
    worst = max(errors)
    return (f"checked on {len(errors)} recorded run(s): median error {median:.0%}, worst "
            f"{worst[1]} {worst[0]:.0%} ({worst[2]:.2f} h estimated, {worst[3]:.2f} h taken)")


# A fit whose price of a step is this far from the probe's default either way is said so: its
# records ran something else than the counted work (a smoke step is mostly evaluation and
# saves), under older code, or beside other jobs.
FAR_FROM_PROBE = 3.0


@dataclass(frozen=True)
class CpuPlan:
    """This CPU's cost model for each scale planned (each fitted to every table's records of
    this CPU at that scale, scaled to the steps timed here) and the folder whose probe and timing
    caches it reads (``runs``): what a dry run and ``status`` both estimate with."""

    models: dict[str, CpuModel]
    runs: Path

    def rate(self, threads: int) -> float:
        return rate_at(threads, self.runs / "cost_probe.json")

    def model_for(self, run) -> CpuModel:
        return self.models[run.scale]

    def estimate(self, run, threads: int, steps: int, settled: str | None = None,
                 target: Target | None = None) -> Estimate:
        """``run``'s ``steps`` at ``threads`` threads (on ``target``: several CPU processes for
        a DDP run), in the precision its table's records settled on (``settled``) or ``auto``
        would take here."""
        return estimate(run, target or Target("cpu"), self.model_for(run), self.rate(threads),
                        steps, cpu_step_ratio(run, threads, self.runs / TIMINGS, settled))

    def warnings(self, runs) -> list[str]:
        """A line for each scale whose fit prices the first of ``runs`` at that scale more than
        ``FAR_FROM_PROBE`` times above or below the probe's default."""
        lines, seen = [], set()
        for run in runs:
            model = self.models[run.scale]
            if run.scale in seen or not model.fitted_on:
                continue
            seen.add(run.scale)
            far = model.against_guess(*step_work(run.config))
            if not 1 / FAR_FROM_PROBE <= far <= FAR_FROM_PROBE:
                lines.append(
                    f"WARNING: at `{run.scale}` the {model.fitted_on} record(s) fitted price "
                    f"{run.run_id}'s step at {far:.2g}x what the probe gives it "
                    f"({DEFAULT_CPU_UTILIZATION:.0%} of its rate): their steps spent their time "
                    "on more than the counted work (a smoke step is mostly evaluation and saves),"
                    " ran older code, or shared the CPU; the estimates below follow the records")
        return lines


def plan_here(records: list[Record], planned: list, runs: Path) -> CpuPlan:
    """The cost models of this CPU for ``planned`` runs, one per scale, from ``records`` (every
    table's)."""
    def rate(threads: int) -> float:
        return rate_at(threads, runs / "cost_probe.json")

    models = {}
    for scale in {run.scale for run in planned}:
        at = [run for run in planned if run.scale == scale]
        models[scale] = level_from_timings(fit_cpu(records, rate, scale), at, rate,
                                           range(1, machine.cores() + 1), runs / TIMINGS)
    return CpuPlan(models, runs)
