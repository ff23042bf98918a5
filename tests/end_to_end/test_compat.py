"""What the code before a change wrote still works after it: its checkpoints resume mid-run, its
encoded cache and tokenizer map. The older code is taken from git history (the commit before
launching, stops, metrics and the records package were reorganized) and run for real beside this
checkout."""

import json
import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from tests.helpers import cli, cli_env

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "5fab401"  # main before launch/, train/stops.py, records/ and runs/metrics.py
RUN = "table3-base-smoke-seed0"


def _checkout(commit: str, into: Path) -> Path:
    """The package and specs of ``commit``, unpacked into ``into`` (importable from there)."""
    try:
        archive = subprocess.run(["git", "archive", commit, "reproduce", "sweeps", "pyproject.toml"],
                                 cwd=ROOT, capture_output=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        pytest.skip(f"commit {commit} is not in this clone's history ({e})")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


@pytest.mark.slow
def test_a_checkpoint_and_cache_of_the_code_before_resume_mid_run_and_map(tmp_path):
    """The old code stopped by SIGTERM at step 13 (its preempted.ckpt: parameters, Adam's state,
    the schedule, the callbacks' state keys); this checkout resumes it from there, mapping the old
    encoded cache, and ends where a run of this checkout never stopped ends."""
    from tests.end_to_end.test_faults import FAULTS
    from tests.helpers import inject

    env = {**cli_env(tmp_path), "REPRODUCE_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    old = _checkout(BEFORE, tmp_path / "before")
    # smoke's batch and evaluation pairs as they were then (the scale's are 512 tokens and 24
    # pairs now): the same config on both sides
    args = ("table3", "--variant", "base", "--scale", "smoke", "--workers", "1", "--set",
            "train.batch_tokens=1024", "data.max_eval_pairs=48")
    stopped = inject({**env, "PYTHONPATH": str(old)}, tmp_path / "inject", FAULTS)
    out = cli({**stopped, "REPRODUCE_TEST_FAULT": "sigterm-at-13"}, *args, check=False)
    assert out.returncode == 1 and "stopped by SIGTERM at step 13 of 30" in out.stderr, out.stderr
    checkpoint = tmp_path / "runs" / "table3" / RUN / "checkpoints" / "preempted.ckpt"
    assert checkpoint.exists()
    out = cli(env, *args)
    assert f"resuming from {checkpoint}" in out.stdout, out.stdout
    assert ": encoded " not in out.stdout + out.stderr  # the old cache, mapped
    after = json.loads((tmp_path / "results" / "table3" / f"{RUN}.json").read_text())
    assert after["resumed_from"]["step"] == 13
    here = {**env, "REPRODUCE_RESULTS": str(tmp_path / "here"),
            "REPRODUCE_RUNS": str(tmp_path / "here" / "runs")}
    cli(here, *args)
    never = json.loads((tmp_path / "here" / "table3" / f"{RUN}.json").read_text())
    assert after["metrics"]["dev_ppl"] == never["metrics"]["dev_ppl"]
    for kind in ("train_loss", "dev_ppl"):  # the same points ([step, seconds, value]; seconds differ)
        assert [p[::2] for p in after["curve"][kind]] == [p[::2] for p in never["curve"][kind]]
