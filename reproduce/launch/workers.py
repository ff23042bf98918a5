"""``--workers N``: one sweep trained by N local processes that split the machine between them.

On a small CPU, N single-threaded workers train more runs per hour than one process using every
core: small matrix products scale poorly across threads (on the 2-core development machine two
1-thread workers did ~1.3x the steps per second of one 2-thread process). The workers are the same
command started N times, so the claims (``reproduce/records/claims.py``) keep each run to one worker, and
an interrupted sweep resumes as always. What ``--workers`` adds:

* threads: each worker gets ``cores // N`` (``OMP_NUM_THREADS``), and its own GPUs where there
  are enough, else a share of one (``gpu_blocks``: small models on one GPU); on a CPU the
  cores follow the work: once a worker has ended, those still training share its cores too (they
  read how many are left from a file this process keeps, ``share_cores``);
* order: the runs without a record are split into N groups of about equal measured cost
  (``step_probe.step_seconds`` x steps left), seed by seed (``by_seed``): each worker starts on its own
  group, lower seeds first and costliest first within a seed, then helps with the others' (claimed
  runs are skipped). So no long run is left to start last, and a sweep stopped part way holds
  whole seeds (every variant at seed 0 before any at seed 1: the table fills row by row, and
  verdicts come with the second seed);
* one table: workers only train and record; this process renders the table when all have ended.

``--workers auto`` (the default) picks N with ``auto_count``: one worker per core on a CPU when
the sweep is long enough to pay for starting them, else one process.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from reproduce.errors import ConfigError
from reproduce.plan.worker_count import WORKER_ENV
from reproduce.records.checkpoints import steps_left
from reproduce.records.store import COMMAND_ENV, finished, recorded_command
from reproduce.util import machine
from reproduce.util.machine import GPU_SHARE_ENV, SHARE_ENV

ORDER_ENV = "REPRODUCE_RUN_ORDER"  # comma-separated run ids a worker tries first, in order


def gpu_blocks(n: int, devices: int, gpus: int, visible: str | None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each of ``n`` workers whose runs take ``devices`` GPUs each,
    of the ``gpus`` this process may use (``visible``: its own ``CUDA_VISIBLE_DEVICES``, if set):
    worker k the k-th block. With more one-GPU workers than GPUs, workers share them, worker k on
    GPU k mod ``gpus``: a small model leaves a GPU idle between its kernels, and several runs side
    by side fill it (a `cpu`-scale sweep on one GPU). Runs on several GPUs each (DDP) cannot
    share: their ranks would meet on one GPU."""
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    if n * devices <= len(ids):
        return [",".join(ids[k * devices:(k + 1) * devices]) for k in range(n)]
    if devices == 1:
        return [ids[k % len(ids)] for k in range(n)]
    raise ConfigError(f"--workers {n} --devices {devices}: this machine has {len(ids)} GPU(s), "
                      f"{devices} per worker at most {len(ids) // devices} worker(s) (only "
                      "one-GPU runs share a GPU)")


def shared_by(blocks: list[str]) -> list[int]:
    """For each worker's GPUs (``gpu_blocks``), how many of the workers train on them: the
    record's ``cost.gpu_shared_by``, its share of the GPU's time."""
    return [blocks.count(b) for b in blocks]


def _write_share(path: Path, active: int, cores: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{active} {cores}\n")
    os.replace(tmp, path)


def reorder(runs: list) -> list:
    """``runs`` with those named in ``$REPRODUCE_RUN_ORDER`` first, in that order."""
    wanted = [r for r in os.environ.get(ORDER_ENV, "").split(",") if r]
    rank = {run_id: i for i, run_id in enumerate(wanted)}
    return sorted(runs, key=lambda run: rank.get(run.run_id, len(rank)))


def balance(costs: dict[str, float], n: int) -> list[list[str]]:
    """Split run ids into ``n`` groups with the largest group total as small as we can find
    (exact search while small, else longest-first greedy); each group costliest first."""
    ids = sorted(costs, key=lambda i: -costs[i])
    best: list[list[str]] | None = None
    if n > 1 and n ** len(ids) <= 100_000:
        best_load = float("inf")
        for assignment in itertools.product(range(n), repeat=len(ids)):
            if assignment and assignment[0] != 0:  # groups are interchangeable
                continue
            loads = [0.0] * n
            for i, g in zip(ids, assignment, strict=True):
                loads[g] += costs[i]
            if max(loads) < best_load - 1e-9:
                best_load = max(loads)
                best = [[i for i, g in zip(ids, assignment, strict=True) if g == k]
                        for k in range(n)]
    if best is None:
        best = [[] for _ in range(n)]
        loads = [0.0] * n
        for i in ids:
            k = loads.index(min(loads))
            best[k].append(i)
            loads[k] += costs[i]
    return best


def by_seed(costs: dict[str, float], seeds: dict[str, int], n: int) -> list[list[str]]:
    """``balance`` within each seed, lowest seed first: each seed's heaviest group goes to the
    worker with the least work so far, so every worker finishes seed k before it starts k + 1."""
    groups: list[list[str]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for seed in sorted(set(seeds.values())):
        part = balance({i: c for i, c in costs.items() if seeds[i] == seed}, n)
        for group in sorted(part, key=lambda g: -sum(costs[i] for i in g)):
            k = loads.index(min(loads))
            groups[k] += group
            loads[k] += sum(costs[i] for i in group)
    return groups


def worker_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--workers N`` / ``--workers=N``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def launch(argv: Sequence[str], runs: list, n: int, devices: int = 1) -> int:
    """Train ``runs`` (those without a record) with ``n`` worker processes, each run on
    ``devices`` devices of its worker's own (GPUs: worker k gets the k-th block of ``devices``;
    a CPU: its share of the cores, split between its ranks); returns 0 if every worker succeeded,
    else a failed one's status (positive). Each worker's output lines are prefixed ``[wK]``."""
    if n < 1:
        raise ConfigError(f"--workers {n}: must be at least 1")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = gpu_blocks(n, devices, gpus, os.environ.get("CUDA_VISIBLE_DEVICES")) if gpus else []
    cores = machine.cores()
    if not gpus and n * devices > cores:
        raise ConfigError(f"--workers {n} --devices {devices}: on a CPU each device is a process "
                          f"with at least one core, and this machine has {cores} core(s)")
    todo = [run for run in runs if finished(run) is None]
    if not todo:
        print("--workers: every run has a record; nothing to train")
        return 0
    from reproduce.plan.step_probe import step_seconds  # a model's step: torch's compiler too

    threads = max(1, cores // min(n, len(todo)))  # no more workers than runs
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # measure each run as a worker will train it
    try:
        costs = {run.run_id: step_seconds(run.config, precision_of=run.precision_from)
                 * steps_left(run) for run in todo}
    finally:
        torch.set_num_threads(previous)
    groups = by_seed(costs, {run.run_id: run.seed for run in todo}, min(n, len(todo)))
    order = [run_id for group in groups for run_id in group]
    shared = gpus and len(groups) > gpus
    print(f"--workers {n}: {len(todo)} run(s) to train, {threads} thread(s) per worker"
          + (f", {len(groups)} workers sharing {gpus} GPU(s)" if shared
             else f", {devices} GPU(s) each" if gpus else ""))
    share = None if gpus else Path(tempfile.mkdtemp(prefix="reproduce-workers-")) / "share"
    if share is not None:
        _write_share(share, len(groups), cores)
    procs = []
    for k, group in enumerate(groups):
        hours = sum(costs[i] for i in group) / 3600
        print(f"  w{k + 1}: {', '.join(group)} (about {hours:.1f} h of training measured here), "
              "then the others' if any are left")
        env = dict(os.environ, **{ORDER_ENV: ",".join(group + [i for i in order if i not in group]),
                                  WORKER_ENV: str(k + 1), COMMAND_ENV: recorded_command(argv),
                                  "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
        if share is not None:
            env[SHARE_ENV] = str(share)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible[k]
            env[GPU_SHARE_ENV] = str(shared_by(visible[:len(groups)])[k])
        proc = subprocess.Popen([sys.executable, "-m", "reproduce", *worker_argv(argv)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        procs.append((k + 1, proc))
    pumps = [threading.Thread(target=_pump, args=(k, proc), daemon=True) for k, proc in procs]
    for pump in pumps:
        pump.start()
    try:
        codes = _wait([proc for _, proc in procs], share, cores)
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reached the workers too; `kill -INT` of this process did not. Each
        # gets SIGTERM, which saves at the step's end as one Ctrl-C does (a worker counts only
        # Ctrl-Cs towards stopping at once), and is waited for: a second Ctrl-C reaches the
        # workers from the terminal, which stop at once, and is not this process's to act on.
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = _wait_through_interrupts([proc for _, proc in procs])
        raise
    finally:
        for pump in pumps:
            pump.join(timeout=5)
        if share is not None:
            for path in (share, share.with_suffix(".tmp")):
                path.unlink(missing_ok=True)
            share.parent.rmdir()
    for (k, _), code in zip(procs, codes, strict=True):
        if code:
            print(f"--workers: w{k} exited with status {code}; run the command again to resume")
    # A worker killed by a signal has a negative status: any failure makes the whole one fail.
    return next((abs(code) for code in codes if code), 0)


def _wait(procs: list[subprocess.Popen], share: Path | None, cores: int,
          poll_seconds: float = 1.0) -> list[int]:
    """Exit statuses of ``procs``; each time one ends, the share file gives its cores to the rest."""
    codes: list[int | None] = [None] * len(procs)
    while None in codes:
        for i, proc in enumerate(procs):
            if codes[i] is None and proc.poll() is not None:
                codes[i] = proc.returncode
                if share is not None:
                    _write_share(share, max(1, codes.count(None)), cores)
        if None in codes:
            time.sleep(poll_seconds)
    return [int(code) for code in codes if code is not None]  # all set: the loop waited


def _wait_through_interrupts(procs: list[subprocess.Popen]) -> list[int]:
    while True:
        try:
            return [proc.wait() for proc in procs]
        except KeyboardInterrupt:
            continue


def _pump(k: int, proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(f"[w{k}] {line}")
        sys.stdout.flush()
