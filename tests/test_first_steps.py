"""docs/first-steps.md works as written: its commands, taken from the page itself, run in a
fresh folder at the smoke scale (the page's only change), and say what the page says they do."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "first-steps.md"


def _commands() -> list[list[str]]:
    """The page's commands, in order: each `python -m reproduce ...` line of its bash blocks."""
    blocks = PAGE.read_text().split("```bash\n")[1:]
    lines = [line.split("#")[0].strip() for block in blocks for line in block.split("```")[0]
             .splitlines()]
    return [shlex.split(line)[3:] for line in lines if line.startswith("python -m reproduce ")]


def _run(args: list[str], cwd: Path) -> str:
    if args[0].startswith("table"):
        args = [*args, "--scale", "smoke", "--workers", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRODUCE_")}
    out = subprocess.run([sys.executable, "-m", "reproduce", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=600,
                         env={**env, "REPRODUCE_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, f"{args}\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


@pytest.mark.slow
def test_the_first_steps_work_as_written(tmp_path):
    # the page's own example spec, copied as it says
    shutil.copy(ROOT / "sweeps" / "examples" / "attention_dropout.yaml", tmp_path / "my_row.yaml")
    plan, train, status, own_row = (_run(args, tmp_path) for args in _commands())
    mine = tmp_path / "mine"
    assert "GUESS: no record of this CPU to fit; 30% of the probe" in plan  # as the page explains
    assert sorted(p.stem for p in (mine / "table3").glob("*.json")) == [
        f"table3-{v}-smoke-seed0" for v in ("A1", "A2", "A3", "A4", "base")]
    assert (mine / "table3.md").is_file() and "table3-A4-smoke-seed0: " in train
    assert "table3 at `smoke` (seeds [0]): 5 done, 0 stale, 0 running, 0 stopped, 15 missing" \
        in status  # the other rows are the missing ones
    # your row: base's training is the folder's table3 base, evaluated again, not retrained
    assert "the same training as table3-base-smoke-seed0" in own_row
    page = (mine / "attention-dropout.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| (P_attn) P1"))
    assert row.endswith("n/a |"), row  # no paper figures, no verdict
