"""What ``--launcher slurm`` asks a cluster for, and the asking: each planned run becomes one task of
a SLURM job array, submitted with submitit (the task's own side: ``launch/task.py``).

Runs of one resource set share an array (``arrays``): GPUs and tasks per node, CPUs per task,
memory and a time limit per scale (``RESOURCES``), over ``--slurm KEY=VALUE`` options and, with
``--on GPU``, a time limit from each run's price (``time_limit``). A run on several GPUs is one
SLURM task per GPU, on one node or on ``--nodes N``; Lightning reads the SLURM environment and
connects them (DDP), and rank 0 decides for all (``devices.Decision``). Every array asks for
``--requeue`` and for USR2 ahead of its time limit, which the task turns into a save and a requeue.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproduce.errors import ConfigError
from reproduce.launch.task import run_one
from reproduce.records.sweep import PlannedRun

# Resources per scale: GPUs and tasks per node, CPUs per task, memory, time limit (docs/cluster.md
# shows this table; a test keeps them equal). The paper's runs take 8 GPUs like the paper's (fewer
# GPUs accumulate to the same batch; --gpus-per-node to change); big runs 3x the time (its steps).
RESOURCES: dict[str, dict[str, Any]] = {
    "paper": {"gpus_per_node": 8, "tasks_per_node": 8, "cpus_per_task": 8, "mem": "256G",
              "timeout_min": 3 * 24 * 60},
    "cpu": {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 2, "mem": "16G",
            "timeout_min": 3 * 60},
    "smoke": {"gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "4G",
              "timeout_min": 15},
}
BIG_STEPS = 100_000  # a paper run with more steps than this (big: 300k) gets 3x the time

# With --on GPU (what the nodes hold), a GPU run's time limit comes from its own price
# (plan/gpu_prices.py): the whole command (start-up, data, compile, training with its saves and
# dev evaluations, averaging, evaluation) x TIME_MARGIN, plus TIME_ALLOWANCE_MIN for what no
# measurement saw (a shared file system's reads, the node's own start), rounded up to one of
# TIME_LIMITS_H so that runs of about the same length share an array. Near the limit a task is
# stopped by USR2, saved at its step and requeued: an estimate too short costs a requeue, not the
# run; a shorter limit is scheduled sooner (backfill) than the scale's default.
TIME_MARGIN = 1.5
TIME_ALLOWANCE_MIN = 30
TIME_LIMITS_H = (1, 2, 3, 4, 6, 8, 12, 18, 24, 36, 48, 72, 96, 120, 168, 240, 336)  # at most 14 d

# --slurm KEY=VALUE: what the harness sets itself (the run's shape, its logs, its signal), so a
# value there would break the run rather than change it; every other sbatch option passes through
# (submitit's own names as submitit takes them, the rest as `#SBATCH --key=value`).
OWNED = {
    "nodes": "use --nodes N", "ntasks": "use --nodes and --gpus-per-node: one task per GPU",
    "ntasks_per_node": "use --gpus-per-node: one task per GPU",
    "ntasks_per_gpu": "use --gpus-per-node: one task per GPU",
    "gpus_per_node": "use --gpus-per-node", "gpus": "use --gpus-per-node",
    "num_gpus": "use --gpus-per-node", "gpus_per_task": "use --gpus-per-node: one task per GPU",
    "gpus_per_socket": "use --gpus-per-node", "cpus_per_gpu": "use cpus-per-task: one task per GPU",
    "gres": "use --gpus-per-node N, and constraint=TYPE for a kind of GPU",
    "array": "one array per resource set, made by the harness",
    "output": "submitit's log paths", "error": "submitit's log paths",
    "open_mode": "submitit's log paths", "signal": "use signal_delay_s=SECONDS to move it",
    "requeue": "always asked for", "no_requeue": "the harness asks for --requeue",
    "setup": "submitit's", "teardown": "submitit's", "srun_args": "submitit's",
    "use_srun": "submitit's", "additional_parameters": "--slurm KEY=VALUE is that",
    "map_count": "submitit's", "stderr_to_stdout": "submitit's", "wrap": "submitit's command",
}
INTEGER = ("cpus_per_task", "array_parallelism", "signal_delay_s")


@dataclass(frozen=True)
class Cluster:
    """What ``--launcher slurm`` asks of the cluster: nodes per run, GPUs per node (None: by
    scale), the partition, ``--slurm KEY=VALUE`` options (``parse_options``) and the GPU the
    nodes hold (``--on``: each run's time limit from its estimate)."""

    nodes: int = 1
    gpus_per_node: int | None = None
    partition: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    on: str | None = None  # --on: the GPU the nodes hold, e.g. H100 (time limits from estimates)
    max_minutes: int | None = None  # the partition's MaxTime (``partition_minutes``); None: none


def parse_options(values: list[str]) -> tuple[tuple[str, Any], ...]:
    """``--slurm`` values, checked: KEY=VALUE (or a bare KEY for a flag such as ``exclusive``),
    KEY an sbatch option with ``-`` or ``_``; ``time`` in any of sbatch's forms (kept as minutes),
    ``mem`` as sbatch takes it, ``cpus_per_task`` a positive count. One line for what is wrong."""
    options = []
    for value in values:
        key, sep, text = value.partition("=")
        key = key.strip().lstrip("-").replace("-", "_").lower()
        if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            raise ConfigError(f"--slurm {value!r}: expected KEY=VALUE with KEY an sbatch option "
                              "(time, mem, cpus-per-task, account, qos, partition, constraint, ...)")
        if key in OWNED:
            raise ConfigError(f"--slurm {key}: the harness sets it ({OWNED[key]})")
        parsed: Any = text if sep else True
        if key == "time":
            parsed = minutes(text)
        elif key == "mem" and not re.fullmatch(r"\d+[KMGT]?B?", text, re.IGNORECASE):
            raise ConfigError(f"--slurm mem={text!r}: expected a size as sbatch takes it, e.g. "
                              "64G, 500M or 65536 (megabytes)")
        elif key in INTEGER:
            if not text.isdigit() or int(text) < (0 if key == "signal_delay_s" else 1):
                raise ConfigError(f"--slurm {key}={text!r}: expected a positive whole number")
            parsed = int(text)
        options.append((key, parsed))
    return tuple(options)


def minutes(text: str) -> int:
    """sbatch's ``--time`` (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in whole minutes, rounded up."""
    days, _, clock = text.rpartition("-") if "-" in text else ("", "", text)
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts + ([days] if days else [])) or len(parts) > 3:
        raise ConfigError(f"--slurm time={text!r}: expected minutes, H:M:S or D-H:M:S, as "
                          "sbatch --time takes it (e.g. 1440, 24:00:00, 2-00:00:00)")
    numbers = [int(p) for p in parts]
    if days:  # D-H, D-H:M, D-H:M:S
        numbers += [0] * (3 - len(numbers))
        seconds = int(days) * 86400 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    elif len(numbers) == 3:  # H:M:S
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    else:  # M or M:S
        seconds = numbers[0] * 60 + (numbers[1] if len(numbers) == 2 else 0)
    if seconds <= 0:
        raise ConfigError(f"--slurm time={text!r}: a time limit must be more than zero")
    return -(-seconds // 60)


# submitit is imported where it is used: only --launcher slurm needs it.


def resources(run: PlannedRun, cluster: Cluster = Cluster()) -> dict[str, Any]:
    """What one run asks for: the scale's defaults (``RESOURCES``), its shape from ``cluster``,
    its time limit (``time_limit``) and ``--slurm`` options over them (``time`` as
    ``timeout_min``; the rest by their names)."""
    res: dict[str, Any] = dict(RESOURCES.get(run.scale, RESOURCES["cpu"]), nodes=cluster.nodes)
    if cluster.gpus_per_node is not None:
        res["gpus_per_node"] = cluster.gpus_per_node
        res["tasks_per_node"] = max(cluster.gpus_per_node, 1)
    res["timeout_min"] = time_limit(run, cluster, res)[0]
    if cluster.partition:
        res["partition"] = cluster.partition
    for key, value in cluster.options:
        if key != "time":  # time_limit took it
            res[key] = value
    return res


def tasks_per_run(run: PlannedRun, cluster: Cluster = Cluster()) -> int:
    """The SLURM tasks one run takes: one per GPU (or one), on each of its nodes."""
    res = resources(run, cluster)
    return res["nodes"] * res["tasks_per_node"]


def time_limit(run: PlannedRun, cluster: Cluster, res: dict[str, Any]) -> tuple[int, str]:
    """Minutes of ``run``'s time limit on nodes of ``res``'s shape, and where they come from:
    ``--slurm time``; else, with ``--on GPU`` and GPUs asked for, the run's estimate there
    (``TIME_MARGIN``, ``TIME_ALLOWANCE_MIN``, ``TIME_LIMITS_H``); else the scale's default (3x for
    a paper run of more than ``BIG_STEPS`` steps)."""
    most = cluster.max_minutes
    if given := dict(cluster.options).get("time"):
        if most and given > most:
            raise ConfigError(f"--slurm time={given}: more than the partition's MaxTime of {most} "
                              "min (sinfo); ask for at most that: a run longer than its limit is "
                              "saved and requeued there")
        return given, "--slurm time"
    limit, why = _time_limit(run, cluster, res)
    if most and limit > most:
        return most, f"{why}; the partition's MaxTime (sinfo), less than that: saved and " \
            "requeued at the limit"
    return limit, why


def _time_limit(run: PlannedRun, cluster: Cluster, res: dict[str, Any]) -> tuple[int, str]:
    from reproduce.plan.gpu_prices import NoMeasurement

    unpriced = False
    if cluster.on and res["gpus_per_node"]:
        try:
            return _priced_limit(run, gpu_target(cluster.on, res["nodes"] * res["gpus_per_node"]))
        except NoMeasurement:  # an installed package, without the project's results/
            unpriced = True
    default = int(RESOURCES.get(run.scale, RESOURCES["cpu"])["timeout_min"])
    if run.scale == "paper" and run.config.train.train_steps > BIG_STEPS:  # big: 3x the steps
        return min(default * 3, 14 * 24 * 60), "the scale's default, 3x for its steps"
    if unpriced:
        return default, "the scale's default (no GPU measured to price --on from)"
    return default, "the scale's default" + (" (--on GPU: from the run's estimate)"
                                             if run.scale == "paper" and not cluster.on else "")


def _priced_limit(run: PlannedRun, target) -> tuple[int, str]:
    """The limit of ``run``'s whole command as priced on ``target`` (``gpu_prices.price``)."""
    from reproduce.plan.gpu_prices import price

    e = price(run.config, target, run.config.train.train_steps, run_id=run.run_id)
    need = e.command_hours * 60 * TIME_MARGIN + TIME_ALLOWANCE_MIN
    hours = next((h for h in TIME_LIMITS_H if h * 60 >= need), TIME_LIMITS_H[-1])
    where = (("measured there" if target.devices == 1 else "one measured")
             if target.gpu.is_measured else f"scaled from {target.gpu.measured.gpu}")
    return hours * 60, (f"{e.command_hours:.1f} h estimated on {target.label} (training "
                        f"{e.hours:.1f} h, with start-up, data, compile, saves, averaging and "
                        f"evaluation; {where}) x {TIME_MARGIN} + {TIME_ALLOWANCE_MIN} min, "
                        "rounded up")


def partition_minutes(partition: str | None) -> int | None:
    """The MaxTime of ``partition`` (None: the cluster's default partition) in minutes, as
    ``sinfo`` gives it; None where it is unlimited or cannot be asked. Many clusters accept a job
    over it and leave it pending for ever (``EnforcePartLimits=NO``), so limits are checked here."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P %l"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        name, _, limit = line.strip().partition(" ")
        if (name.rstrip("*") == partition) if partition else name.endswith("*"):
            try:
                return minutes(limit.strip())
            except ConfigError:  # infinite, UNLIMITED, n/a
                return None
    return None


@functools.lru_cache(maxsize=8)
def gpu_target(on: str, devices: int):
    """``--on``'s GPU with the run's ``devices`` (nodes x GPUs per node); a count given in
    ``--on`` must be that one. Once per process: every run's resources ask for it."""
    from dataclasses import replace

    from reproduce.plan.gpu_prices import parse_on

    target = parse_on(on)
    if target.kind == "cpu":
        raise ConfigError(f"--on {on}: with --launcher slurm, the GPU the nodes hold (e.g. H100);"
                          " runs without GPUs get the scale's time limit")
    count = re.match(r"\s*(\d+)\s*[xX]", on)
    if count and int(count.group(1)) != devices:
        raise ConfigError(f"--on {on}: a run here takes {devices} GPU(s) (--nodes x "
                          f"--gpus-per-node); name the GPU alone (--on {target.name})")
    return replace(target, devices=devices)


def arrays(runs: list[PlannedRun], cluster: Cluster = Cluster()) -> list[list[PlannedRun]]:
    """``runs`` grouped by what they ask for: one array each (a big run's time is not asked for
    the base runs beside it), in plan order."""
    groups: dict[str, list[PlannedRun]] = {}
    for run in runs:
        key = repr(sorted(resources(run, cluster).items()))
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def plan_lines(runs: list[PlannedRun], cluster: Cluster = Cluster()) -> list[str]:
    lines = []
    for run in runs:
        res = resources(run, cluster)
        nodes = f"{res['nodes']} nodes x " if res["nodes"] > 1 else ""
        shown = {"partition", "nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node", "mem",
                 "timeout_min"}
        extra = "".join(f", {k} {v}" if v is not True else f", {k}"
                        for k, v in res.items() if k not in shown)
        lines.append(
            f"{run.run_id}: {nodes}{res['tasks_per_node']} task(s) x {res['cpus_per_task']} CPUs, "
            f"{res['gpus_per_node']} GPU(s), {res['mem']} memory, {res['timeout_min']} min ("
            f"{time_limit(run, cluster, res)[1]})"
            + (f", partition {res['partition']}" if res.get("partition") else "") + extra)
    return lines


def slurm_parameters(scale: str, runs: list[PlannedRun], cluster: Cluster = Cluster(),
                     role: str = "run", after: str | None = None) -> dict[str, Any]:
    """submitit's SLURM parameters for one array of these runs (``arrays``: the same resources;
    were they not, the longest time limit is asked for all); ``role``: what its tasks do
    (``ROLES``); ``after``: a job whose tasks must all end before these start."""
    res = max((resources(run, cluster) for run in runs), key=lambda r: r["timeout_min"])
    params: dict[str, Any] = {
        "job_name": f"reproduce-{scale}" + ("-trials" if role == "trial" else ""),
        "time": res.pop("timeout_min"),
        "nodes": res.pop("nodes"), "ntasks_per_node": res.pop("tasks_per_node"),
        "array_parallelism": len(runs),
        # USR2 two minutes before the time limit (save at the step, requeue: run_one)
        "signal_delay_s": 120,
    }
    if gpus := res.pop("gpus_per_node"):  # one task per GPU
        params["gpus_per_node"] = gpus
    known = submitit_parameters()
    # --requeue: a preempted or failed node's task goes back in the queue (and USR2 requeues)
    extra: dict[str, Any] = {"requeue": True}
    for key, value in res.items():
        if key in known:
            params[key] = value
        else:  # any other sbatch option, as `#SBATCH --key=value`
            extra[key] = value
    if after is not None:  # afterany: the best of the trials that ended, however they ended
        # beside a dependency of the user's own (--slurm dependency=...): both must hold
        mine = params.pop("dependency", None) or extra.pop("dependency", None)
        extra["dependency"] = ",".join(d for d in (f"afterany:{after}", mine) if d)
    params["additional_parameters"] = extra
    return params


def submitit_parameters() -> set[str]:
    from submitit.slurm.slurm import SlurmExecutor

    return set(SlurmExecutor._valid_parameters()) - set(OWNED)


TASK_PROCESS = "reproduce.launch.task_process"


def task_command(python: str, folder: Path) -> str:
    """Each task's command in the sbatch file: ``TASK_PROCESS`` (submitit's job runner, then an
    exit without teardown) where submitit itself starts ``submitit.core._submit``, with the same
    arguments. Jobs submitted before this started the latter; either runs them."""
    return f"{python} -u -m {TASK_PROCESS} {shlex.quote(str(folder))}"


def executor(folder: Path):
    """submitit's SLURM executor, its tasks started by ``task_command``."""
    import submitit

    class Executor(submitit.SlurmExecutor):
        @property
        def _submitit_command_str(self) -> str:
            return task_command(self.python, self.folder)

    return Executor(folder=folder / "%j")


def executor_for(folder: Path, scale: str, runs: list[PlannedRun], cluster: Cluster = Cluster(),
                 role: str = "run", after: str | None = None):
    """A submitit SLURM executor with these runs' resources (one array)."""
    slurm = executor(folder)
    slurm.update_parameters(**slurm_parameters(scale, runs, cluster, role, after))
    return slurm


def sbatch_script(folder: Path, scale: str, runs: list[PlannedRun], cluster: Cluster = Cluster(),
                  role: str = "run", after: str | None = None) -> str:
    """The sbatch file submitit writes for one array of these runs (for `--dry-run`, the tests)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(scale, runs, cluster, role, after)
    params["map_count"] = len(runs)
    return _make_sbatch_string(command=task_command("python", folder),
                               folder=folder / "%A_%a", **params)


# What an array task does: ``run`` trains and records its run; with ``--tune``, ``trial`` adds
# one trial to the run's study (a task per trial, side by side, sharing the study's storage) and
# ``best``, once every trial task has ended, trains the best settings and records them.
ROLES = ("run", "trial", "best")


def submit(executor, spec_path: str, runs: list[PlannedRun], split: str, command: str,
           cluster: Cluster = Cluster(), role: str = "run") -> list:
    """One job per run (an array on SLURM: ``runs`` is one of ``arrays``, a run repeated per
    trial for ``trial`` tasks); the submitit jobs, in order."""
    args = []
    for r in runs:
        res = resources(r, cluster)
        args.append((spec_path, r.variant, r.scale, r.seed, split, command,
                     res["tasks_per_node"], r.sets, res["nodes"], 1 if role == "trial" else 0,
                     role))
    with sbatch(), executor.batch():
        return [executor.submit(run_one, *a) for a in args]


@contextlib.contextmanager
def sbatch() -> Iterator[None]:
    """Around a submitit submission: sbatch's refusal as ``Refused``, its own words in one line
    (submitit also prints sbatch's stderr when it fails: held back here); on a submission sbatch
    took, its warnings are passed on."""
    from submitit.core.utils import FailedJobError

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except FailedJobError as e:
        raise Refused(" ".join(str(e).split()) or "no reason given") from None
    if said.getvalue().strip():
        print(said.getvalue().rstrip(), file=sys.stderr)


RENDER_MINUTES = 15  # the render job's time limit: it reads records and writes a page


def render_executor(folder: Path, table: str, after: list[str], cluster: Cluster = Cluster()):
    """A one-task job that waits for the ``after`` jobs (``afterany``), on the runs' partition
    with their account, QoS and other options, a CPU and ``RENDER_MINUTES``."""
    extra: dict[str, Any] = {"dependency": "afterany:" + ":".join(after)}
    skip = {"time", "mem", "cpus_per_task", "constraint", "dependency", "begin", "exclusive"}
    extra.update((k, v) for k, v in cluster.options if k not in skip)
    slurm = executor(folder)
    slurm.update_parameters(job_name=f"reproduce-render-{table}", nodes=1, ntasks_per_node=1,
                            cpus_per_task=1, mem="4G", time=min(RENDER_MINUTES, cluster.max_minutes
                                                               or RENDER_MINUTES),
                            **({"partition": cluster.partition} if cluster.partition else {}),
                            additional_parameters=extra)
    return slurm


def submit_render(executor, render: Callable[[str], str], spec_path: str):
    """Submit the render job (``render_executor``): ``render(spec_path)``; its submitit job."""
    with sbatch():
        return executor.submit(render, spec_path)


class Refused(Exception):
    """sbatch refused an array; its reason, in one line."""
