"""Cluster runs without a cluster: the SLURM submission plan, its options and arrays, the job
definitions and the requeue guard. Against a real SLURM: ``tests/end_to_end/test_slurm_cluster.py``."""

import os
import re
from pathlib import Path

import pytest

from reproduce.__main__ import main
from reproduce.errors import ConfigError
from reproduce.launch import slurm, task
from reproduce.records.sweep import load_spec


def test_slurm_dry_run_prints_the_plan_and_the_sbatch_header(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    assert main(["table3", "--row", "A", "--scale", "paper", "--launcher", "slurm", "--dry-run",
                 "--partition", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "5 of 5 run(s) have no record" in out
    assert out.count("8 task(s) x 8 CPUs, 8 GPU(s)") == 5
    for line in ("#SBATCH --array=0-4%5", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=4320"):
        assert line in out
    assert not (tmp_path / "runs").exists()  # a dry run submits and writes nothing


def test_big_gets_three_times_the_time_and_gpus_can_be_changed():
    spec = load_spec("table3")
    base, big = spec.plan(["base", "big"], "paper", [0])
    assert slurm.slurm_parameters("paper", [big])["time"] == \
        3 * slurm.slurm_parameters("paper", [base])["time"]
    one = slurm.slurm_parameters("paper", [base], slurm.Cluster(gpus_per_node=1))
    assert (one["gpus_per_node"], one["ntasks_per_node"], one["nodes"]) == (1, 1, 1)
    two = slurm.slurm_parameters("paper", [base], slurm.Cluster(nodes=2, gpus_per_node=4))
    assert (two["gpus_per_node"], two["ntasks_per_node"], two["nodes"]) == (4, 4, 2)
    cpu = slurm.slurm_parameters("cpu", spec.plan(["base"], "cpu", [0]))
    assert "gpus_per_node" not in cpu and cpu["cpus_per_task"] == 2


def test_set_values_travel_with_each_array_task():
    import contextlib

    from reproduce.records.sweep import with_sets

    spec = load_spec("table3")
    runs = with_sets(spec.plan(["A3"], "smoke", [0]), spec, {"warmup_steps": 5})
    submitted = []

    class Executor:
        def batch(self):
            return contextlib.nullcontext()

        def submit(self, fn, *args):
            submitted.append((fn, args))
            return args

    slurm.submit(Executor(), str(spec.path), runs, spec.split, "python -m reproduce test")
    [(fn, args)] = submitted
    assert fn is task.run_one and args[-4:] == ({"warmup_steps": 5}, 1, 0, "run")



def test_tuning_submits_a_task_per_trial_then_each_run_after_them_storage_in_the_environment(
        capsys, tmp_path, monkeypatch):
    # --tune: an array of a task per trial, then the runs' own array after it (afterany); the
    # storage URL, password and all, goes in the tasks' environment, never into the arguments
    # submitit pickles into its folders
    import contextlib

    from reproduce.train.tuning import STORAGE_ENV

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    submitted = []

    class Executor:
        def batch(self):
            return contextlib.nullcontext()

        def submit(self, fn, *args):
            submitted.append(args)
            return type("Job", (), {"job_id": f"9_{len(submitted) - 1}", "paths": type(
                "Paths", (), {"stdout": "o", "stderr": "e"})})()

    executors = []

    def executor_for(folder, scale, runs, cluster, role, after):
        executors.append((len(runs), role, after))
        return Executor()

    monkeypatch.setattr(slurm, "executor_for", executor_for)
    monkeypatch.setattr(slurm, "render_executor", lambda folder, table, after, cluster:
                        executors.append((table, "render", after)) or Executor())
    url = "postgresql://me:hunter2@db.example/optuna"
    assert main(["table3", "--variant", "base", "--variant", "A1", "--scale", "smoke",
                 "--launcher", "slurm", "--tune", "--trials", "3", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "--tune: 3 trial task(s) per run" in out and "me:***@db.example" in out
    assert "hunter2" not in out
    # the runs after the trials' job; the table once both have ended
    assert executors == [(6, "trial", None), (2, "best", "9"), ("table3", "render", ["9", "9"])]
    assert "table3: job 9_8 renders" in out
    assert [args[-2:] for args in submitted[:-1]] == [(1, "trial")] * 6 + [(0, "best")] * 2
    assert submitted[-1][0].endswith("table3.yaml")  # the render job's one argument
    assert "table3-A1-smoke-seed0: job 9_7 (after job 9)" in out
    assert "hunter2" not in repr(submitted)
    assert os.environ[STORAGE_ENV] == url
    # a second --tune submits the runs again (more trials), unless their tasks are queued
    assert (tmp_path / "runs" / "table3" / "slurm" / "submitted.jsonl").exists()


def test_slurm_options_reach_the_sbatch_header_and_runs_of_other_needs_get_their_own_array():
    spec = load_spec("table3")
    runs = spec.plan(["base", "A1", "big"], "paper", [0])
    cluster = slurm.Cluster(partition="gpu", options=slurm.parse_options(
        ["mem=64G", "cpus-per-task=6", "account=nlp", "qos=high", "constraint=a100",
         "mail-user=me@example.org", "exclusive"]))
    base_and_a1, big = slurm.arrays(runs, cluster)  # big asks 3x the time: an array of its own
    assert [r.variant for r in base_and_a1] == ["base", "A1"] and [r.variant for r in big] == ["big"]
    header = slurm.sbatch_script(Path("/jobs"), "paper", base_and_a1, cluster).splitlines()
    for line in ("#SBATCH --mem=64G", "#SBATCH --cpus-per-task=6", "#SBATCH --account=nlp",
                 "#SBATCH --qos=high", "#SBATCH --constraint=a100", "#SBATCH --exclusive",
                 "#SBATCH --mail-user=me@example.org", "#SBATCH --partition=gpu",
                 "#SBATCH --requeue", "#SBATCH --array=0-1%2", "#SBATCH --time=4320"):
        assert line in header
    assert "#SBATCH --time=12960" in slurm.sbatch_script(Path("/jobs"), "paper", big, cluster)
    # one time limit for all, as the user set it: one array again
    timed = slurm.Cluster(options=slurm.parse_options(["time=1-12:00:00"]))
    assert [len(a) for a in slurm.arrays(runs, timed)] == [3]
    assert "#SBATCH --time=2160" in slurm.sbatch_script(Path("/jobs"), "paper", runs, timed)


def test_with_on_gpu_each_run_asks_the_time_its_estimate_needs_and_similar_runs_share_an_array(
        monkeypatch):
    from reproduce import paths
    from reproduce.plan.gpu_prices import price

    # the H200 measured on 2026-11-27, whatever a later GPU window commits to results/
    monkeypatch.setenv("REPRODUCE_RESULTS", str(paths.REPO / "tests" / "golden" / "gpu"))
    slurm.gpu_target.cache_clear()

    spec = load_spec("table3")
    runs = spec.plan(["base", "A1", "C1", "big"], "paper", [0])
    cluster = slurm.Cluster(gpus_per_node=8, on="H100")
    limits = {}
    for run in runs:
        minutes, why = slurm.time_limit(run, cluster, slurm.resources(run, cluster))
        hours = price(run.config, slurm.gpu_target("H100", 8),
                      run.config.train.train_steps).command_hours
        assert minutes % 60 == 0 and minutes / 60 in slurm.TIME_LIMITS_H
        # enough for the estimate with its margin, and the next shorter limit would not be
        need = hours * 60 * slurm.TIME_MARGIN + slurm.TIME_ALLOWANCE_MIN
        shorter = [h for h in slurm.TIME_LIMITS_H if h * 60 < minutes]
        assert minutes >= need and (not shorter or shorter[-1] * 60 < need), (run.variant, hours)
        assert f"{hours:.1f} h estimated on 8x H100 (training" in why
        assert "scaled from NVIDIA H200" in why  # no H100 was measured
        limits[run.variant] = minutes
    assert limits["big"] > limits["base"] and limits["base"] < 3 * 24 * 60  # not the default
    groups = slurm.arrays(runs, cluster)
    assert sorted(len(g) for g in groups) == sorted(
        list(limits.values()).count(m) for m in set(limits.values()))  # one array per limit
    line = slurm.plan_lines(runs[:1], cluster)[0]
    assert f"{limits['base']} min (" in line and "estimated on 8x H100" in line
    # the user's own time limit still wins; a CPU-only run keeps the scale's
    timed = slurm.Cluster(gpus_per_node=8, on="H100", options=slurm.parse_options(["time=600"]))
    assert slurm.resources(runs[0], timed)["timeout_min"] == 600
    cpu = slurm.Cluster(gpus_per_node=0, on="H100")
    assert slurm.resources(runs[0], cpu)["timeout_min"] == slurm.RESOURCES["paper"]["timeout_min"]
    with pytest.raises(ConfigError, match=r"--on 4xH100: a run here takes 8 GPU\(s\)"):
        slurm.resources(runs[0], slurm.Cluster(gpus_per_node=8, on="4xH100"))
    with pytest.raises(ConfigError, match="--on cpu: with --launcher slurm, the GPU"):
        slurm.resources(runs[0], slurm.Cluster(gpus_per_node=8, on="cpu"))


def _fake_command(tmp_path: Path, monkeypatch, name: str, body: str) -> None:
    """``name`` on PATH as a shell script of ``body`` (SLURM's commands, without a SLURM)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / name).write_text(f"#!/bin/sh\n{body}\n")
    (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")


def test_a_partition_s_max_time_caps_the_estimates_and_refuses_a_longer_time_in_one_line(
        tmp_path, monkeypatch):
    _fake_command(tmp_path, monkeypatch, "sinfo",
                  "echo 'debug* infinite'\necho 'gpu 2-00:00:00'\necho 'short 5:00'")
    assert [slurm.partition_minutes(p) for p in (None, "gpu", "short", "nowhere")] == \
        [None, 2880, 5, None]
    (big,) = load_spec("table3").plan(["big"], "paper", [0])
    capped = slurm.Cluster(gpus_per_node=1, on="H100", max_minutes=600)
    minutes, why = slurm.time_limit(big, capped, slurm.resources(big, capped))
    assert minutes == 600 and "the partition's MaxTime" in why  # big on 1 GPU: hours more
    over = slurm.Cluster(options=slurm.parse_options(["time=3000"]), max_minutes=2880)
    with pytest.raises(ConfigError, match="--slurm time=3000: more than the partition's MaxTime "
                                          "of 2880 min"):
        slurm.resources(big, over)
    # the runs' own array waits on the trials' and on a dependency of the user's
    mine = slurm.Cluster(options=slurm.parse_options(["dependency=afterok:5"]))
    header = slurm.sbatch_script(Path("/jobs"), "paper", [big], mine, "best", "77")
    assert "#SBATCH --dependency=afterany:77,afterok:5" in header.splitlines()


def test_tuning_a_run_of_several_tasks_on_slurm_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    assert main(["table3", "--variant", "A1", "--scale", "smoke", "--launcher", "slurm",
                 "--nodes", "2", "--gpus-per-node", "0", "--tune", "--trials", "2",
                 "--dry-run"]) == 2
    assert "--tune with --launcher slurm: a trial trains in one task, and table3-A1-smoke-seed0 " \
           "takes 2" in capsys.readouterr().err


def test_on_without_a_dry_run_or_a_cluster_is_one_line(capsys):
    assert main(["table3", "--variant", "base", "--scale", "smoke", "--on", "H100"]) == 2
    assert "--on H100: a local sweep trains on this machine" in capsys.readouterr().err


@pytest.mark.parametrize("text, minutes", [("90", 90), ("90:30", 91), ("24:00:00", 1440),
                                           ("2-00:00:00", 2880), ("1-12", 2160), ("0-0:30", 30)])
def test_time_limits_read_in_every_form_sbatch_takes(text, minutes):
    assert slurm.minutes(text) == minutes


@pytest.mark.parametrize("option, says", [
    ("time=soon", "--slurm time='soon': expected minutes, H:M:S or D-H:M:S"),
    ("time=0", "a time limit must be more than zero"),
    ("mem=lots", "--slurm mem='lots': expected a size as sbatch takes it"),
    ("cpus-per-task=0", "--slurm cpus_per_task='0': expected a positive whole number"),
    ("nodes=2", "--slurm nodes: the harness sets it (use --nodes N)"),
    ("cpus-per-gpu=4", "--slurm cpus_per_gpu: the harness sets it (use cpus-per-task: one task"),
    ("requeue", "--slurm requeue: the harness sets it (always asked for)"),
    ("gres=gpu:2", "use --gpus-per-node N, and constraint=TYPE"),
    ("=x", "expected KEY=VALUE with KEY an sbatch option"),
])
def test_a_bad_slurm_option_is_one_line_naming_it(option, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        slurm.parse_options([option])


def test_cluster_options_without_the_slurm_launcher_are_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    assert main(["table3", "--variant", "base", "--scale", "smoke", "--slurm", "time=60",
                 "--partition", "gpu", "--dry-run"]) == 2
    assert "--slurm, --partition: for --launcher slurm only" in capsys.readouterr().err


def test_the_docs_table_of_defaults_is_the_launcher_s():
    page = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    for scale, res in slurm.RESOURCES.items():
        row = (f"| `{scale}` | {res['gpus_per_node']} | {res['cpus_per_task']} | {res['mem']} | "
               f"{res['timeout_min']} |")
        assert row in page, row


def test_a_run_stopped_three_times_without_progress_is_not_requeued_the_third_time(tmp_path):
    work = tmp_path / "table3-base-paper-seed0"
    # stops at a new step each time: always requeued
    assert [task.stalled(work, "7_0", step) for step in (100, 250, 400, 400)] == [None] * 4
    # then three stops before training (a data preparation longer than the time limit)
    assert task.stalled(work, "7_0", None) is None
    assert task.stalled(work, "7_0", None) is None
    why = task.stalled(work, "7_0", None)
    assert why is not None and why.startswith(
        "table3-base-paper-seed0 was stopped 3 times in a row before or after training")
    assert "--slurm time=" in why
    # at one step three times over: the same
    other = tmp_path / "table3-A1-paper-seed0"
    assert [task.stalled(other, "8_1", 60) is None for _ in range(3)] == [True, True, False]


def test_status_counts_the_steps_a_run_was_submitted_with(tmp_path):
    # a run submitted with --set train.train_steps=1500 is 1500 steps long in `status`, not 30
    from reproduce.launch import progress, queue

    (run,) = load_spec("table3").plan(["base"], "smoke", [0])
    task = queue.Task(run.run_id, "5_0", "", "", {"train_steps": 1500}, "RUNNING")
    assert progress._with_sets(run, None, task).config.train.train_steps == 1500
    assert progress._with_sets(run, None, None).config.train.train_steps == 30


def test_status_names_a_tuned_run_s_task_and_its_trial_tasks_still_in_the_queue(
        capsys, tmp_path, monkeypatch):
    import json

    from reproduce.launch import queue

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    folder = tmp_path / "runs" / "table3" / "slurm"
    folder.mkdir(parents=True)
    run = "table3-A1-smoke-seed0"
    lines = [{"run_id": run, "job_id": f"7_{k}", "trial": True} for k in range(3)]
    lines.append({"run_id": run, "job_id": "8_0"})
    (folder / queue.LEDGER).write_text("".join(json.dumps(e) + "\n" for e in lines))
    states = {"7_0": ("RUNNING", 0), "7_1": ("RUNNING", 0), "8_0": ("PENDING", 0)}  # 7_2 ended
    monkeypatch.setattr(queue, "squeue_states", lambda: states)
    assert set(queue.tasks(folder)) == {run, f"{run} trial 7_0", f"{run} trial 7_1",
                                        f"{run} trial 7_2"}
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"queued   {run} (SLURM job 8_0), after 2 trial task(s) still in the queue" in out


def test_status_says_how_sacct_says_tasks_ended_and_how_often_squeue_says_one_was_requeued(
        capsys, tmp_path, monkeypatch):
    """``squeue`` and ``sacct`` as a cluster with accounting (slurmdbd) answers them: stand-ins
    for the end states the test cluster's (tools/slurm/cluster.sh) would take minutes to give;
    squeue's restart count as the real one gives it (``-O JobArrayID:|,State:|,RestartCnt``)."""
    import json

    from reproduce.launch import queue

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    folder = tmp_path / "runs" / "table3" / "slurm"
    folder.mkdir(parents=True)
    runs = ["table3-A1-smoke-seed0", "table3-A2-smoke-seed0", "table3-A3-smoke-seed0",
            "table3-A4-smoke-seed0", "table3-base-smoke-seed0"]
    (folder / queue.LEDGER).write_text("".join(
        json.dumps({"run_id": run, "job_id": f"9_{k}", "stderr": f"/logs/9_{k}.err"}) + "\n"
        for k, run in enumerate(runs)))
    _fake_command(tmp_path, monkeypatch, "squeue", "echo '9_4|RUNNING|2                   '")
    _fake_command(tmp_path, monkeypatch, "sacct", "echo '9_0|TIMEOUT|0:0'\necho "
                  "'9_1|OUT_OF_MEMORY|0:125'\necho '9_2|NODE_FAIL|0:0'\necho '9_3|FAILED|1:0'\n"
                  "echo '8_1|COMPLETED|0:0'")  # 8_1: not one of ours
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    for k, said in enumerate(("TIMEOUT (its time limit ran out)", "OUT_OF_MEMORY (out of memory)",
                              "NODE_FAIL (its node failed)", "FAILED (exit code 1)")):
        assert f"ended    {runs[k]}: its SLURM task 9_{k} ended {said} without a record: it " \
               f"left no log (log /logs/9_{k}.err)" in out
    assert "running  table3-base-smoke-seed0 (no checkpoint yet) (SLURM job 9_4, requeued 2 " \
           "time(s))" in out
    # a cluster without accounting: how they ended is not claimed
    _fake_command(tmp_path, monkeypatch, "sacct", "echo 'Slurm accounting storage is disabled' "
                  ">&2\nexit 1")
    assert queue.tasks(folder)["table3-A1-smoke-seed0"].ending() is None


def test_tasks_cancelled_while_pending_share_one_line_of_sacct_and_each_is_told(
        tmp_path, monkeypatch):
    """sacct shows an array's tasks cancelled before they started as one line (``9_[2-4,7%2]``):
    each of them ends CANCELLED, none is left without a word."""
    from reproduce.launch import queue

    _fake_command(tmp_path, monkeypatch, "sacct", "echo '9_0|COMPLETED|0:0'\n"
                  "echo '9_[2-4,7%2]|CANCELLED by 1000|0:0'\necho '10_[1-2]|CANCELLED|0:0'")
    asked = ["9_0", "9_1", "9_2", "9_4", "9_7", "9_8", "10_3"]
    assert queue.sacct_states(asked) == {"9_0": ("COMPLETED", "0:0"),
                                         **{k: ("CANCELLED", "0:0") for k in ("9_2", "9_4", "9_7")}}
    assert queue.array_tasks("12_[3]") == ["12_3"]
    assert queue.array_tasks("12_[x-2]") == ["12_[x-2]"]  # not a range: kept as it is


def test_a_refused_requeue_is_one_line_that_says_how_to_resume(tmp_path, monkeypatch):
    _fake_command(tmp_path, monkeypatch, "scontrol", "echo 'scontrol: error: Requested "
                  "operation is presently disabled for job 42' >&2\nexit 1")
    for key, value in (("SUBMITIT_EXECUTOR", "slurm"), ("SLURM_JOB_ID", "42"),
                       ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")):
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stop:
        task.requeue(tmp_path / "table3-base-paper-seed0", 1200)
    assert str(stop.value) == (
        "not requeued: scontrol requeue 42 failed (scontrol: error: Requested operation is "
        "presently disabled for job 42); what was trained is saved: submit the same command "
        "again to resume it")


def test_a_sweep_whose_runs_all_have_records_renders_without_the_trainer(capsys, tmp_path,
                                                                        monkeypatch):
    """The main job on a fresh clone (every run recorded) answers each run from its record, as
    ``runner.execute`` would, and never imports the trainer (Lightning, torch's compiler)."""
    import shutil
    import sys

    import reproduce.train
    from reproduce.paths import REPO

    (tmp_path / "results" / "table3").mkdir(parents=True)
    shutil.copy(REPO / "results" / "table3" / "table3-base-cpu-seed0.json",
                tmp_path / "results" / "table3")
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    import reproduce.plan

    for package, name in ((reproduce.train, "runner"), (reproduce.train, "tuning"),
                          (reproduce.plan, "step_probe")):
        monkeypatch.delattr(package, name, raising=False)
        monkeypatch.setitem(sys.modules, f"{package.__name__}.{name}", None)  # importing it fails
    assert main(["table3", "--variant", "base", "--scale", "cpu", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"table3-base-cpu-seed0: dev PPL [\d.]+, dev BLEU", out), out
    assert "All 1 run(s) already had a record in" in out
    assert (tmp_path / "results" / "table3.md").is_file()
