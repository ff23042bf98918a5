"""What a checkpoint save at the paper's size costs a run: the seconds training stands still while
the files are written, as ``train.callbacks.AtomicCheckpointIO`` writes them.

    python benchmarks/checkpoint_save.py [--folder runs/ckpt-bench] [--rounds 3] [--out FILE.md]

For the paper's base and big (vocabulary 37000), on this machine's CPU: the model and its Adam
state (after one step), then, per save, what Table 2's runs write every 10 minutes of training
(section 5.2's checkpoints, ``train.ckpt_every_minutes``): a ``step<N>.ckpt`` holding the weights
alone (kept for averaging: ``records.disk``) and ``last.ckpt`` with the optimizer state (to resume),
each streamed to a temporary file, fsynced and renamed into ``--folder``. Reported: each file's
size and median seconds, and the stall as a share of the 10 minutes between saves. On a GPU the
tensors are copied to the host as they are written (PCIe or NVLink: some GB/s more than a disk),
so this is the disk's and the serializer's part. The folder should be on the disk runs use.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import torch

from reproduce.config import BASE, BIG
from reproduce.paper.model import Transformer
from reproduce.paper.optim import adam_with_schedule
from reproduce.train.callbacks import AtomicCheckpointIO
from reproduce.util.machine import cpu_name

EVERY_MINUTES = 10


def checkpoints(config) -> tuple[dict, dict, int]:
    """(a weights-only checkpoint, a full one, the parameter count) of ``config``'s model, laid
    out as Lightning's (``state_dict``, ``optimizer_states``, ...)."""
    model = Transformer(config.model)
    optimizer, schedule = adam_with_schedule(model.parameters(), config.train, config.model.d_model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # Adam's two moments exist from here on
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    weights = {"epoch": 0, "global_step": 1, "state_dict": state}
    full = {**weights, "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [schedule.state_dict()], "callbacks": {}, "loops": {}}
    return weights, full, sum(p.numel() for p in model.parameters())


def timed_save(io: AtomicCheckpointIO, checkpoint: dict, path: Path) -> float:
    start = time.perf_counter()
    io.save_checkpoint(checkpoint, path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("runs/ckpt-bench"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    args = parser.parse_args()
    io = AtomicCheckpointIO()
    lines = [f"# Checkpoint saves at the paper's size\n\nMachine: {cpu_name()}; folder "
             f"`{args.folder}`. Command: `python benchmarks/checkpoint_save.py --rounds "
             f"{args.rounds}` ({time.strftime('%Y-%m-%d')}, load average "
             f"{os.getloadavg()[0]:.1f} at the start). Median of {args.rounds} saves.\n",
             "| model | parameters | step file (weights) | last.ckpt (full) | stall per save "
             f"| of {EVERY_MINUTES} min |\n|---|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    try:
        for name, config in (("base", BASE), ("big", BIG)):
            weights, full, params = checkpoints(config)
            args.folder.mkdir(parents=True, exist_ok=True)
            seconds: dict[str, list[float]] = {"step": [], "last": []}
            for r in range(args.rounds):
                seconds["step"].append(timed_save(io, weights, args.folder / f"step{r}.ckpt"))
                seconds["last"].append(timed_save(io, full, args.folder / "last.ckpt"))
            sizes = {k: (args.folder / f).stat().st_size / 1e9
                     for k, f in (("step", "step0.ckpt"), ("last", "last.ckpt"))}
            med = {k: statistics.median(v) for k, v in seconds.items()}
            stall = med["step"] + med["last"]
            lines.append(f"| {name} | {params / 1e6:.0f}M | {sizes['step']:.2f} GB in "
                         f"{med['step']:.1f} s | {sizes['last']:.2f} GB in {med['last']:.1f} s "
                         f"| {stall:.1f} s | {100 * stall / (EVERY_MINUTES * 60):.1f} % |")
            print(lines[-1], flush=True)
            del weights, full
            shutil.rmtree(args.folder)
    finally:
        shutil.rmtree(args.folder, ignore_errors=True)
    lines.append("\nEach save is a step file and `last.ckpt`, streamed to a temporary file, fsynced "
                 "and renamed (`train.callbacks.AtomicCheckpointIO`); `benchmarks/checkpoint_save.py` "
                 "says what is timed.")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
