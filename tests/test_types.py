"""The record is typed at both ends: mypy checks every reader of reproduce/ against
records/schema.py (its settings in pyproject.toml), so a field renamed on one side fails here, not
in a table at render time."""

import os
import subprocess
import sys
from pathlib import Path

from reproduce.records import schema, sharing

ROOT = Path(__file__).resolve().parents[1]


def _mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # MYPYPATH: the checkout's reproduce/, which an editable install hides from mypy
    return subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MYPYPATH": str(ROOT)})


def test_reproduce_type_checks():
    done = _mypy()  # files and settings: pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_misspelt_record_field_fails_the_type_checker(tmp_path):
    # what a reader renamed on one side only looks like to mypy: the spec's own settings
    (tmp_path / "reader.py").write_text(
        "from reproduce.records.schema import Record, config_of\n\n\n"
        "def ppl(r: Record) -> float:\n    return r['metrics']['dev_perplexity']\n\n\n"
        "def steps(r: Record) -> int:\n    return config_of(r).train.steps\n")
    done = _mypy("--ignore-missing-imports", "reader.py", cwd=tmp_path)
    assert done.returncode == 1
    assert '"Metrics" has no key "dev_perplexity"' in done.stdout
    assert '"TrainConfig" has no attribute "steps"' in done.stdout


def test_names_held_in_variables_are_the_records_fields():
    # keys mypy cannot check where they sit in a tuple: checked against the TypedDicts here
    assert set(schema.METRIC_NAMES) == set(schema.Metrics.__annotations__)
    assert set(sharing.TRAINING_FIELDS) <= set(schema.Record.__annotations__)
    assert set(sharing.TRAINING_METRICS) <= set(schema.Metrics.__annotations__)
