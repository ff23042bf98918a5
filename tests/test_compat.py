"""What the code before a change wrote still works after it: its checkpoints resume, its encoded
cache and tokenizer map. The older code is taken from git history (the commit before the record
was typed and train/fit.py split by job) and run for real beside this checkout."""

import json
import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from tests.helpers import cli, cli_env

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "6acbe5e"  # the last commit before train/fit.py was split and records typed
RUN = "table3-base-smoke-seed0"


def _checkout(commit: str, into: Path) -> Path:
    """The package and specs of ``commit``, unpacked into ``into`` (importable from there)."""
    try:
        archive = subprocess.run(["git", "archive", commit, "reproduce", "sweeps"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        pytest.skip(f"commit {commit} is not in this clone's history ({e})")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


@pytest.mark.slow
def test_a_checkpoint_and_cache_of_the_code_before_resume_and_map(tmp_path):
    env = {**cli_env(tmp_path), "REPRODUCE_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    old = _checkout(BEFORE, tmp_path / "before")
    cli({**env, "PYTHONPATH": str(old)}, "table3", "--variant", "base", "--scale", "smoke",
        "--workers", "1")
    record = tmp_path / "results" / "table3" / f"{RUN}.json"
    before = json.loads(record.read_text())
    record.unlink()  # the run is unfinished again: only its old checkpoints remain
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--workers", "1")
    after = json.loads(record.read_text())
    assert after["resumed"] is True, out.stdout + out.stderr
    assert after["resumed_from"]["step"] == 30
    assert after["data"]["encoded"] == before["data"]["encoded"]  # the old cache, mapped
    assert ": encoded " not in out.stderr  # nothing encoded again
    assert after["metrics"]["dev_ppl"] == before["metrics"]["dev_ppl"]
