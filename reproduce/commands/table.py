"""``python -m reproduce table2|table3|table4``: plan a table's runs, train, evaluate and record
them (here, in worker processes, or as SLURM array tasks), and render the table from the records.
``--render`` only renders, ``--dry-run`` only plans, ``table3 --params`` counts parameters."""

from __future__ import annotations

import argparse
import os
import sys

from reproduce.commands.base import Command, add_results_option, positive_or_auto
from reproduce.config import ACCELERATORS


class Table(Command):
    """One of the paper's tables: its sweep spec's runs, then its page in ``results/``."""

    def __init__(self, name: str, about: str):
        self.name, self.help = name, about

    def add_arguments(self, t: argparse.ArgumentParser) -> None:
        t.add_argument("--row", action="append", help="a row of the table (repeatable): "
                       "runs base and the row's variants")
        t.add_argument("--variant", action="append", help="one variant (repeatable)")
        t.add_argument("--scale", help="a scale of sweeps/scales.yaml or of the spec: paper, "
                       "cpu, smoke, ... (default: fits this machine)")
        t.add_argument("--seeds", type=int, nargs="+", action="extend",
                       help="seeds (default 0)")
        t.add_argument("--dry-run", action="store_true", help="print the plan and what each run "
                       "should take, from counted FLOPs and a cached probe, and exit")
        t.add_argument("--on", help="with --dry-run: plan for other hardware, e.g. 8xH100, "
                       "A100, or cpu (this machine, the default); with --launcher slurm: the GPU "
                       "the nodes hold (e.g. H100): each run's time limit from its estimate")
        t.add_argument("--render", action="store_true", help="train nothing: render "
                       f"results/{self.name}.md (and its figures) from the records there and exit")
        t.add_argument("--spec", help=f"a sweep spec file instead of sweeps/{self.name}.yaml")
        t.add_argument("--launcher", choices=["local", "slurm"], default="local",
                       help="local: train on this machine (default; --workers says how many "
                       "processes); slurm: submit one job-array task per run with submitit")
        t.add_argument("--gpus-per-node", "--gpus", dest="gpus", type=int, help="with "
                       "--launcher slurm: GPUs (one task each) per node of a run (default: by "
                       "scale, 8 at `paper`)")
        t.add_argument("--nodes", type=int, default=1, help="with --launcher slurm: nodes one "
                       "run trains on (default 1); every node's tasks join one DDP run")
        t.add_argument("--partition", help="with --launcher slurm: the SLURM partition")
        t.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                       help="with --launcher slurm: an sbatch option for every array "
                       "(repeatable), e.g. time=24:00:00 mem=64G cpus-per-task=8 account=X "
                       "qos=Y constraint=a100; over the scale's defaults (docs/cluster.md)")
        t.add_argument("--workers", type=positive_or_auto, default="auto", help="local: train "
                       "with N processes that split the cores (or one GPU each), runs balanced "
                       "by measured cost; auto (default): one per core on a CPU when two or more "
                       "runs have 1000+ steps left between them, else 1 (on a 2-core CPU 2 "
                       "trains a row ~1.3x faster)")
        t.add_argument("--devices", type=positive_or_auto, help="devices one run trains on: "
                       "N (DDP over N GPUs, or N CPU processes with cores / N threads each, "
                       "gloo) or auto (every visible GPU; 1 on a CPU); default: the scale's "
                       "(`paper`: auto, else 1). The paper's batch is kept by accumulation")
        t.add_argument("--accelerator", choices=ACCELERATORS, default="auto",
                       help="auto (default: GPU if torch sees one), cpu or gpu")
        t.add_argument("--tune", action="store_true", help="tune the spec's nuisance settings "
                       "(`tune:`; never what a row varies) on the dev split with optuna first, "
                       "then run the best")
        t.add_argument("--trials", type=int, default=10, help="with --tune: trials to add to the "
                       "study (default 10, at least 1); running again resumes the same study")
        t.add_argument("--storage", help="with --tune: an optuna storage URL shared by workers, "
                       "or journal:PATH (optuna's journal file) (default: sqlite:///runs/optuna.db;"
                       " with --launcher slurm, journal:runs/optuna.journal)")
        t.add_argument("--set", nargs="+", action="extend", default=[],
                       metavar="SECTION.FIELD=VALUE",
                       help="config values for every run, over the spec and scale, e.g. "
                       "train.warmup_steps=8000 decode.beam=8, repeatable (checked as a spec is; "
                       "not what a chosen row varies); recorded. Needs --results DIR in a checkout")
        t.add_argument("--skip-disk-check", action="store_true", help="start runs even where "
                       "the free space is short of what their checkpoints need (the plan says "
                       "how much each needs)")
        add_results_option(t)

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.runs.disk import SKIP_ENV
        from reproduce.runs.sweep import load_spec, sets_line, with_sets

        if args.skip_disk_check:  # in the environment: workers and ranks see it too
            os.environ[SKIP_ENV] = "1"
        from reproduce.util.machine import default_scale

        spec = load_spec(args.spec or self.name, kind=self.name)
        scale = args.scale or default_scale()
        sets = _sets(args.set)
        runs = self.planned(spec, scale, args)
        set_line = sets_line(runs, sets) if sets else ""
        runs = with_sets(runs, spec, sets)
        _check_cluster_options(args)
        tuning = spec.search_space(scale) if args.tune else None
        if tuning:
            from reproduce.train.tuning import check_trials
            check_trials(args.trials)
        print(f"{spec.table}: {len(runs)} run(s) at scale `{scale}`"
              f"{'' if args.scale else ' (default for this machine; --scale to change)'}: "
              f"{spec.scale(scale).about}")
        _overridden_line(spec, scale)
        if set_line:
            print(set_line)
        todo = self.announce(spec, runs, args, tuning)
        return 1 if _train_and_render(args, argv, spec, todo, scale, tuning, self.report) else 0

    def planned(self, spec, scale: str, args: argparse.Namespace) -> list:
        return spec.plan(spec.select(args.row, args.variant, scale), scale,
                         list(dict.fromkeys(args.seeds or [0])))

    def announce(self, spec, runs: list, args: argparse.Namespace, tuning) -> list:
        """Print each planned run; return those to run."""
        from reproduce.runs.sweep import planned_summary

        for run in runs:
            print("  " + planned_summary(run, spec.variants[run.variant].overrides))
        return runs

    @staticmethod
    def report(m: dict) -> str:
        """A finished run's line: its headline metrics."""
        return (f"dev PPL {m['dev_ppl']}, dev BLEU {m['dev_bleu']}, test BLEU {m['test_bleu']}, "
                f"{m['params'] / 1e6:.2f}M params, {m['train_seconds']:.0f} s training")


class Table3(Table):
    """Table 3, which can also count every variant's parameters at the paper's sizes."""

    def add_arguments(self, t: argparse.ArgumentParser) -> None:
        super().add_arguments(t)
        t.add_argument("--params", action="store_true",
                       help="print parameter counts of all variants at the paper's sizes and exit")
        t.add_argument("--vocab-size", type=int, default=37000,
                       help="shared vocabulary for --params (default 37000, the paper's)")
        t.add_argument("--json", action="store_true", help="with --params: print JSON")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        if args.params:
            _print_params(self.name, args.vocab_size, args.json)
            return 0
        return super().run(args, argv)


class Table4(Table):
    """Table 4: the parser's rows, on the user's treebank or NLTK's sample, tuned or not."""

    def add_arguments(self, t: argparse.ArgumentParser) -> None:
        super().add_arguments(t)
        t.add_argument("--treebank", help="the Penn Treebank's parsed/mrg/wsj (sections 02-23); "
                       "default: NLTK's WSJ sample, found through NLTK_DATA")
        t.add_argument("--silver", help="bracketed trees (a file or folder) added to training for "
                       "the semi-supervised row; without them that row is not run")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.errors import ConfigError

        for flag, path, what in (("--treebank", args.treebank, "the Penn Treebank's parsed/mrg/wsj"),
                                 ("--silver", args.silver, "bracketed trees, a file or a folder")):
            if path and not os.path.exists(path):
                raise ConfigError(f"{flag} {path!r}: no such file or folder ({what})")
        if args.launcher != "local":
            raise ConfigError(f"--launcher {args.launcher}: table4 runs locally only, for now")
        return super().run(args, argv)

    def planned(self, spec, scale: str, args: argparse.Namespace) -> list:
        from reproduce.runs.sweep import with_data

        return [with_data(run, args.treebank, args.silver)
                for run in super().planned(spec, scale, args)]

    def announce(self, spec, runs: list, args: argparse.Namespace, tuning) -> list:
        from reproduce.data import missing_input
        from reproduce.runs.sweep import planned_summary

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
            goal = "maximising" if tuning.direction == "maximize" else "minimising"
            print(f"  tuning: {args.trials} more trial(s) per run, {goal} {tuning.metric} on dev")
            for knob in tuning.knobs.values():
                print(f"    {knob.name}: " + (f"one of {list(knob.choices)}" if knob.choices else
                                               f"{knob.low:g} .. {knob.high:g}"
                                               + (" (log scale)" if knob.log else "")))
        return todo

    @staticmethod
    def report(m: dict) -> str:
        return (f"dev F1 {m['dev_f1']}, test F1 {m['test_f1']} (P {m['test_precision']}, R "
                f"{m['test_recall']}), dev PPL {m['dev_ppl']}, {m['params'] / 1e6:.2f}M params, "
                f"{m['train_seconds']:.0f} s training")


def _sets(items: list[str]) -> dict:
    """``--set``, parsed and checked; refused where its records would land among the project's
    own (a checkout's results/): a run with other settings is another run."""
    from reproduce import paths
    from reproduce.config import parse_sets
    from reproduce.errors import ConfigError

    sets = parse_sets(items)
    if sets and paths.REPO is not None and paths.results_dir() == paths.REPO / "results":
        raise ConfigError("--set changes what the runs are: keep their records apart from the "
                          "project's with --results DIR (e.g. --results my-results)")
    return sets


def _print_params(table: str, vocab_size: int, as_json: bool) -> None:
    import json

    from reproduce.runs.sweep import load_spec
    from reproduce.tables.params import parameter_rows

    rows = parameter_rows(load_spec(table), vocab_size)
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    print(f"Table 3 parameter counts at the paper's sizes, shared vocabulary {vocab_size} "
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


def _overridden_line(spec, scale: str) -> None:
    """Say where the scale replaces a value the spec's base set (the record keeps both)."""
    if overridden := spec.scale_overrides(scale):
        print(f"  scale `{scale}` replaces the spec's base: " + ", ".join(
            f"{k} {v['spec']} -> {v['scale']}" for k, v in overridden.items())
            + " (a scale sets these for every run; recorded as scale_overrode)")


def _train_and_render(args: argparse.Namespace, argv: list[str], spec, runs: list, scale: str,
                      tuning, report) -> bool:
    """Train ``runs`` (tuned first with ``tuning``), here or in ``--workers`` processes, then render
    the table from the records; ``--render`` only renders, ``--dry-run`` only estimates and
    ``--launcher slurm`` submits instead. Whether a run failed (diverged)."""
    from reproduce.errors import DamagedRecords
    from reproduce.paths import results_dir
    from reproduce.tables.render import render
    from reproduce.train import devices

    layout = devices.resolve(args.accelerator, args.devices, spec.scale(scale).devices)
    out = results_dir() / f"{spec.table}.md"
    log = not args.dry_run  # the rendered table to W&B (with its figures; Table 4 has none)
    if args.render:
        if render(spec, out, log=log):
            raise DamagedRecords(f"{spec.table}: damaged record(s) set aside (above); the table "
                                 "shows the rest; the sweep command redoes their runs")
        return False
    if args.launcher == "slurm":
        _submit(args, argv, spec, runs, scale, args.trials if tuning else 0)
        return False
    if args.dry_run:
        from reproduce.plan.dry_run import print_plan
        print_plan(spec, runs, layout, args.on, args.devices, args.workers)
        return False
    from reproduce.plan import workers
    from reproduce.runs.records import plan_state, recorded_command
    from reproduce.train import runner
    from reproduce.train.tuning import tune
    from reproduce.util.logs import quiet_libraries
    from reproduce.util.tracking import init_timeout, wandb_mode

    quiet_libraries()
    _check_writable()
    if wandb_mode() == "online":
        init_timeout()  # a bad WANDB_INIT_TIMEOUT is found now, not when the first run logs
    command = recorded_command(argv)
    planned = list(runs)  # workers take runs over; the closing lines speak of all of them
    failed = False
    recorded = bool(runs) and all(plan_state(run) == "done" for run in runs)
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
            outcome = runner.execute(run, spec.split, command, extra, layout)
            if outcome.record is None:  # not run now, and why
                print(f"{run.run_id}: {outcome.why}")
                failed |= outcome.failed
                continue
            print(f"{run.run_id}: {report(outcome.record['metrics'])}")
    except BaseException:
        if not workers.is_worker():
            _render_after_failure(spec, out, log)
        raise  # the run's failure is what the command reports and exits with
    if not workers.is_worker():  # workers leave the table to the process that started them
        render(spec, out, log=log)
    if recorded and not workers.is_worker():
        _nothing_trained(spec, planned, argv)
    return failed


def _check_writable() -> None:
    """Refuse to train, in one line, where the records or the checkpoints could not be written:
    found now, not after the hours of training before the first write."""
    from reproduce.errors import ConfigError
    from reproduce.paths import results_dir, runs_dir
    from reproduce.util.files import writable

    for what, folder, how in (("results", results_dir(), "--results DIR writes them elsewhere"),
                              ("runs", runs_dir(), "REPRODUCE_RUNS=DIR puts them elsewhere")):
        if (error := writable(folder)) is not None:
            raise ConfigError(f"the {what} folder {folder} is not writable: {error.strerror} "
                              f"(nothing was trained; {how})")


def _render_after_failure(spec, out, log: bool) -> None:
    """Render what the records hold after a run failed; a failure here is one warning line, never
    the error the command reports (that is the run's)."""
    from reproduce.tables.render import render

    try:
        render(spec, out, log=log)
    except Exception as exc:  # noqa: BLE001 - reported, and the run's error re-raised by the caller
        print(f"warning: {spec.table}: the table was not rendered either ({type(exc).__name__}:"
              f" {exc})", file=sys.stderr)


def _check_cluster_options(args: argparse.Namespace) -> None:
    """The cluster's options mean nothing to a local sweep: one line, not silently ignored."""
    from reproduce.errors import ConfigError

    given = [name for name, value in (("--slurm", args.slurm), ("--partition", args.partition),
                                      ("--nodes", args.nodes != 1),
                                      ("--gpus-per-node", args.gpus is not None)) if value]
    if given and args.launcher != "slurm":
        raise ConfigError(f"{', '.join(given)}: for --launcher slurm only (a local sweep trains "
                          "on this machine: --devices and --workers say how)")
    if args.on and args.launcher != "slurm" and not args.dry_run:
        raise ConfigError(f"--on {args.on}: a local sweep trains on this machine; --on plans for "
                          "other hardware with --dry-run, or sizes time limits with --launcher "
                          "slurm")


def _submit(args: argparse.Namespace, argv: list[str], spec, runs: list, scale: str,
            trials: int = 0) -> None:
    """--launcher slurm: one array task per run without a record and without a task in the queue
    (reproduce/plan/launch.py; queue.py), one array per resource set. ``trials`` (``--tune``):
    first an array of that many trial tasks per run, side by side in the run's study; then the
    run's own task, once they have all ended, trains the best settings, as a local sweep does."""
    from reproduce.errors import ConfigError
    from reproduce.paths import runs_dir
    from reproduce.plan import launch, queue
    from reproduce.runs.records import recorded_command
    from reproduce.util.secrets import mask

    if args.nodes < 1 or (args.gpus is not None and args.gpus < 0):
        raise ConfigError(f"--nodes {args.nodes} --gpus-per-node {args.gpus}: nodes must be 1 or "
                          "more and GPUs per node 0 or more")
    cluster = launch.Cluster(args.nodes, args.gpus, args.partition, launch.parse_options(args.slurm),
                             args.on, launch.partition_minutes(args.partition))
    folder = runs_dir() / spec.table / "slurm"
    todo = _runs_to_submit(runs, queue.tasks(folder), tuned=bool(trials))
    wide = {r.run_id: n for r in todo if trials and (n := launch.tasks_per_run(r, cluster)) > 1}
    if wide:
        run_id, n = next(iter(wide.items()))
        raise ConfigError(f"--tune with --launcher slurm: a trial trains in one task, and {run_id}"
                          f" takes {n} (--nodes x --gpus-per-node); tune with --gpus-per-node 1 "
                          "(the batch is kept by accumulation), or locally")
    groups = launch.arrays(todo, cluster)
    if not todo:
        print(f"submission plan: none of the {len(runs)} run(s) needs a task (each has a record "
              "or a task in the queue): nothing to submit")
        return
    print(f"submission plan: {len(todo)} of {len(runs)} run(s) have no record and no task in the "
          f"queue; one SLURM array task each, in {len(groups)} array(s)"
          + (f", each after an array of {trials} trial task(s) per run (--tune)" if trials else "")
          + ":")
    for line in launch.plan_lines(todo, cluster):
        print("  " + line)
    if args.dry_run:
        for group in groups:
            headers = [(group, "run", None)] if not trials else [
                ([r for r in group for _ in range(trials)], "trial", None),
                (group, "best", "TRIALS_JOB_ID")]
            for members, role, after in headers:
                script = launch.sbatch_script(folder, scale, members, cluster, role, after)
                print(f"sbatch header of the array of {', '.join(r.run_id for r in group)}"
                      + (f" ({trials} trial task(s) each)" if role == "trial" else "")
                      + " (submitit writes the rest):")
                print("\n".join("  " + line for line in script.splitlines()
                                if line.startswith("#SBATCH")))
        return
    if trials:
        from reproduce.train.tuning import STORAGE_ENV, cluster_storage

        # the storage reaches the tasks in their environment (sbatch passes it on), so a
        # password in it is never written into submitit's folders
        os.environ[STORAGE_ENV] = args.storage or cluster_storage()
        print(f"--tune: {trials} trial task(s) per run, side by side, then each run's task trains "
              f"the best settings; studies in {mask(os.environ[STORAGE_ENV])}")
    done = 0
    arrays: list[str] = []
    for group in groups:
        after = None
        if trials:
            members = [r for r in group for _ in range(trials)]
            jobs = _submit_array(folder, scale, members, cluster, "trial", None, spec,
                                 recorded_command(argv), done)
            queue.record_submission(folder, members, jobs, trial=True)
            after = str(jobs[0].job_id).split("_")[0]
            print(f"  trials of {', '.join(r.run_id for r in group)}: job {after} "
                  f"({len(jobs)} task(s))")
        jobs = _submit_array(folder, scale, group, cluster, "best" if trials else "run", after,
                             spec, recorded_command(argv), done)
        queue.record_submission(folder, group, jobs)
        done += len(group)
        arrays += [a for a in (after, str(jobs[0].job_id).split("_")[0]) if a]
        for run, job in zip(group, jobs, strict=True):
            print(f"  {run.run_id}: job {job.job_id}" + (f" (after job {after})" if after else ""))
    _render_after(folder, spec, arrays, cluster)
    _after_submission(folder)


def _render_after(folder, spec, arrays: list[str], cluster) -> None:
    """The render job: the table once every array task has ended (or one line: render by hand)."""
    from reproduce.paths import results_dir
    from reproduce.plan import launch

    out = results_dir() / f"{spec.table}.md"
    try:
        job = launch.submit_render(launch.render_executor(folder, spec.table, arrays, cluster),
                                   render_job, str(spec.path))
    except launch.Refused as e:  # the runs are in; the table is one command away
        print(f"  {spec.table}: no render job ({e}); once the tasks end: python -m reproduce "
              f"{spec.table} --render")
        return
    print(f"  {spec.table}: job {job.job_id} renders {out} once every task above has ended")


def _runs_to_submit(runs: list, submitted: dict, tuned: bool) -> list:
    """The runs that need a task: no record (any, with ``--tune``: more trials) and no task of
    theirs queued or running; a line for each that is skipped, or whose last task failed."""
    from reproduce.runs.records import finished

    todo = []
    for run in (run for run in runs if tuned or finished(run) is None):
        task = submitted.get(run.run_id)
        if task is not None and (task.queued or task.running):
            print(f"  {run.run_id}: job {task.job_id} is {str(task.state).lower()}; not submitted "
                  "again")
            continue
        if task is not None and task.ended:
            print(f"  {run.run_id}: its last task, job {task.job_id}, ended"
                  + (f" {task.ending()}" if task.ending() else "")
                  + f" without a record ({task.last_words()}; log {task.stderr})")
        todo.append(run)
    return todo


def _submit_array(folder, scale: str, runs: list, cluster, role: str, after: str | None, spec,
                  command: str, done: int) -> list:
    """One array of ``runs``' tasks (``launch.ROLES``); sbatch's refusal as one line that says
    what earlier arrays of this command (``done`` runs) had already submitted."""
    from reproduce.errors import ConfigError
    from reproduce.plan import launch

    executor = launch.executor_for(folder, scale, runs, cluster, role, after)
    try:
        return launch.submit(executor, str(spec.path), runs, spec.split, command, cluster, role)
    except launch.Refused as e:
        trials = ("its runs' trial tasks were submitted (they add trials to the studies), not "
                  "the runs' own tasks" if role == "best" else "")
        earlier = f"{done} run(s) were submitted before it, the rest were not" if done else ""
        raise ConfigError(
            f"sbatch refused the array ({e}); "
            + ("; ".join(part for part in (trials, earlier) if part) or "nothing was submitted")
            + ". Check --partition, --gpus-per-node (0 on a partition without GPUs), --nodes "
            "and --slurm against `sinfo`") from None


def render_job(spec_path: str) -> str:
    """The render job's body, on a node: the table from the records there are (as ``--render``),
    once the arrays it waits on have ended, however they ended."""
    from reproduce.paths import results_dir
    from reproduce.runs.sweep import load_spec
    from reproduce.tables.render import render
    from reproduce.util.logs import quiet_libraries

    quiet_libraries()
    spec = load_spec(spec_path)
    out = results_dir() / f"{spec.table}.md"
    render(spec, out, log=True)
    print(f"rendered {out}", flush=True)
    return str(out)


def _after_submission(folder) -> None:
    """Where the tasks' logs and W&B files go, and how to follow them."""
    from reproduce.util.tracking import wandb_mode

    print(f"logs: {folder}/<job>/; `python -m reproduce status` shows the queued, running and "
          "failed tasks")
    if wandb_mode() == "offline":
        print("W&B: the tasks log offline (no WANDB_API_KEY set; compute nodes often have no "
              f"internet); to upload, from a login node: wandb sync {folder.parent}/*/wandb/"
              "offline-run-*")


def _nothing_trained(spec, runs: list, argv: list[str]) -> None:
    """The last lines of a command whose runs all had records: say so, and how to train them
    yourself (a fresh clone holds the project's committed records) or re-run one and compare."""
    from reproduce.paths import results_dir
    from reproduce.runs.records import record_path

    folder = os.path.relpath(results_dir())
    print(f"All {len(runs)} run(s) already had a record in {folder}/: nothing was trained "
          "(a fresh clone holds the project's committed records; a record is never redone).")
    if "--results" not in argv:
        print("  to train them yourself, beside ours: python -m reproduce "
              + " ".join(argv + ["--results", "my-results"]))
    example = os.path.relpath(record_path(runs[0]))
    print(f"  to re-run one from nothing and compare with its record: python -m reproduce verify "
          f"{example}")
