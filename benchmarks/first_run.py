"""A first run on a WMT-sized corpus through the real CLI, with empty caches, then a later run:
what each costs outside training, for this checkout and for any other one (an older commit).

    python benchmarks/first_run.py --data /tmp/data-scale/corpus-4500000 \
        [--tree /path/to/other/checkout ...] [--work /tmp/first-run] [--out FILE.md]

Each run is ``python -m reproduce table3 --variant base`` of a one-variant spec on the local
corpus ``--data`` (made by ``benchmarks/data_scale.py``): the paper's vocabulary (37000) and batch
(25,000 tokens), the ``smoke`` model (widths / 16) for 10 steps, 20 evaluation pairs decoded to at
most 5 pieces past their source (an untrained model never stops early), W&B off. A *first* run
starts with the BPE model, the encoded corpus, the Hugging Face datasets cache and the runs folder
empty, so it reads the files, trains the vocabulary and encodes the corpus as a user's first run
does. This checkout then makes a *later* run: the same command on the caches its first run left
(runs and results emptied, so it trains again), as another variant or table would. Other trees
(``--tree``) make a first run only.

Reported per run: the command's wall clock, its training seconds (the record's
``metrics.train_seconds``) and the difference, everything outside training (start-up, reading, BPE,
encoding, evaluating 20 pairs); the record's ``phases`` where the tree writes them; peak RSS, and
the most private (anonymous) memory once the encoded corpus is mapped (training and evaluation:
the training step's own memory included; trees that map no cache get none). Runs go one after
another, in this checkout's virtual environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = "table: wmt-sized\nbase: {corpus: local-en-de}\nvariants: {base: {}}\n"
MAPPED = "training pairs mapped from"  # the log line once the encoded corpus is mapped
SETTINGS = ("data.max_train_pairs=0", "data.max_eval_pairs=20", "decode.max_len_offset=5",
            "model.vocab_size=37000", "train.batch_tokens=25000", "train.max_tokens_per_sentence=256",
            "train.train_steps=10")


def first_run(tree: Path, data: Path, work: Path, later: bool = False) -> dict:
    """One first run of ``tree`` on ``data`` with empty caches under ``work``; ``later``: a later
    run instead, on the caches the first one left there (its runs and results removed)."""
    for folder in ([work / "runs", work / "results"] if later else [work]):
        shutil.rmtree(folder, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "wmt.yaml"
    spec.write_text(SPEC)
    env = {**os.environ, "REPRODUCE_CACHE": str(work / "cache"), "REPRODUCE_RUNS": str(work / "runs"),
           "REPRODUCE_RESULTS": str(work / "results"), "HF_DATASETS_CACHE": str(work / "hf"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "reproduce", "table3", "--spec", str(spec), "--variant", "base",
               "--scale", "smoke", "--set", f"data.data_dir={data}", *SETTINGS]
    started = time.perf_counter()
    mapped_anon = 0  # the most private memory once the corpus is mapped: training, evaluation
    tree_peak = 0  # the most RSS of the command and all its descendants together, sampled
    log_path = work / ("log-later" if later else "log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # this child's own peak RSS
            if pid:
                break
            tree_peak = max(tree_peak, sum(_memory(p, "VmRSS") for p in _tree(proc.pid)))
            if MAPPED in log_path.read_text(errors="replace"):
                mapped_anon = max(mapped_anon, _memory(proc.pid, "RssAnon"))
            time.sleep(0.2)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{tree}: exit {os.waitstatus_to_exitcode(status)}; see {log_path}")
    record = json.loads(next((work / "results").rglob("wmt-sized-base-*.json")).read_text())
    train = record["metrics"]["train_seconds"]
    git = lambda *a: subprocess.run(["git", *a], cwd=tree, text=True,  # noqa: E731
                                    capture_output=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") + (" dirty" if git("status", "--porcelain",
                                                                       "--", "reproduce") else "")
    return {"tree": str(tree), "commit": commit, "run": "later" if later else "first",
            "wall_s": round(wall, 1),
            "train_s": train, "outside_training_s": round(wall - train, 1),
            "phases": record.get("phases"),
            "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2),
            "tree_peak_rss_gb": round(max(tree_peak, usage.ru_maxrss) / 1e6, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "private_once_mapped_gb": round(mapped_anon / 1e6, 1) if mapped_anon else None}


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _memory(pid: int, field: str) -> int:
    """A field of the process's /proc status in kB (RssAnon: its private memory), 0 once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a corpus folder (data_scale.py)")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="another checkout to run as well (repeatable)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/first-run"))
    parser.add_argument("--out", type=Path, help="write a Markdown report here")
    args = parser.parse_args()
    results = []
    runs = [(ROOT, 0, False), (ROOT, 0, True)]  # this checkout's first run, then a later one
    runs += [(tree, i, False) for i, tree in enumerate(args.tree, 1)]
    for tree, i, later in runs:
        result = first_run(tree.resolve(), args.data.resolve(), args.work / str(i), later)
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out:
        args.out.write_text(report(results, args))
        print(f"wrote {args.out}")


def report(results: list[dict], args) -> str:
    from reproduce.util.machine import cpu_name

    pairs = sum(1 for _ in open(args.data / "train.jsonl", "rb"))
    trees = " ".join(f"--tree {t}" for t in args.tree)
    lines = ["# A first run at WMT's size, through the CLI", "",
             f"Machine: {cpu_name()}, {os.cpu_count()} cores. Corpus: {pairs:,} training pairs "
             f"(`benchmarks/data_scale.py`'s). Command: `python benchmarks/first_run.py --data "
             f"{args.data} {trees}".rstrip() + f"` ({time.strftime('%Y-%m-%d')}; the script says "
             "what each run is). Seconds of wall clock; outside training = the command less its "
             "training seconds (start-up, reading, BPE, encoding, the evaluation of 20 pairs).",
             "Peak RSS: the command's process tree, its processes' RSS summed (sampled every "
             "0.2 s); CPU: the command's user and system seconds; data: the record's data phase "
             "(reading, BPE, encoding, mapping).",
             "", "| commit | run | command | training | outside training | data | CPU "
             "| peak RSS | private memory once mapped |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        mapped = r["private_once_mapped_gb"]
        data = (r.get("phases") or {}).get("data")
        lines.append(f"| {r['commit']} | {r['run']} | {r['wall_s']:.0f} s | {r['train_s']:.0f} s | "
                     f"{r['outside_training_s']:.0f} s | "
                     + (f"{data:.0f} s" if data is not None else "") + f" | {r['cpu_s']:.0f} s | "
                     f"{r['tree_peak_rss_gb']:.2f} GB | "
                     + (f"{mapped:.1f} GB" if mapped else "(no cache)") + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
