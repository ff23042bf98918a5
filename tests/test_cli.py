"""The real CLI, end to end, at the smoke scale: train, evaluate, record, render, skip, resume."""

import json
from pathlib import Path

import pytest

from tests.helpers import WANDB_OFFLINE, cli, cli_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def row_a(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    env = {**cli_env(root), **WANDB_OFFLINE, "REPRODUCE_CACHE": str(root / "cache")}
    out = cli(env, "table3", "--row", "A", "--scale", "smoke")
    return env, root / "results", out


def test_row_a_writes_five_records_and_the_table(row_a):
    env, results, out = row_a
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
        assert r["command"].startswith("python -m reproduce table3 --row A --scale smoke")
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


def test_running_again_skips_finished_runs(row_a):
    env, results, _ = row_a
    before = {p: p.read_bytes() for p in (results / "table3").glob("*.json")}
    out = cli(env, "table3", "--row", "A", "--scale", "smoke")
    assert out.stdout.count("finished earlier") == 5
    assert {p: p.read_bytes() for p in (results / "table3").glob("*.json")} == before


def test_render_trains_nothing_and_rewrites_the_table_from_records(row_a):
    env, results, _ = row_a
    (results / "table3.md").unlink()
    before = sorted((results / "table3").glob("*.json"))
    out = cli(env, "table3", "--row", "B", "--scale", "smoke", "--render")
    assert "finished earlier" not in out.stdout and "recorded" not in out.stdout
    assert sorted((results / "table3").glob("*.json")) == before  # row B was not trained
    assert "## Scale `smoke`" in (results / "table3.md").read_text()


def test_a_run_whose_record_is_lost_resumes_from_its_checkpoint(row_a):
    env, results, _ = row_a
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
def test_bad_input_is_one_line_and_nonzero(row_a, args, message):
    env, results, _ = row_a
    before = sorted(p.name for p in (results / "table3").glob("*.json"))
    out = cli(env, *args, check=False)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in (results / "table3").glob("*.json")) == before


def test_bad_spec_file_names_file_and_key(row_a, tmp_path):
    env, _, _ = row_a
    spec = tmp_path / "mine.yaml"
    spec.write_text("variants: {base: {set: {d_modle: 3}}}\n")
    out = cli(env, "table3", "--spec", str(spec), "--dry-run", check=False)
    assert out.returncode == 2
    assert "mine.yaml: variants.base.set: unknown config key 'd_modle'" in out.stderr


def test_missing_corpus_fails_cleanly(row_a, tmp_path):
    env, _, _ = row_a
    spec = tmp_path / "local.yaml"
    spec.write_text(f"base: {{corpus: wmt14-en-de, data_dir: {tmp_path / 'nowhere'}}}\n"
                    "variants: {base: {}}\n")
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", check=False)
    assert out.returncode == 2 and "nowhere" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_repo_readme_and_ci_run_the_same_test_command():
    root = Path(__file__).resolve().parent.parent
    ci = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in (root / "README.md").read_text()


def test_wandb_mode_disabled_trains_and_renders_without_wandb(tmp_path):
    env = {**cli_env(tmp_path), "WANDB_MODE": "disabled"}
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke")
    record = json.loads((tmp_path / "results/table3/table3-base-smoke-seed0.json").read_text())
    assert record["wandb"] == {"id": None, "mode": "disabled", "dir": None, "url": None}
    assert "logged the table to W&B" not in out.stdout
    assert not list(tmp_path.rglob("wandb"))  # no run folder, for the run or the table
    refused = cli(env, "publish", "--table", "table3", check=False)
    assert refused.returncode != 0 and "WANDB_MODE=disabled" in refused.stderr


def test_wandb_mode_follows_wandb_s_own_switch(monkeypatch):
    from reproduce.util.tracking import wandb_mode

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for mode, key, want in ((None, None, "offline"), ("online", None, "offline"),
                            (None, "k", "online"), ("offline", "k", "offline"),
                            ("dryrun", "k", "offline"), ("disabled", "k", "disabled"),
                            ("disabled", None, "disabled")):
        for name, value in (("WANDB_MODE", mode), ("WANDB_API_KEY", key)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert wandb_mode() == want, (mode, key)


def test_a_bad_wandb_init_timeout_is_one_line_before_training(tmp_path):
    env = {**cli_env(tmp_path), "WANDB_MODE": "", "WANDB_API_KEY": "0123456789abcdef0123",
           "WANDB_INIT_TIMEOUT": "soon"}
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: WANDB_INIT_TIMEOUT='soon': allowed values are seconds above 0 (how long an "
        "online run waits for W&B before logging offline)")
    assert not (tmp_path / "runs" / "table3").exists()
