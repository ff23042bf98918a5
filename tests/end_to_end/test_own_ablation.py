"""docs/own-ablation.md works as written: its commands, taken from the page, train the example's
part of one's own (sweeps/examples/glu.yaml: a GEGLU feed-forward in glu_feed_forward.py) at
`smoke` and see its records, from a folder whose `sweeps/` is this checkout's (the page runs them
from the checkout's root; here the results go to that folder, not into the checkout)."""

import hashlib
import json
import os
import shlex
from pathlib import Path

import pytest

from tests.helpers import WANDB_OFFLINE, cli

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-ablation.md"
pytestmark = pytest.mark.slow


def _commands() -> list[list[str]]:
    block = PAGE.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line)[3:] for line in block.splitlines()
            if line.startswith(".venv/bin/python -m reproduce ")]


def test_a_part_of_ones_own_trains_and_is_recorded_as_the_page_says(tmp_path):
    (tmp_path / "sweeps").symlink_to(ROOT / "sweeps")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRODUCE_")}
    env.update(REPRODUCE_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    train, status = _commands()
    cli(env, *train, "--workers", "1", cwd=tmp_path)
    mine = tmp_path / "mine"
    record = json.loads((mine / "glu" / "glu-GEGLU-smoke-seed0.json").read_text())
    module = "sweeps/examples/glu_feed_forward.py"
    source = (ROOT / module).read_text()
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert record["modules"] == {module: {"sha256": digest, "source": source}}
    assert record["config"]["model"]["modules"] == f"{module}#{digest[:16]}"
    assert record["config"]["model"]["feed_forward"] == "geglu"
    page = (mine / "glu.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| (FFN) GEGLU | "))
    assert "| modules sweeps/examples/glu_feed_forward.py, feed_forward geglu |" in row
    assert row.split(" | ")[-2].split("; ")[0] in ("better", "worse", "no effect"), row  # 2 seeds
    said = cli(env, *status, cwd=tmp_path).stdout
    assert said.startswith("glu at `smoke` (seeds [0, 1]): 4 done, 0 stale"), said
    published = cli({**env, **WANDB_OFFLINE}, "publish", "--spec", "sweeps/examples/glu.yaml",
                    "--results", "mine", cwd=tmp_path).stdout  # W&B offline, as without a key
    assert published.startswith("glu: 4 record(s) logged to W&B (offline)"), published
    plan = cli(env, *train, "--seeds", "2", "--dry-run", cwd=tmp_path).stdout  # 0, 1 and 2
    assert "(the feed-forward 'geglu' counted by torch's FlopCounterMode: 12,288 multiply-adds " \
        "a token)" in plan.split("glu-GEGLU-smoke-seed2: 30 steps")[1].splitlines()[0]
