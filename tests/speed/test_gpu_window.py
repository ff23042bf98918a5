"""benchmarks/gpu_window.py rehearsed on the CPU: the GPU window's one command at smoke with every
part (the compiled ones by dynamo's capture alone, ``--compile-backend eager``) and the fallbacks
forced where a CPU never meets them (a CUDA graph's capture failing, a step too large for the
device's memory), a part cut at its cap, a run stopped at its cap, and what comes back from each."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reproduce.speed.gpu import PARTS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

# Imported first by every Python the window starts (PYTHONPATH): once the modules named below are
# imported, CUDA graphs fail at their capture in the backward (pytorch/pytorch#169545, where the
# forward's try cannot see it: lit.backward), and the micro-batch search sees a device on which
# one pass of the step runs out of memory and half of it fits.
FAULTS = '''
import importlib.abc, importlib.machinery, sys

def graphs(module):
    import torch
    fast = module.compiled_fast
    class CaptureFailed(RuntimeError):
        pass
    CaptureFailed.__module__ = "torch._inductor.cudagraph_trees"
    class FailsBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()
        @staticmethod
        def backward(ctx, grad):
            raise CaptureFailed("operation not permitted when stream is capturing (forced)")
    def compiled_fast(loss_fn, cuda_graphs=False):
        run = fast(loss_fn, False)
        if not cuda_graphs:
            return run
        def failing(*args, **kwargs):
            smoothed, nll, n = run(*args, **kwargs)
            return FailsBackward.apply(smoothed), nll, n
        return failing
    module.compiled_fast = compiled_fast

def memory(module):
    choose = module.choose
    def forced(config, devices, precision, accelerator, cache, peak=None, total=None):
        whole = config.train.split_batch(devices)[1]
        return choose(config, devices, precision, accelerator, cache,
                      lambda tokens: None if tokens > whole // 2 else 10**8, 10**9)
    module.choose = forced

PATCH = {"reproduce.train.step_time": graphs, "reproduce.train.micro_batch": memory}

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCH:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            PATCH[name](module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Finder())
'''


def window(tmp_path: Path, *argv: str, faults: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_DIR": str(tmp_path)}
    if faults:
        (tmp_path / "faults").mkdir()
        (tmp_path / "faults" / "sitecustomize.py").write_text(FAULTS)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path / "faults"),
                                                          os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "benchmarks/gpu_window.py", "--out",
                           str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--scale",
                           "smoke", "--pairs", "2000", "--no-kit", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_window_runs_every_part_in_order_through_its_fallbacks_and_keeps_what_each_measured(
        tmp_path):
    done = window(tmp_path, "--seconds", "200", "--run-seconds", "120", "--steps", "20",
                  "--eval-pairs", "20", "--compile-backend", "eager", "--batch-shapes", "4",
                  "--micro-batch", "auto", "--set", "train.cuda_graphs=true", "--cap",
                  "beam=0.05", "tf32=0", faults=True)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert list(stages) == ["preflight", "paper-scale run", "copied", "bench --gpu"]
    assert stages["preflight"]["gpu_available"] is False and stages["preflight"]["torch"]
    assert stages["bench --gpu"]["outcome"] == "exit 0"
    # 1. base on the fast path through the CLI, through both fallbacks, its step profiled
    record = json.loads((out / "paper-run.json").read_text())
    assert record["compile"] is True and record["metrics"]["train_steps"] == 20
    how = record["compile_choice"]
    assert how["in_training"]["backend"] == "eager" and how["in_training"]["graphs"] >= 1
    assert how["cuda_graphs_failed_in_training"].startswith("step 0: CaptureFailed: operation")
    micro = record["batch"]["micro_batch_choice"]  # one pass ran out of memory: two
    assert micro["asked"] == "auto" and micro["measured"]["passes"] == 2
    assert record["batch"]["accumulate"] == 2
    assert None in micro["measured"]["peak_bytes"].values()
    census = record["batch"]["step_census"]
    assert len(census["top"]) == 8 and census["host_ms"] > census["top"][0][1] > 0
    page = (out / "paper-run.md").read_text()
    assert "profiled (the record's `batch.step_census`)" in page and "| op (own time) |" in page
    assert "--compile on --batch-shapes 4 --micro-batch auto --set train.cuda_graphs=true" in page
    with tarfile.open(out / "tokenizer.tar.gz") as tar:
        [model] = tar.getnames()
    assert model.startswith("spm/") and model.endswith(".model")
    # 2.-10. bench --gpu: every part, in order, one cut at its cap and one skipped by a cap of 0
    gpu = json.loads((out / "gpu.json").read_text())
    assert gpu["compile_backend"] == "eager"
    measured = ["base, compiled", "big, compiled", "base, compiled, two passes", "nn.Transformer",
                "nn.Transformer, compiled", "base", "big"]
    assert list(gpu["parts"]) == measured
    assert gpu["parts"]["base, compiled, two passes"]["accumulate"] == 2
    assert gpu["skipped"]["base, tf32"] == "skipped (--cap tf32=0)"  # 0 skips, never uncaps
    assert gpu["skipped"]["beam search, base"].startswith("cut at 0.05 s (its cap 0.05 s")
    page = (out / "gpu.md").read_text()
    assert "- ours over the peer, both compiled: " in page and "- one pass over two" in page
    log = (out / "window.log").read_text()
    assert "done: something measured" in log
    assert "profiled step 12: host " in log  # the census in the log too (a stopped run's)


def test_a_window_that_measures_nothing_exits_1_and_says_where_it_stopped(tmp_path):
    """The run stopped at its cap (dynamo's capture alone: inductor's compile of its first step
    outlasts the cap and the 15 s the window then waits, so it would be killed, ~15 s of CPU
    later), every part of the bench cut."""
    caps = [f"{key}=0.01" for key in PARTS]
    cut = window(tmp_path, "--seconds", "30", "--run-seconds", "6", "--steps", "5000",
                 "--compile-backend", "eager", "--cap", *caps)
    assert cut.returncode == 1, cut.stdout + cut.stderr
    out = tmp_path / "out"
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert stages["paper-scale run"]["outcome"] == "stopped at its time"
    logged = stages["paper-scale run, as logged"]  # what its progress lines showed, if any
    assert set(logged) == {"ended_at_s", "last_step", "at_seconds", "step_s", "steps_timed"}
    assert stages["copied"]["record"] is False
    assert not (out / "paper-run.json").exists()
    assert "done: nothing measured" in (out / "window.log").read_text()


def test_a_stopped_runs_log_gives_its_steps():
    """The window reads back the progress lines a run writes (``callbacks.PROGRESS``)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_window import logged_steps

    from reproduce.train.callbacks import PROGRESS

    log = "\n".join([PROGRESS % (50, 300, 6.1, 40.2), "step 50/300  dev PPL 300.1  41 s",
                     *(PROGRESS % (step, 300, 5.0, seconds) for step, seconds in
                       ((100, 50.4), (150, 61.0), (200, 70.0), (250, 79.6)))]) + "\n"
    # from the first point past step 0 (the compile is before it) to the last
    assert logged_steps("step 0/300  loss 9.0  30 s\n" + log) == {
        "last_step": 250, "at_seconds": 80, "step_s": 0.2, "steps_timed": 200}
    assert logged_steps("") == {"last_step": None, "at_seconds": None, "step_s": None,
                                "steps_timed": 0}
