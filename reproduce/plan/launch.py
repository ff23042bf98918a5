"""Cluster runs: each planned run becomes one task of a SLURM job array, submitted with submitit.

``python -m reproduce table3 --row A --scale paper --launcher slurm`` submits the runs that have
no record yet; ``--dry-run`` prints the submission plan instead. Every task runs the same code path
as a local sweep (``runner.execute``): it claims its run, so tasks never duplicate one another or a
worker started by hand, and a task that dies leaves its run to be resumed by the next one (submit
the same command again, from cron or a CI schedule if you like: finished runs are skipped). A run
on several GPUs is one task per GPU on one node; Lightning reads the SLURM environment and
connects them (DDP).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from reproduce.runs.records import finished
from reproduce.runs.sweep import PlannedRun, load_spec, with_sets
from reproduce.train.devices import Layout
from reproduce.train.runner import execute
from reproduce.util.logs import quiet_libraries

# Resources per scale: GPUs and tasks per node, CPUs per task, memory, time limit. The paper's
# runs take 8 GPUs like the paper's (fewer GPUs accumulate to the same batch; --gpus to change).
RESOURCES = {
    "paper": {"gpus_per_node": 8, "tasks_per_node": 8, "cpus_per_task": 8, "mem_gb": 256,
              "timeout_min": 3 * 24 * 60},
    "cpu": {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 2, "mem_gb": 16,
            "timeout_min": 3 * 60},
    "smoke": {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 4,
              "timeout_min": 15},
}


# submitit is imported where it is used: only --launcher slurm needs it.


def resources(scale: str, gpus: int | None = None, train_steps: int | None = None) -> dict[str, Any]:
    res = dict(RESOURCES.get(scale, RESOURCES["cpu"]))
    if gpus is not None:
        res["gpus_per_node"], res["tasks_per_node"] = gpus, max(gpus, 1)
    if scale == "paper" and train_steps and train_steps > 100_000:  # big: 3x the steps
        res["timeout_min"] = min(res["timeout_min"] * 3, 14 * 24 * 60)
    return res


def run_one(spec_path: str, variant: str, scale: str, seed: int, split: str, command: str,
            devices: int = 1, sets: dict[str, Any] | None = None) -> str:
    """The body of one array task (one of ``devices`` tasks, one per device, on a multi-device run):
    plan the run afresh from the spec (with the command's ``--set`` values) and execute it."""

    quiet_libraries()
    spec = load_spec(spec_path)
    run = with_sets(spec.plan([variant], scale, [seed])[-1:], spec, sets or {})[0]
    if finished(run) is not None:
        return f"{run.run_id}: finished earlier"
    layout = Layout("gpu" if torch.cuda.is_available() else "cpu", devices)
    record = execute(run, split, command, layout=layout)
    if isinstance(record, str):  # not run now, and why
        return f"{run.run_id}: {record}"
    return f"{run.run_id}: recorded, dev PPL {record['metrics'].get('dev_ppl')}"


def plan_lines(runs: list[PlannedRun], gpus: int | None, partition: str | None) -> list[str]:
    lines = []
    for run in runs:
        res = resources(run.scale, gpus, run.config.train.train_steps)
        lines.append(
            f"{run.run_id}: {res['tasks_per_node']} task(s) x {res['cpus_per_task']} CPUs, "
            f"{res['gpus_per_node']} GPU(s), {res['mem_gb']} GB, {res['timeout_min']} min"
            + (f", partition {partition}" if partition else ""))
    return lines


def slurm_parameters(scale: str, runs: list[PlannedRun], gpus: int | None,
                     partition: str | None) -> dict[str, Any]:
    """submitit's SLURM parameters for these runs (one array; the largest run sets the time)."""
    steps = max(run.config.train.train_steps for run in runs)
    res = resources(scale, gpus, steps)
    params: dict[str, Any] = {
        "job_name": f"reproduce-{scale}", "time": res["timeout_min"], "nodes": 1,
        "ntasks_per_node": res["tasks_per_node"], "cpus_per_task": res["cpus_per_task"],
        "mem": f"{res['mem_gb']}GB", "array_parallelism": len(runs),
        # Lightning's SLURM support: one task per GPU, requeue-friendly signal before the limit.
        "signal_delay_s": 120,
    }
    if res["gpus_per_node"]:
        params["gpus_per_node"] = res["gpus_per_node"]
    if partition:
        params["partition"] = partition
    return params


def executor_for(folder: Path, scale: str, runs: list[PlannedRun], gpus: int | None,
                 partition: str | None, cluster: str = "slurm"):
    """A submitit executor with these runs' resources. ``cluster="local"`` runs the same jobs as
    local processes (the tests use it: there is no SLURM here)."""
    import submitit

    params = slurm_parameters(scale, runs, gpus, partition)
    if cluster == "local":
        executor = submitit.LocalExecutor(folder=folder / "%j")
        executor.update_parameters(timeout_min=params["time"])
        return executor
    executor = submitit.SlurmExecutor(folder=folder / "%j")
    executor.update_parameters(**{k: v for k, v in params.items()})
    return executor


def sbatch_script(folder: Path, scale: str, runs: list[PlannedRun], gpus: int | None,
                  partition: str | None) -> str:
    """The sbatch file submitit writes for these runs (for `--dry-run` and the tests)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(scale, runs, gpus, partition)
    params["map_count"] = len(runs)
    return _make_sbatch_string(command="python -u -m submitit.core._submit " + str(folder),
                               folder=folder / "%A_%a", **params)


def submit(executor, spec_path: str, runs: list[PlannedRun], split: str, command: str,
           gpus: int | None = None) -> list:
    """One job per run (an array on SLURM); returns the submitit jobs."""
    args = [(spec_path, r.variant, r.scale, r.seed, split, command,
             resources(r.scale, gpus, r.config.train.train_steps)["tasks_per_node"], r.sets)
            for r in runs]
    with executor.batch():
        jobs = [executor.submit(run_one, *a) for a in args]
    return jobs
