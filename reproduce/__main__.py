"""Command line: ``python -m reproduce table3 --row A`` (parse and dispatch only)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import devices, workers
from .errors import ConfigError
from .logs import quiet_libraries
from .records import DamagedRecords
from .sweep import load_spec

TABLES = {"table2": "Table 2: BLEU and training cost, base and big, EN-DE and EN-FR",
          "table3": "Table 3: variations on the architecture",
          "table4": "Table 4: English constituency parsing, WSJ section 23 F1"}


def _params(args: argparse.Namespace) -> None:
    from .cost import parameter_rows

    rows = parameter_rows(load_spec(args.table), args.vocab_size)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"Table 3 parameter counts at the paper's sizes, shared vocabulary {args.vocab_size} "
          "(tied source/target/softmax embedding; biases and LayerNorms included).")
    print("The paper's column fits a tied vocabulary of about 41000 better than 37000 "
          "(--vocab-size 41000 to compare).\n")
    header = f"{'variant':8} {'N':>2} {'d_model':>7} {'d_ff':>5} {'h':>3} {'d_k':>4} {'d_v':>4} "
    print(header + f"{'positions':>10} {'ours (M)':>9} {'paper (M)':>9}")
    for r in rows:
        paper = "" if r["paper_params_m"] is None else f"{r['paper_params_m']:>9}"
        print(f"{r['variant']:8} {r['N']:>2} {r['d_model']:>7} {r['d_ff']:>5} {r['h']:>3} "
              f"{r['d_k']:>4} {r['d_v']:>4} {r['positions']:>10} {r['params'] / 1e6:>9.1f} "
              f"{paper:>9}")


def _run_table(args: argparse.Namespace, argv: list[str]) -> None:
    from .machine import default_scale
    from .runner import planned_summary

    spec = load_spec(args.spec or args.table)
    scale = args.scale or default_scale()
    names = spec.select(args.row, args.variant)
    runs = spec.plan(names, scale, args.seeds)
    sc = spec.scale(scale)
    print(f"{spec.table}: {len(runs)} run(s) at scale `{scale}`"
          f"{'' if args.scale else ' (default for this machine; --scale to change)'}: {sc.about}")
    _overridden_line(spec, scale)
    for run in runs:
        print("  " + planned_summary(run, spec.variants[run.variant].overrides))
    tuning = spec.search_space(scale) if args.tune else None
    _train_and_render(args, argv, spec, runs, scale, tuning, _bleu_line, log=not args.dry_run)


def _overridden_line(spec, scale: str) -> None:
    """Say where the scale replaces a value the spec's base set (the record keeps both)."""
    if overridden := spec.scale_overrides(scale):
        print(f"  scale `{scale}` replaces the spec's base: " + ", ".join(
            f"{k} {v['spec']} -> {v['scale']}" for k, v in overridden.items())
            + " (a scale sets these for every run; recorded as scale_overrode)")


def _bleu_line(m: dict) -> str:
    return (f"dev PPL {m['dev_ppl']}, dev BLEU {m['dev_bleu']}, test BLEU {m['test_bleu']}, "
            f"{m['params'] / 1e6:.2f}M params, {m['train_seconds']:.0f} s training")


def _f1_line(m: dict) -> str:
    return (f"dev F1 {m['dev_f1']}, test F1 {m['test_f1']} (P {m['test_precision']}, R "
            f"{m['test_recall']}), dev PPL {m['dev_ppl']}, {m['params'] / 1e6:.2f}M params, "
            f"{m['train_seconds']:.0f} s training")


def _positive_or_auto(value: str) -> int | str:
    """``--workers``, ``--devices``: a positive number or ``auto``."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'auto', got {value!r}")
    return n


def _train_and_render(args: argparse.Namespace, argv: list[str], spec, runs, scale: str, tuning,
                      report, log: bool) -> None:
    """Train ``runs`` (tuned first with ``tuning``), here or in ``--workers`` processes, then render
    the table from the records; ``--render`` only renders, ``--dry-run`` only estimates and
    ``--launcher slurm`` submits instead."""
    from .records import results_dir
    from .runner import execute

    layout = devices.resolve(args.accelerator, args.devices, spec.scale(scale).devices)
    if args.render:
        if _render(spec, results_dir() / f"{spec.table}.md", log=log):
            raise DamagedRecords(f"{spec.table}: damaged record(s) set aside (above); the table "
                                 "shows the rest; the sweep command redoes their runs")
        return
    if args.launcher == "slurm":
        _submit(args, argv, spec, runs, scale)
        return
    elif args.dry_run:
        from .cost import estimate

        print(f"each run on {layout.describe()}; estimates from a measured training step on this "
              "machine (no data, no network):")
        from .records import plan_state

        for run in runs:
            state = plan_state(run)
            if state == "done":
                print(f"  {run.run_id}: done (its record is kept; not run again)")
                continue
            if state.startswith("redo: "):
                print(f"  {run.run_id}: will be redone: {state[6:]}")
            print("  " + estimate(run.run_id, run.config, layout.devices))
        return
    quiet_libraries()
    command = workers.command(argv)
    try:
        n = args.workers
        if n == "auto":
            n = 1 if layout.devices > 1 else workers.auto_count(runs, tuning=bool(tuning))
            if n > 1:
                print(f"--workers auto: {n} worker processes (one per core, at most one per "
                      "run; --workers 1 trains in this process)")
        if n > 1 and runs:
            if workers.launch(argv, runs, n, layout.devices):
                raise SystemExit(1)
            runs = []
        for run in workers.reorder(runs):
            extra = None
            if tuning:
                from .tuning import tune

                run, summary = tune(run, tuning, args.trials, args.storage, run.seed)
                extra = {"tuning": summary}
                print(f"{summary['study']}: best of {summary['n_trials']} trial(s): "
                      f"{summary['metric']} {summary['best_value']:.3f} with "
                      f"{summary['best_params']}")
            record = execute(run, spec.split, command, extra, layout)
            if record is None:
                print(f"{run.run_id}: another worker is training it")
                continue
            print(f"{run.run_id}: {report(record['metrics'])}")
    finally:
        if not workers.is_worker():  # workers leave the table to the process that started them
            _render(spec, results_dir() / f"{spec.table}.md", log=log)


def _render(spec, out, log: bool) -> list[str]:
    """Render ``out`` (and Tables 2-3's figures, logged to W&B with the table) from records;
    return a line per damaged record set aside (the rest are rendered)."""
    from .records import load_records, results_dir
    from .results import RENDERERS

    out.parent.mkdir(parents=True, exist_ok=True)
    render = RENDERERS.get(spec.table, RENDERERS["table3"])
    damaged: list[str] = []
    records = load_records(spec.table, results_dir(), damaged)
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    out.write_text(render(spec, records))
    print(f"rendered {out}" + (f" without {len(damaged)} damaged record(s)" if damaged else ""))
    if records and spec.table in ("table2", "table3"):
        from .plots import plot_table

        figures = plot_table(spec, records, results_dir())
        for path in figures:
            print(f"plotted {path}")
        if log:
            from .dashboard import log_table
            from .records import runs_dir

            where = log_table(spec, records, out, figures, runs_dir() / spec.table / "tables")
            print(f"logged the table to W&B ({where['mode']}, {where['dir']})")
    return damaged


def _publish(args: argparse.Namespace) -> int:
    """``publish``: the committed records of one table (and scale) as W&B runs (dashboard.py)."""
    from .dashboard import publish
    from .plots import plot_table
    from .records import load_records, results_dir, runs_dir

    quiet_libraries()
    spec = load_spec(args.table)
    damaged: list[str] = []
    records = [r for r in load_records(spec.table, results_dir(), damaged)
               if args.scale in (None, r["scale"])]
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    if not records:
        raise ConfigError(f"{spec.table}: no records" + (f" at scale {args.scale!r}"
                                                         if args.scale else "") + " to publish")
    markdown = results_dir() / f"{spec.table}.md"
    if not markdown.exists():
        _render(spec, markdown, log=False)
    figures = plot_table(spec, records, runs_dir() / spec.table / "published" / "figures") \
        if spec.table in ("table2", "table3") else []
    out = publish(spec, records, markdown, figures, runs_dir() / spec.table / "published")
    print(f"{spec.table}: {len(out['published'])} record(s) logged to W&B ({out['mode']}), "
          f"{len(out['unchanged'])} already published unchanged; table "
          + (f"logged ({out['table']['dir']})" if out["table"] else "unchanged"))
    if out["mode"] == "offline":
        print(f"  sync with: wandb sync {runs_dir() / spec.table / 'published' / 'wandb'}")
    return 1 if damaged else 0


def _run_table4(args: argparse.Namespace, argv: list[str]) -> None:
    """Table 4: the parser's rows, on the user's treebank or NLTK's sample, tuned or not."""
    from .data import missing_input
    from .machine import default_scale
    from .runner import planned_summary, with_data

    spec = load_spec(args.spec or args.table)
    scale = args.scale or default_scale()
    for flag, path, what in (("--treebank", args.treebank, "the Penn Treebank's parsed/mrg/wsj"),
                             ("--silver", args.silver, "bracketed trees, a file or a folder")):
        if path and not os.path.exists(path):
            raise ConfigError(f"{flag} {path!r}: no such file or folder ({what})")
    runs = [with_data(run, args.treebank, args.silver)
            for run in spec.plan(spec.select(args.row, args.variant), scale, args.seeds)]
    tuning = spec.search_space(scale) if args.tune else None
    if args.trials < 1:
        raise ConfigError(f"--trials {args.trials}: must be at least 1")
    if getattr(args, "launcher", "local") != "local":
        raise ConfigError(f"--launcher {args.launcher}: table4 runs locally only, for now")
    print(f"{spec.table}: {len(runs)} run(s) at scale `{scale}`"
          f"{'' if args.scale else ' (default for this machine; --scale to change)'}: "
          f"{spec.scale(scale).about}")
    _overridden_line(spec, scale)
    print("  data: " + (f"Penn Treebank WSJ at {args.treebank}" if args.treebank else
                        "NLTK's WSJ sample (NLTK_DATA); --treebank DIR for the full WSJ"))
    todo = []
    for run in runs:
        print("  " + planned_summary(run, spec.variants[run.variant].overrides))
        why = missing_input(run.config.data.corpus, run.config.data.extra_trees)
        if why:
            print(f"    not run: {why}")
        else:
            todo.append(run)
    if tuning:
        print(f"  tuning: {args.trials} more trial(s) per run, maximising {tuning.metric} on dev"
              if tuning.direction == "maximize" else
              f"  tuning: {args.trials} more trial(s) per run, minimising {tuning.metric} on dev")
        for knob in tuning.knobs.values():
            print(f"    {knob.name}: " + (f"one of {list(knob.choices)}" if knob.choices else
                                           f"{knob.low:g} .. {knob.high:g}"
                                           + (" (log scale)" if knob.log else "")))
    _train_and_render(args, argv, spec, todo, scale, tuning, _f1_line, log=False)


def _submit(args: argparse.Namespace, argv: list[str], spec, runs, scale: str) -> None:
    """--launcher slurm: one array task per run without a record (reproduce/launch.py)."""
    from . import launch
    from .records import finished, runs_dir

    todo = [run for run in runs if finished(run) is None]
    print(f"submission plan: {len(todo)} of {len(runs)} run(s) have no record; one SLURM array "
          "task each:")
    for line in launch.plan_lines(todo, args.gpus, args.partition):
        print("  " + line)
    if not todo:
        return
    if args.dry_run:
        script = launch.sbatch_script(runs_dir() / spec.table / "slurm", scale, todo, args.gpus,
                                      args.partition)
        print("sbatch header (submitit writes the rest):")
        for line in script.splitlines():
            if line.startswith("#SBATCH"):
                print("  " + line)
        return
    executor = launch.executor_for(runs_dir() / spec.table / "slurm", scale, todo, args.gpus,
                                   args.partition)
    jobs = launch.submit(executor, str(spec.path), todo, spec.split,
                         workers.command(argv), args.gpus)
    for run, job in zip(todo, jobs, strict=True):
        print(f"  {run.run_id}: job {job.job_id}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reproduce", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for table, about in TABLES.items():
        t = sub.add_parser(table, help=about)
        t.add_argument("--row", action="append", help="a row of the table (repeatable): "
                       "runs base and the row's variants")
        t.add_argument("--variant", action="append", help="one variant (repeatable)")
        t.add_argument("--scale", help="paper, cpu or smoke (default: fits this machine)")
        t.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default 0)")
        t.add_argument("--dry-run", action="store_true", help="print the plan and exit")
        t.add_argument("--render", action="store_true", help="train nothing: render "
                       f"results/{table}.md (and its figures) from the records there and exit")
        t.add_argument("--spec", help=f"a sweep spec file instead of sweeps/{table}.yaml")
        t.add_argument("--launcher", choices=["local", "slurm"], default="local",
                       help="local: train here, one run after another (default); slurm: submit "
                       "one job-array task per run with submitit")
        t.add_argument("--gpus", type=int, help="with --launcher slurm: GPUs per run (default: "
                       "by scale, 8 at `paper`)")
        t.add_argument("--partition", help="with --launcher slurm: the SLURM partition")
        t.add_argument("--workers", type=_positive_or_auto, default="auto", help="local: train with N "
                       "processes that split the cores (or one GPU each), runs balanced by "
                       "measured cost; auto (default): one per core on a CPU when two or more "
                       "runs have 1000+ steps left between them, else 1 (on a 2-core CPU 2 "
                       "trains a row ~1.3x faster)")
        t.add_argument("--devices", type=_positive_or_auto, help="devices one run trains on: "
                       "N (DDP over N GPUs, or N CPU processes with cores / N threads each, "
                       "gloo) or auto (every visible GPU; 1 on a CPU); default: the scale's "
                       "(`paper`: auto, else 1). The paper's batch is kept by accumulation")
        t.add_argument("--accelerator", choices=list(devices.ACCELERATORS), default="auto",
                       help="auto (default: GPU if torch sees one), cpu or gpu")
        t.set_defaults(table=table)
    t3 = sub.choices["table3"]
    t3.add_argument("--params", action="store_true",
                    help="print parameter counts of all variants at the paper's sizes and exit")
    t3.add_argument("--vocab-size", type=int, default=37000,
                    help="shared vocabulary for --params (default 37000, the paper's)")
    t3.add_argument("--json", action="store_true", help="with --params: print JSON")
    t4 = sub.choices["table4"]
    t4.add_argument("--treebank", help="the Penn Treebank's parsed/mrg/wsj (sections 02-23); "
                    "default: NLTK's WSJ sample, found through NLTK_DATA")
    t4.add_argument("--silver", help="bracketed trees (a file or folder) added to training for "
                    "the semi-supervised row; without them that row is not run")
    for table in TABLES:
        t = sub.choices[table]
        t.add_argument("--tune", action="store_true", help="tune the spec's nuisance settings "
                       "(`tune:`; never what a row varies) on the dev split with optuna first, "
                       "then run the best")
        t.add_argument("--trials", type=int, default=10, help="with --tune: trials to add to the "
                       "study (default 10); running again resumes the same study")
        t.add_argument("--storage", help="with --tune: an optuna storage URL shared by workers "
                       "(default: sqlite:///runs/optuna.db)")
    _bench_parser(sub)
    st = sub.add_parser("status", help="per table and scale: runs done, running, stopped and "
                        "missing, and the cost so far")
    st.add_argument("--all", action="store_true", help="also list the missing runs")
    pb = sub.add_parser("publish", help="log every committed record of a table as a W&B run "
                        "(config, curve, metrics, examples, cost) plus the table and figures; "
                        "idempotent; offline unless WANDB_API_KEY is set")
    pb.add_argument("--table", required=True, choices=sorted(TABLES))
    pb.add_argument("--scale", help="only the records of this scale")
    v = sub.add_parser("verify", help="re-run a record's run from nothing in a scratch folder and "
                       "compare every metric and hash with the record (reproduce/verify.py)")
    v.add_argument("record", help="a record, e.g. results/table3/table3-base-cpu-seed0.json")
    v.add_argument("--steps", type=int, help="train the first N steps only and compare the "
                   "learning curve there")
    v.add_argument("--scratch", help="the scratch folder (default: a new temporary one)")
    at = sub.add_parser("attention", help="attention maps of a trained run for one sentence "
                        "(results/attention-<run>.png), as the paper's Figures 3-5")
    at.add_argument("--run", required=True, help="a run id, e.g. table3-base-cpu-seed0")
    at.add_argument("--sentence", help="the English source sentence (default: John 1:1)")
    at.add_argument("--layer", type=int, help="encoder layer, 1-based (default: the next to last)")
    return parser


def _bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="training and decoding speed beside torch.nn.Transformer and "
                       "MarianMT, in one process (reproduce/bench.py)")
    b.add_argument("--quick", action="store_true", help="fewer batches and rounds (minutes)")
    b.add_argument("--gpu", action="store_true", help="one GPU with the paper's base and big: "
                   "step time, tokens/s, MFU, memory, projected hours -> results/gpu.md (on a "
                   "CPU: says so and checks the same code on a tiny model)")
    b.add_argument("--scales", nargs="+", default=["cpu", "paper"],
                   help="scales whose base config to measure (default: cpu paper)")
    b.add_argument("--data", choices=["bible", "synthetic"], default="bible",
                   help="training batches: Bible EN-DE (default) or random ids")
    b.add_argument("--checkpoint", help="trained `cpu`-scale base checkpoint: decode Bible dev "
                   "sentences with it instead of untrained weights on random sources")
    b.add_argument("--precision", default="auto", help="auto (default), 32-true or bf16-mixed")
    b.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    b.add_argument("--compile", action="store_true", help="add our model under torch.compile")
    b.add_argument("--no-lightning", action="store_true", help="skip the Lightning-loop contender")
    b.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides for every scale, e.g. N=2 (a quick look, or tests)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", default="results/performance.md", help="the report (Markdown)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_rank-run"] and len(argv) == 2:  # one rank of a multi-device run (devices.py)
        from .runner import run_here

        quiet_libraries()
        return devices.rank_main(argv[1], run_here)
    args = build_parser().parse_args(argv)
    from .errors import DataError

    try:
        if args.command == "status":
            from .records import results_dir, runs_dir
            from .status import report

            damaged: list[str] = []
            print(report(results_dir(), runs_dir(), verbose=args.all, damaged=damaged))
            for line in damaged:
                print(f"warning: {line}", file=sys.stderr)
            return 1 if damaged else 0
        if args.command == "publish":
            return _publish(args)
        if args.command == "verify":
            from pathlib import Path

            from .verify import verify

            quiet_libraries()
            return verify(Path(args.record), args.steps,
                          Path(args.scratch) if args.scratch else None)
        if args.command == "attention":
            from .attention import draw
            from .records import results_dir, runs_dir

            print(f"plotted {draw(args.run, args.sentence, args.layer, results_dir(), runs_dir())}")
            return 0
        if args.command == "bench" and args.gpu:
            from .gpu_check import run as check_gpu

            return check_gpu(out="results/gpu.md" if args.out == "results/performance.md"
                             else args.out)
        if args.command == "bench":
            from .bench import run

            return run(args, workers.command(argv))
        if getattr(args, "params", False):
            _params(args)
        elif args.command == "table4":
            _run_table4(args, argv)
        else:
            _run_table(args, argv)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (devices.RankFailure, DamagedRecords) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
