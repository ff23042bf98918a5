"""The `cpu` scale's training step of this checkout against another commit's, interleaved in one
run: has the default (eager) step got slower?

    python benchmarks/step_ratio.py [--against 5fab401] [--rounds 3] [--steps 100] [--threads 2]
        [--work /tmp/step-ratio] [--out results/step-ratio.md]

The other commit is checked out once in a git worktree under ``--work``. Each round runs both
trees' CLI, in turn (the order alternating from round to round), on Table 3's base at `cpu`:
``table3 --variant base --scale cpu --results <fresh folder> --set train.train_steps=N
train.precision=32-true data.max_eval_pairs=8`` (fp32, as the table's records; a few dev pairs, so
evaluation is short), ``OMP_NUM_THREADS`` threads, the project's corpus cache shared, W&B off.
A run's seconds per step are the median over its learning curve's points between step 20 and
the last before the end (the curve logs the wall clock at each point; the first steps and the
final checkpoint are left out). The report gives each round's figures, the medians over rounds and
the ratio: the other commit's seconds per step over this checkout's (above 1: this checkout is
faster). Stop anything else that uses the cores first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tree_of(commit: str, work: Path) -> Path:
    """A worktree of ``commit`` under ``work`` (made once)."""
    sha = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, text=True, capture_output=True,
                         check=True).stdout.strip()
    tree = work / sha[:12]
    if not (tree / "reproduce").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT,
                       check=True, capture_output=True)
    return tree


def seconds_per_step(tree: Path, out: Path, steps: int, threads: int) -> float:
    """One CLI run of ``tree``'s code into ``out``; the median seconds per step of its curve."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads),
           "WANDB_MODE": "disabled", "REPRODUCE_RUNS": str(out / "runs"),
           "REPRODUCE_CACHE": os.environ.get("REPRODUCE_CACHE", str(ROOT / "cache"))}
    command = [sys.executable, "-m", "reproduce", "table3", "--variant", "base", "--scale", "cpu",
               "--results", str(out), "--set", f"train.train_steps={steps}",
               "train.precision=32-true", "data.max_eval_pairs=8"]
    done = subprocess.run(command, cwd=tree, env=env, text=True, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-3000:]}")
    [path] = (out / "table3").glob("*.json")
    points = json.loads(path.read_text())["curve"]["train_loss"]  # [step, seconds, loss]
    inside = [(s, t) for s, t, _ in points if 20 <= s < steps]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(inside)]
    if not rates:
        raise SystemExit(f"{path}: too few curve points between step 20 and {steps}")
    return statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="5fab401")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/step-ratio"))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "step-ratio.md")
    args = parser.parse_args()
    here = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "reproduce"], cwd=ROOT,
                                text=True, capture_output=True).stdout.strip())
    trees = {"this checkout": ROOT, args.against: tree_of(args.against, args.work)}
    times: dict[str, list[float]] = {name: [] for name in trees}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            out = args.work / f"{stamp}-round{r}-{'here' if trees[name] == ROOT else 'other'}"
            times[name].append(seconds_per_step(trees[name], out, args.steps, args.threads))
            print(f"round {r}: {name}: {times[name][-1]:.4f} s/step", flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratio = medians[args.against] / medians["this checkout"]
    from reproduce.speed.report import environment

    env = environment()
    command = " ".join(["python", "benchmarks/step_ratio.py", *sys.argv[1:]])
    lines = ["# The `cpu` scale's step against an earlier commit", "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, this checkout {here}"
             f"{' with uncommitted changes under reproduce/' if dirty else ''}, {env['cpu']}, "
             f"{env['cores']} cores, {args.threads} thread(s); `benchmarks/step_ratio.py` says "
             "how). Table 3's base at `cpu`, fp32, eager, the runs of both trees interleaved.", "",
             "| round | " + " | ".join(f"{n} (s/step)" for n in trees) + " |",
             "|---:|" + "---:|" * len(trees)]
    for r in range(args.rounds):
        lines.append(f"| {r} | " + " | ".join(f"{times[n][r]:.4f}" for n in trees) + " |")
    lines += ["| median | " + " | ".join(f"{medians[n]:.4f}" for n in trees) + " |", "",
              f"Ratio, {args.against}'s seconds per step over this checkout's: **{ratio:.3f}** "
              "(above 1: this checkout is faster).", ""]
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(
        {"command": command, "commit": here, "dirty": dirty, "against": args.against,
         "threads": args.threads, "steps": args.steps, "seconds_per_step": times,
         "ratio": ratio, "environment": env}, indent=1) + "\n")
    print(args.out, f"ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
