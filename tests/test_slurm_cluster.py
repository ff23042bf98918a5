"""``--launcher slurm`` against a real SLURM: two nodes on this machine, brought up by
``tools/slurm/cluster.sh up`` (Debian's slurm-wlm and munge; issue 50). Without one these tests
skip, saying how to start it; ``tests/slurm_sim.py`` still covers what they do not."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = Path(os.environ.get("REPRODUCE_SLURM_DIR", "/tmp/reproduce-slurm")) / "slurm.conf"
pytestmark = pytest.mark.slow  # the module-scoped cluster keeps them on one worker: one at a time


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    env = {**os.environ, "SLURM_CONF": str(CONF)}
    try:
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True,
                               text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        nodes = []
    if not CONF.is_file() or sorted(line for line in nodes if line) != ["n1 idle", "n2 idle"]:
        pytest.skip(f"no two-node SLURM at {CONF}: `tools/slurm/cluster.sh up` starts one")
    return env


def _submit(env: dict[str, str], root: Path, *args: str) -> str:
    user = {k: v for k, v in env.items() if not k.startswith("REPRODUCE_")}
    out = subprocess.run([sys.executable, "-m", "reproduce", "table3", "--scale", "smoke",
                          "--launcher", "slurm", "--results", str(root / "mine"), *args],
                         env={**user, "REPRODUCE_CACHE": str(root / "cache"),
                              "WANDB_MODE": "disabled"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _wait_for_queue(env: dict[str, str], stdout: str, timeout: float = 600) -> None:
    jobs = {line.rsplit("job ", 1)[1].split("_")[0] for line in stdout.splitlines()
            if ": job " in line}
    assert jobs, stdout
    deadline = time.time() + timeout
    while time.time() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], env=env,
                                capture_output=True, text=True).stdout.split()
        if not queued:
            return
        time.sleep(3)
    pytest.fail(f"jobs {jobs} still queued after {timeout:.0f} s")


def test_an_array_task_per_run_leaves_their_records(slurm_env, tmp_path):
    out = _submit(slurm_env, tmp_path, "--variant", "base", "--variant", "A1")
    _wait_for_queue(slurm_env, out)
    records = sorted(p.name for p in (tmp_path / "mine" / "table3").glob("*.json"))
    assert records == ["table3-A1-smoke-seed0.json", "table3-base-smoke-seed0.json"]


def test_one_run_over_both_nodes_is_one_ddp_run(slurm_env, tmp_path):
    out = _submit(slurm_env, tmp_path, "--variant", "base", "--nodes", "2", "--gpus-per-node", "0")
    _wait_for_queue(slurm_env, out)
    record = json.loads((tmp_path / "mine" / "table3" / "table3-base-smoke-seed0.json").read_text())
    assert (record["batch"]["nodes"], record["batch"]["world_size"]) == (2, 2)
    assert record["batch"]["strategy"].startswith("ddp")


def test_a_request_the_cluster_refuses_is_one_line(slurm_env, tmp_path):
    # a GPU on a partition without GPUs: sbatch's own reason, no traceback, nothing submitted
    user = {k: v for k, v in slurm_env.items() if not k.startswith("REPRODUCE_")}
    out = subprocess.run([sys.executable, "-m", "reproduce", "table3", "--scale", "smoke",
                          "--launcher", "slurm", "--variant", "base", "--gpus-per-node", "1",
                          "--results", str(tmp_path / "mine")], env=user, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: sbatch refused the array (sbatch: error: Invalid generic resource (gres) " \
           "specification); nothing was submitted" in out.stderr
    assert "Traceback" not in out.stderr
