"""Where a run trains: the device layout (``--accelerator``, ``--devices``, a scale's ``devices``)
and, for more than one device, one run spread over one process per device with DDP.

A multi-device run is trained by its own process group, ``python -m reproduce _rank-run FILE``
(FILE: the planned run, its precision and layout, written by the sweep's process, which holds the
run's claim). Lightning's DDP launcher starts that same command once more per extra device, so
every rank trains exactly that run and nothing else: no rank plans the sweep, takes claims or
renders tables. All ranks fit (each on its own shard of every epoch's batches) and compute the dev
perplexity over their shards, gathered; rank 0 alone decodes (beam search, BLEU, EVALB) every
sentence, logs to W&B and writes the one record. The sweep's process waits for the group: if any
rank dies, Lightning kills the others (its child observer) and the sweep kills what is left of the
group, says so in one line and releases the claim; the next command resumes from the last
checkpoint. Ctrl-C stops the whole group.

On a CPU, N devices are N processes over the gloo backend, each with cores / N threads: the same
launcher, samplers, rank-zero logic, checkpoints and collectives as on GPUs, testable anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from reproduce.config import ACCELERATORS, Config, seconds_from_env
from reproduce.errors import ConfigError, DiskError, RankFailure, Stopped, one_line
from reproduce.records.checkpoints import PREEMPTED
from reproduce.records.claims import rank
from reproduce.records.sweep import PlannedRun
from reproduce.train import stops
from reproduce.util import machine
from reproduce.util.files import DISK_ERRNOS, write_atomic
from reproduce.util.machine import SHARE_ENV

PAYLOAD = "ranks.json"  # in the run's folder: what its ranks train
# Seconds a rank waits in a collective (or for the others to join) before it gives up. Long enough
# for a rank to load paper-scale data before the first one; a rank that dies is noticed at once.
TIMEOUT_ENV = "REPRODUCE_DDP_TIMEOUT"


DEVICE_NAMES = {"cpu": ("CPU process", "CPU processes"), "gpu": ("GPU", "GPUs")}  # one, many


@dataclass(frozen=True)
class Layout:
    """Devices one run trains on: ``accelerator`` cpu or gpu, ``devices`` processes on each of
    ``nodes`` nodes (DDP if more than one in all; several nodes: tasks a cluster started)."""

    accelerator: str = "cpu"
    devices: int = 1
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.devices * self.nodes

    @property
    def strategy(self) -> str:
        return "ddp" if self.world > 1 else "single-device"

    def describe(self, backend: bool = True) -> str:
        """``2 nodes x 8 GPUs (DDP, nccl)``; without ``backend``, ``... (DDP)``."""
        one, many = DEVICE_NAMES[self.accelerator]
        where = f"{self.nodes} nodes x " if self.nodes > 1 else ""
        ddp = f"DDP, {self.backend}" if backend else "DDP"
        return (f"{where}{self.devices} {many if self.devices > 1 else one}"
                + (f" ({ddp})" if self.world > 1 else ""))

    @property
    def backend(self) -> str:
        return "nccl" if self.accelerator == "gpu" else "gloo"

    def rank_threads(self) -> int | None:
        """Torch threads each rank takes: on a CPU, this process's split ``devices`` ways (the
        ranks share its cores); None where ranks keep what they have (one device, or GPUs)."""
        if self.accelerator != "cpu" or self.devices <= 1:
            return None
        return max(1, torch.get_num_threads() // self.devices)


ONE_DEVICE = Layout()


@contextmanager
def threads_of_one_rank(layout: Layout) -> Iterator[None]:
    """This process times a step with the threads one rank of ``layout`` will have (its
    ``rank_threads``), and gets its own back after."""
    threads, rank_threads = torch.get_num_threads(), layout.rank_threads()
    if rank_threads is not None:
        torch.set_num_threads(rank_threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def attention_kernels() -> None:
    """Turn cuDNN's fused attention off where CUDA runs: it builds a graph for each new batch
    shape, and a run's token-count batches have a new shape almost every step. On an H200
    (torch 2.11, `benchmarks/attention_shapes.py`, results/attention-shapes.json) the paper's
    base took 1.01 s per step over new shapes with it and 0.097 s without it (0.101 s over one
    fixed shape). torch then picks flash or memory-efficient attention, which need no per-shape
    build. Process-wide; a no-op without CUDA."""
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)


def external_ranks() -> bool:
    """Whether this process is one of several a cluster started for one run (SLURM: one task per
    device, on one node or several): then every rank trains in place, no process group is started
    here, and the ranks other than 0 follow rank 0's decision (``Decision``)."""
    return int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1


def cluster_plugins() -> list:
    """Lightning's cluster environment for a SLURM task, with Lightning's own requeue (on USR1)
    off: ``launch.task`` owns preemption (submitit's signal, a checkpoint at the step, requeue)."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


class Decision:
    """What rank 0 of a cluster's tasks decided for a run (train it, in which precision, or not),
    in a file of the run's folder that the other ranks wait for: they cannot decide alone, as a
    precision timed on each node, or a claim, could differ from rank 0's. Keyed by the job and its
    restart count, so a requeued job never reads its previous start's file."""

    def __init__(self, work: Path) -> None:
        job = os.environ.get("SLURM_JOB_ID", "0")
        restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
        self.path = work / f"decision-{job}.{restart}.json"
        self.written = False

    def publish(self, precision: tuple[str, dict] | None) -> None:
        """Rank 0: train with ``precision``, or (None) nothing to train now."""
        write_atomic(self.path, json.dumps({"precision": precision}).encode())
        self.written = True

    def close(self) -> None:
        """Rank 0, whatever happened: the ranks never wait on a decision that was not made."""
        if not self.written:
            self.publish(None)

    def wait(self) -> tuple[str, dict] | None:
        """Another rank: rank 0's precision, or None (nothing to train); waits up to the DDP
        timeout (``REPRODUCE_DDP_TIMEOUT``)."""
        deadline = time.time() + timeout_seconds()
        while not self.path.exists():
            if time.time() > deadline:
                raise RankFailure(f"rank {rank()}: rank 0 made no decision about this run in "
                                  f"{timeout_seconds():.0f} s ({self.path} never appeared; "
                                  f"{TIMEOUT_ENV} sets the wait)")
            time.sleep(0.5)
        found = json.loads(self.path.read_text())["precision"]
        return tuple(found) if found is not None else None


def resolve(accelerator: str | None, devices: int | str | None, scale_devices: int | str = 1
            ) -> Layout:
    """The layout asked for, checked against this machine. ``devices`` (``--devices``) wins over
    the scale's; ``auto`` is every visible GPU on a GPU, one process on a CPU."""
    accelerator = accelerator or "auto"
    if accelerator not in ACCELERATORS:
        raise ConfigError(f"--accelerator {accelerator}: allowed values are "
                          f"{', '.join(ACCELERATORS)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if accelerator == "gpu" and not gpus:
        raise ConfigError("--accelerator gpu: this machine has no GPU that torch can use "
                          f"(torch {torch.__version__}); use --accelerator cpu or auto")
    kind = "gpu" if accelerator == "gpu" or (accelerator == "auto" and gpus) else "cpu"
    asked = devices if devices is not None else scale_devices
    if asked == "auto":
        n = gpus if kind == "gpu" else 1
    else:
        n = int(asked)
    if kind == "gpu" and n > gpus:
        raise ConfigError(f"--devices {n}: this machine has {gpus} GPU(s) visible to torch")
    if kind == "cpu" and n > machine.cores():
        raise ConfigError(f"--devices {n}: on a CPU each device is a process with at least one "
                          f"core, and this machine has {machine.cores()} core(s)")
    return Layout(kind, n)


# --- the sweep's side ----------------------------------------------------------------------------


def train_on_ranks(run: PlannedRun, split: str, command: str, work: Path,
                   extra: dict[str, Any] | None, layout: Layout, precision: tuple[str, dict]
                   ) -> None:
    """Train, evaluate and record ``run`` in its own process group of ``layout.devices`` ranks;
    return when the record is written, or raise RankFailure (one line) if a rank failed."""
    work.mkdir(parents=True, exist_ok=True)
    payload = work / PAYLOAD
    payload.write_text(json.dumps({
        "run": {**{k: v for k, v in asdict(run).items() if k not in ("config", "precision_from")},
                "config": run.config.to_dict(),
                # the table's base, which the ranks' timing caches are keyed by (train.compiling)
                "precision_from": run.precision_from and run.precision_from.to_dict()},
        "split": split, "command": command, "extra": extra, "layout": asdict(layout),
        "precision": precision[0], "precision_choice": precision[1]}, indent=1))
    env = dict(os.environ)
    env.pop(SHARE_ENV, None)  # ranks keep their split of the cores; only workers share theirs
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT", "RANK", "GROUP_RANK"):
        env.pop(key, None)  # a new group: Lightning's launcher sets these for its ranks
    if (threads := layout.rank_threads()) is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.Popen([sys.executable, "-m", "reproduce", "_rank-run", str(payload)],
                            env=env, start_new_session=True)
    stopped: list[int] = []
    ctrl_c = stops.CtrlC()

    def forward(signum, frame) -> None:  # every rank saves the step it is at and exits
        if signum == signal.SIGINT and ctrl_c.again():
            raise KeyboardInterrupt  # Ctrl-C again: stop every rank now (below)
        stopped.append(signum)
        _signal_group(proc.pid, signum)

    try:
        with stops.handling(forward, (signal.SIGTERM, signal.SIGINT)):
            code = proc.wait()
    except BaseException:  # Ctrl-C twice: every rank stops at once, then go on stopping
        _stop_group(proc, signal.SIGINT)
        raise
    finally:
        _kill_group(proc.pid)  # ranks still alive after rank 0 ended (it died, or they linger)
    if code != 0 and stopped:
        saved = work / "checkpoints" / PREEMPTED
        where = (f"its ranks saved the step they were at ({saved}): run the command again to "
                 "resume from it" if saved.exists() else "run the command again to resume it")
        name = signal.Signals(stopped[0]).name
        raise Stopped(f"{run.run_id}: stopped by {name}; {where}", stopped[0], work=work)
    if code != 0:
        how = f"signal {-code}" if code < 0 else f"status {code}"
        raise RankFailure(f"{run.run_id}: rank 0 of {layout.devices} exited with {how}; every "
                           "rank was stopped. Run the command again to resume from the last "
                           f"checkpoint (rank logs: {work}/rank*-error.log, if any)")


def _stop_group(proc: subprocess.Popen, sig: int, grace: float = 30.0) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# --- a rank's side -------------------------------------------------------------------------------


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Be killed (SIGKILL) when the process that started this one dies, however it dies (kill -9,
    the OOM killer): rank 0 with the sweep's process, the other ranks with rank 0 (Lightning's
    launcher starts them), so no rank trains on unsupervised, holding devices. Linux's
    ``PR_SET_PDEATHSIG``; elsewhere a thread that watches the parent."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True, name="die-with-parent").start()
    if parent == 1 or os.getppid() != parent:  # it died before the line above took effect
        os.kill(os.getpid(), signal.SIGKILL)


def rank_main(path: str, run_here: Callable[..., Any]) -> int:
    """``python -m reproduce _rank-run FILE``: this process's part of the run in FILE, trained by
    ``run_here`` (``runner.run_here``)."""
    die_with_parent()
    data = json.loads(Path(path).read_text())
    spec = data["run"]
    reference = spec.get("precision_from")
    run = PlannedRun(**{**spec, "config": Config.from_dict(spec["config"]),
                        "precision_from": reference and Config.from_dict(reference)})
    layout = Layout(**data["layout"])
    me = rank()
    if me:  # rank 0 speaks for the run; the others only warn
        logging.getLogger("reproduce").setLevel(logging.WARNING)
        logging.getLogger("datasets").setLevel(logging.WARNING)
    try:
        run_here(run, data["split"], data["command"], Path(path).parent, data["extra"], layout,
                 (data["precision"], data["precision_choice"]))
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # one line here, the traceback in the run's folder
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            print(f"rank {me} of {layout.world}: {DiskError(run.run_id, e)}", file=sys.stderr)
            return 1
        where = Path(path).parent / f"rank{me}-error.log"
        where.write_text(traceback.format_exc())
        print(f"rank {me} of {layout.devices}: {one_line(e, 160)} (traceback: {where})",
              file=sys.stderr)
        return 1
    # Leave the process group before the interpreter exits: a rank whose communication threads
    # are still joinable at exit dies in C++ terminate(), and Lightning's observer in rank 0 then
    # kills a run whose record is already written.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def timeout_seconds() -> float:
    """Seconds a rank waits in a collective (``REPRODUCE_DDP_TIMEOUT``, default 600)."""
    return seconds_from_env(TIMEOUT_ENV, 600.0)
