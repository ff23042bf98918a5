"""Many workers on one sweep: each run is claimed by one worker, a dead worker's run is taken over
(resumed from its checkpoint), and every run is recorded exactly once."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from reproduce.claims import claim, holder

pytestmark = pytest.mark.slow


def test_a_claim_is_exclusive_and_dies_with_its_holder(tmp_path):
    with claim(tmp_path) as first:
        assert first and holder(tmp_path)["worker"].endswith("(local)")
        with claim(tmp_path) as second:  # a second claim on the same run, even from this process
            assert not second
        assert holder(tmp_path) is not None  # looking does not release it
    assert holder(tmp_path) is None
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from reproduce.claims import claim\n"
        f"with claim(Path({str(tmp_path)!r})) as mine:\n"
        "    print(mine, flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "True"
    assert holder(tmp_path)["worker"].split(" ")[0].endswith(f":{child.pid}")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert holder(tmp_path) is None  # the kernel released the dead worker's claim
    with claim(tmp_path) as mine:
        assert mine


def _worker(env, log):
    return subprocess.Popen([sys.executable, "-m", "reproduce", "table3", "--row", "A",
                             "--scale", "smoke"], env=env, stdout=log, stderr=subprocess.STDOUT)


def test_four_workers_one_killed_and_restarted_record_each_run_once(tmp_path):
    env = {**os.environ, "REPRODUCE_RESULTS": str(tmp_path / "results"),
           "REPRODUCE_RUNS": str(tmp_path / "runs"), "REPRODUCE_CACHE": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    logs = [open(tmp_path / f"worker{i}.log", "w") for i in range(5)]
    workers = [_worker(env, logs[i]) for i in range(4)]
    victim, taken = workers[0], None
    deadline = time.time() + 240
    while taken is None and time.time() < deadline and victim.poll() is None:
        for work in (tmp_path / "runs" / "table3").glob("*"):
            who = holder(work)
            if who and who["worker"].split(" ")[0].endswith(f":{victim.pid}"):
                taken = work.name
        time.sleep(0.2)
    assert taken, "worker 0 never claimed a run"
    time.sleep(3)  # mid-run
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    workers[0] = _worker(env, logs[4])  # the restarted worker
    for w in workers:
        assert w.wait(timeout=600) == 0
    for log in logs:
        log.close()
    records = sorted((tmp_path / "results" / "table3").glob("*.json"))
    assert [p.stem for p in records] == [f"table3-{v}-smoke-seed0" for v in
                                         ("A1", "A2", "A3", "A4", "base")]
    outputs = [(tmp_path / f"worker{i}.log").read_text() for i in range(5)]
    recorded = Counter(line.split(":")[0] for text in outputs for line in text.splitlines()
                       if ": recorded " in line)
    assert recorded == Counter(p.stem for p in records), recorded  # each exactly once
    redone = json.loads((tmp_path / "results" / "table3" / f"{taken}.json").read_text())
    assert not redone["worker"].split(" ")[0].endswith(f":{victim.pid}")
    assert "table3.md" in os.listdir(tmp_path / "results")
