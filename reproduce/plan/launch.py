"""Cluster runs: each planned run becomes one task of a SLURM job array, submitted with submitit.

``python -m reproduce table3 --row A --scale paper --launcher slurm`` submits the runs that have
no record yet; ``--dry-run`` prints the submission plan instead. Every task runs the same code path
as a local sweep (``runner.execute``): it claims its run, so tasks never duplicate one another or a
worker started by hand, and a task that dies leaves its run to be resumed by the next one (submit
the same command again, from cron or a CI schedule if you like: finished runs are skipped). A run
on several GPUs is one SLURM task per GPU, on one node or on ``--nodes N``; Lightning reads the
SLURM environment and connects them (DDP), and rank 0 decides for all (``devices.Decision``).

Preemption has one owner, here. SLURM sends USR2 ahead of the time limit (submitit's
``--signal``): every task saves a checkpoint at the step it is at (``callbacks.SaveOnStop``, the ranks
agreeing on the step), rank 0 requeues the job through ``scontrol requeue`` (submitit's job id)
and the tasks exit; the requeued job resumes from that checkpoint. SIGTERM (``scancel``, a node
going away) saves the same way and exits without requeueing. Lightning's own requeue on USR1 is
off (``devices.cluster_plugins``).
"""

from __future__ import annotations

import logging
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reproduce.errors import ConfigError, Stopped
from reproduce.runs.records import finished
from reproduce.runs.sweep import PlannedRun, load_spec, with_sets
from reproduce.train.devices import Layout
from reproduce.train.runner import execute
from reproduce.util.logs import quiet_libraries

log = logging.getLogger("reproduce")

# Resources per scale: GPUs and tasks per node, CPUs per task, memory, time limit. The paper's
# runs take 8 GPUs like the paper's (fewer GPUs accumulate to the same batch; --gpus-per-node to change).
RESOURCES = {
    "paper": {"gpus_per_node": 8, "tasks_per_node": 8, "cpus_per_task": 8, "mem_gb": 256,
              "timeout_min": 3 * 24 * 60},
    "cpu": {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 2, "mem_gb": 16,
            "timeout_min": 3 * 60},
    "smoke": {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 1, "mem_gb": 4,
              "timeout_min": 15},
}


# submitit is imported where it is used: only --launcher slurm needs it.


@dataclass(frozen=True)
class Cluster:
    """What ``--launcher slurm`` asks of the cluster: nodes per run, GPUs per node (None: by
    scale) and the partition."""

    nodes: int = 1
    gpus_per_node: int | None = None
    partition: str | None = None


def resources(scale: str, cluster: Cluster = Cluster(), train_steps: int | None = None
              ) -> dict[str, Any]:
    res = dict(RESOURCES.get(scale, RESOURCES["cpu"]), nodes=cluster.nodes)
    if cluster.gpus_per_node is not None:
        res["gpus_per_node"] = cluster.gpus_per_node
        res["tasks_per_node"] = max(cluster.gpus_per_node, 1)
    if scale == "paper" and train_steps and train_steps > 100_000:  # big: 3x the steps
        res["timeout_min"] = min(res["timeout_min"] * 3, 14 * 24 * 60)
    return res


def requeue() -> None:
    """Rank 0 asks SLURM to requeue this job (submitit's job id: an array task's own); every rank
    exits. The requeued start resumes from the newest checkpoint."""
    import submitit

    from reproduce.runs.claims import rank

    if rank() == 0:
        job = submitit.JobEnvironment().job_id
        log.warning("requeueing job %s: it resumes from its newest checkpoint", job)
        subprocess.run(["scontrol", "requeue", job], check=False, timeout=60)
    raise SystemExit("preempted: requeued")


def run_one(spec_path: str, variant: str, scale: str, seed: int, split: str, command: str,
            devices: int = 1, sets: dict[str, Any] | None = None, nodes: int = 1) -> str:
    """The body of one array task (one of ``nodes`` x ``devices`` tasks on a multi-device run):
    plan the run afresh from the spec (with the command's ``--set`` values) and execute it."""

    quiet_libraries()
    # USR2 (the time limit is near): while fitting, callbacks.SaveOnStop takes it (the run stops at the
    # step's end, saved there, and requeues below); before or after, there is nothing a requeued
    # start would not redo, so requeue at once.
    signal.signal(signal.SIGUSR2, lambda signum, frame: requeue())
    spec = load_spec(spec_path)
    run = with_sets(spec.plan([variant], scale, [seed])[-1:], spec, sets or {})[0]
    if finished(run) is not None:
        return f"{run.run_id}: finished earlier"
    layout = Layout("gpu" if torch.cuda.is_available() else "cpu", devices, nodes)
    try:
        outcome = execute(run, split, command, layout=layout)
    except Stopped as e:
        if e.signal == signal.SIGUSR2:  # saved at the step it stopped at
            requeue()
        raise
    if outcome.record is None:  # not run now, and why
        return f"{run.run_id}: {outcome.why}"
    return f"{run.run_id}: recorded, dev PPL {outcome.record['metrics'].get('dev_ppl')}"


def plan_lines(runs: list[PlannedRun], cluster: Cluster = Cluster()) -> list[str]:
    lines = []
    for run in runs:
        res = resources(run.scale, cluster, run.config.train.train_steps)
        nodes = f"{res['nodes']} nodes x " if res["nodes"] > 1 else ""
        lines.append(
            f"{run.run_id}: {nodes}{res['tasks_per_node']} task(s) x {res['cpus_per_task']} CPUs, "
            f"{res['gpus_per_node']} GPU(s), {res['mem_gb']} GB, {res['timeout_min']} min"
            + (f", partition {cluster.partition}" if cluster.partition else ""))
    return lines


def slurm_parameters(scale: str, runs: list[PlannedRun], cluster: Cluster = Cluster()
                     ) -> dict[str, Any]:
    """submitit's SLURM parameters for these runs (one array; the largest run sets the time)."""
    steps = max(run.config.train.train_steps for run in runs)
    res = resources(scale, cluster, steps)
    params: dict[str, Any] = {
        "job_name": f"reproduce-{scale}", "time": res["timeout_min"], "nodes": res["nodes"],
        "ntasks_per_node": res["tasks_per_node"], "cpus_per_task": res["cpus_per_task"],
        "mem": f"{res['mem_gb']}GB", "array_parallelism": len(runs),
        # One task per GPU; USR2 two minutes before the time limit (_Preemption: save, requeue).
        "signal_delay_s": 120,
    }
    if res["gpus_per_node"]:
        params["gpus_per_node"] = res["gpus_per_node"]
    if cluster.partition:
        params["partition"] = cluster.partition
    return params


def executor_for(folder: Path, scale: str, runs: list[PlannedRun], cluster: Cluster = Cluster(),
                 where: str = "slurm"):
    """A submitit executor with these runs' resources. ``where="local"`` runs the same jobs as
    local processes (a test uses it; another submits to a simulated SLURM: ``tests/slurm_sim``)."""
    import submitit

    params = slurm_parameters(scale, runs, cluster)
    if where == "local":
        executor = submitit.LocalExecutor(folder=folder / "%j")
        executor.update_parameters(timeout_min=params["time"])
        return executor
    slurm = submitit.SlurmExecutor(folder=folder / "%j")
    slurm.update_parameters(**params)
    return slurm


def sbatch_script(folder: Path, scale: str, runs: list[PlannedRun], cluster: Cluster = Cluster()
                  ) -> str:
    """The sbatch file submitit writes for these runs (for `--dry-run` and the tests)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(scale, runs, cluster)
    params["map_count"] = len(runs)
    return _make_sbatch_string(command="python -u -m submitit.core._submit " + str(folder),
                               folder=folder / "%A_%a", **params)


def submit(executor, spec_path: str, runs: list[PlannedRun], split: str, command: str,
           cluster: Cluster = Cluster()) -> list:
    """One job per run (an array on SLURM); returns the submitit jobs."""
    args = []
    for r in runs:
        res = resources(r.scale, cluster, r.config.train.train_steps)
        args.append((spec_path, r.variant, r.scale, r.seed, split, command,
                     res["tasks_per_node"], r.sets, res["nodes"]))
    from submitit.core.utils import FailedJobError

    try:
        with executor.batch():
            jobs = [executor.submit(run_one, *a) for a in args]
    except FailedJobError as e:  # sbatch refused it: its own words, one line
        why = " ".join(str(e).split()) or "no reason given"
        raise ConfigError(f"sbatch refused the array ({why}); nothing was submitted. Check "
                          "--partition, --gpus-per-node (0 on a partition without GPUs) and "
                          "--nodes against `sinfo`") from None
    return jobs
