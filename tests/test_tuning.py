"""--tune for Table 3: nuisance settings only, a persistent study that resumes, the best settings
recorded with the final run."""

import json
import os
import subprocess
import sys

import pytest

from reproduce.sweep import SpecError, load_spec

pytestmark = pytest.mark.slow


def test_table3_tunes_only_what_no_row_varies():
    tuning = load_spec("table3").search_space("cpu")
    assert set(tuning.knobs) == {"lr_scale", "warmup_steps"}
    assert (tuning.knobs["warmup_steps"].low, tuning.knobs["warmup_steps"].high) == (100, 1000)
    assert (tuning.metric, tuning.direction) == ("dev_ppl", "minimize")


def test_a_knob_a_row_varies_is_refused(tmp_path):
    spec = (tmp_path / "t.yaml")
    spec.write_text("table: t\nvariants:\n  base: {set: {}}\n  D1: {set: {p_drop: 0.0}}\n"
                    "tune: {metric: dev_ppl, direction: minimize, knobs: {p_drop: {low: 0, high: 0.3}}}\n")
    with pytest.raises(SpecError, match="p_drop"):
        load_spec(spec)


def test_table3_study_persists_and_resumes(tmp_path):
    import optuna

    env = {**os.environ, "REPRODUCE_RESULTS": str(tmp_path / "results"),
           "REPRODUCE_RUNS": str(tmp_path / "runs"), "REPRODUCE_CACHE": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}

    def run(trials):
        out = subprocess.run([sys.executable, "-m", "reproduce", "table3", "--variant", "A3",
                              "--scale", "smoke", "--tune", "--trials", str(trials)],
                             capture_output=True, text=True, env=env, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    run(2)
    storage = f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    study = optuna.load_study(study_name="table3-A3-smoke-seed0", storage=storage)
    assert len(study.trials) == 2
    assert set(study.trials[0].params) == {"lr_scale", "warmup_steps"}
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results" / "table3").glob("*.json")]
    best = record["tuning"]["best_params"]
    assert record["config"]["train"]["lr_scale"] == pytest.approx(best["lr_scale"])
    assert record["config"]["train"]["warmup_steps"] == best["warmup_steps"]
    assert record["config"]["model"]["h"] == 16  # what the row varies is untouched
    run(1)
    assert len(optuna.load_study(study_name="table3-A3-smoke-seed0", storage=storage).trials) == 3
