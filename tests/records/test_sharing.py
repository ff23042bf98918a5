"""One training, several records: Table 3's base (seed 0) evaluated from Table 2's base EN-DE
training, which is the same training (reproduce/records/sharing.py)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from reproduce.records.sharing import same_training
from reproduce.records.sweep import load_spec
from tests.helpers import cli, cli_env, wandb_runs


def test_same_training_ignores_only_what_acts_after_training():
    t2, t3 = load_spec("table2"), load_spec("table3")
    big2, big3 = t2.resolve("big-en-de", "cpu"), t3.resolve("big", "cpu")
    assert big2.train.average_last == 20 and big3.train.average_last == 1
    assert same_training(big2.to_dict(), big3)
    assert same_training(t2.resolve("base-en-de", "paper").to_dict(), t3.resolve("base", "paper"))
    # Different weights: another corpus, dropout, seed or length of training.
    assert not same_training(t2.resolve("big-en-fr", "cpu").to_dict(), big3)
    for changed in (replace(big3, model=replace(big3.model, p_drop=0.1)),
                    replace(big3, train=replace(big3.train, seed=1)),
                    replace(big3, train=replace(big3.train, train_steps=100))):
        assert not same_training(big2.to_dict(), changed)
    assert not same_training(None, big3) and not same_training({"model": {"nope": 1}}, big3)


def test_a_donor_must_hold_every_checkpoint_the_run_averages(tmp_path):
    from reproduce.records.sharing import _enough

    config = load_spec("table2").resolve("base-en-de", "smoke")  # averages the last 5
    for step in (3, 6, 9, 12):
        torch.save({"step": step}, tmp_path / f"step{step}.ckpt")
    assert not _enough(tmp_path, config)  # no final weights
    torch.save({}, tmp_path / "last.ckpt")
    assert _enough(tmp_path, replace(config, train=replace(config.train, average_last=1)))
    assert not _enough(tmp_path, config)  # four of five
    torch.save({"step": 15}, tmp_path / "step15.ckpt")
    assert _enough(tmp_path, config)
    (tmp_path / "step9.ckpt").write_bytes(b"half a file")
    assert not _enough(tmp_path, config)  # one unreadable: not a donor


def test_a_plan_says_which_runs_train_the_same_weights(tmp_path):
    env = cli_env(tmp_path)
    t3 = cli(env, "table3", "--row", "big", "--scale", "paper", "--dry-run").stdout
    assert ("table3-big-paper-seed0: 300000 steps" in t3 and "    the same training as "
            "table2-big-en-de-paper-seed0: run that table first and this run only evaluates its "
            "checkpoints") in t3
    assert t3.count("the same training as") == 2  # base and big; seed 0 only
    t2 = cli(env, "table2", "--scale", "paper", "--dry-run").stdout
    assert ("    table3-big-paper-seed0, run after this one, will evaluate its training instead of "
            "training again") in t2
    assert t2.count("will evaluate its training") == 2  # base and big EN-DE, not EN-FR


def test_a_run_waits_for_its_twin_that_a_worker_is_training(tmp_path):
    # Table 2's base EN-DE in training (its claim held here): Table 3's base seed 0 is left to
    # evaluate it later, not trained beside it
    from reproduce.records.claims import claim

    with claim(tmp_path / "runs" / "table2" / "table2-base-en-de-smoke-seed0") as mine:
        assert mine
        out = cli(cli_env(tmp_path), "table3", "--variant", "base", "--scale", "smoke",
                  "--seeds", "0", "--workers", "1")
        status = cli(cli_env(tmp_path), "status").stdout
        plan = cli(cli_env(tmp_path), "table3", "--variant", "base", "--scale", "smoke",
                   "--seeds", "0", "--dry-run").stdout
    waits = ("waits for table2-base-en-de-smoke-seed0's training, which a worker is training now "
             "(the same training; no training left)")  # one line, in the plan and in status
    assert f"table3-base-smoke-seed0: {waits}" in [s.strip() for s in plan.splitlines()]
    assert "total: 0 device-hours" in plan  # nothing priced for it, as status
    assert f"stopped  table3-base-smoke-seed0: {waits}" in status
    assert ("table3-base-smoke-seed0: the same training as table2-base-en-de-smoke-seed0, which a "
            "worker is training now: left to evaluate that once it has finished") in out.stdout
    assert not (tmp_path / "results" / "table3" / "table3-base-smoke-seed0.json").exists()
    assert not list((tmp_path / "runs" / "table3").rglob("*.ckpt"))


def _record(root, table, run_id):
    return json.loads((root / "results" / table / f"{run_id}.json").read_text())


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Table 2's base EN-DE at smoke, then Table 3's base seed 0 (its training), and the same
    Table 3 run trained on its own in another folder."""
    root, alone = tmp_path_factory.mktemp("shared"), tmp_path_factory.mktemp("alone")
    env = {**cli_env(root), "WANDB_MODE": "offline", "WANDB_DIR": str(root / "wandb-here")}
    cli(env, "table2", "--variant", "base-en-de", "--scale", "smoke", "--workers", "1")
    (root / "runs" / "table3" / "table3-base-smoke-seed0").mkdir(parents=True)  # a stopped run
    status = cli(env, "status").stdout
    status += cli(env, "table3", "--variant", "base", "--scale", "smoke", "--seeds", "0",
                  "--dry-run").stdout
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--seeds", "0",
              "--workers", "1")
    cli(cli_env(alone), "table3", "--variant", "base", "--scale", "smoke", "--seeds", "0",
        "--workers", "1")
    return root, alone, status, out.stdout + out.stderr


def test_table3_base_evaluates_table2_s_training_instead_of_training(shared):
    root, alone, _, log = shared
    donor = _record(root, "table2", "table2-base-en-de-smoke-seed0")
    reused = _record(root, "table3", "table3-base-smoke-seed0")
    assert reused["trained_by"]["run_id"] == donor["run_id"]
    assert "evaluating those" in log
    # Nothing trained or saved for it: its checkpoints are Table 2's.
    assert not list((root / "runs" / "table3" / "table3-base-smoke-seed0").rglob("*.ckpt"))
    for key in ("curve", "cost", "batch", "precision", "hardware"):
        assert reused[key] == donor[key], key
    assert reused["metrics"]["train_seconds"] == donor["metrics"]["train_seconds"]
    assert reused["evaluated_on"]["cpu"] and reused["averaged_checkpoints"] == []
    assert len(donor["averaged_checkpoints"]) == 5  # Table 2 averaged; Table 3 takes the final weights
    # The same weights as the run trained on its own: the same dev PPL and BLEU.
    own = _record(alone, "table3", "table3-base-smoke-seed0")
    assert "trained_by" not in own
    for key in ("dev_ppl", "dev_bleu", "test_bleu", "train_sample_nll"):
        assert reused["metrics"][key] == own["metrics"][key], key


def test_the_evaluating_run_is_its_own_w_b_run_tagged_and_linked_to_the_training(shared):
    """Read back from W&B's files, all under ``WANDB_DIR`` as the user set it: the donor's run and
    the evaluating run are two W&B runs; the second says whose training it is and where its
    curve is."""
    root = shared[0]
    donor = _record(root, "table2", "table2-base-en-de-smoke-seed0")
    reused = _record(root, "table3", "table3-base-smoke-seed0")
    runs = wandb_runs(root / "wandb-here")
    assert donor["wandb"]["id"] != reused["wandb"]["id"] and {donor["wandb"]["id"],
                                                            reused["wandb"]["id"]} <= set(runs)
    assert Path(reused["wandb"]["dir"]).is_relative_to(root / "wandb-here")
    assert not list((root / "runs").rglob("*.wandb"))  # WANDB_DIR, not the runs' folders
    run = runs[reused["wandb"]["id"]]
    assert {"shared-training", "trained-by:table2-base-en-de-smoke-seed0"} <= run["tags"]
    assert run["config"]["trained_by_wandb_id"] == donor["wandb"]["id"]
    assert "shared-training" not in runs[donor["wandb"]["id"]]["tags"]


def test_status_says_what_reuses_a_training_and_counts_it_once(shared):
    root, _, before, _ = shared
    evaluates = ("evaluates table2-base-en-de-smoke-seed0's training (the same training, "
                 "finished; no training left)")  # one line, in status and in the plan
    assert f"stopped  table3-base-smoke-seed0: {evaluates}" in before
    assert f"table3-base-smoke-seed0: {evaluates}" in [s.strip() for s in before.splitlines()]
    after = cli(cli_env(root), "status").stdout
    line = next(s for s in after.splitlines() if s.startswith("table3 at `smoke`"))
    assert "1 done" in line and "spent 0.00 h training (0.00 device-hours" in line
    cli(cli_env(root), "table3", "--render")
    table = (root / "results" / "table3.md").read_text()
    assert ("1 run(s) evaluated from another run's training, counted there: "
            "table3-base-smoke-seed0 (table2-base-en-de-smoke-seed0's training)") in table
    assert "(table2's training) |" in table


def test_under_slurm_a_twin_s_evaluation_frees_the_other_tasks_before_it_starts(tmp_path,
                                                                                 monkeypatch):
    """Rank 0 of a run's SLURM tasks evaluates a twin's training alone, on one device; the other
    tasks are told at once that they have nothing to do, not after the evaluation (which at the
    paper's size can outlast their wait, REPRODUCE_DDP_TIMEOUT)."""
    from reproduce.records.sharing import Donor
    from reproduce.train import runner
    from reproduce.train.devices import Layout

    for key, value in {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7",
                       "REPRODUCE_RUNS": str(tmp_path / "runs"),
                       "REPRODUCE_RESULTS": str(tmp_path / "results")}.items():
        monkeypatch.setenv(key, value)
    run = load_spec("table3").plan(["base"], "smoke", [0])[0]
    donor = Donor({"run_id": "table2-base-en-de-smoke-seed0", "precision": "32-true"},
                  tmp_path / "donor")
    monkeypatch.setattr(runner, "reuse", lambda run: donor)
    seen = {}

    def evaluate(run, split, command, work, extra, layout, precision, donor=None):
        seen["decision"] = json.loads((work / "decision-7.0.json").read_text())
        seen["devices"], seen["donor"] = layout.devices, donor
        return {"run_id": run.run_id}

    monkeypatch.setattr(runner, "run_here", evaluate)
    assert runner.execute(run, "dev", "cmd", layout=Layout("cpu", 2)).record == {"run_id": run.run_id}
    assert seen == {"decision": {"precision": None}, "devices": 1, "donor": donor}
