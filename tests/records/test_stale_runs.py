"""A record or checkpoint made under other settings (a scale or spec edited since) is not the run:
it is never skipped as finished nor resumed, and it is moved aside, not deleted."""

import dataclasses
import json
import shutil

import pytest
import torch

from reproduce.launch import progress as status
from reproduce.records import store as records
from reproduce.records.sweep import load_spec


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    return tmp_path / "results", tmp_path / "runs"


def _run():
    return load_spec("table3").plan(["base"], "smoke", [0])[0]


def _record(run, config):
    path = records.record_path(run)
    records.write_record(path, {"run_id": run.run_id, "config": config.to_dict(),
                               "metrics": {"train_seconds": 1.0}})
    return path


def test_a_record_of_the_same_config_is_finished(dirs):
    run = _run()
    _record(run, run.config)
    assert records.finished(run)["run_id"] == run.run_id


def test_a_record_written_before_a_field_existed_counts_it_at_its_default(dirs):
    run = _run()
    stored = run.config.to_dict()
    del stored["model"]["init"]  # as records made before model.init was added
    assert records.same_config(stored, run.config)
    assert not records.same_config(stored, run.config.overrides(init="depth-scaled"))
    stored["model"]["removed_field"] = 1  # a field this version no longer has: another config
    assert not records.same_config(stored, run.config)


def test_a_record_of_another_config_is_stale_and_retired_not_deleted(dirs):
    results, runs = dirs
    run = _run()
    old = run.config.overrides(lr_scale=run.config.train.lr_scale * 2)
    path = _record(run, old)
    work = runs / "table3" / run.run_id
    (work / "checkpoints").mkdir(parents=True)
    torch.save({"hyper_parameters": {"config": old.to_dict()}}, work / "checkpoints" / "last.ckpt")

    assert records.finished(run) is None
    rows = status.table_status("table3", results, runs)
    assert rows[0]["stale"] == [run.run_id] and rows[0]["done"] == []

    records.retire_stale(run, work)
    assert not path.exists() and not (work / "checkpoints").exists()
    [moved] = (results / "table3" / "superseded").glob(f"{run.run_id}.*.json")
    assert json.loads(moved.read_text())["config"] == old.to_dict()
    [kept] = work.glob("superseded-*/checkpoints/last.ckpt")
    assert kept.stat().st_size > 0


def test_what_is_set_aside_twice_within_a_second_is_kept_twice(tmp_path, monkeypatch):
    """Two records (files) and two checkpoint folders moved aside in the same second: each kept,
    the later after the earlier in name order (it overwrote the first, or failed on a folder)."""
    from reproduce.util import files

    monkeypatch.setattr(files, "timestamp", lambda: "20261129T195245")
    moved = []
    for text in ("first", "second"):
        (tmp_path / "r.json").write_text(text)
        moved.append(files.move_aside(tmp_path / "r.json", tmp_path / "damaged" / "r.{time}.json"))
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "last.ckpt").write_text(text)
        moved.append(files.move_aside(tmp_path / "checkpoints",
                                      tmp_path / "superseded-{time}" / "checkpoints"))
    assert [p.relative_to(tmp_path).as_posix() for p in moved] == [
        "damaged/r.20261129T195245.json", "superseded-20261129T195245/checkpoints",
        "damaged/r.20261129T195245_2.json", "superseded-20261129T195245_2/checkpoints"]
    assert [p.name for p in sorted((tmp_path / "damaged").iterdir())] == [
        "r.20261129T195245.json", "r.20261129T195245_2.json"]
    assert [(p / "last.ckpt" if p.is_dir() else p).read_text() for p in moved] == [
        "first", "first", "second", "second"]


def test_checkpoints_of_the_same_config_stay_to_be_resumed(dirs):
    _, runs = dirs
    run = _run()
    work = runs / "table3" / run.run_id
    (work / "checkpoints").mkdir(parents=True)
    torch.save({"hyper_parameters": {"config": run.config.to_dict()}},
               work / "checkpoints" / "last.ckpt")
    records.retire_stale(run, work)
    assert (work / "checkpoints" / "last.ckpt").exists()


def test_table4_spec_asks_for_tags_and_an_old_xx_run_is_not_resumed_as_one():
    """Runs recorded before ``data.linearization`` existed used XX targets: their stored config
    (no such key) must read as ``xx``, so a Table 4 run now (tags) never takes them as its own."""
    config = load_spec("table4").resolve("wsj_only", "smoke")
    assert config.data.linearization == "tags"
    old = config.to_dict()
    del old["data"]["linearization"]
    assert not records.same_config(old, config)
    assert records.same_config(old, config.overrides(linearization="xx"))


def test_a_decoding_change_redoes_the_record_but_keeps_the_checkpoints(dirs):
    results, runs = dirs
    run = _run()
    old = run.config.overrides(beam=run.config.decode.beam + 2)
    path = _record(run, old)
    work = runs / "table3" / run.run_id
    (work / "checkpoints").mkdir(parents=True)
    torch.save({"hyper_parameters": {"config": old.to_dict()}}, work / "checkpoints" / "last.ckpt")
    assert records.finished(run) is None  # the metrics depend on decoding: evaluate again
    assert records.same_config(old.to_dict(), run.config, training_only=True)
    records.retire_stale(run, work)
    assert not path.exists()
    assert (work / "checkpoints" / "last.ckpt").exists()  # the weights do not: no retraining


def test_more_steps_train_on_from_the_checkpoint_fewer_start_over(dirs):
    _, runs = dirs
    run = _run()
    work = runs / "table3" / run.run_id
    steps = run.config.train.train_steps
    for new_steps, kept in ((steps * 3, True), (steps - 1, False)):
        (work / "checkpoints").mkdir(parents=True)
        torch.save({"hyper_parameters": {"config": run.config.to_dict()}, "global_step": steps},
                   work / "checkpoints" / "last.ckpt")
        longer = dataclasses.replace(run, config=run.config.overrides(train_steps=new_steps))
        records.retire_stale(longer, work)
        assert (work / "checkpoints" / "last.ckpt").exists() == kept
        if kept:  # other training settings still count
            other = dataclasses.replace(run, config=longer.config.overrides(warmup_steps=7))
            records.retire_stale(other, work)
            assert not (work / "checkpoints").exists()
        shutil.rmtree(work)


def test_status_reads_scales_and_variants_with_hyphens_from_run_ids(dirs):
    # table3-base-cpu-wide-seed1 is base at cpu-wide, not a variant "base-cpu" at a scale "wide"
    results, runs = dirs
    for run in load_spec("table3").plan(["base"], "cpu-wide", [1]):
        _record(run, run.config)
    rows = status.table_status("table3", results, runs)
    assert [(r["scale"], r["seeds"]) for r in rows] == [("cpu-wide", [1])]
    assert rows[0]["done"] == ["table3-base-cpu-wide-seed1"]
    # cpu-wide names its rows (A): the others are not missing there
    assert rows[0]["missing"] == [f"table3-A{k}-cpu-wide-seed1" for k in range(1, 5)]


def test_status_says_how_far_each_started_run_got(dirs):
    # one run of the smoke base stopped with a checkpoint at step 20, one started without any
    results, runs = dirs
    done, stopped, fresh = load_spec("table3").plan(["base", "A1", "A2"], "smoke", [0])
    _record(done, done.config)
    (runs / "table3" / stopped.run_id / "checkpoints").mkdir(parents=True)
    (runs / "table3" / stopped.run_id / "checkpoints" / "step20.ckpt").write_bytes(b"x")
    (runs / "table3" / fresh.run_id).mkdir(parents=True)
    out = status.report(results, runs)
    steps = stopped.config.train.train_steps
    assert f"stopped  {stopped.run_id} (checkpoint at step 20 of {steps})" in out
    assert f"stopped  {fresh.run_id} (no checkpoint yet)" in out
    # the precision the finished runs trained in (a record without one says so)
    assert "1 done" in out and "; trained in unrecorded" in out
    records.write_record(records.record_path(done), {
        "run_id": done.run_id, "config": done.config.to_dict(), "precision": "32-true",
        "metrics": {"train_seconds": 1.0}})
    assert "; trained in 32-true\n" in status.report(results, runs)


def test_a_record_calls_the_code_dirty_for_edits_outside_results_only(tmp_path, monkeypatch):
    # a sweep re-renders results/ while its workers still run: that is no edit of the code a
    # record names
    import subprocess

    from reproduce import paths
    from reproduce.util import machine

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table3.md").write_text("old\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    monkeypatch.setattr(paths, "REPO", tmp_path)
    assert machine.commit()["dirty"] is False
    (tmp_path / "results" / "table3.md").write_text("new\n")
    (tmp_path / "results" / "r.json").write_text("{}\n")
    assert machine.commit()["dirty"] is False
    (tmp_path / "model.py").write_text("x = 2\n")
    assert machine.commit()["dirty"] is True


def test_time_left_estimates_fp32_steps_where_the_finished_runs_trained_in_fp32(dirs, monkeypatch):
    # This machine timed bf16 twice as fast (cached), but a scale whose runs trained in fp32 keeps
    # its remaining `auto` runs in fp32 (records.precision_history.settled): steps estimated as fp32.
    from reproduce.plan import estimates

    results, runs = dirs
    run = dataclasses.replace(_run(), config=_run().config.overrides(precision="auto"))
    real = estimates.cpu_step_ratio

    def bf16_timed_twice_as_fast(run, threads, cache, settled=None):
        # as if this machine's cached timing said so; the real function answers for fp32 records
        return real(run, threads, cache, settled) if settled == "32-true" else 0.5
    monkeypatch.setattr(estimates, "cpu_step_ratio", bf16_timed_twice_as_fast)
    to_go = {run.run_id: 1000}
    free = status._time_left([run], to_go, [], runs)
    fp32 = status._time_left([run], to_go, [], runs, settled="32-true")
    assert fp32["device_hours"] == pytest.approx(2 * free["device_hours"])
    assert status._time_left([run], to_go, [], runs, settled="bf16-mixed")["device_hours"] \
        == pytest.approx(free["device_hours"])


def test_a_copied_tree_names_its_commit_by_the_environment(tmp_path, monkeypatch):
    from reproduce import __version__, paths
    from reproduce.util import machine

    monkeypatch.setattr(paths, "REPO", tmp_path)  # no .git here
    monkeypatch.delenv(machine.COMMIT_ENV, raising=False)
    assert machine.commit()["sha"] is None
    monkeypatch.setenv(machine.COMMIT_ENV, "abc123 dirty")
    assert machine.commit() == {"sha": "abc123", "dirty": True, "from": machine.COMMIT_ENV,
                                "version": __version__}
    monkeypatch.setenv(machine.COMMIT_ENV, "abc123")
    assert machine.commit()["dirty"] is False
    monkeypatch.undo()  # this project's .git, and the environment still names another commit
    monkeypatch.setenv(machine.COMMIT_ENV, "abc123")
    assert machine.commit()["sha"] == "abc123"


def test_status_says_which_runs_wait_for_data_and_counts_no_time_for_them(dirs):
    # Table 4's semi-supervised row needs silver trees only the user has: it waits, it is not "left"
    results, runs = dirs
    spec = load_spec("table4")
    words, semi = spec.plan(["wsj_only_words", "semi_supervised"], "smoke", [0])
    (runs / "table4" / words.run_id).mkdir(parents=True)
    row = status.table_status("table4", results, runs)[0]
    assert row["missing"] == ["table4-wsj_only-smoke-seed0", "table4-wsj_only_bpe-smoke-seed0",
                              semi.run_id]
    assert list(row["blocked"]) == [semi.run_id] and "--silver PATH" in row["blocked"][semi.run_id]
    out = status.report(results, runs, verbose=True)
    assert f"  waits    {semi.run_id}: corpus 'wsj-parse-semi' needs" in out
    assert f"missing  {semi.run_id}" not in out and "missing  table4-wsj_only-smoke-seed0" in out
