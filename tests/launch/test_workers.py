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

from reproduce.records.claims import claim, holder
from tests.helpers import PACED, cli, inject, start

pytestmark = pytest.mark.slow


def test_a_claim_is_exclusive_and_dies_with_its_holder(tmp_path):
    with claim(tmp_path) as first:
        assert first and holder(tmp_path)["worker"].endswith("(local)")
        with claim(tmp_path) as second:  # a second claim on the same run, even from this process
            assert not second
        assert holder(tmp_path) is not None  # looking does not release it
    assert holder(tmp_path) is None
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from reproduce.records.claims import claim\n"
        f"with claim(Path({str(tmp_path)!r})) as mine:\n"
        "    print(mine, flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "True"
    assert holder(tmp_path)["worker"].split(" ")[0].endswith(f":{child.pid}")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert holder(tmp_path) is None  # the kernel released the dead worker's claim
    with claim(tmp_path) as mine:
        assert mine


def test_four_workers_one_killed_and_restarted_record_each_run_once(tmp_path):
    """Four commands on one sweep at once, each its own process as from four shells (forked from
    the zygotes where one is free, else fresh: ``helpers.start``). Their steps are paced (at
    least 0.25 s) until worker 0 is stopped, so its run is still training when SIGTERM comes,
    however fast a forked worker starts."""
    pace = tmp_path / "pace"
    pace.touch()
    env = {**inject(os.environ, tmp_path / "inject", PACED), "REPRODUCE_TEST_PACE": str(pace),
           "REPRODUCE_RESULTS": str(tmp_path / "results"), "REPRODUCE_RUNS": str(tmp_path / "runs"),
           "REPRODUCE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ("table3", "--row", "A", "--scale", "smoke")
    workers = [start(env, *args) for _ in range(4)]
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
    # SIGTERM, as `kill` or a scheduler sends: Lightning turns it into a SystemExit with status 0
    # during training; the worker must still fail, so that nobody takes the run for finished.
    victim.send_signal(signal.SIGTERM)
    assert victim.wait(timeout=120) != 0
    pace.unlink()  # the rest at the machine's own pace
    workers.append(start(env, *args))  # the restarted worker
    for w in workers[1:]:
        assert w.wait(timeout=600) == 0
    records = sorted((tmp_path / "results" / "table3").glob("*.json"))
    assert [p.stem for p in records] == [f"table3-{v}-smoke-seed0" for v in
                                         ("A1", "A2", "A3", "A4", "base")]
    outputs = ["".join(w.communicate(timeout=60)) for w in workers]
    recorded = Counter(line.split(":")[0] for text in outputs for line in text.splitlines()
                       if ": recorded " in line)
    assert recorded == Counter(p.stem for p in records), recorded  # each exactly once
    redone = json.loads((tmp_path / "results" / "table3" / f"{taken}.json").read_text())
    assert not redone["worker"].split(" ")[0].endswith(f":{victim.pid}")
    assert "table3.md" in os.listdir(tmp_path / "results")


# --- --workers N: one command, N processes ----------------------------------------------------


def test_balance_finds_the_best_split_that_longest_first_misses():
    from reproduce.launch.workers import balance

    # Row A's measured minutes at `cpu` scale: longest-first greedy ends at 157, the best at 142.
    costs = {"A4": 72, "A3": 64, "base": 49, "A2": 49, "A1": 44}
    groups = balance(costs, 2)
    loads = sorted(sum(costs[i] for i in g) for g in groups)
    assert loads == [136, 142]
    assert sorted(i for g in groups for i in g) == sorted(costs)
    for group in groups:  # costliest first within a group
        assert [costs[i] for i in group] == sorted((costs[i] for i in group), reverse=True)
    many = {f"r{i}": float(i % 7 + 1) for i in range(30)}  # too many to search: greedy
    assert sorted(i for g in balance(many, 3) for i in g) == sorted(many)


def test_workers_finish_a_seed_before_the_next_and_stay_balanced():
    from reproduce.launch.workers import by_seed

    # Row A at `cpu`, three seeds: every worker's list holds seed 0, then 1, then 2.
    minutes = {"A4": 72, "A3": 64, "base": 49, "A2": 49, "A1": 44}
    costs = {f"{v}-s{s}": m for v, m in minutes.items() for s in range(3)}
    seeds = {i: int(i[-1]) for i in costs}
    groups = by_seed(costs, seeds, 2)
    assert sorted(i for g in groups for i in g) == sorted(costs)
    for group in groups:
        assert [seeds[i] for i in group] == sorted(seeds[i] for i in group)
        assert {seeds[i] for i in group} == {0, 1, 2}  # both workers train every seed
    loads = sorted(sum(costs[i] for i in g) for g in groups)
    assert loads[1] - loads[0] <= 72  # within one run of an even split (834 / 2)
    assert by_seed({"a": 1.0}, {"a": 0}, 1) == [["a"]]


def test_worker_argv_and_order(monkeypatch):
    from reproduce.launch.workers import ORDER_ENV, reorder, worker_argv
    from reproduce.records.sweep import load_spec

    assert worker_argv(["table3", "--workers", "2", "--row", "A"]) == ["table3", "--row", "A"]
    assert worker_argv(["table3", "--workers=3", "--scale", "cpu"]) == ["table3", "--scale", "cpu"]
    runs = load_spec("table3").plan(["base", "A1", "A4"], "smoke", [0])
    monkeypatch.setenv(ORDER_ENV, "table3-A4-smoke-seed0,table3-base-smoke-seed0")
    assert [r.variant for r in reorder(runs)] == ["A4", "base", "A1"]
    monkeypatch.delenv(ORDER_ENV)
    assert [r.variant for r in reorder(runs)] == ["base", "A1", "A4"]


def test_workers_auto_splits_a_cpu_only_for_long_sweeps(tmp_path, monkeypatch):
    import torch

    from reproduce.plan import worker_count as workers
    from reproduce.records.sweep import load_spec

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv(workers.WORKER_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(workers.machine, "cores", lambda: 2)
    spec = load_spec("table3")
    row_a = spec.plan(["base", "A1", "A2", "A3", "A4"], "cpu", [0])  # 5 x 2500 steps
    assert workers.auto_count(row_a) == 2
    assert workers.auto_count(spec.plan(["base", "A1", "A2", "A3", "A4"], "smoke", [0])) == 1
    assert workers.auto_count(row_a, tuning=True) == 1
    assert workers.auto_count(row_a[:1]) == 1
    monkeypatch.setattr(workers.machine, "cores", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert workers.auto_count(row_a) == 5  # at most one per run
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # OMP_NUM_THREADS=1
    assert workers.auto_count(row_a) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    left = {row_a[0].run_id}  # the others have records
    monkeypatch.setattr(workers, "plan_state",
                        lambda run: "train" if run.run_id in left else "done")
    assert workers.auto_count(row_a) == 1
    # steps the caller read from its own folders (status): no records or checkpoints read here
    assert workers.auto_count(row_a, to_go={run.run_id: 2500 for run in row_a[:3]}) == 3
    assert workers.auto_count(row_a, to_go={row_a[0].run_id: 2500}) == 1
    assert workers.auto_count(row_a, to_go={run.run_id: 10 for run in row_a}) == 1
    monkeypatch.setattr(workers, "plan_state", lambda run: "train")
    monkeypatch.setenv(workers.WORKER_ENV, "1")  # a worker never starts workers
    assert workers.auto_count(row_a) == 1
    monkeypatch.delenv(workers.WORKER_ENV)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # runs take the GPUs
    assert workers.auto_count(row_a) == 1


def test_workers_get_their_own_gpus_or_share_them_when_runs_take_one_each():
    from reproduce.errors import ConfigError
    from reproduce.launch import workers

    assert workers.gpu_blocks(2, 1, 2, None) == ["0", "1"]
    assert workers.gpu_blocks(2, 2, 4, None) == ["0,1", "2,3"]
    assert workers.gpu_blocks(2, 2, 4, "4,5,6,7") == ["4,5", "6,7"]  # this process's own GPUs
    # more one-GPU workers than GPUs: they share, round-robin (small models on one GPU)
    assert workers.gpu_blocks(4, 1, 1, None) == ["0"] * 4
    assert workers.gpu_blocks(5, 1, 2, "3,5") == ["3", "5", "3", "5", "3"]
    assert workers.shared_by(["3", "5", "3", "5", "3"]) == [3, 2, 3, 2, 3]
    assert workers.shared_by(["0,1", "2,3"]) == [1, 1]
    # DDP ranks of two runs would meet on one GPU: refused, with what the machine has
    with pytest.raises(ConfigError, match=r"--workers 3 --devices 2: this machine has 4 GPU\(s\), "
                       r"2 per worker at most 2 worker\(s\)"):
        workers.gpu_blocks(3, 2, 4, None)


def test_workers_flag_rejects_what_is_not_a_count(capsys):
    from reproduce.__main__ import main

    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exit_:
            main(["table3", "--row", "A", "--workers", bad])
        assert exit_.value.code == 2
        assert f"expected a positive number or 'auto', got '{bad}'" in capsys.readouterr().err


def test_workers_flag_trains_runs_in_parallel_and_renders_once(tmp_path):
    env = {**os.environ, "REPRODUCE_RESULTS": str(tmp_path / "results"),
           "REPRODUCE_RUNS": str(tmp_path / "runs"), "REPRODUCE_CACHE": str(tmp_path / "cache")}
    env.pop("OMP_NUM_THREADS", None)
    args = ["table3", "--variant", "A1", "--variant", "A4", "--scale", "smoke", "--workers", "2"]
    out = subprocess.run([sys.executable, "-m", "reproduce", *args], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("[w1] ") for line in lines)
    assert any(line.startswith("[w2] ") for line in lines)
    recorded = [line for line in lines if ": recorded " in line]
    assert len(recorded) == 2 and {line[:4] for line in recorded} == {"[w1]", "[w2]"}, recorded
    assert sum("rendered " in line for line in lines) == 1  # by the parent, after both
    assert not any(line.startswith("[w") and "rendered " in line for line in lines)
    threads = []
    for variant in ("A1", "A4"):
        record = json.loads((tmp_path / "results" / "table3" / f"table3-{variant}-smoke-seed0.json")
                            .read_text())
        assert record["command"] == "python -m reproduce " + " ".join(args)
        threads.append(record["hardware"]["torch_threads"])
    # Half the cores each; the worker that ends last may have taken the other's by then.
    cores = len(os.sched_getaffinity(0))
    assert min(threads) == max(1, cores // 2) and max(threads) <= max(1, cores)
    table = (tmp_path / "results" / "table3.md").read_text()
    assert "## Scale `smoke`" in table  # rendered from the two workers' records
    # forked from a zygote (one thread: only the plan is read), not a fresh interpreter
    again = cli({**env, "OMP_NUM_THREADS": "1"}, *args)
    assert "nothing to train" in again.stdout


def test_kill_int_of_a_sweep_with_workers_stops_each_worker_at_its_saved_step(tmp_path):
    """`kill -INT` of the sweep, which a terminal's Ctrl-C would have sent its workers as well:
    it passes the stop on (SIGTERM), each worker saves the step it is at and says so, and the
    command ends in one line, exit 130. It waited on its workers forever before: they never
    heard of it."""
    from tests.helpers import cli_env, start

    spec = tmp_path / "mine.yaml"  # 3000 steps at smoke: both still train when it comes
    spec.write_text("table: mine\nbase: {train_steps: 10000000}\n"
                    "variants: {base: {}, four: {set: {h: 4}}}\n")
    runs = tmp_path / "runs" / "mine"
    proc = start({**cli_env(tmp_path), "REPRODUCE_CACHE": str(tmp_path / "cache")}, "table3",
                 "--spec", str(spec), "--scale", "smoke", "--workers", "2", sigint=True)
    deadline = time.time() + 300
    names = ("mine-base-smoke-seed0", "mine-four-smoke-seed0")
    while not all(any((runs / run / "checkpoints").glob("step*.ckpt")) for run in names):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # this process only
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:] + err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C); run the same command again to go on"
    for run in names:
        saved = runs / run / "checkpoints" / "preempted.ckpt"
        assert f"{run}: stopped by SIGTERM at step " in out and f"saved at that step ({saved})" \
            in out, out[-3000:]
        assert saved.exists()


def test_cores_follow_the_work_when_a_worker_ends(tmp_path, monkeypatch):
    """The parent rewrites the share file as workers end; a worker still running reads it and
    takes the freed cores (`share_cores`)."""
    import torch

    from reproduce.launch.workers import _wait, _write_share
    from reproduce.util.machine import SHARE_ENV, share_cores

    share = tmp_path / "share"
    _write_share(share, 2, 4)
    reader = ("import time, sys; time.sleep(1.5); "
              f"print(open({str(share)!r}).read().strip())")
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"]),
             subprocess.Popen([sys.executable, "-c", reader], stdout=subprocess.PIPE, text=True)]
    assert _wait(procs, share, 4, poll_seconds=0.05) == [3, 0]
    assert procs[1].stdout.read().strip() == "1 4"  # the first had ended: one worker, 4 cores

    before = torch.get_num_threads()
    monkeypatch.setenv(SHARE_ENV, str(share))
    try:
        torch.set_num_threads(1)
        _write_share(share, 2, 2)
        assert share_cores() is None and torch.get_num_threads() == 1  # still one core each
        _write_share(share, 1, 2)
        assert share_cores() == 2 and torch.get_num_threads() == 2
        share.write_text("garbage")
        assert share_cores() is None and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_steps_left_counts_from_the_latest_checkpoint(tmp_path, monkeypatch):
    from reproduce.records.checkpoints import steps_left
    from reproduce.records.sweep import load_spec

    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path))
    run = load_spec("table3").plan(["base"], "cpu", [0])[0]
    total = run.config.train.train_steps
    assert steps_left(run) == total
    ckpts = tmp_path / "table3" / run.run_id / "checkpoints"
    ckpts.mkdir(parents=True)
    for name in ("step300.ckpt", "step1200.ckpt", "last.ckpt", "step99.ckpt.tmp"):
        (ckpts / name).write_bytes(b"")
    assert steps_left(run) == total - 1200
    (ckpts / f"step{total + 5}.ckpt").write_bytes(b"")
    assert steps_left(run) == 0
