"""The array task's side of ``--launcher slurm``, on a compute node: plan the run afresh from the
spec and execute it as a local sweep does (``runner.execute``). The table is rendered once the
arrays have ended by a job of its own (``render_job``).

Preemption has one owner, here. SLURM sends USR2 ahead of the time limit (submitit's
``--signal``): every task saves a checkpoint at the step it is at (``callbacks.SaveOnStop``, the
ranks agreeing on the step), rank 0 requeues the job through ``scontrol requeue`` (submitit's job
id) and the tasks exit; the requeued job resumes from that checkpoint. SIGTERM (``scancel``, a node
going away) saves the same way and exits without requeueing. Lightning's own requeue on USR1 is
off (``devices.cluster_plugins``). A run stopped ``STALLED`` times in a row at one step is not
requeued again (``stalled``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from reproduce.errors import Stopped, one_line
from reproduce.launch.render_job import render_job  # noqa: F401 - jobs pickled before it moved
from reproduce.paths import runs_dir
from reproduce.records.store import finished
from reproduce.records.sweep import load_spec, with_sets
from reproduce.train import stops
from reproduce.train.devices import Layout
from reproduce.train.runner import execute
from reproduce.util.logs import quiet_libraries

log = logging.getLogger("reproduce")


def requeue(work: Path | None = None, step: int | None = None) -> None:
    """Rank 0 asks SLURM to requeue this job (submitit's job id: an array task's own); every rank
    exits. The requeued start resumes from the newest checkpoint. ``step``: where training
    stopped (None: before or after training); a run requeued ``STALLED`` times in a row at the
    same step is not requeued again (``stalled``), in one line, instead of looping."""
    import submitit

    from reproduce.records.claims import rank

    if rank() == 0:
        job = submitit.JobEnvironment().job_id
        if work is not None and (why := stalled(work, job, step)):
            raise SystemExit(f"not requeued: {why}")
        log.warning("requeueing job %s%s: it resumes from its newest checkpoint", job,
                    f" (stopped at step {step}, saved there)" if step is not None else "")
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                                  timeout=60)
            said = " ".join((done.stderr or done.stdout or f"exit {done.returncode}").split())
            refused = said[:200] if done.returncode else None
        except (OSError, subprocess.TimeoutExpired) as e:
            refused = one_line(e, 200)
        if refused is not None:  # the step is saved: a resubmission resumes it
            raise SystemExit(f"not requeued: scontrol requeue {job} failed ({refused}); what "
                             "was trained is saved: submit the same command again to resume it")
    raise SystemExit("preempted: requeued")


STALLED = 3  # requeues in a row without a step of training between them


REQUEUES = "requeues.jsonl"  # in the run's folder: a line per requeue


def stalled(work: Path, job: str, step: int | None) -> str | None:
    """Note this requeue of the run in ``work`` (at ``step``); why not to requeue it, when the
    last ``STALLED`` requeues, this one included, all stopped at the same step (or all before
    training): the time limit is shorter than what the task does outside training."""
    path = work / REQUEUES
    try:
        past = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, KeyError, TypeError):
        past = []
    work.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({"job": job, "step": step, "at": time.time()}) + "\n")
    last = [*past, step][-STALLED:]
    if len(last) < STALLED or len(set(last)) > 1:
        return None
    where = f"at step {step}" if step is not None else "before or after training"
    return (f"{work.name} was stopped {STALLED} times in a row {where}, with no step trained in "
            "between: its time limit is shorter than what the task does outside training (data "
            "preparation, evaluation). Submit it again with a longer --slurm time=..., or "
            "prepare its data first (a local run of the same command does)")


def run_one(*args: Any, **kwargs: Any) -> str:
    """An array task (``_run_one``); what it did, in its log's last line and as its result."""
    said = _run_one(*args, **kwargs)
    print(said, flush=True)
    return said


def _run_one(spec_path: str, variant: str, scale: str, seed: int, split: str, command: str,
             devices: int = 1, sets: dict[str, Any] | None = None, nodes: int = 1,
             trials: int = 0, role: str = "run") -> str:
    """The body of one array task (one of ``nodes`` x ``devices`` tasks on a multi-device run):
    plan the run afresh from the spec (with the command's ``--set`` values) and execute it.
    ``--tune`` (``ROLES``): ``trial`` tasks each add ``trials`` trials to the run's study, in the
    storage the submitting command named (``tuning.STORAGE_ENV``, in the task's environment, not
    in its files) or the journal file in the runs folder; the ``best`` task, started after them,
    trains the best settings found and records them, as a local sweep does."""

    quiet_libraries()
    if cpus := os.environ.get("SLURM_CPUS_PER_TASK"):  # the task's CPUs, not the node's
        torch.set_num_threads(int(cpus))
    # USR2 (the time limit is near): while fitting, callbacks.SaveOnStop takes it (the run stops at the
    # step's end, saved there, and requeues below); before or after, there is nothing a requeued
    # start would not redo, so requeue at once.
    stops.for_the_process(signal.SIGUSR2, lambda signum, frame: requeue())
    spec = load_spec(spec_path)
    run = with_sets(spec.plan([variant], scale, [seed])[-1:], spec, sets or {})[0]
    work = runs_dir() / run.table / run.run_id
    stops.for_the_process(signal.SIGUSR2, lambda signum, frame: requeue(work))
    if role == "run" and finished(run) is not None:
        return f"{run.run_id}: finished earlier"
    layout = Layout("gpu" if torch.cuda.is_available() else "cpu", devices, nodes)
    extra = None
    if role in ("trial", "best") and (tuning := spec.search_space(scale)):
        from reproduce.train.tuning import STORAGE_ENV, cluster_storage, tune

        storage = os.environ.get(STORAGE_ENV) or cluster_storage()
        try:  # a trial stopped by USR2: its settings are queued again, and the task requeued
            run, summary = tune(run, tuning, trials if role == "trial" else 0, storage, seed,
                                need_best=role == "best")
        except Stopped as e:
            if e.signal == signal.SIGUSR2:
                requeue(e.work or work, e.step)
            raise
        if role == "trial":
            return (f"{run.run_id}: trial added to study {summary['study']} "
                    f"({summary['n_trials']} trial(s), best so far {summary['best_value']})")
        extra = {"tuning": summary}
    try:
        outcome = execute(run, split, command, extra, layout=layout)
    except Stopped as e:
        if e.signal == signal.SIGUSR2:  # saved at the step it stopped at
            requeue(e.work or work, e.step)
        raise
    if outcome.record is None:  # not run now, and why
        return f"{run.run_id}: {outcome.why}"
    return f"{run.run_id}: recorded, dev PPL {outcome.record['metrics'].get('dev_ppl')}"
