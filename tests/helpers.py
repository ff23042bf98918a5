"""The real CLI in a subprocess, with results and runs in a folder of the test's own."""

import os
import subprocess
import sys
from pathlib import Path


def cli_env(root: Path, threads: int = 1) -> dict[str, str]:
    """The environment of a CLI call whose results and runs go under ``root``."""
    return {**os.environ, "REPRODUCE_RESULTS": str(root / "results"),
            "REPRODUCE_RUNS": str(root / "runs"), "OMP_NUM_THREADS": str(threads)}


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m reproduce *args``; with ``check``, a non-zero exit fails with its output."""
    out = subprocess.run([sys.executable, "-m", "reproduce", *args], capture_output=True,
                         text=True, env=env, check=False, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out
