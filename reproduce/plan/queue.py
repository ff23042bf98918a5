"""What SLURM holds of a table's runs: the array tasks ``--launcher slurm`` submitted, from its
ledger (``runs/<table>/slurm/submitted.jsonl``, a line per task: run, job id, logs, ``--set``
values), and their state now from ``squeue``.

A submission skips the runs whose last task is still queued or running, and says why; ``status``
counts them as *queued* or *running*, and says of a task that ended without a record how it
ended (the last line of its log) and where its log is. Where ``squeue`` cannot be asked (no SLURM
on this machine), their state is UNKNOWN: nothing is skipped for it, nothing called ended.
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
        return "its logs are empty" if found else "it left no log (cancelled before it started?)"


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
    states = squeue_states() if last else {}
    return {key: Task(e["run_id"], e["job_id"], e.get("stdout", ""), e.get("stderr", ""),
                      e.get("sets") or {},
                      "UNKNOWN" if states is None else states.get(e["job_id"]))
            for key, e in last.items()}


def squeue_states() -> dict[str, str] | None:
    """This user's tasks in the queue: job id (an array task as ``<array>_<index>``) -> state.
    None where squeue is missing or does not answer."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i %T"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line.strip())
