"""How many worker processes ``--workers auto`` trains a sweep with (``auto_count``), for the sweep
itself (``launch/workers.py``), its dry run and ``status``; and whether this process is one of
them (``is_worker``)."""

from __future__ import annotations

import os

import torch

from reproduce.records.checkpoints import steps_left
from reproduce.records.store import plan_state
from reproduce.util import machine

WORKER_ENV = "REPRODUCE_WORKER"  # set in workers: train and record, leave the table to the parent


# Fewer training steps than this left between a sweep's runs: one process (a worker takes ~10 s
# to start, and a 30-step `smoke` run a few seconds to train).
AUTO_MIN_STEPS = 1000


def is_worker() -> bool:
    return bool(os.environ.get(WORKER_ENV))


def auto_count(runs: list, tuning: bool = False, to_go: dict[str, int] | None = None) -> int:
    """``--workers auto``: how many workers to train ``runs`` with. One, unless this is a CPU (no
    GPU: there a run takes the devices its scale asks for) with several cores for torch, this
    process is not itself a worker, nothing is tuned first, and two or more runs without a record
    have ``AUTO_MIN_STEPS`` training steps left between them; then one worker per core, at most
    one per run (the cores follow the work as workers end). ``to_go``: the training steps each run
    still needs, when the caller has read them (``status``, from its own folders); then ``runs``
    are taken as unfinished, and neither records nor checkpoints are read here."""
    if tuning or is_worker() or torch.cuda.is_available():
        return 1
    cores = min(machine.cores(), torch.get_num_threads())  # OMP_NUM_THREADS=1 keeps one process
    if cores < 2:
        return 1
    if to_go is None:  # reads only: dry runs call it too
        to_go = {run.run_id: steps_left(run) for run in runs if plan_state(run) != "done"}
    if len(to_go) < 2 or sum(to_go.values()) < AUTO_MIN_STEPS:
        return 1
    return min(cores, len(to_go))
