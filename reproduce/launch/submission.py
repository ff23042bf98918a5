"""``--launcher slurm`` from the login node: which runs need a task (no record, none queued or
running: ``queue``), one array per resource set (``slurm``), with ``--tune`` an array of trial
tasks before each, and the render job that writes the table once the arrays have ended."""

from __future__ import annotations

import os
import time

from reproduce.launch import queue, slurm
from reproduce.launch.options import Options
from reproduce.launch.render_job import render_job


def submit_sweep(options: Options, argv: list[str], spec, runs: list, scale: str,
                 trials: int = 0) -> None:
    """--launcher slurm: one array task per run without a record and without a task in the queue
    (``launch/slurm.py``; ``queue.py``), one array per resource set. ``trials`` (``--tune``):
    first an array of that many trial tasks per run, side by side in the run's study; then the
    run's own task, once they have all ended, trains the best settings, as a local sweep does."""
    from reproduce.errors import ConfigError
    from reproduce.paths import runs_dir
    from reproduce.records.store import recorded_command
    from reproduce.util.secrets import mask

    if options.nodes < 1 or (options.gpus is not None and options.gpus < 0):
        raise ConfigError(f"--nodes {options.nodes} --gpus-per-node {options.gpus}: nodes must be "
                          "1 or more and GPUs per node 0 or more")
    cluster = slurm.Cluster(options.nodes, options.gpus, options.partition,
                            slurm.parse_options(list(options.slurm)), options.on,
                            slurm.partition_minutes(options.partition))
    folder = runs_dir() / spec.table / "slurm"
    todo = _runs_to_submit(runs, queue.tasks(folder), tuned=bool(trials))
    wide = {r.run_id: n for r in todo if trials and (n := slurm.tasks_per_run(r, cluster)) > 1}
    if wide:
        run_id, n = next(iter(wide.items()))
        raise ConfigError(f"--tune with --launcher slurm: a trial trains in one task, and {run_id}"
                          f" takes {n} (--nodes x --gpus-per-node); tune with --gpus-per-node 1 "
                          "(the batch is kept by accumulation), or locally")
    groups = slurm.arrays(todo, cluster)
    # the time: a scheduled sweep's log (docs/cluster.md: cron) tells its firings apart
    now = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    if not todo:
        print(f"submission plan, {now}: none of the {len(runs)} run(s) needs a task (each has a "
              "record or a task in the queue): nothing to submit")
        return
    print(f"submission plan, {now}: {len(todo)} of {len(runs)} run(s) have no record and no task in the "
          f"queue; one SLURM array task each, in {len(groups)} array(s)"
          + (f", each after an array of {trials} trial task(s) per run (--tune)" if trials else "")
          + ":")
    for line in slurm.plan_lines(todo, cluster):
        print("  " + line)
    if options.dry_run:
        for group in groups:
            headers = [(group, "run", None)] if not trials else [
                ([r for r in group for _ in range(trials)], "trial", None),
                (group, "best", "TRIALS_JOB_ID")]
            for members, role, after in headers:
                script = slurm.sbatch_script(folder, scale, members, cluster, role, after)
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
        os.environ[STORAGE_ENV] = options.storage or cluster_storage()
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

    out = results_dir() / f"{spec.table}.md"
    try:
        job = slurm.submit_render(slurm.render_executor(folder, spec.table, arrays, cluster),
                                   render_job, str(spec.path))
    except slurm.Refused as e:  # the runs are in; the table is one command away
        print(f"  {spec.table}: no render job ({e}); once the tasks end: python -m reproduce "
              f"{spec.table} --render")
        return
    print(f"  {spec.table}: job {job.job_id} renders {out} once every task above has ended")


def _runs_to_submit(runs: list, submitted: dict, tuned: bool) -> list:
    """The runs that need a task: no record (any, with ``--tune``: more trials) and no task of
    theirs queued or running; a line for each that is skipped, or whose last task failed."""
    from reproduce.records.store import finished

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
    """One array of ``runs``' tasks (``slurm.ROLES``); sbatch's refusal as one line that says
    what earlier arrays of this command (``done`` runs) had already submitted."""
    from reproduce.errors import ConfigError

    executor = slurm.executor_for(folder, scale, runs, cluster, role, after)
    try:
        return slurm.submit(executor, str(spec.path), runs, spec.split, command, cluster, role)
    except slurm.Refused as e:
        trials = ("its runs' trial tasks were submitted (they add trials to the studies), not "
                  "the runs' own tasks" if role == "best" else "")
        earlier = f"{done} run(s) were submitted before it, the rest were not" if done else ""
        raise ConfigError(
            f"sbatch refused the array ({e}); "
            + ("; ".join(part for part in (trials, earlier) if part) or "nothing was submitted")
            + ". Check --partition, --gpus-per-node (0 on a partition without GPUs), --nodes "
            "and --slurm against `sinfo`") from None


def _after_submission(folder) -> None:
    """Where the tasks' logs and W&B files go, and how to follow them."""
    from reproduce.util.tracking import wandb_mode

    print(f"logs: {folder}/<job>/; `python -m reproduce status` shows the queued, running and "
          "failed tasks")
    if wandb_mode() == "offline":
        print("W&B: the tasks log offline (no WANDB_API_KEY set; compute nodes often have no "
              f"internet); to upload, from a login node: wandb sync {folder.parent}/*/wandb/"
              "offline-run-*")
