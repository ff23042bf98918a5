"""How many ops the host issues for one training step, the projections one by one and fused.

    python benchmarks/step_ops.py [--out results/step-ops.md]

At the paper's base and big dims (Table 3's ``paper`` scale), one batch of 20 sentences of 30
source and 30 target tokens: the forward pass, the fast path's loss
(``optim.padded_output_loss``) and the backward, counted by a dispatch mode as aten ops (each
an eager kernel launch or more) and matmuls (``mm``, ``addmm``). Once with every projection its
own matmul (the eager path's model), once with ``features(fused=True)`` (the fast path's: each
self-attention's Q, K and V one matmul, the source's keys and values of all decoder layers one).
The counts depend on the model's shape, not on the batch's size or the machine; a GPU step bound
by the host issuing kernels (``results/gpu.md``) pays for each. Compiled, inductor fuses the
elementwise ops but keeps every matmul a kernel of its own. Writes Markdown and JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reproduce.paper.model import Transformer
from reproduce.paper.optim import padded_output_loss
from reproduce.records.sweep import load_spec

ROOT = Path(__file__).resolve().parent.parent
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.matmuls += func in MATMULS
        return func(*args, **(kwargs or {}))


def count(variant: str, fused: bool) -> dict[str, int]:
    config = load_spec("table3").resolve(variant, "paper")
    torch.manual_seed(0)
    model = Transformer(config.model)
    src = torch.randint(4, 1000, (20, 30))
    tgt = torch.randint(4, 1000, (20, 31))
    with _Ops() as ops:
        hidden = model.features(src, tgt[:, :-1], fused=fused)
        smoothed, _, _ = padded_output_loss(hidden, model.embed.weight, tgt[:, 1:],
                                            config.train.eps_ls, config.model.pad_id)
        smoothed.backward()
    return {"ops": ops.ops, "matmuls": ops.matmuls}


def report(rows: list[dict], command: str, commit: str) -> str:
    lines = ["# Ops a training step issues: projections one by one, and fused", "",
             f"`{command}` at {commit}: one step's forward, loss and backward at Table 3's "
             "`paper` dims (the optimizer's fused Adam adds a few). Counted, not timed: the "
             "same on any machine.", "",
             "| model | projections | aten ops | matmuls |", "|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {'fused' if r['fused'] else 'one by one'} "
                     f"| {r['ops']:,} | {r['matmuls']} |")
    lines.append("")
    for variant in dict.fromkeys(r["variant"] for r in rows):
        plain, fused = (next(r for r in rows if r["variant"] == variant and r["fused"] is f)
                        for f in (False, True))
        lines.append(f"- {variant}: fused issues {fused['ops'] / plain['ops']:.2f}x the ops "
                     f"and {fused['matmuls'] / plain['matmuls']:.2f}x the matmuls.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "step-ops.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [{"variant": v, "fused": f, **count(v, f)} for v in ("base", "big") for f in (False, True)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    command = " ".join(["python", "benchmarks/step_ops.py", *sys.argv[1:]])
    args.out.write_text(report(rows, command, commit))
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
