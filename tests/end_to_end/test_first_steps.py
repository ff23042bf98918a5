"""docs/first-steps.md works as written: its commands, taken from the page itself, run in a
fresh folder at the smoke scale (the page's only change), and say what the page says they do.
The row A they train is also what the CLI's end-to-end tests read (records, render, skip, resume,
bad input): one training of the row for both."""

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from tests.helpers import WANDB_OFFLINE, cli

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-steps.md"
pytestmark = pytest.mark.slow


def _commands() -> list[list[str]]:
    """The page's commands, in order: each `.venv/bin/python -m reproduce ...` line of its bash
    blocks (the install lines stand for this checkout's venv)."""
    blocks = PAGE.read_text().split("```bash\n")[1:]
    lines = [line.split("#")[0].strip() for block in blocks for line in block.split("```")[0]
             .splitlines()]
    return [shlex.split(line)[3:] for line in lines
            if line.startswith(".venv/bin/python -m reproduce ")]


def _run(args: list[str], cwd: Path) -> str:
    if args[0].startswith("table"):  # at smoke, where the page has not chosen it already
        args = [*args, *(["--scale", "smoke"] if "--scale" not in args else []), "--workers", "1"]
    out = cli(_env(cwd), *args, cwd=cwd, check=False)
    assert out.returncode == 0, f"{args}\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def _env(cwd: Path) -> dict[str, str]:
    """A new user's environment (no REPRODUCE_* folders: the page's --results decides), W&B
    offline as without a key; the later tests' CLI calls reach the same folders through it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRODUCE_")}
    return {**env, **WANDB_OFFLINE, "REPRODUCE_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The page's commands, run once in a fresh folder; the tests below read what they left.
    Returns (env, results, outputs) with env reaching the page's folders from anywhere."""
    root = tmp_path_factory.mktemp("first-steps")
    # the page's own example spec, copied as it says
    shutil.copy(ROOT / "sweeps" / "examples" / "attention_dropout.yaml", root / "my_row.yaml")
    outputs = [_run(args, root) for args in _commands()]
    env = {**_env(root), "REPRODUCE_RESULTS": str(root / "mine"),
           "REPRODUCE_RUNS": str(root / "mine" / "runs")}
    return env, root / "mine", outputs


def test_the_first_steps_work_as_written(page):
    _, mine, (smoke, plan, train, status, own_row) = page
    assert "table3-base-smoke-seed0: dev PPL" in smoke  # the plumbing, in its own folder
    assert "GUESS: no record of this CPU at `smoke` to fit; 30% of the probe" in plan  # the page
    assert sorted(p.stem for p in (mine / "table3").glob("*.json")) == [
        f"table3-{v}-smoke-seed0" for v in ("A1", "A2", "A3", "A4", "base")]
    assert (mine / "table3.md").is_file() and "table3-A4-smoke-seed0: " in train
    assert "profiler_st" not in train  # Kineto's lines at each run's step census (issue 82)
    assert "table3 at `smoke` (seeds [0]): 5 done, 0 stale, 0 running, 0 stopped, 15 missing" \
        in status  # the other rows are the missing ones
    # your row: base's training is the folder's table3 base, evaluated again, not retrained
    assert "the same training as table3-base-smoke-seed0" in own_row
    page_md = (mine / "attention-dropout.md").read_text()
    row = next(line for line in page_md.splitlines() if line.startswith("| (P_attn) P1"))
    assert row.endswith("| n/a; n/a |  |"), row  # one seed a side: no noise, no verdict


# The same row A, read by the CLI's end-to-end tests: records, rendering, skipping, resuming and
# bad input (one training of row A for both).


def test_row_a_writes_five_records_and_the_table(page):
    env, results, _ = page
    records = sorted((results / "table3").glob("*.json"))
    assert [p.stem for p in records] == [f"table3-{v}-smoke-seed0" for v in
                                         ("A1", "A2", "A3", "A4", "base")]
    for path in records:
        r = json.loads(path.read_text())
        assert r["scale"] == "smoke" and r["seed"] == 0 and r["split"] == "dev"
        assert r["metrics"]["train_steps"] == r["config"]["train"]["train_steps"] > 0
        assert r["metrics"]["dev_ppl"] > 1
        assert r["bleu"]["dev"]["sacrebleu"]["signature"].startswith("nrefs:1|case:mixed")
        assert r["bleu"]["test"]["tokenized"]["kind"] == "tokenized-compound-split"
        assert r["command"].startswith("python -m reproduce table3 --row A --results mine")
        assert r["commit"]["sha"] and r["hardware"]["cpu"] and r["wall_seconds"] > 0
        assert list(r["phases"]) == ["data", "fit", "average", "dev_ppl", "decode"]
        assert r["phases"]["fit"] >= r["metrics"]["train_seconds"] > 0
        assert sum(r["phases"].values()) <= r["wall_seconds"] + 0.5  # each rounded to 0.1 s
        assert r["wandb"]["mode"] == "offline" and r["wandb"]["id"]
    a1 = json.loads((results / "table3" / "table3-A1-smoke-seed0.json").read_text())
    assert (a1["config"]["model"]["h"], a1["config"]["model"]["d_k"]) == (1, 32)
    table = (results / "table3.md").read_text()
    base = json.loads((results / "table3" / "table3-base-smoke-seed0.json").read_text())
    assert f"| {base['metrics']['dev_ppl']:.2f} |" in table
    assert "## Scale `smoke`" in table
    assert (results / "table3-smoke.png").read_bytes()[:4] == b"\x89PNG"
    steps = [point[0] for point in base["curve"]["train_loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == base["metrics"]["train_steps"]


def test_running_again_skips_finished_runs(page):
    env, results, _ = page
    before = {p: p.read_bytes() for p in (results / "table3").glob("*.json")}
    out = cli(env, "table3", "--row", "A", "--scale", "smoke")
    assert out.stdout.count("finished earlier") == 5
    assert {p: p.read_bytes() for p in (results / "table3").glob("*.json")} == before


def test_render_trains_nothing_and_rewrites_the_table_from_records(page):
    env, results, _ = page
    (results / "table3.md").unlink()
    before = sorted((results / "table3").glob("*.json"))
    out = cli(env, "table3", "--row", "B", "--scale", "smoke", "--render")
    assert "finished earlier" not in out.stdout and "recorded" not in out.stdout
    assert sorted((results / "table3").glob("*.json")) == before  # row B was not trained
    assert "## Scale `smoke`" in (results / "table3.md").read_text()


def test_a_run_whose_record_is_lost_resumes_from_its_checkpoint(page):
    env, results, _ = page
    path = results / "table3" / "table3-A2-smoke-seed0.json"
    old = json.loads(path.read_text())
    path.unlink()
    out = cli(env, "table3", "--variant", "A2", "--scale", "smoke")
    assert "resuming from" in out.stdout
    new = json.loads(path.read_text())
    assert new["resumed"] and new["metrics"]["train_steps"] == old["metrics"]["train_steps"]
    assert new["metrics"]["dev_ppl"] == pytest.approx(old["metrics"]["dev_ppl"], rel=1e-3)


@pytest.mark.parametrize("args, message", [
    (["table3", "--row", "Z", "--scale", "smoke"], "unknown row 'Z'; valid rows: A, B, C"),
    (["table3", "--variant", "A9"], "unknown variant 'A9'; valid variants: base, A1"),
    (["table3", "--row", "A", "--scale", "huge"], "unknown scale 'huge'; valid scales: paper, cpu"),
])
def test_bad_input_is_one_line_and_nonzero(page, args, message):
    env, results, _ = page
    before = sorted(p.name for p in (results / "table3").glob("*.json"))
    out = cli(env, *args, check=False)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in (results / "table3").glob("*.json")) == before
