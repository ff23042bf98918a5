"""A paper-scale run through the real CLI, each phase timed: Table 2's base EN-DE at `paper` (the
paper's model, vocabulary 37000, ~25,000 tokens per step, bf16-mixed on a GPU) for a few hundred
steps on a generated WMT-sized corpus (``benchmarks/data_scale.py``'s: Bible verses in WMT14's
shape, local files), with a checkpoint every sixth of the steps, the last 5 averaged, dev
perplexity and BLEU on its 3000 dev and 3003 test sentences. Made for the first GPU:

    python benchmarks/paper_run.py [--pairs 1000000] [--steps 300] [--eval-pairs 0]
        [--work /tmp/paper-run] [--out results/paper-run.md] [--scale paper]

The report comes from the run's record: its phases (data preparation with an empty cache, fit,
averaging, dev perplexity, decoding), seconds per step, target tokens per second, precision and
device, beside the command's wall clock; the record goes beside it (``paper-run.json``) with the
command's wall clock as ``command_seconds``, which GPU plans price start-up from
(``plan.gpu_prices``). ``--scale smoke --pairs 2000 --steps 30`` checks the
script on a CPU in a minute or two: nothing is claimed from that.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from data_scale import generate  # noqa: E402 - a sibling script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-pairs", type=int, default=0,
                        help="dev and test sentences evaluated (data.max_eval_pairs; 0 = all)")
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--compile", default="off", choices=("off", "on", "auto"),
                        help="train.compile (default off: the eager step GPU plans price from, "
                             "plan.gpu_prices; gpu_window.py passes on: the fast path)")
    parser.add_argument("--batch-shapes", type=int, default=0,
                        help="train.batch_shapes (default 0: exact widths)")
    parser.add_argument("--micro-batch", default="",
                        help="train.device_batch_tokens (default: the scale's; auto: the fewest "
                        "passes a step that fit the GPU's measured memory)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more config values for the run, as the CLI's --set (e.g. "
                        "train.cuda_graphs=true)")
    parser.add_argument("--profile", action="store_true",
                        help="run the CLI under cProfile; its top functions (by own time and by "
                        "cumulative time) go to the report's folder as paper-run.prof.txt")
    parser.add_argument("--work", type=Path, default=Path("/tmp/paper-run"))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "paper-run.md")
    args = parser.parse_args()
    started = time.time()
    data = generate(args.work / f"corpus-{args.pairs}", args.pairs)
    generated = time.time() - started
    every = max(1, args.steps // 6)
    stats = args.work / "cli.prof"
    profile = ["-m", "cProfile", "-o", str(stats)] if args.profile else []
    command = [sys.executable, *profile, "-m", "reproduce", "table2", "--variant", "base-en-de", "--scale",
               args.scale, "--results", str(args.work / "results"), "--set",
               f"data.data_dir={data}", f"train.train_steps={args.steps}",
               f"train.ckpt_every_steps={every}", "train.ckpt_every_minutes=0",
               f"train.val_every_steps={max(1, args.steps // 3)}", f"train.compile={args.compile}",
               f"train.batch_shapes={args.batch_shapes}",
               f"data.max_eval_pairs={args.eval_pairs}",
               *([f"train.device_batch_tokens={args.micro_batch}"] if args.micro_batch else []),
               *args.set]
    env = {**os.environ, "REPRODUCE_RUNS": str(args.work / "runs"),
           "REPRODUCE_CACHE": str(args.work / "cache"), "PYTHONUNBUFFERED": "1"}
    print(" ".join(command[1:]), flush=True)
    start = time.time()
    subprocess.run(command, env=env, check=True, cwd=ROOT)
    wall = time.time() - start
    if args.profile:
        write_profile(stats, args.out.with_name(args.out.stem + ".prof.txt"))
    [path] = (args.work / "results" / "table2").glob("*.json")
    record = json.loads(path.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(record, wall, generated, args, " ".join(command[1:])))
    # the record beside its report, with the command's wall clock (what plans price start-up by)
    record["command_seconds"] = round(wall, 1)
    if args.profile:  # its steps paid the profiler: GPU plans do not price from it
        record["profiled"] = True
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json').name}")


def write_profile(stats: Path, out: Path, top: int = 45) -> None:
    """The profile's heaviest functions, by their own time and by cumulative time, as text."""
    import io
    import pstats

    text = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(str(stats), stream=text).strip_dirs().sort_stats(key).print_stats(top)
    out.write_text(text.getvalue())


def _shapes(b: dict) -> str:
    """An epoch's batch shapes and their padding, where the record has them."""
    if "shapes_per_epoch" not in b:
        return ""
    return (f"; an epoch's batches in {b['shapes_per_epoch']} shapes, {b['padding_share']:.1%} of "
            "their positions (both sides) padding")


def _compiled(r: dict) -> str:
    """How the run trained: eager, or compiled (the fast path) with its graphs and recompiles."""
    if not r.get("compile"):
        return "eager"
    graphs = r.get("compile_choice", {}).get("in_training")
    return (f"compiled ({graphs['graphs']} graph(s), {graphs['recompiles']} recompile(s))"
            if graphs else "compiled")


def report(r: dict, wall: float, generated: float, args, command: str) -> str:
    m, b, p = r["metrics"], r["batch"], r["phases"]
    steps = m["train_steps"]
    tokens = b["measured_tgt_tokens_per_step"] * steps
    device = r["cost"]["device"]
    lines = [f"# A `{args.scale}`-scale run through the CLI: Table 2's base EN-DE on {device}", "",
             f"`python benchmarks/paper_run.py --pairs {args.pairs} --steps {args.steps} "
             f"--eval-pairs {args.eval_pairs} --scale {args.scale}"
             f"{f' --compile {args.compile}' if args.compile != 'off' else ''}"
             f"{f' --batch-shapes {args.batch_shapes}' if args.batch_shapes else ''}"
             f"{f' --micro-batch {args.micro_batch}' if args.micro_batch else ''}"
             f"{f' --set {chr(32).join(args.set)}' if args.set else ''}"
             f"{' --profile' if args.profile else ''}` ({r['finished_at']}, commit "
             f"{(r['commit'].get('sha') or '?')[:7]}): the generated corpus "
             f"({r['data']['train_pairs']:,} training pairs, {generated:.0f} s to write), then",
             "", f"    python -m reproduce {command.split(' reproduce ', 1)[-1]}", "",
             f"{steps} steps of {b['effective_tokens_per_step']} tokens ({b['devices']} device(s) x "
             f"{b['accumulate']} accumulated x {b['device_batch_tokens']}), {r['precision']}, "
             f"{len(r['averaged_checkpoints'])} checkpoints averaged, {_compiled(r)}; "
             f"{b.get('tgt_padding_share', 0):.1%} of the target positions padding"
             f"{_shapes(b)}.", "",
             "| phase | seconds |", "|---|---:|"]
    names = {"data": "data: files read, BPE trained, corpus encoded (an empty cache)",
             "fit": "fit: training steps and checkpoint saves", "average": "averaging",
             "dev_ppl": "dev and training-sample perplexity", "decode": "beam search, dev and test"}
    lines += [f"| {names.get(k, k)} | {v:.1f} |" for k, v in p.items()]
    lines += [f"| the command, start to end | {wall:.1f} |", "",
              f"Training: {r['metrics']['train_seconds']:.1f} s for {steps} steps, "
              f"{m['train_seconds'] / steps:.3f} s/step, {tokens / m['train_seconds']:.0f} target "
              f"tokens/s. Dev PPL {m['dev_ppl']}, dev BLEU {m['dev_bleu']} (a few hundred steps "
              "under warm-up: the speed is the point, not the score)."]
    late = steady_step(r["curve"]["train_loss"])
    if late is not None:
        lines += ["", f"The median step over the second half of the curve: {late:.3f} s (no "
                  "compiling, first-batch or warm-up cost in it; saves and dev loss fall between "
                  "logged points, which the median leaves out)."]
    lines += profiled_step(b.get("step_census", {}))
    if args.profile:
        lines += ["", "The command ran under cProfile (`--profile`): every phase carries its "
                  "overhead. Its heaviest functions: `paper-run.prof.txt` beside this page."]
    return "\n".join(lines) + "\n"


def profiled_step(census: dict) -> list[str]:
    """Where the record's profiled step went (``step_census``): the host's span, the device's busy
    time, the costliest kernels (GPU) or ops (CPU)."""
    if not census.get("top"):
        return []
    busy = census.get("device_ms")
    what = "kernel" if census["device"] == "cuda" else "op (own time)"
    return ["", f"Step {census['step']}, profiled (the record's `batch.step_census`): the host's "
            f"span {census['host_ms']:.1f} ms" + (f", the GPU busy {busy:.1f} ms of it "
                                                  f"({busy / census['host_ms']:.0%})" if busy else "")
            + f"; {census['kernels']} kernels, {census['host_waits']} host waits. The costliest:",
            "", f"| {what} | ms | calls |", "|---|---:|---:|",
            *(f"| `{name}` | {ms:.2f} | {calls} |" for name, ms, calls in census["top"])]


def steady_step(curve: list) -> float | None:
    """The median seconds per step between logged points ``[step, seconds, loss]`` of the second
    half of the run; None with under two such points."""
    late = curve[len(curve) // 2:]
    per = sorted((b[1] - a[1]) / (b[0] - a[0])
                 for a, b in zip(late, late[1:], strict=False) if b[0] > a[0])
    return per[len(per) // 2] if per else None


if __name__ == "__main__":
    main()
