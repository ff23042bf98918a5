"""A run's time on a GPU, phase by phase, from what was measured on a GPU: nothing guessed.

Two measurements of one GPU price every run (``Measured.load``):

* ``bench --gpu`` (``results/gpu.json``): the steady eager step of base and of big, ~25,000
  tokens in the micro-batches its ``accumulate`` says (two in the H200's of 2026-11-27);
* a run through the CLI on the same GPU (``results/paper-run.json``, ``benchmarks/paper_run.py``):
  its phases, its learning curve's timestamps and the command's wall clock.

**The step** takes the longer of two times: the host issuing its kernels, and the GPU running
them. Base's step is the host's (8 % MFU; big does 3.4x its FLOPs in 1.13x its time): per
micro-batch and per layer, it prices a model of another depth or accumulation. Big's step is the
GPU's: its TFLOP/s run any model's counted FLOPs (``estimates.step_work``). Both are scaled by the
CLI's quiet step (the intervals of its curve that hold no save or evaluation) over the bench's
step of the same model.

**Around the steps**, each from the CLI run: start-up and shutdown (the command's wall clock less
the runner's), data (pairs a second, from an empty cache), fit's start, the first step's extra, a
save (per parameter), an evaluation during training (per dev pair), averaging (per checkpoint
parameter), perplexity (per pair) and beam search (per sentence). Saves and evaluations are fitted
by least squares to the extra seconds of the curve's intervals that hold them. Another model's
evaluations scale with its step; its saves and averaging with its parameters; beam search with the
beam. ``compile: on`` or ``auto`` adds the bench's compile warm-up; the compiled step through the
CLI was not measured on a GPU, so the step stays the eager one (an upper bound).

**A GPU never measured** is priced from the measured one: the GPU's part of the step times the
larger of the two ratios, dense bf16 peak (measured / it; its fp32 peak where it has no bf16
tensor cores) and memory bandwidth (measured / it); the
host's part and the phases around the steps as measured (a like host); the micro-batch's memory
(16 bytes a parameter for weights, gradients and Adam, plus activations per token from the
measured peak, scaled by d_model x layers) checked against what it holds. The plan says "scaled
from <GPU>, not measured" with the factor.

Only a CLI run of one GPU, eager, in one sitting, not profiled prices (``unfit``). Not priced,
and said on the line: several GPUs' gradient all-reduce (one GPU was measured), a Hub download.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reproduce.config import Config, ModelConfig
from reproduce.errors import ConfigError
from reproduce.paper.flops import (
    BF16_DENSE_TFLOPS,
    MEMORY_GB,
    MEMORY_TBS,
    SUSTAINED_TFLOPS,
    gpu_tflops,
    lookup,
)
from reproduce.paper.model import build_on_meta, count_parameters
from reproduce.paths import REPO, results_dir
from reproduce.plan.estimates import Estimate, Target, step_work

BENCH, CLI_RUN = "gpu.json", "paper-run.json"
# Dev and test sentences where a run evaluates all of them (max_eval_pairs 0): newstest2013 has
# 3000, newstest2014 3003.
EVAL_SENTENCES = 3000
BYTES_PER_PARAMETER = 16  # fp32 weights and gradients, Adam's two moments
GIB = 2 ** 30


class NoMeasurement(ConfigError):
    """No GPU measurement to price from (an installed package, without the project's results/)."""


def layers(m: ModelConfig) -> int:
    return 2 * m.N  # encoder and decoder


@functools.cache
def parameters(m: ModelConfig) -> int:
    return count_parameters(build_on_meta(m))


@dataclass(frozen=True)
class Measured:
    """One GPU as measured: what its steps and every phase around them cost, per unit."""

    gpu: str
    host_s: float  # seconds per micro-batch and layer the host takes to issue a step (base)
    device_tflops: float  # counted TFLOP/s the GPU runs a step at (big)
    cli_factor: float  # the CLI's quiet step / bench --gpu's step, same model and tokens
    config: Config  # the run measured through the CLI
    beam: int  # its beam search's beam
    per: dict[str, float]  # the phases around the steps, per unit (``_around``)
    peak_gib: float  # base's peak memory at `micro` tokens a micro-batch
    micro: int
    compile_s: float  # bench --gpu's compiled base: its warm-up
    source: str

    @classmethod
    def load(cls, results: Path | None = None) -> Measured | None:
        """The GPU measured in ``results`` (default: the results folder, else the project's),
        from its ``gpu.json`` and ``paper-run.json``; None where either is missing or they were
        measured on different GPUs. A CLI run that cannot price plans (profiled, compiled,
        several devices, resumed, or missing what the prices read) is one line naming why."""
        folders = [results] if results else [results_dir(), *([REPO / "results"] if REPO else [])]
        for folder in folders:
            try:
                bench = json.loads((folder / BENCH).read_text())
                run = json.loads((folder / CLI_RUN).read_text())
            except (OSError, ValueError):
                continue
            if (run.get("hardware", {}).get("gpus") or [None])[0] != bench.get("gpu"):
                continue
            if why := unfit(run):
                raise ConfigError(f"{folder / CLI_RUN}: cannot price GPU runs from it: {why}")
            try:
                return _measured(bench, run, folder)
            except (KeyError, TypeError, ValueError, ZeroDivisionError,
                    statistics.StatisticsError) as e:
                raise ConfigError(f"{folder / BENCH} and {CLI_RUN}: cannot price GPU runs from "
                                  f"them: {type(e).__name__} {e}") from None
        return None

    def step(self, config: Config, devices: int, factor: float = 1.0) -> tuple[float, float, float]:
        """(seconds a step as the CLI runs it, the host's part, the GPU's part) of ``config`` on
        ``devices`` of these GPUs, the GPU's part x ``factor`` (a GPU never measured)."""
        accumulate, _ = config.train.split_batch(devices)
        host = self.host_s * accumulate * layers(config.model)
        device = step_work(config, devices)[0] / (self.device_tflops * 1e12) * factor
        return max(host, device) * self.cli_factor, host, device

    def activation_bytes(self, m: ModelConfig) -> float:
        """Bytes a micro-batch token takes beyond the weights: base's measured peak less its
        parameters' bytes, scaled by d_model x layers."""
        base = self.config.model
        fixed = parameters(base) * BYTES_PER_PARAMETER
        per_token = (self.peak_gib * GIB - fixed) / self.micro
        return per_token * m.d_model * layers(m) / (base.d_model * layers(base))


def unfit(run: dict[str, Any]) -> str:
    """Why a CLI run's record cannot price plans ("" where it can): its step must be the eager
    one of one device, timed without a profiler, in one sitting."""
    if run.get("profiled"):
        return "it ran under cProfile (its host-bound steps pay the profiler)"
    if run.get("compile"):
        return "it trained compiled (the prices start from the eager step bench --gpu measured)"
    if run.get("batch", {}).get("world_size", 1) != 1:
        return "it trained on several devices"
    if run.get("resumed"):
        return "it resumed from a checkpoint (its curve's seconds are two sittings')"
    return ""


def _measured(bench: dict[str, Any], run: dict[str, Any], folder: Path) -> Measured:
    parts = bench["parts"]
    base, big = parts["base"], parts.get("big", parts["base"])
    config = Config.from_dict(run["config"])
    model = config.model
    host = float(base["seconds_per_step"]) / (int(base["accumulate"]) * layers(model))
    device = float(big["flops_per_step"]) / float(big["seconds_per_step"]) / 1e12
    quiet, first, save, evaluation = fit_curve(run)
    # the CLI's quiet step over the bench's model of the same config (its micro-batches)
    accumulate = int(run.get("batch", {}).get("accumulate") or config.train.split_batch(1)[0])
    modelled = max(host * accumulate * layers(model), step_work(config)[0] / (device * 1e12))
    compiled = parts.get("base, compiled", {}).get("warmup_seconds", 0.0)
    notes = [] if "big" in parts else ["big not measured: every model's GPU part at base's rate"]
    if "command_seconds" not in run:
        notes.append("no command wall clock in the CLI run: start-up not priced")
    return Measured(
        gpu=str(bench["gpu"]), host_s=host, device_tflops=device, cli_factor=quiet / modelled,
        config=config, beam=int(run["config"]["decode"]["beam"]),
        per=_around(run, model, first, save, evaluation), peak_gib=float(base["peak_memory_gib"]),
        micro=int(base["micro_batch_tokens"]), compile_s=float(compiled),
        source=(f"{bench['gpu']}: bench --gpu ({BENCH}, {bench.get('measured_at', '?')[:10]}) "
                f"and a CLI run ({CLI_RUN}, {run.get('finished_at', '?')[:10]}) in {folder.name}/"
                + "".join(f" ({n})" for n in notes)))


def measured_phases(r: dict[str, Any]) -> dict[str, float]:
    """Seconds of each phase around training a CLI run's record holds: start-up and shutdown
    (the command's wall clock less the runner's, where the record has it), data, fit's start
    (fit less training), averaging, perplexity and beam search."""
    p, train = r["phases"], r["metrics"]["train_seconds"]
    phases = {"data": p["data"], "fit's start": p["fit"] - train,
              "averaging": p.get("average", 0.0), "perplexity": p["dev_ppl"],
              "beam search": p["decode"]}
    if "command_seconds" in r:
        phases["start-up"] = r["command_seconds"] - r["wall_seconds"]
    return phases


def _around(r: dict[str, Any], model: ModelConfig, first: float, save: float,
            evaluation: float) -> dict[str, float]:
    """The CLI run's phases around its steps, per unit: per pair, parameter or sentence."""
    d, took = r["data"], measured_phases(r)
    params = parameters(model)
    averaged = max(1, len(r.get("averaged_checkpoints") or []))
    return {
        "start-up": took.get("start-up", 0.0),
        "data per pair": took["data"] / d["train_pairs"],
        "fit's start": max(0.0, took["fit's start"]),
        "first step": first,
        "save per parameter": save / params,
        "evaluation per pair": evaluation / max(1, d["dev_pairs"]),
        "averaging per parameter": took["averaging"] / (averaged * params),
        "perplexity per pair": took["perplexity"] / (d["dev_pairs"]
                                                     + d.get("train_sample_pairs", 0)),
        "beam search per sentence": took["beam search"] / (d["dev_pairs"] + d["test_pairs"]),
    }


def fit_curve(r: dict[str, Any]) -> tuple[float, float, float, float]:
    """(the quiet step, the first step's extra, a save, an evaluation during training), seconds,
    from a record's learning curve ``[step, seconds, loss]``: the quiet step is the median over the
    intervals that hold no save or evaluation; saves and evaluations are fitted by least squares
    (at least 0; one cost for both where they always fall together) to the extra seconds of the
    others, the last interval running to the end of training. A point at step s is logged after
    s steps (at step 0, after the first of ``batch.accumulate`` micro-batches); a save or
    evaluation at a logged step falls after its point. Saves every N minutes fall where the
    clock crosses a multiple of N."""
    c = Config.from_dict(r["config"]).train
    steps, val = c.train_steps, c.val_every_steps
    unit, every = c.save_interval()
    accumulate = int(r.get("batch", {}).get("accumulate") or 1)
    points = [(int(s), float(sec)) for s, sec, _ in r["curve"]["train_loss"]]
    points.append((steps + 1, float(r["metrics"]["train_seconds"])))

    def count(a: int, b: int, n: float) -> int:  # multiples of n in [a, b), 0 excluded
        return sum(1 for s in range(max(a, 1), b) if n and s % n == 0)

    def saves(a: tuple[int, float], b: tuple[int, float]) -> int:
        if unit == "steps":
            return count(a[0], b[0], every)
        return int(b[1] // (every * 60)) - int(a[1] // (every * 60))

    spans = [(b[0] - a[0], b[1] - a[1], saves(a, b), count(a[0], b[0], val))
             for a, b in zip(points, points[1:], strict=False)]
    counted = [(min(n, steps - a), sec, k, e) for (n, sec, k, e), (a, _)
               in zip(spans, points, strict=False)]
    quiet_ones = [sec / n for n, sec, k, e in counted if not k + e and n]
    if not quiet_ones:
        raise ValueError("no interval of its curve without a save or an evaluation: its quiet "
                         "step cannot be told from them")
    quiet = statistics.median(quiet_ones)
    busy = [(k, e, sec - n * quiet) for n, sec, k, e in counted if k + e]
    save = evaluation = 0.0
    if busy:
        x = np.array([[k, e] for k, e, _ in busy], float)
        y = np.array([extra for *_, extra in busy])
        if np.linalg.matrix_rank(x) < 2:  # saves and evaluations never apart: one cost, saves'
            total = x.sum(axis=1)
            save = max(0.0, float(total @ y / (total @ total)))
        else:
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            save, evaluation = (max(0.0, float(v)) for v in coef)
    first = points[0][1] - max(points[0][0], 1 / accumulate) * quiet
    return quiet, max(0.0, first), save, evaluation


@dataclass(frozen=True)
class Gpu:
    """A GPU by name as plans price it: the measured GPU, the factor its GPU part of a step takes
    and where that comes from."""

    measured: Measured
    factor: float
    memory_gb: float | None
    source: str
    is_measured: bool  # this GPU is the one measured; else scaled from it


def gpu(name: str, results: Path | None = None) -> Gpu:
    """The price of GPU ``name``: measured, or scaled from the one that was."""
    m = Measured.load(results)
    if m is None:
        raise NoMeasurement(f"--on {name}: no GPU measured to price it from (results/{BENCH} and "
                          f"results/{CLI_RUN}, made by benchmarks/gpu_window.py on a GPU)")
    memory = lookup(name, MEMORY_GB)
    if lookup(m.gpu, {name: 1.0}) is not None:  # every word of `name` in the measured GPU's name
        return Gpu(m, 1.0, memory or lookup(m.gpu, MEMORY_GB), f"MEASURED on {m.source}", True)
    # the measured rate is a bf16-mixed step's: against the other GPU's dense bf16 peak, or its
    # fp32 peak where it has no bf16 tensor cores (a P100 runs the step in fp32)
    its = lookup(name, BF16_DENSE_TFLOPS)
    peaks = [lookup(m.gpu, BF16_DENSE_TFLOPS), its or lookup(name, SUSTAINED_TFLOPS)]
    which = "dense bf16 peak" if its else "bf16 peak over its fp32 peak"
    bandwidths = [lookup(g, MEMORY_TBS) for g in (m.gpu, name)]
    ratios = {}
    for what, (measured, other) in ((which, peaks), ("memory bandwidth", bandwidths)):
        if measured is not None and other is not None:
            ratios[what] = measured / other
    if not ratios:
        raise ConfigError(f"--on {name}: neither its peak nor its bandwidth is known")
    why, factor = max(ratios.items(), key=lambda kv: kv[1])
    return Gpu(m, factor, memory, (
        f"SCALED from {m.gpu}, not measured: its GPU part of a step x{factor:.2f} (the larger of "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) + f": {why}), the host's part and "
        f"the phases around the steps as on {m.source}"), False)


def names_gpu(on: str | None) -> bool:
    """Whether ``--on`` names GPUs (``8xH100``, ``H100``), not this machine (``cpu``, absent)."""
    return bool(on) and on.lower() not in ("cpu", "here")  # type: ignore[union-attr]


def parse_on(value: str | None, results: Path | None = None) -> Target:
    """``--on``: ``8xH100``, ``H100`` or ``cpu``/absent (this machine)."""
    if value is None or not names_gpu(value):
        return Target("cpu")
    match = re.fullmatch(r"(?:(\d+)\s*[xX]\s*)?(.+)", value.strip())
    assert match is not None  # `.+` matches any non-empty value
    devices, name = int(match.group(1) or 1), match.group(2).strip()
    if lookup(name, BF16_DENSE_TFLOPS) is None and gpu_tflops(name) is None:
        raise ConfigError(f"--on {value!r}: unknown device {name!r}; known: "
                          + ", ".join(sorted(set(BF16_DENSE_TFLOPS) | {"V100", "P100", "T4"}))
                          + " (or cpu for this machine)")
    return Target("gpu", devices, name, gpu=gpu(name, results))


def price(config: Config, target: Target, steps: int, pairs: int | None = None,
          run_id: str = "") -> Estimate:
    """``config``'s ``steps`` on ``target``'s GPUs, each phase apart. ``pairs``: its corpus's
    training pairs to read and encode (default: counted by ``records.footprint``; 0: built)."""
    g = target.gpu
    assert isinstance(g, Gpu), "a GPU target has its price"
    m, c = g.measured, config
    step, host, device = m.step(c, target.devices, g.factor)
    # this model's evaluations (on one GPU) against the measured one's
    slower = m.step(c, 1, g.factor)[0] / m.step(m.config, 1)[0]
    params = parameters(c.model)
    quiet = steps * step + m.per["first step"]
    # during training (with none, fit validates nothing: the end's pass is "perplexity")
    evals = (steps // c.train.val_every_steps) if c.train.val_every_steps else 0
    dev = c.data.max_eval_pairs or EVAL_SENTENCES
    unit, every = c.train.save_interval()
    saves = int(steps // every if unit == "steps" else quiet / 60 / every)
    save_s = m.per["save per parameter"] * params
    eval_s = m.per["evaluation per pair"] * dev * slower
    train = quiet + saves * save_s + evals * eval_s
    notes = []
    if pairs is None:
        from reproduce.records.footprint import footprint

        f = footprint(c)
        pairs = 0 if f is None or f.built else f.pairs
        if f is not None and f.download:
            notes.append(f"its download of {f.download / 1e9:.1f} GB not priced")
    if target.devices > 1:
        notes.append(f"one GPU measured: {target.devices} GPUs' gradient all-reduce not priced")
    around = {
        "start-up": m.per["start-up"],
        "data": pairs * m.per["data per pair"],
        # auto compiles to time it (once a machine: runs/timings.json) and again to train
        "compile": m.compile_s * {"on": 1, "auto": 2}.get(c.train.compile, 0),
        "fit's start": m.per["fit's start"],
        "averaging": (m.per["averaging per parameter"] * params * c.train.average_last
                      if c.train.average_last > 1 else 0.0),
        "perplexity": m.per["perplexity per pair"] * 2 * dev * slower,
        "beam search": m.per["beam search per sentence"] * 2 * dev * slower
        * c.decode.beam / m.beam,
    }
    detail = (f"a quiet step {step:.3g} s (host {host * m.cli_factor:.3g} s, taken by layers and "
              f"micro-batches from base's; GPU {device * m.cli_factor:.3g} s), {saves} save(s) of "
              f"{save_s:.2g} s, {evals} dev evaluation(s) of {eval_s:.2g} s"
              + "".join(f"; {n}" for n in notes))
    return Estimate(run_id, steps, train / steps, target.devices,
                    step_work(c, target.devices)[0] * target.devices * steps,
                    f"{g.source}; {detail}{_memory(g, c, target.devices)}", around)


def _memory(g: Gpu, c: Config, devices: int) -> str:
    """A warning where the micro-batch would not fit on the GPU (``Measured.activation_bytes``)."""
    if g.memory_gb is None:
        return ""
    _, micro = c.train.split_batch(devices)
    fixed = parameters(c.model) * BYTES_PER_PARAMETER
    per_token = g.measured.activation_bytes(c.model)
    need = (fixed + micro * per_token) / 1e9
    if need <= g.memory_gb:
        return ""
    fits = int((g.memory_gb * 1e9 - fixed) / per_token) // 100 * 100
    if c.train.device_batch_tokens == "auto" and fits > 0:  # train.micro_batch splits the step
        return (f"; device_batch_tokens auto: one pass of {micro} tokens needs ~{need:.0f} GB of "
                f"its {g.memory_gb:g} GB (scaled from {g.measured.gpu}'s peak): about "
                f"{-(-micro // fits)} passes a step, each slower than this price's one")
    return (f"; DOES NOT FIT: a micro-batch of {micro} tokens needs ~{need:.0f} GB of its "
            f"{g.memory_gb:g} GB (scaled from {g.measured.gpu}'s peak): set "
            f"train.device_batch_tokens={max(fits, 0)} or less")


def check(record: dict[str, Any], results: Path | None = None) -> dict[str, tuple[float, float]]:
    """{phase: (planned, measured) seconds} of a run through the CLI on a GPU (``record``), its
    plan made for its own config, steps and corpus size on its GPU: how far the plan is from what
    the run took. The command's wall clock where the record has it (``benchmarks/paper_run.py``)."""
    config = Config.from_dict(record["config"])
    world = int(record.get("batch", {}).get("world_size") or 1)
    target = parse_on(f"{world}x{record['hardware']['gpus'][0]}", results)
    m = record["metrics"]
    e = price(config, target, m["train_steps"], pairs=record["data"]["train_pairs"])
    measured = {"training": m["train_seconds"], **measured_phases(record)}
    planned = {"training": e.hours * 3600, **e.around}
    if "command_seconds" in record:
        measured["the command"] = record["command_seconds"]
        planned["the command"] = e.command_hours * 3600
    return {k: (planned[k], v) for k, v in measured.items()}
