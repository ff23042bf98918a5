"""This machine's CPU, read once for every module that needs it: its name, the instruction sets
that decide matmul speed (records, precision choice, benchmarks) and the cores this process may
use (workers, devices)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(name: str) -> str | None:
    """The first ``name: value`` line of /proc/cpuinfo, or None (not Linux, or no such line)."""
    if not CPUINFO.exists():
        return None
    for line in CPUINFO.read_text().splitlines():
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
