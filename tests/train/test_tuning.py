"""--tune for Table 3: nuisance settings only, a persistent study that resumes, the best settings
recorded with the final run."""

import json
import os
import sys

import pytest

from reproduce.errors import SpecError
from reproduce.records.sweep import load_spec
from tests.helpers import cli, cli_env, inject

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
           "REPRODUCE_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}

    def run(trials):
        out = cli(env, "table3", "--variant", "A3", "--scale", "smoke", "--tune", "--trials",
                  str(trials), check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    run(1)  # a trial, then the record of the best (and only) one
    storage = f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    study = optuna.load_study(study_name="table3-A3-smoke-seed0", storage=storage)
    assert len(study.trials) == 1
    assert set(study.trials[0].params) == {"lr_scale", "warmup_steps"}
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results" / "table3").glob("*.json")]
    best = record["tuning"]["best_params"]
    assert record["config"]["train"]["lr_scale"] == pytest.approx(best["lr_scale"])
    assert record["config"]["train"]["warmup_steps"] == best["warmup_steps"]
    assert record["config"]["model"]["h"] == 16  # what the row varies is untouched
    run(1)  # the same study, resumed: one more trial
    assert len(optuna.load_study(study_name="table3-A3-smoke-seed0", storage=storage).trials) == 2


def test_a_trial_killed_outright_or_stopped_by_a_signal_is_resumed_by_the_next_trial(tmp_path):
    """A trial's process killed outright (kill -9 at step 13, a node lost): nothing in it can
    fail the trial, and the journal file has no heartbeats, so optuna would keep it RUNNING for
    ever. The next call finds it by its run folder's claim, free since its process died, fails it
    and queues its settings again; its next trial resumes the folder from its last checkpoint (of
    step 10). SIGTERM (or SLURM's USR2) at step 23 of that trial: optuna would leave it RUNNING
    and draw new settings next time; it is failed and its settings queued again, and the next
    call's trial resumes them from the step it stopped at. The first trial's settings are the
    ones finally recorded."""
    import optuna

    from tests.end_to_end.test_faults import FAULTS

    env = {**cli_env(tmp_path), "REPRODUCE_CACHE": str(tmp_path / "cache"),
           "REPRODUCE_TRIAL_STALE_SECONDS": "0"}
    faulty = inject(env, tmp_path / "inject", FAULTS)
    journal = tmp_path / "runs" / "optuna.journal"
    args = ("table3", "--variant", "A3", "--scale", "smoke", "--tune", "--storage",
            f"journal:{journal}", "--trials")
    killed = cli({**faulty, "REPRODUCE_TEST_FAULT": "kill-9-at-13"}, *args, "2", check=False)
    assert killed.returncode == -9, killed.stdout + killed.stderr

    def trials() -> list:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(journal)))
        return optuna.load_study(study_name="table3-A3-smoke-seed0", storage=storage).trials

    (first,) = trials()
    assert first.state == optuna.trial.TrialState.RUNNING  # what optuna alone leaves
    folder = tmp_path / "runs" / "table3" / first.user_attrs["run_id"]
    assert (folder / "checkpoints" / "step10.ckpt").exists()

    stopped = cli({**faulty, "REPRODUCE_TEST_FAULT": "sigterm-at-23"}, *args, "1", check=False)
    said = stopped.stdout + stopped.stderr
    assert stopped.returncode == 1, said
    assert "trial 0 was left running by a process that is gone" in said
    assert f"resuming from {folder / 'checkpoints' / 'last.ckpt'}" in said
    assert "step 20/30" in said and "step 10/30" not in said  # from step 10 on
    assert "stopped by SIGTERM at step 23 of 30; saved at that step" in said
    assert "trial 1 stopped; its settings are queued again" in said
    fail, waiting = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING
    assert [t.state for t in trials()] == [fail, fail, waiting]
    assert trials()[2].user_attrs == {"resumes_trial": 1}  # its params: set once it starts

    out = cli(env, *args, "1")
    assert f"resuming from {folder / 'checkpoints' / 'preempted.ckpt'}" in out.stdout, out.stdout
    after = trials()
    assert [t.state for t in after] == [fail, fail, optuna.trial.TrialState.COMPLETE]
    assert after[1].params == after[2].params == first.params
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results" / "table3").glob("*.json")]
    assert record["tuning"]["best_params"] == first.params


def test_a_running_trial_whose_folder_is_claimed_is_left_alone(tmp_path, monkeypatch):
    """A RUNNING trial whose run folder a live process claims is training: not failed, however
    old; one past the wait with its folder unclaimed is failed and its settings queued again."""
    import optuna

    from reproduce.records.claims import claim
    from reproduce.train.tuning import requeue_dead_trials

    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("REPRODUCE_TRIAL_STALE_SECONDS", "0")
    study = optuna.create_study(study_name="s")
    alive, dead = study.ask({"lr": optuna.distributions.FloatDistribution(0.1, 1.0)}), \
        study.ask({"lr": optuna.distributions.FloatDistribution(0.1, 1.0)})
    alive.set_user_attr("run_id", "table3-base-smoke-seed0-tuned-a")
    dead.set_user_attr("run_id", "table3-base-smoke-seed0-tuned-b")
    with claim(tmp_path / "runs" / "table3" / "table3-base-smoke-seed0-tuned-a") as held:
        assert held
        requeue_dead_trials(study, "table3")
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL,
                      optuna.trial.TrialState.WAITING]
    assert study.trials[2].user_attrs == {"resumes_trial": 1}
    monkeypatch.setenv("REPRODUCE_TRIAL_STALE_SECONDS", "3600")  # started just now: not yet
    requeue_dead_trials(study, "table3")
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING


def test_a_storage_password_is_never_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's files are searched for it too
    """A record, its W&B run, the logs and the table name the study's URL as user:***@host."""
    from reproduce.__main__ import main
    from reproduce.train import tuning
    from reproduce.util.secrets import mask

    assert mask("x postgresql://me:s3cr:et@db.example:5432/optuna y") == \
        "x postgresql://me:***@db.example:5432/optuna y"
    assert mask("sqlite:////runs/optuna.db") == "sqlite:////runs/optuna.db"
    # a password in the query, a form libpq and the drivers accept, is a password too
    assert mask("postgresql://db.example/optuna?password=hunter2&sslmode=require") == \
        "postgresql://db.example/optuna?password=***&sslmode=require"
    assert mask("sqlite:///x.db?Token=abc#frag and ?sslpassword=p") == \
        "sqlite:///x.db?Token=***#frag and ?sslpassword=***"
    assert mask("https://example.org/?page=2&q=password") == "https://example.org/?page=2&q=password"
    # a credential of the environment, wherever its value shows up
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123")
    monkeypatch.setenv("MY_DB_PASSWORD", "hunter22")
    assert mask("--storage postgresql://db/x?sslmode=hunter22 key 0123456789abcdef0123") == \
        "--storage postgresql://db/x?sslmode=*** key ***"
    assert mask("https://example.org/v1?key=abc&monkey=1") == "https://example.org/v1?key=***&monkey=1"
    secret_url = "postgresql://me:hunter2@db.example/optuna"
    out = cli({**os.environ, "REPRODUCE_RESULTS": str(tmp_path / "r0"),
               "REPRODUCE_RUNS": str(tmp_path / "r0")},
              "table3", "--variant", "A3", "--scale", "smoke", "--tune", "--trials", "1",
              "--storage", "postgresql://me:hunter2@127.0.0.1:9/optuna", check=False)
    assert out.returncode == 2 and "me:***@127.0.0.1" in out.stderr
    assert "hunter2" not in out.stdout + out.stderr

    # A database that answers, reached through a URL with a password (optuna's sqlite cannot
    # take one: the URL is what we check, the storage behind it is a local file).
    real = tuning._storage
    monkeypatch.setattr(tuning, "_storage",
                        lambda url: real(f"sqlite:///{tmp_path / 'optuna.db'}"))
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    argv = ["table3", "--variant", "A3", "--scale", "smoke", "--tune", "--trials", "1",
            "--storage", secret_url, "--workers", "1"]
    # the command line as a shell gives it: W&B copies sys.argv into its run files
    monkeypatch.setattr(sys, "argv", ["reproduce", *argv])
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "hunter2" not in printed.out + printed.err
    written = [p for folder in ("results", "runs") for p in (tmp_path / folder).rglob("*")
               if p.is_file() and b"hunter2" in p.read_bytes()]
    assert written == []
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results" / "table3").glob("*.json")]
    assert record["tuning"]["storage"] == "postgresql://me:***@db.example/optuna"
    assert "--storage postgresql://me:***@db.example/optuna" in record["command"]


def test_a_trial_whose_settings_another_process_is_training_is_pruned(tmp_path, monkeypatch):
    # two SLURM trial tasks that drew the same settings share one run folder: the second stops
    import optuna

    from reproduce.records.claims import claim
    from reproduce.train.tuning import train_and_score

    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path))
    (run,) = load_spec("table3").plan(["A1"], "smoke", [0])
    with claim(tmp_path / run.table / run.run_id) as held:  # another trial's, trained now
        assert held
        with pytest.raises(optuna.TrialPruned, match="the same settings are training in another"):
            train_and_score(run)
    assert not (tmp_path / run.table / run.run_id / "checkpoints").exists()
