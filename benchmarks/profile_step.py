"""Where a training step's time goes: torch.profiler over whole steps, grouped by kind of work.

    python benchmarks/profile_step.py [--variant base] [--scale cpu] [--threads 1] [--steps 4]

On Bible training batches (``reproduce.speed.inputs.Bible``) at the scale's config, the step the
runs take (forward, fused output loss, backward, Adam, schedule; ``reproduce.speed.training``)
is warmed up for two batches, timed over ``--steps`` more, then profiled over the same number.
It prints each group's share of the profiled CPU time (self time of its aten ops), the step's
seconds, and the FLOP rate it reaches (the model's analytic training FLOPs, ``reproduce.paper.flops``)
beside this CPU's fp32 matmul rate at the same threads (512 x 512, as ``estimates.probe``): a
step near that rate has little to gain but fewer FLOPs or a faster number format.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from reproduce.records.sweep import load_spec
from reproduce.speed.inputs import Bible, batch_flops
from reproduce.speed.report import environment
from reproduce.speed.training import plain_step
from reproduce.train.lit import TranslationModule
from reproduce.util.machine import matmul_gflops

# aten op (self time) -> group; an op in none of these counts as "other"
GROUPS = {
    "matmuls (linear layers, tied output projection)": ("aten::mm", "aten::addmm", "aten::bmm",
                                                        "aten::matmul", "aten::linear"),
    "attention kernel (fused, forward and backward)": ("scaled_dot_product", "flash_attention"),
    "dropout masks": ("aten::bernoulli_", "aten::native_dropout"),
    "loss softmax (output_loss chunks)": ("aten::_log_softmax", "aten::exp_", "aten::softmax",
                                          "aten::_softmax"),
    "layer norm": ("layer_norm",),
    "Adam": ("_fused_adam", "aten::_foreach"),
}


def group_of(name: str) -> str:
    for group, keys in GROUPS.items():
        if any(k in name for k in keys):
            return group
    return "other (elementwise, copies, autograd bookkeeping)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="base")
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--table", default="table3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = load_spec(args.table).resolve(args.variant, args.scale)
    m = config.model
    batches, _ = Bible(m.vocab_size, config.train.max_tokens_per_sentence, 0).batches(
        config.train.batch_tokens, 2 + 2 * args.steps)
    warm, timed, profiled = batches[:2], batches[2:2 + args.steps], batches[2 + args.steps:]
    module = TranslationModule(config.to_dict())

    def loss(batch):
        smoothed, _, n = module._losses(batch)
        return smoothed, n
    step = plain_step(module.model, loss, config, "32-true")
    step(warm)
    start = time.perf_counter()
    step(timed)
    seconds = (time.perf_counter() - start) / len(timed)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(profiled)
    shares: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        shares[group_of(event.key)] += event.self_cpu_time_total
    total = sum(shares.values())
    rate = sum(batch_flops(m, b) for b in timed) / len(timed) / seconds / 1e9
    peak = matmul_gflops(torch.float32, 512, budget=0.3)
    info = environment()
    print(f"{info['cpu']}, {info['cores']} cores, load average {info['load_average'][0]:.2f}; "
          f"torch {info['torch']}, {args.threads} thread(s); {args.table} {args.variant} at "
          f"`{args.scale}` (d_model {m.d_model}, vocabulary {m.vocab_size}), "
          f"{config.train.batch_tokens} tokens a batch")
    print(f"step: {seconds:.3f} s (mean of {len(timed)}); analytic training FLOPs at {rate:.1f} "
          f"GFLOP/s, {rate / peak:.2f}x this CPU's fp32 512x512 matmul ({peak:.1f} GFLOP/s)")
    print(f"\n{'share':>6}  group (self CPU time of {len(profiled)} profiled steps)")
    for group, t in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"{100 * t / total:5.1f}%  {group}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
