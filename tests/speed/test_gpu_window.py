"""benchmarks/gpu_window.py rehearsed on the CPU: the first GPU window's one command, with a tiny
model, a part cut at its cap, a paper-scale run stopped at the window's end, and what comes back
from each."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def window(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "benchmarks/gpu_window.py", "--out",
                           str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--scale",
                           "smoke", "--pairs", "2000", "--no-kit", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_window_keeps_what_each_part_measured_and_cuts_a_slow_part_at_its_cap(tmp_path):
    done = window(tmp_path, "--seconds", "120", "--reserve", "90", "--steps", "20",
                  "--eval-pairs", "20", "--cap", "beam=0.05", "tf32=0", "--micro-batch", "auto",
                  "--set", "train.cuda_graphs=true")
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back
    gpu = json.loads((out / "gpu.json").read_text())
    assert {"base", "big"} <= set(gpu["parts"]) and "base, tf32" not in gpu["parts"]
    assert gpu["skipped"]["base, tf32"] == "skipped (--cap tf32=0)"  # 0 skips, never uncaps
    assert gpu["parts"]["base"]["seconds_per_step"] > 0
    assert gpu["skipped"]["beam search, base"].startswith("cut at 0.05 s (its cap 0.05 s")
    assert "Skipped: beam search, base: cut at" in (out / "gpu.md").read_text()
    record = json.loads((out / "paper-run.json").read_text())
    assert record["metrics"]["train_steps"] == 20
    assert record["config"]["data"]["max_eval_pairs"] == 20
    assert record["batch"]["micro_batch_choice"]["asked"] == "auto"  # a CPU: one pass
    assert "--micro-batch auto --set train.cuda_graphs=true" in (out / "paper-run.md").read_text()
    assert record["config"]["train"]["cuda_graphs"] is True  # eager here: no effect
    assert set(record["phases"]) >= {"data", "fit", "decode"}
    assert record["command_seconds"] > record["wall_seconds"] > 0  # start-up, for GPU plans
    assert "| the command, start to end |" in (out / "paper-run.md").read_text()
    with tarfile.open(out / "tokenizer.tar.gz") as tar:
        [model] = tar.getnames()
    assert model.startswith("spm/") and model.endswith(".model")
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert list(stages) == ["preflight", "bench --gpu", "paper-scale run", "copied"]
    assert stages["preflight"]["gpu_available"] is False and stages["preflight"]["torch"]
    assert stages["bench --gpu"]["outcome"] == "exit 0"
    assert "done: something measured" in (out / "window.log").read_text()


def test_a_window_that_measures_nothing_exits_1_and_says_where_it_stopped(tmp_path):
    cut = window(tmp_path, "--seconds", "14", "--reserve", "9", "--steps", "5000", "--cap",
                 "base=0.01", "big=0.01", "beam=0.01", "tf32=0.01")
    assert cut.returncode == 1, cut.stdout + cut.stderr
    out = tmp_path / "out"
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert stages["paper-scale run"]["outcome"] == "stopped at its time"
    assert stages["copied"]["record"] is False
    assert not (out / "paper-run.json").exists()
    assert "done: nothing measured" in (out / "window.log").read_text()
