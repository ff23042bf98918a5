"""How far GPU plans are from the runs through the CLI that a GPU made, phase by phase.

    python benchmarks/plan_check.py [--out results/plan-check.md]

For each record of a run through the CLI on a GPU beside the tables in ``results/``
(``paper-run*.json``, written by ``benchmarks/paper_run.py``), ``plan.gpu_prices.check`` plans the
same run (its config, steps and corpus size, on its GPU, from the GPU measurement the project
keeps) and the report puts each phase's planned seconds beside what the run took. Nothing is run:
it reads records. Rerun it whenever a GPU measurement or the pricing changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from reproduce.config import Config  # noqa: E402 - the checkout's package
from reproduce.plan import gpu_prices  # noqa: E402


def report(results: Path) -> str:
    measured = gpu_prices.Measured.load(results)
    lines = ["# GPU plans against the runs through the CLI", "",
             "`python benchmarks/plan_check.py`: each run planned by `--dry-run --on <its GPU>` "
             "for its own config, steps and corpus size, beside what it took (seconds).", "",
             f"The plans price from {measured.source if measured else 'nothing (no GPU measured)'}"
             ". A run that the plan was made from checks how the phases are read and added up, "
             "not how the plan predicts; a run made under a profiler pays its overhead on every "
             "host-bound step.", ""]
    for path in sorted(results.glob("paper-run*.json"), key=lambda p: p.name != gpu_prices.CLI_RUN):
        record = json.loads(path.read_text())
        if not record.get("hardware", {}).get("gpus"):
            continue
        unit, every = Config.from_dict(record["config"]).train.save_interval()
        val = record["config"]["train"]["val_every_steps"]
        lines += [f"## {path.name}", "",
                  f"{record['metrics']['train_steps']} steps on {record['hardware']['gpus'][0]}, "
                  f"a save every {every:g} {unit}, "
                  + (f"a dev evaluation every {val} steps, " if val else "")
                  + f"{record['data']['train_pairs']:,} training pairs; "
                  f"commit {record['commit']['sha'][:7]}, {record['finished_at'][:10]}"
                  + (", under cProfile" if "profiled" in path.name else "")
                  + ("; the plan is made from this run" if path.name == gpu_prices.CLI_RUN
                     else "") + ".", "",
                  "| phase | planned | took | error |", "|---|---:|---:|---:|"]
        for phase, (planned, took) in gpu_prices.check(record, results).items():
            error = f"{(planned - took) / took:+.0%}" if took else "-"
            lines.append(f"| {phase} | {planned:.1f} | {took:.1f} | {error} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "plan-check.md")
    args = parser.parse_args()
    args.out.write_text(report(args.results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
