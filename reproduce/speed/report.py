"""The benchmark's report: the machine it ran on, and the Markdown of its results."""

from __future__ import annotations

import os
import platform
import statistics
from typing import Any

import torch

from reproduce.config import model_items
from reproduce.speed.inputs import OURS
from reproduce.util.machine import cpu_flags, cpu_name


def environment() -> dict[str, Any]:
    """CPU model, cores, the instruction sets that decide matmul speed, library versions."""
    try:
        import transformers
        hf = transformers.__version__
    except ImportError:
        hf = None
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "flags": cpu_flags(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": hf,
            "python": platform.python_version(), "load_average": os.getloadavg()}


def fmt_rate(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def spread(seconds: list[float], work: float) -> str:
    return f"{fmt_rate(work / max(seconds))}–{fmt_rate(work / min(seconds))}"


def _training(s: dict[str, Any], peak: dict[str, float]) -> list[str]:
    """A scale's training table: every contender in each precision, against ours in the same."""
    train = s["train"]
    ours = {r.precision: r for r in train if r.name == OURS}
    first = next(iter(ours.values()))
    lines = [f"Training: {s['batches_about']}; interleaved rounds: {len(first.seconds)}, after "
             "one warm-up round; median target tokens per second (min–max over rounds). "
             "Loss on the first batch in eval mode, fp32, same weights: ours "
             f"{s['first_loss'][OURS]:.4f}, largest difference of a peer "
             f"{max(abs(v - s['first_loss'][OURS]) for v in s['first_loss'].values()):.1e}.",
             "", f"Runs at this scale train in {s['runs_take']}.", "",
             "| contender | precision | trainable params | target tokens/s | min–max | vs ours | "
             "model GFLOP/s | of its peak | note |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in train:
        gflops = r.flops / statistics.median(r.seconds) / 1e9
        lines.append(f"| {r.name} | {r.precision} | {r.params:,} | {r.rate:.0f} | "
                     f"{spread(r.seconds, r.work)} | {r.rate / ours[r.precision].rate:.2f}x | "
                     f"{gflops:.1f} | {gflops / peak[r.precision]:.0%} | {r.note} |")
    lines.append("")
    for precision, mine in ours.items():
        others = [r for r in train if r.precision == precision and not r.name.startswith(OURS)]
        if others:
            best = max(others, key=lambda r: r.rate)
            lines.append(f"In {precision}, our step against the fastest peer ({best.name}): "
                         f"{mine.rate / best.rate:.2f}x.")
    if len(ours) > 1:
        rate = {(r.name, r.precision): r.rate for r in train}
        pairs = [f"{name} {rate[(name, 'bf16-mixed')] / rate[(name, '32-true')]:.2f}x"
                 for name in dict.fromkeys(r.name for r in train)
                 if (name, "bf16-mixed") in rate and (name, "32-true") in rate]
        lines += ["", "bf16-mixed against fp32, same contender: " + "; ".join(pairs) + "."]
    return lines


def scale_heading(scale: str, config) -> str:
    """A scale's heading: its name and the model's shape fields (``config.model_items``)."""
    return f"## Scale `{scale}`: " + ", ".join(f"{name}={value}" for name, value in
                                               model_items(config.model))


def performance_page(info: dict[str, Any], sections: list[dict[str, Any]], command: str) -> str:
    """The Markdown report (results/performance.md)."""
    m = info["machine"]
    load = m["load_average"][0]
    contended = load >= 0.5
    lines = ["# Performance: our training step and decoding beside the alternatives", "",
             f"Written by `{command}` on {info['date']}; regenerate it, never edit it by hand.", ""]
    if contended:
        lines += [f"**Contended run**: the 1-minute load average was {load:.2f} on {m['cores']} "
                  "cores before the benchmark started (another job was running). Absolute rates "
                  "are low and noisy; the ratios, from interleaved rounds, are the numbers to "
                  "read. Rerun on an idle machine for absolute figures.", ""]
    flags = ", ".join(m["flags"]) or "none of avx2/fma/avx512*/amx*"
    missing = [f for f in ("avx512_bf16", "amx_bf16") if f not in m["flags"]]
    lines += ["## Machine", "", "| | |", "|---|---|",
              f"| CPU | {m['cpu']}, {m['cores']} cores |",
              f"| flags | {flags}{'; no ' + ', '.join(missing) if missing else ''} "
              f"(torch dispatches {m['torch_cpu_capability']}) |",
              f"| threads | {m['threads']} (torch.get_num_threads) |",
              f"| precision | {info['precision']} |",
              f"| versions | torch {m['torch']}, transformers {m['transformers'] or 'not installed'}, "
              f"Python {m['python']} |",
              f"| load average before | {', '.join(f'{x:.2f}' for x in m['load_average'])} |", "",
              f"Matmul peak measured here with the same {m['threads']} thread(s) (best of "
              "repeats of one n x n product, before and after the contenders; a row's `of its "
              "peak` is against its precision's):", "",
              "| dtype | n | GFLOP/s |", "|---|---:|---:|"]
    for dtype, (n, rate) in info["peaks"].items():
        lines.append(f"| {dtype} | {n} | {rate:.1f} |")
    peak = {"32-true": info["peaks"]["float32"][1], "bf16-mixed": info["peaks"]["bfloat16"][1]}
    for s in sections:
        lines += ["", scale_heading(s["scale"], s["config"]), ""]
        lines += _training(s, peak)
        lines += _decoding(s)
    lines += ["", "## Notes", ""] + NOTES
    return "\n".join(lines) + "\n"


def _decoding(s: dict[str, Any]) -> list[str]:
    """A scale's decoding table: each search's contenders in sentences per second, and checks."""
    if not s.get("decode"):
        return []
    dec = s["decode"]
    lines = ["", f"Decoding: {s['decode_about']}; interleaved rounds: "
             f"{len(dec[0].seconds)}; median sentences per second.", "",
             "| search | contender | sentences/s | min–max | vs ours, cached |",
             "|---|---|---:|---:|---:|"]
    for r in dec:
        search, who = r.name.split(" | ")
        base = next(x for x in dec if x.name == f"{search} | ours, cached")
        lines.append(f"| {search} | {who} | {fmt_rate(r.rate)} | {spread(r.seconds, r.work)} "
                     f"| {r.rate / base.rate:.2f}x |")
    lines += ["", "Checks: " + "; ".join(f"{k}: {v}" for k, v in s["checks"].items()) + "."]
    rate = {r.name: r.rate for r in dec}
    for search in dict.fromkeys(r.name.split(" | ")[0] for r in dec):
        cached = rate[f"{search} | ours, cached"]
        line = (f"{search}: cached {cached / rate[f'{search} | ours, uncached']:.1f}x "
                "uncached")
        if f"{search} | MarianMT generate" in rate:
            line += f", {cached / rate[f'{search} | MarianMT generate']:.2f}x MarianMT"
        lines += ["", line + "."]
    return lines


# What every report says of how its contenders are built and timed.
NOTES = [
    "- Every contender computes the same function: the peers are built by "
    "`reproduce/speed/peers.py` with our weights copied in (nn.Transformer without its final "
    "LayerNorms, which the paper lacks; Marian with our interleaved sinusoid table). "
    "The FLOP count (`reproduce/paper/flops.py`: matmuls only, padded shapes, training = "
    "3 x forward) is the same for all, so `model GFLOP/s` is useful work.",
    "- Loss: ours is `optim.output_loss` (the tied output projection, one log-softmax, "
    "the smoothed loss and the unsmoothed NLL for perplexity, in chunks over the real "
    "target tokens, gradients written out); the peers project to logits and use "
    "`F.cross_entropy(label_smoothing)`, the same formula.",
    "- Precision: each contender runs in fp32 and, where bf16 is native (its matmul "
    "no slower than fp32's), in bf16-mixed (autocast, fp32 weights and optimizer). "
    "`Runs at this scale train in` is what a run of the table's base decides here "
    "(`train/precision.py`: timed training steps of both, cached), not a matmul.",
    "- `ours, torch.compile` (`--compile`) is `torch.compile` of our training loss, "
    "the whole forward (encoder, decoder, tied projection, loss) and so its backward, "
    "on a copy of our weights. Its graphs are counted from cleared dynamo counters "
    "(several graphs for one function: graph breaks); each precision compiles its own.",
    "- `ours, Lightning loop` is the time between the Trainer's `on_train_start` and "
    "`on_train_end` over the same batches: what a real run pays per step, with logging "
    "and hooks; the Trainer's set-up (a few tenths of a second per run) is left out.",
    "- MarianMT `generate` (HF `transformers`) is run with beam 4, `length_penalty` = "
    "alpha, `early_stopping=True` (stop once 4 hypotheses ended, as ours), EOS forced "
    "after input + 50 tokens, PAD/BOS suppressed. HF's length penalty divides by "
    "|Y|^alpha; ours (GNMT, as the paper's tensor2tensor) by ((5 + |Y|) / 6)^alpha, so "
    "beam outputs can differ at alpha 0.6; with alpha 0 on both they rank alike. HF "
    "limits length per batch, we per sentence.",
    "- Untrained weights almost never emit EOS, so outputs run to the maximum length "
    "(input + 50): the worst case for the uncached search, whose step cost grows with the "
    "prefix. With `--checkpoint` the `cpu` scale decodes Bible dev sentences with trained "
    "weights, at realistic lengths.",
]
