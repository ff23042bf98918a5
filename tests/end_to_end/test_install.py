"""A user's paths into the harness: the wheel installed anywhere, sweeps of one's own beside the
project's results (``--results``), and one-off settings from the command line (``--set``)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reproduce import __version__, paths
from tests.helpers import WANDB_OFFLINE, cli

pytestmark = pytest.mark.slow


def _own_env(root: Path) -> dict[str, str]:
    """The environment of a user with no REPRODUCE_* variables: folders come from the command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRODUCE_")}
    return {**env, "REPRODUCE_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}


def test_the_wheel_carries_every_package_and_the_specs_and_runs_a_variant_from_any_folder(tmp_path):
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    source = tmp_path / "source"  # a copy: building leaves build/ and *.egg-info behind
    for name in ("reproduce", "sweeps"):
        shutil.copytree(paths.REPO / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(paths.REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", str(source), "-w", str(wheels)], check=True,
                   capture_output=True)
    [wheel] = wheels.glob("reproduce-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    assert sorted(p.name for p in (target / "reproduce" / "sweeps").glob("*.yaml")) == [
        "scales.yaml", "table2.yaml", "table3-followups.yaml", "table3.yaml", "table4.yaml"]
    env = {**_own_env(tmp_path), **WANDB_OFFLINE, "PYTHONPATH": str(target)}

    def run(*args: str) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "reproduce", *args], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    where = subprocess.run([sys.executable, "-c", "import reproduce; print(reproduce.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(target)  # the wheel, not this checkout
    assert run("--version").stdout.strip() == f"reproduce {__version__}"
    assert "table3-A4-smoke-seed0" in run("table3", "--row", "A", "--scale", "smoke",
                                          "--dry-run").stdout
    run("table3", "--variant", "A1", "--scale", "smoke")  # one run: the rows are test_cli's
    records = sorted((elsewhere / "results" / "table3").glob("*.json"))
    assert len(records) == 1 and (elsewhere / "results" / "table3.md").is_file()
    record = json.loads(records[0].read_text())
    # outside git the code is known by its own hash, never called clean (the wheel's files)
    source = hashlib.sha256()
    for path in sorted((target / "reproduce").rglob("*.py")):
        source.update(path.relative_to(target / "reproduce").as_posix().encode() + b"\0"
                      + path.read_bytes())
    assert record["commit"] == {"sha": None, "dirty": None, "version": __version__,
                                "provenance": "unknown: not run from a git checkout",
                                "source_sha256": source.hexdigest()}
    assert record["wandb"]["dir"].startswith("runs/table3/")  # relative to the runs root
    assert (elsewhere / "runs" / "table3").is_dir()


def test_own_results_and_set_values_stay_apart_from_the_projects(tmp_path):
    env = _own_env(tmp_path)
    mine = tmp_path / "mine"
    before = sorted((paths.REPO / "results").rglob("*"))
    refused = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--set",
                  "train.warmup_steps=5", check=False)
    assert refused.returncode == 2 and "--results DIR" in refused.stderr
    varied = cli(env, "table3", "--row", "A", "--scale", "smoke", "--results", str(mine),
                 "--set", "model.h=2", "--dry-run", check=False)
    assert varied.returncode == 2
    assert "error: --set h: row A varies it (A1 sets h=1)" in varied.stderr
    for bad, message in ((["warmup=5"], "unknown config key 'warmup'"),
                         (["warmup_steps=many"], "warmup_steps = 'many': expected int"),
                         (["warmup_steps"], "expected SECTION.FIELD=VALUE")):
        out = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--results", str(mine),
                  "--set", *bad, check=False)
        assert out.returncode == 2 and message in out.stderr, out.stderr

    # --set repeated adds to the values before it (none dropped)
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--results", str(mine),
              "--set", "train.warmup_steps=5", "--set", "decode.beam=2", "--workers", "1")
    assert "--set, for every run: warmup_steps 10 -> 5, beam 4 -> 2" in out.stdout
    record = json.loads((mine / "table3" / "table3-base-smoke-seed0.json").read_text())
    assert record["set"] == {"warmup_steps": 5, "beam": 2}
    assert (record["config"]["train"]["warmup_steps"], record["config"]["decode"]["beam"]) == (5, 2)
    assert (mine / "table3.md").is_file() and (mine / "runs" / "table3").is_dir()
    assert sorted((paths.REPO / "results").rglob("*")) == before  # the project's untouched

    again = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--results", str(mine),
                "--set", "train.warmup_steps=5", "decode.beam=2")
    assert "All 1 run(s) already had a record in" in again.stdout
    assert "python -m reproduce verify" in again.stdout


# attention_dropout.yaml runs in tests/end_to_end/test_first_steps.py, as docs/first-steps.md uses it
@pytest.mark.parametrize("spec, table, variants, seeds", [
    ("local_corpus", "local-tiny", ["N2", "N8", "base"], ["0"]),
    ("pre_norm", "pre-norm", ["base", "pre-LN"], ["0", "1"]),  # two seeds: a verdict
])
def test_the_example_specs_run_at_smoke_scale(tmp_path, spec, table, variants, seeds):
    # run from the repository root, as docs/specs.md says (local_corpus's data_dir is relative)
    out = cli(_own_env(tmp_path), "table3", "--spec", f"sweeps/examples/{spec}.yaml", "--scale",
              "smoke", "--seeds", *seeds, "--results", str(tmp_path / "mine"), "--workers", "1",
              cwd=paths.REPO, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    mine = tmp_path / "mine"
    assert sorted(p.stem for p in (mine / table).glob("*.json")) == [
        f"{table}-{v}-smoke-seed{s}" for v in variants for s in seeds]
    page = (mine / f"{table}.md").read_text()
    assert f"`results/{table}/`" in page and (mine / f"{table}-smoke.png").is_file()
    if spec == "pre_norm":  # its configuration named, and a verdict against base
        row = next(line for line in page.splitlines() if line.startswith("| (LN) pre-LN | "))
        assert row.startswith("| (LN) pre-LN | wiring pre-norm |"), row
        assert row.split(" | ")[-2].split("; ")[0] in ("better", "worse", "no effect"), row
        record = json.loads((mine / table / f"{table}-pre-LN-smoke-seed0.json").read_text())
        assert record["config"]["model"]["wiring"] == "pre-norm"
    if spec == "local_corpus":
        record = json.loads((mine / table / f"{table}-base-smoke-seed0.json").read_text())
        assert record["data"]["corpus"] == "local-en-de"
        assert set(record["data"]["files"]) == {"train", "dev", "test"}
        # The three variants read one encoded corpus, built once, named in every record.
        records = [json.loads(p.read_text()) for p in (mine / table).glob("*.json")]
        assert {r["data"]["encoded"] for r in records} == {record["data"]["encoded"]}
        built = [p.name for p in (tmp_path / "cache" / "encoded").iterdir() if p.is_dir()]
        assert built == [record["data"]["encoded"]]
