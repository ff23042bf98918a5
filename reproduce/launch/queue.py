"""What SLURM holds of a table's runs: the array tasks ``--launcher slurm`` submitted, from its
ledger (``runs/<table>/slurm/submitted.jsonl``, a line per task: run, job id, logs, ``--set``
values), and their state now from ``squeue``.

A submission skips the runs whose last task is still queued or running, and says why; ``status``
counts them as *queued* or *running* (and how many times SLURM requeued them), and says of a task
that ended without a record how it ended: SLURM's own word where the cluster keeps accounting
(``sacct``: TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, FAILED with its exit code, CANCELLED), the last
line of its log, and where its log is.
Where ``squeue`` cannot be asked (no SLURM on this machine), their state is UNKNOWN: nothing is
skipped for it, nothing called ended.
"""

from __future__ import annotations

import getpass
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEDGER = "submitted.jsonl"
# squeue's states of a task that will still run (or is running): not submitted again
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED",
           "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT"}
RUNNING = {"RUNNING", "COMPLETING"}
# what sacct's states of an ended task mean to a user (FAILED with its exit code)
ENDINGS = {"TIMEOUT": "its time limit ran out", "OUT_OF_MEMORY": "out of memory",
           "NODE_FAIL": "its node failed", "BOOT_FAIL": "its node failed to start",
           "FAILED": "{code}", "CANCELLED": "cancelled", "PREEMPTED": "preempted",
           "DEADLINE": "past its deadline", "COMPLETED": "{code}"}


@dataclass(frozen=True)
class Task:
    """One run's last array task: its job id (``<array>_<index>``), its logs, the ``--set``
    values it was submitted with, and its state in the queue (None: not there any more;
    ``UNKNOWN``: squeue could not be asked)."""

    run_id: str
    job_id: str
    stdout: str
    stderr: str
    sets: dict[str, Any] = field(default_factory=dict)
    state: str | None = None
    restarts: int = 0  # times SLURM requeued it (preempted, its node lost, its time limit's USR2)
    outcome: tuple[str, str] | None = None  # (state, exit code) as sacct keeps it, once ended

    @property
    def queued(self) -> bool:
        return self.state in WAITING

    @property
    def running(self) -> bool:
        return self.state in RUNNING

    @property
    def ended(self) -> bool:
        """Gone from the queue (finished, failed or cancelled), as far as squeue says."""
        return self.state is None

    def ending(self) -> str | None:
        """SLURM's word for how it ended and what that means (``TIMEOUT (its time limit ran
        out)``); None where the cluster keeps no record of ended jobs."""
        if self.outcome is None:
            return None
        state, code = self.outcome
        status, _, signal = code.partition(":")  # sacct's ExitCode is <exit code>:<signal>
        said = f"signal {signal}" if signal not in ("", "0") else f"exit code {status}"
        return f"{state} ({ENDINGS[state].format(code=said)})"

    def last_words(self) -> str:
        """The last line its logs end with (an error's last line), or why there is none."""
        found = False
        for path in (self.stderr, self.stdout):
            try:
                lines = Path(path).read_text(errors="replace").splitlines()
            except OSError:
                continue
            found = True
            # srun's own closing lines ("srun: error: n1: task 0: Exited with exit code 1") say
            # less than the error above them
            if said := [line.strip() for line in lines
                        if line.strip() and not line.startswith(("srun: ", "slurmstepd: "))]:
                return said[-1][:400]
        if found:
            return "its logs are empty"
        return "it left no log" + ("" if self.outcome else " (cancelled before it started?)")


def ledger(folder: Path) -> Path:
    return folder / LEDGER


def record_submission(folder: Path, runs: list, jobs: list, trial: bool = False) -> None:
    """Append a line per submitted task (``runs`` and their submitit ``jobs``, in order);
    ``trial``: tasks that add a trial to their run's study (``--tune``), kept apart from the
    run's own task."""
    folder.mkdir(parents=True, exist_ok=True)
    with ledger(folder).open("a") as out:
        for run, job in zip(runs, jobs, strict=True):
            out.write(json.dumps({"run_id": run.run_id, "job_id": str(job.job_id),
                                  "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr),
                                  "sets": run.sets, **({"trial": True} if trial else {})}) + "\n")


def tasks(folder: Path) -> dict[str, Task]:
    """Each run's last submitted task, with its state in the queue now; and each trial task
    (``--tune``) under ``<run> trial <job id>``."""
    last: dict[str, dict[str, Any]] = {}
    try:
        lines = ledger(folder).read_text().splitlines()
    except FileNotFoundError:
        return {}
    for line in lines:
        try:
            entry = json.loads(line)
            # a trial task under its own key (`<run> trial <job>`): never taken for the run's task
            key = f"{entry['run_id']} trial {entry['job_id']}" if entry.get("trial") \
                else entry["run_id"]
            last[key] = entry
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut by a full disk: the tasks before and after it still count
    queued = squeue_states() if last else {}
    gone = [e["job_id"] for e in last.values() if queued is not None and e["job_id"] not in queued]
    ended = sacct_states(gone) if gone else {}

    def task(e: dict[str, Any]) -> Task:
        state, restarts = ("UNKNOWN", 0) if queued is None else queued.get(e["job_id"], (None, 0))
        return Task(e["run_id"], e["job_id"], e.get("stdout", ""), e.get("stderr", ""),
                    e.get("sets") or {}, state, restarts, ended.get(e["job_id"]))

    return {key: task(e) for key, e in last.items()}


def squeue_states() -> dict[str, tuple[str, int]] | None:
    """This user's tasks in the queue: job id (an array task as ``<array>_<index>``) -> its
    state and the times it was requeued. None where squeue is missing or does not answer."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(),
                              "-O", "JobArrayID:|,State:|,RestartCnt"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        job, state, restarts = (line.split("|") + ["", ""])[:3]
        if job.strip() and state.strip():
            states[job.strip()] = (state.strip(), int(restarts) if restarts.strip().isdigit()
                                   else 0)
    return states


def sacct_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """How tasks that left the queue ended: job id -> (state, exit code), from the cluster's
    accounting (``sacct``). Empty where it keeps none ("Slurm accounting storage is disabled").
    Not ``sacct -c`` (a job completion log): SLURM 22.05's names array tasks by their own job
    ids, not as ``<array>_<index>``."""
    # by array: tasks cancelled before they started have no job of their own to ask for
    asked = ",".join(dict.fromkeys(job.split("_")[0] for job in job_ids))
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", asked,
                              "-o", "JobID,State,ExitCode"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    ended = {}
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        job, state, code = (line.split("|") + ["", ""])[:3]
        state = state.split()[0] if state else ""  # "CANCELLED by 0": CANCELLED
        for one in array_tasks(job):
            if one in job_ids and state in ENDINGS:  # not RUNNING: just gone from squeue
                ended[one] = (state, code)
    return ended


def array_tasks(job: str) -> list[str]:
    """The job ids one line of sacct stands for: tasks of an array that never started (cancelled
    while pending) share a line, ``9_[2-4,7%2]`` for 9_2, 9_3, 9_4 and 9_7 (``%2``: at most two
    at once)."""
    head, bracket, rest = job.partition("_[")
    if not bracket or not rest.endswith("]"):
        return [job]
    ids: list[str] = []
    for part in rest[:-1].partition("%")[0].split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or not (last or first).isdigit():
            return [job]
        ids.extend(f"{head}_{k}" for k in range(int(first), int(last or first) + 1))
    return ids
