"""``python -m reproduce bench --gpu``: what one GPU does with the paper's models, in one command.

For base and big at the paper's sizes and batch (Table 2's EN-DE configs: ~25000 tokens per step,
micro-batches of ``device_batch_tokens`` accumulated as one GPU would), in bf16-mixed where the GPU
supports it: seconds per optimizer step, target tokens per second, model FLOPs utilization (counted
FLOPs, ``flops.analytic_flops``, against the GPU's dense bf16 peak, ``flops.BF16_DENSE_TFLOPS``),
peak memory, and the hours Table 2's runs (100K and 300K steps) would take on this GPU and on 8 of
them at perfect scaling. Writes ``results/gpu.md`` and ``results/gpu.json`` naming the GPU.
Synthetic sentences of 32 pieces; no data, no network.

On a machine without a GPU it says so and exits 0 after the same measurement on a tiny model on
the CPU (the `smoke` widths), writing nothing: the code path stays tested where no GPU is lent.
Not measured here yet: DDP scaling over several GPUs (train one run with ``--devices N``: see
docs/devices.md) and a `paper`-scale table run.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config
from reproduce.paper.flops import BF16_DENSE_TFLOPS, analytic_flops, lookup
from reproduce.paper.model import Transformer
from reproduce.paper.optim import accumulation, adam_with_schedule
from reproduce.runs.sweep import load_spec
from reproduce.train.step_time import synthetic_batch, train_step

MODELS = ("base-en-de", "big-en-de")
LENGTH = 32  # pieces per synthetic sentence


def measure(config: Config, device: str, precision: str, steps: int, warmup: int = 2
            ) -> dict[str, Any]:
    """Seconds per optimizer step (micro-batches accumulated as one device of ``config`` would),
    target tokens per second, counted FLOPs per step and peak memory."""
    m, t = config.model, config.train
    accumulate, micro = accumulation(t.batch_tokens, t.device_batch_tokens, 1)
    torch.manual_seed(0)
    model = Transformer(m).to(device).train()
    optimizer, schedule = adam_with_schedule(model.parameters(), t, m.d_model)
    batch = {k: v.to(device) for k, v in synthetic_batch(m.vocab_size, micro, LENGTH).items()}
    B, S = batch["src"].shape
    T = batch["tgt_in"].shape[1]

    def step() -> None:
        train_step(model, optimizer, schedule, batch, config, precision, accumulate)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / steps
    n = accumulate
    flops = analytic_flops(m, n * B * S, n * B * T, n * B * S * S, n * B * T * T, n * B * T * S)
    return {"seconds_per_step": seconds, "accumulate": accumulate, "micro_batch_tokens": B * S,
            "tokens_per_step": n * B * T, "target_tokens_per_second": n * B * T / seconds,
            "flops_per_step": flops, "achieved_tflops": flops / seconds / 1e12,
            "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2 ** 30
                                if device == "cuda" else None)}


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def run(steps: int = 10, out: str = "results/gpu.md") -> int:
    spec = load_spec("table2")
    if not torch.cuda.is_available():
        print(f"no GPU: torch {torch.__version__} sees none. The same measurement on a tiny model "
              "on the CPU (smoke widths), nothing written:")
        for name in MODELS:
            config = spec.resolve(name, "smoke")  # half-size micro-batches: accumulation too
            config = config.overrides(device_batch_tokens=config.train.batch_tokens // 2)
            r = measure(config, "cpu", "32-true", steps=2, warmup=1)
            print(f"  {name} (smoke): {r['seconds_per_step']:.3f} s/step, accumulate "
                  f"{r['accumulate']}, {r['target_tokens_per_second']:.0f} target tokens/s, "
                  f"{r['achieved_tflops'] * 1e3:.2f} GFLOP/s counted")
        return 0
    name = torch.cuda.get_device_name(0)
    precision = "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    peak = lookup(name, BF16_DENSE_TFLOPS) if precision == "bf16-mixed" else None
    rows = []
    for variant in MODELS:
        config = spec.resolve(variant, "paper")
        r = measure(config, "cuda", precision, steps)
        r.update(variant=variant, train_steps=config.train.train_steps,
                 mfu=None if peak is None else r["achieved_tflops"] / peak,
                 hours_one_gpu=r["seconds_per_step"] * config.train.train_steps / 3600)
        r["hours_eight_gpus_ideal"] = r["hours_one_gpu"] / 8
        rows.append(r)
        print(f"{variant}: {r['seconds_per_step']:.3f} s/step ({r['accumulate']} x "
              f"{r['micro_batch_tokens']} tokens), {r['target_tokens_per_second']:.0f} target "
              f"tokens/s, {r['achieved_tflops']:.1f} TFLOP/s counted, MFU "
              f"{_percent(r['mfu'])}, peak "
              f"{r['peak_memory_gib']:.1f} GiB, {r['hours_one_gpu']:.1f} h for "
              f"{r['train_steps']} steps on one GPU")
    info = {"gpu": name, "gpus_visible": torch.cuda.device_count(), "precision": precision,
            "bf16_dense_peak_tflops": peak, "torch": torch.__version__, "steps_timed": steps,
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    lines = [f"# One GPU: {name}", "",
             f"`python -m reproduce bench --gpu` ({precision}, torch {torch.__version__}, "
             f"{steps} steps timed after 2 of warm-up; synthetic {LENGTH}-piece sentences; dense "
             f"bf16 peak {peak or 'unknown'} TFLOPS).", "",
             "| model | s/step | accumulate x micro | target tok/s | TFLOP/s | MFU | peak GiB | "
             "h, 1 GPU | h, 8 GPUs (ideal) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['seconds_per_step']:.3f} | {r['accumulate']} x "
                     f"{r['micro_batch_tokens']} | {r['target_tokens_per_second']:.0f} | "
                     f"{r['achieved_tflops']:.1f} | "
                     f"{_percent(r['mfu'])} | "
                     f"{r['peak_memory_gib']:.1f} | {r['hours_one_gpu']:.1f} | "
                     f"{r['hours_eight_gpus_ideal']:.1f} |")
    lines += ["", "Not measured by this command: DDP scaling over several GPUs, a paper-scale "
              "table run (docs/devices.md)."]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path} and {path.with_suffix('.json')}")
    return 0
