"""``python -m reproduce bench --gpu``: what one GPU does with the paper's models, in one prepared,
time-boxed command for a machine that starts bare (no data, no network: synthetic sentences).

Parts, in this order (what matters most first), each under a hard cap of its own (``PARTS``;
``--cap KEY=SECONDS``, 0 skips it), each written to ``results/gpu.md`` and ``results/gpu.json`` as
it ends (a command stopped at its time limit keeps what it measured), each skipped once ``budget``
seconds have gone (said so in the report); a part that fails or is cut is one line there, and the
others go on. Each times optimizer steps on one synthetic batch of Table 2's EN-DE config
(~25,000 tokens a step) in bf16-mixed where supported: seconds per step, target tokens/s, counted
TFLOP/s (``flops.analytic_flops``), MFU against the GPU's dense bf16 peak
(``flops.BF16_DENSE_TFLOPS``), peak memory, the first steps' seconds (a compile's):

1. ``compiled``: base on the fast path (``step_time.fast_step_loss``: the loss a run compiles,
   ``train.compile``), the step in one pass;
2. ``big-compiled``: big, as 1;
3. ``two-passes``: 1 in two accumulated passes of half the tokens (the scale's micro-batch before
   ``device_batch_tokens: auto``);
4. ``peer``: the same model from ``torch.nn.Transformer`` with ``F.cross_entropy(label_smoothing)``
   (``speed.peers``), eager, on the same batch;
5. ``peer-compiled``: 4 under ``torch.compile`` as a user would write it;
6. ``base`` and 7. ``big``: eager, for reference (what the first windows measured);
8. ``beam``: beam search (beam 4, alpha 0.6, input + 50) over 3000 sentences of 27 pieces (a dev
   sentence's typical length), untrained weights (outputs run to the maximum length: the worst
   case), batched by source tokens as evaluation batches them: sentences/s;
9. ``tf32``: base eager in fp32 with TF32 matmuls;
10. ``micro``: the largest micro-batch of base that fits in memory (doubling from the config's
    until out of memory).

Then the hours of Table 2's runs (100K steps base, 300K big) on this GPU and on 8 at ideal
scaling, from each step part, and ours against the peer. ``plan.gpu_prices`` prices
``--dry-run --on <a GPU>`` from parts 6 and 7 (``results/gpu.json``) with a run through the
CLI on the same GPU (``results/paper-run.json``, ``benchmarks/paper_run.py``).

On a machine without a GPU it says so and runs the parts on a tiny model on the CPU (the `smoke`
widths), writing only to an ``--out`` given (a rehearsal): the code path stays tested where no
GPU is lent. The compiled parts run there only with another backend than inductor
(``step_time.COMPILE_BACKEND_ENV``: inductor's compile takes a CPU minutes), the memory search
never. Not
measured here: DDP over several GPUs (``--devices N`` on a table run; docs/devices.md).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config
from reproduce.errors import one_line
from reproduce.paper.decoding import beam_search
from reproduce.paper.flops import BF16_DENSE_TFLOPS, analytic_flops, lookup
from reproduce.paper.model import Transformer
from reproduce.paper.optim import adam_with_schedule
from reproduce.records.sweep import load_spec
from reproduce.speed.peers import TorchTransformer, peer_step_loss
from reproduce.train.devices import attention_kernels
from reproduce.train.step_time import (
    COMPILE_BACKEND_ENV,
    compile_backend,
    compile_with_backend,
    fast_step_loss,
    step_loss,
    synthetic_batch,
    train_step,
)
from reproduce.util import machine
from reproduce.util.files import write_atomic

LENGTH = 32  # pieces per synthetic training sentence
DEV_LENGTH, DEV_SENTENCES = 27, 3000  # beam search: sentences like a dev set's
MICRO_CAP = 16  # the memory search stops at 16x the config's micro-batch
BOS, EOS = 2, 3


def measure(config: Config, device: str, precision: str, steps: int, warmup: int = 2,
            loss_fn: Callable = step_loss, build: Callable[[Any], torch.nn.Module] = Transformer
            ) -> dict[str, Any]:
    """Seconds per optimizer step (micro-batches accumulated as one device of ``config`` would),
    target tokens per second, counted FLOPs per step and peak memory of the model ``build``
    makes of ``config.model`` (ours, or a peer of the same function)."""
    m, t = config.model, config.train
    accumulate, micro = t.split_batch(1)
    torch.manual_seed(0)
    model = build(m).to(device).train()
    optimizer, schedule = adam_with_schedule(model.parameters(), t, m.d_model)
    batch = {k: v.to(device) for k, v in synthetic_batch(m.vocab_size, micro, LENGTH).items()}
    B, S = batch["src"].shape
    T = batch["tgt_in"].shape[1]

    def step() -> None:
        train_step(model, optimizer, schedule, batch, config, precision, accumulate, loss_fn)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    first = time.perf_counter() - start  # compiling, for a compiled loss
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / steps
    n = accumulate
    flops = analytic_flops(m, n * B * S, n * B * T, n * B * S * S, n * B * T * T, n * B * T * S)
    return {"seconds_per_step": seconds, "warmup_seconds": first, "accumulate": accumulate,
            "micro_batch_tokens": B * S, "tokens_per_step": n * B * T,
            "target_tokens_per_second": n * B * T / seconds, "flops_per_step": flops,
            "achieved_tflops": flops / seconds / 1e12,
            "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2 ** 30
                                if device == "cuda" else None)}


def largest_micro_batch(config: Config, precision: str) -> dict[str, Any]:
    """The largest micro-batch (tokens per side) of ``config``'s model whose forward and backward
    fit in this GPU's memory, doubling from the config's own up to ``MICRO_CAP`` times it."""
    m, t = config.model, config.train
    micro = t.split_batch(1)[1]
    model = Transformer(m).cuda().train()
    fits, tried = None, micro
    while tried <= MICRO_CAP * micro:
        batch = {k: v.cuda() for k, v in synthetic_batch(m.vocab_size, tried, LENGTH).items()}
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                loss = step_loss(model, batch, t.eps_ls, m.pad_id)
            loss.backward()
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            break
        finally:
            model.zero_grad(set_to_none=True)
            del batch
            torch.cuda.empty_cache()
        fits, tried = tried, tried * 2
    return {"config_micro_batch_tokens": micro, "largest_fitting_tokens": fits,
            "first_failing_tokens": tried if tried <= MICRO_CAP * micro else None,
            "gib_total": torch.cuda.get_device_properties(0).total_memory / 2 ** 30}


def beam_rate(config: Config, device: str, sentences: int) -> dict[str, Any]:
    """Sentences per second of beam search (the config's beam, alpha and maximum length) over
    ``sentences`` random sources of ``DEV_LENGTH`` pieces, batched by source tokens as evaluation
    batches them (``config.train.batch_tokens``); untrained weights."""
    torch.manual_seed(0)
    model = Transformer(config.model).to(device).eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, config.model.vocab_size, (sentences, DEV_LENGTH), generator=g)
    # evaluate.decode_batch_tokens of a translation corpus, without importing the data stack
    per_batch = max(1, config.train.batch_tokens // DEV_LENGTH)
    d = config.decode
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16,
                                         enabled=device == "cuda" and torch.cuda.is_bf16_supported()):
        for begin in range(0, sentences, per_batch):
            beam_search(model, src[begin:begin + per_batch].to(device), BOS, EOS, d.beam,
                        d.alpha, d.max_len_offset)
    sync()
    seconds = time.perf_counter() - start
    return {"sentences": sentences, "sentences_per_batch": per_batch, "seconds": seconds,
            "sentences_per_second": sentences / seconds, "beam": d.beam, "alpha": d.alpha}


class Report:
    """The parts measured so far, written after each (``results/gpu.md`` and ``.json``)."""

    def __init__(self, out: Path | None, info: dict[str, Any]) -> None:
        self.out, self.info = out, info
        self.parts: dict[str, dict[str, Any]] = {}
        self.skipped: dict[str, str] = {}

    def add(self, name: str, result: dict[str, Any]) -> None:
        self.parts[name] = result
        self.write()

    def skip(self, name: str, why: str) -> None:
        self.skipped[name] = why
        print(f"{name}: skipped ({why})", flush=True)
        self.write()

    def write(self) -> None:
        if self.out is None:
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        data = {**self.info, "parts": self.parts, "skipped": self.skipped}
        # whole, or not at all: a kill can come at any moment
        write_atomic(self.out.with_suffix(".json"), (json.dumps(data, indent=1) + "\n").encode())
        write_atomic(self.out, gpu_page(data).encode())


# Each part's key (``--cap KEY=SECONDS``), its name in the report and its hard cap in seconds, in
# the order they run: what the fast path does first, the reference and the costly searches last.
PARTS = {"compiled": ("base, compiled", 90.0), "big-compiled": ("big, compiled", 90.0),
         "two-passes": ("base, compiled, two passes", 45.0), "peer": ("nn.Transformer", 30.0),
         "peer-compiled": ("nn.Transformer, compiled", 90.0), "base": ("base", 30.0),
         "big": ("big", 40.0), "beam": ("beam search, base", 40.0), "tf32": ("base, tf32", 30.0),
         "micro": ("base, largest micro-batch", 40.0)}
COMPILED = {"compiled", "big-compiled", "two-passes", "peer-compiled"}


class PartCut(BaseException):
    """A part ran past its cap (a BaseException, so no part's own ``except Exception`` keeps it)."""


@contextmanager
def capped(seconds: float) -> Iterator[None]:
    """Raise ``PartCut`` in this (the main) thread once ``seconds`` have gone."""
    from reproduce.train.stops import alarm

    with alarm(seconds, PartCut):
        yield


def _where(cuda: bool, steps: int, out: str | None, budget: float
           ) -> tuple[str, str, str, float | None, int, Report]:
    """(device, scale, precision, dense bf16 peak, steps timed, report) of ``run``: the paper's
    sizes on the GPU, written to ``out`` (default ``results/gpu.md``); without one, a tiny model on
    the CPU, written only to an ``out`` given (a rehearsal), never to ``results/gpu.md``."""
    info = {"torch": torch.__version__, "steps_timed": steps, "budget_seconds": budget,
            "compile_backend": compile_backend(),
            "commit": machine.commit(), "command": "python -m reproduce " + " ".join(sys.argv[1:]),
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if not cuda:
        print(f"no GPU: torch {torch.__version__} sees none. The same parts on a tiny model on the "
              "CPU (smoke widths; compiled by " + compile_backend() + "), "
              + (f"written to {out} (a rehearsal):" if out else "nothing written:"))
        return "cpu", "smoke", "32-true", None, 2, Report(Path(out) if out else None, {
            **info, "gpu": "none: a CPU rehearsal at smoke widths", "gpus_visible": 0,
            "precision": "32-true", "bf16_dense_peak_tflops": None, "steps_timed": 2})
    name = torch.cuda.get_device_name(0)
    precision = "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    peak = lookup(name, BF16_DENSE_TFLOPS) if precision == "bf16-mixed" else None
    return "cuda", "paper", precision, peak, steps, Report(Path(out or "results/gpu.md"), {
        **info, "gpu": name, "gpus_visible": torch.cuda.device_count(), "precision": precision,
        "bf16_dense_peak_tflops": peak})


def run(steps: int = 10, out: str | None = None, budget: float = 420.0,
        caps: dict[str, float] | None = None) -> int:
    """Every part in order, each within its cap, while ``budget`` seconds last: 0 when a part was
    measured, 1 when none was."""
    caps = {key: cap for key, (_, cap) in PARTS.items()} | (caps or {})
    spec = load_spec("table2")
    attention_kernels()  # as a run trains (fit)
    started, cuda = time.perf_counter(), torch.cuda.is_available()
    device, scale, precision, peak, steps, report = _where(cuda, steps, out, budget)

    def config(variant: str, passes: int = 1) -> Config:
        c = spec.resolve(variant, scale)
        return c.overrides(device_batch_tokens=c.train.batch_tokens // passes)

    def step_part(part: str, variant: str, part_precision: str, loss: Callable | None = None,
                  passes: int = 1, build: Callable = Transformer) -> None:
        c = config(variant, passes)
        r = measure(c, device, part_precision, steps, 2 if cuda else 1,
                    step_loss if loss is None else loss(c), build)
        r.update(variant=variant, precision=part_precision, train_steps=c.train.train_steps,
                 mfu=None if peak is None or part_precision != "bf16-mixed"
                 else r["achieved_tflops"] / peak,
                 hours_one_gpu=r["seconds_per_step"] * c.train.train_steps / 3600)
        r["hours_eight_gpus_ideal"] = r["hours_one_gpu"] / 8
        print(f"{part}: {r['seconds_per_step']:.3f} s/step (accumulate {r['accumulate']} x "
              f"{r['micro_batch_tokens']} tokens), {r['target_tokens_per_second']:.0f} target "
              f"tokens/s, {r['achieved_tflops'] * 1e3:.2f} GFLOP/s counted, MFU "
              f"{_percent(r['mfu'])}" + (f", peak {r['peak_memory_gib']:.1f} GiB" if cuda else "")
              + f", first steps {r['warmup_seconds']:.1f} s", flush=True)
        report.add(part, r)

    def tf32() -> None:
        was = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = cuda
        try:
            step_part("base, tf32", "base-en-de", "32-true")
        finally:
            torch.backends.cuda.matmul.allow_tf32 = was

    def beam() -> None:
        sentences = DEV_SENTENCES if cuda else 8
        r = beam_rate(config("base-en-de"), device, sentences)
        print(f"beam search: {r['sentences_per_second']:.1f} sentences/s ({sentences} sentences "
              f"of {DEV_LENGTH} pieces, {r['sentences_per_batch']} per batch, beam {r['beam']}, "
              f"alpha {r['alpha']}, {r['seconds']:.1f} s)", flush=True)
        report.add("beam search, base", r)

    peer = lambda c: peer_step_loss  # noqa: E731 - the loss a user of nn.Transformer writes
    do: dict[str, Callable[[], None]] = {
        "compiled": lambda: step_part("base, compiled", "base-en-de", precision, fast_step_loss),
        "big-compiled": lambda: step_part("big, compiled", "big-en-de", precision, fast_step_loss),
        "two-passes": lambda: step_part("base, compiled, two passes", "base-en-de", precision,
                                        fast_step_loss, passes=2),
        "peer": lambda: step_part("nn.Transformer", "base-en-de", precision, peer,
                                  build=TorchTransformer),
        "peer-compiled": lambda: step_part(
            "nn.Transformer, compiled", "base-en-de", precision,
            lambda c: compile_with_backend(peer_step_loss), build=TorchTransformer),
        "base": lambda: step_part("base", "base-en-de", precision),
        "big": lambda: step_part("big", "big-en-de", precision),
        "beam": beam, "tf32": tf32,
        "micro": lambda: report.add("base, largest micro-batch",
                                    largest_micro_batch(config("base-en-de", 2), precision))}
    _run_parts(do, caps, budget, started, cuda, report)
    if report.out is not None:
        print(f"wrote {report.out} and {report.out.with_suffix('.json')}")
    return 0 if report.parts else 1


def _run_parts(do: dict[str, Callable[[], None]], caps: dict[str, float], budget: float,
               started: float, cuda: bool, report: Report) -> None:
    """Each part of ``do`` in ``PARTS``' order, each within its cap while ``budget`` seconds from
    ``started`` last; what it measured, or one line of why not, in ``report``."""
    for key, (part, _) in PARTS.items():
        if not cuda and (elsewhere := _cpu_skips(key)):
            print(f"{part}: {elsewhere}", flush=True)
            continue
        left = budget - (time.perf_counter() - started)
        if why := _not_run(key, caps[key], left, budget):
            report.skip(part, why)
            continue
        cap = min(caps[key], left)
        try:
            with capped(cap):
                do[key]()
        except PartCut:
            report.skip(part, f"cut at {cap:.3g} s (its cap {caps[key]:g} s, with {left:.0f} s of "
                        "the budget left)")
        except Exception as e:  # noqa: BLE001 - one line (out of memory, say); the others go on
            report.skip(part, f"failed: {one_line(e)}")
        if cuda:
            torch.cuda.empty_cache()


def _cpu_skips(key: str) -> str | None:
    """Why a part is not rehearsed on a CPU, or None: the memory search is a GPU's; the compiled
    parts are where inductor compiles (minutes on a CPU: ``step_time.COMPILE_BACKEND_ENV``)."""
    if key == "micro":
        return "on a GPU only"
    if key in COMPILED and compile_backend() == "inductor":
        return f"on a GPU only (or with {COMPILE_BACKEND_ENV}=eager: a rehearsal)"
    return None


def _not_run(key: str, cap: float, left: float, budget: float) -> str | None:
    """Why a part is not run: its ``--cap KEY=0`` (a 0 s timer would be none: never uncapped),
    or the budget spent; None to run it."""
    if cap <= 0:
        return f"skipped (--cap {key}=0)"
    return f"the budget of {budget:.0f} s was spent" if left <= 0 else None


def gpu_page(data: dict[str, Any]) -> str:
    """``results/gpu.md`` from what ``Report`` holds."""
    parts = data["parts"]
    lines = [f"# One GPU: {data['gpu']}", "",
             f"`{data.get('command', 'python -m reproduce bench --gpu')}` (commit "
             f"{(data.get('commit', {}).get('sha') or '?')[:7]}, {data['precision']}, torch "
             f"{data['torch']}, "
             f"{data['steps_timed']} steps timed after 2 of warm-up; compiled by "
             f"{data.get('compile_backend', 'inductor')}; synthetic {LENGTH}-piece "
             f"sentences; dense bf16 peak {data['bf16_dense_peak_tflops'] or 'unknown'} TFLOPS; "
             f"measured {data['measured_at']}, budget {data['budget_seconds']:.0f} s).", "",
             "| part | precision | s/step | accumulate x micro | target tok/s | TFLOP/s | MFU | "
             "peak GiB | first steps s | h, 1 GPU | h, 8 GPUs (ideal) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in parts.items():
        if "seconds_per_step" not in r:
            continue
        lines.append(f"| {name} | {r['precision']} | {r['seconds_per_step']:.3f} | "
                     f"{r['accumulate']} x {r['micro_batch_tokens']} | "
                     f"{r['target_tokens_per_second']:.0f} | {r['achieved_tflops']:.1f} | "
                     f"{_percent(r['mfu'])} | {_gib(r['peak_memory_gib'])} | "
                     f"{r['warmup_seconds']:.1f} | {r['hours_one_gpu']:.1f} | "
                     f"{r['hours_eight_gpus_ideal']:.1f} |")
    lines += _ratios(parts)
    if m := parts.get("base, largest micro-batch"):
        lines += ["", f"Largest micro-batch of base that fits ({m['gib_total']:.0f} GiB): "
                  f"{m['largest_fitting_tokens']} tokens per side (the config's: "
                  f"{m['config_micro_batch_tokens']}; first to fail: "
                  f"{m['first_failing_tokens'] or f'none up to {MICRO_CAP}x'})."]
    if b := parts.get("beam search, base"):
        lines += ["", f"Beam search (beam {b['beam']}, alpha {b['alpha']}, input + 50), base, "
                  f"untrained weights, {b['sentences']} sentences of {DEV_LENGTH} pieces, "
                  f"{b['sentences_per_batch']} per batch: {b['sentences_per_second']:.1f} "
                  f"sentences/s ({b['seconds']:.1f} s)."]
    for name, why in data["skipped"].items():
        lines += ["", f"Skipped: {name}: {why}."]
    lines += ["", "Hours: s/step x Table 2's steps (100K base, 300K big); 8 GPUs at ideal "
              "scaling. Not measured by this command: DDP over several GPUs, a paper-scale table "
              "run (docs/devices.md)."]
    return "\n".join(lines) + "\n"


# (faster, slower, what the ratio says): each pair the page compares where both were measured
RATIOS = (("base, compiled", "nn.Transformer, compiled", "ours over the peer, both compiled"),
          ("base", "nn.Transformer", "ours over the peer, both eager"),
          ("base, compiled", "base", "the fast path over eager (ours)"),
          ("big, compiled", "big", "the fast path over eager (big)"),
          ("base, compiled", "base, compiled, two passes", "one pass over two (compiled)"))


def _ratios(parts: dict[str, dict[str, Any]]) -> list[str]:
    """Lines of the page that set parts side by side: how many times faster a step is."""
    lines = [f"- {what}: {parts[b]['seconds_per_step'] / parts[a]['seconds_per_step']:.2f}x "
             f"({parts[a]['seconds_per_step']:.3f} s against {parts[b]['seconds_per_step']:.3f} s)"
             for a, b, what in RATIOS
             if "seconds_per_step" in parts.get(a, {}) and "seconds_per_step" in parts.get(b, {})]
    return ["", "Side by side (a step's seconds, the same batch; above 1x the first is faster):",
            "", *lines] if lines else []


def _gib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"
