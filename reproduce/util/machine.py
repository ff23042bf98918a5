"""Where a run happens, read once for every module that needs it: the CPU's name, the instruction
sets that decide matmul speed (records, precision choice, benchmarks), the cores this process may
use (workers, devices), the GPUs, the commit, and this machine's sustained matmul rate."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import time
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import torch

from reproduce import paths

CPUINFO = Path("/proc/cpuinfo")
# Set in a --workers worker on a CPU: a file "<workers still running> <cores they share>" (launch/workers.py)
SHARE_ENV = "REPRODUCE_WORKER_SHARE"
# How many workers of one --workers command train on this worker's GPU (workers.gpu_blocks)
GPU_SHARE_ENV = "REPRODUCE_GPU_SHARE"


@lru_cache(maxsize=1)
def _cpuinfo() -> str:
    """/proc/cpuinfo, read once per process (records, plans and probes ask for it often)."""
    return CPUINFO.read_text() if CPUINFO.exists() else ""


def _cpuinfo_field(name: str) -> str | None:
    """The first ``name: value`` line of /proc/cpuinfo, or None (not Linux, or no such line)."""
    for line in _cpuinfo().splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return None


def cpu_name() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The instruction sets that decide matmul speed: avx2, fma, avx512*, amx*."""
    flags = (_cpuinfo_field("flags") or "").split()
    return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))


def cores() -> int:
    """Cores this process may run on (its affinity, as taskset or SLURM set it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# "<sha>" or "<sha> dirty": the commit of a tree copied to another machine (tools/offline-gpu);
# set, it wins over the copy's .git
COMMIT_ENV = "REPRODUCE_COMMIT"


def commit() -> dict[str, Any]:
    """The code a record was made with: the package's version and the commit of the checkout it
    ran from (an installed package: of the current folder, where that is a git checkout; else
    None), dirty when tracked files other than results/ differ from it."""
    from reproduce import __version__

    where = paths.REPO or Path.cwd()

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True,
                                  check=False).stdout.strip()
        except OSError:  # no git on this machine
            return ""
    if os.environ.get(COMMIT_ENV):
        # a copy of the tree carried to an offline machine names its commit: it may have no .git,
        # or one whose HEAD lags behind the tree it holds
        named, _, dirty = os.environ[COMMIT_ENV].partition(" ")
        return {"sha": named, "dirty": dirty == "dirty", "from": COMMIT_ENV,
                "version": __version__}
    sha = git("rev-parse", "HEAD")
    if not sha:  # a copy, an unpacked archive: what ran is only known by its own hash
        return {"sha": None, "dirty": None, "version": __version__,
                "provenance": "unknown: not run from a git checkout",
                "source_sha256": source_sha256()}
    # results/ is what runs write (records, rendered tables): a sweep's own output there is no
    # change to the code that made a record, so it does not make the tree dirty.
    return {"sha": sha,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                              ":(exclude)results")),
            "version": __version__}


@cache
def source_sha256() -> str:
    """SHA-256 over the package's Python files, each by its path inside the package and its bytes:
    what identifies the code of a record made outside git."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def hardware() -> dict[str, Any]:
    info = {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "gpus": [],
            # Other work on the machine slows a run: the load when the record was written.
            "load_average": [round(x, 2) for x in os.getloadavg()]}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def default_scale() -> str:
    """The scale that fits this machine: the paper's on a GPU, `cpu` otherwise."""
    return "paper" if torch.cuda.is_available() else "cpu"


def matmul_seconds(dtype: torch.dtype, n: int, budget: float = 0.5, most: int = 50) -> list[float]:
    """Seconds of each of up to ``most`` n x n products (after one to warm up), stopping once
    ``budget`` seconds are spent: the one matmul timer (cost, precision screen, bench)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times: list[float] = []
    while len(times) < most and sum(times) <= budget:
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return times


def matmul_gflops(dtype: torch.dtype, n: int, budget: float = 0.5) -> float:
    """Best matmul rate in GFLOP/s over repeats of an n x n product (a peak, for MFU)."""
    return 2 * n ** 3 / min(matmul_seconds(dtype, n, budget)) / 1e9


def measured_tflops() -> float:
    """This CPU's sustained fp32 matmul rate at this process's thread count, in TFLOPS (the
    paper's method needs one). Measured once per thread count in a process (~0.2 s), so the runs
    a sweep trains in one process are costed at one rate: their paper-method FLOPs differ by
    their hours, not by the noise of a short measurement."""
    return _measured_tflops(torch.get_num_threads())


@cache
def _measured_tflops(threads: int, n: int = 1024, repeats: int = 8) -> float:
    times = matmul_seconds(torch.float32, n, budget=float("inf"), most=repeats)
    return round(2 * n ** 3 * len(times) / sum(times) / 1e12, 4)


def gpu_share() -> int:
    """How many workers of this command share this process's GPU (1: it has its own). Other
    processes on that GPU, another command's workers say, are not counted."""
    try:
        return max(1, int(os.environ.get(GPU_SHARE_ENV, "1")))
    except ValueError:
        return 1


def share_cores() -> int | None:
    """In a CPU worker: take this worker's share of the cores as it is now (the cores split between
    the workers still running). Returns the new thread count when it changed, else None. Cheap:
    training calls it every few steps (``callbacks.ShareCores``)."""
    path = os.environ.get(SHARE_ENV)
    if not path:
        return None
    try:
        active, cores = (int(x) for x in Path(path).read_text().split())
    except (OSError, ValueError):
        return None  # the parent has gone, or is rewriting it: keep what we have
    threads = max(1, cores // max(1, active))
    if threads == torch.get_num_threads():
        return None
    torch.set_num_threads(threads)
    return threads



def return_free_memory() -> None:
    """Hand memory freed by Python back to the system: glibc's ``malloc_trim`` (elsewhere,
    nothing). After a first run's corpus text is dropped (gigabytes at WMT's size), glibc keeps
    the freed pages for this process unless asked: at 1M pairs 763 MB of private memory after the
    corpus was mapped, 332 MB once trimmed (docs/scales-and-data.md)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass  # not glibc: its allocator returns memory in its own way
