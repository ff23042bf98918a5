"""One run on two ranks (DDP over CPU processes) through the real CLI, at `smoke`, and how it
stops and resumes: one record, one W&B run, one table; a killed rank; SIGTERM and kill -9 of the
process that started the ranks; Ctrl-C. Every interrupted run's record must equal that of the
same run never interrupted (``two_ranks``). Two SLURM nodes, USR2 and the requeue run on a real
SLURM: ``tests/end_to_end/test_slurm_cluster.py``."""

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from reproduce.records import claims
from reproduce.train import devices
from tests.helpers import WANDB_OFFLINE, cli, cli_env, processes, start

pytestmark = pytest.mark.slow


def _env(root: Path) -> dict[str, str]:
    return cli_env(root, threads=2)


def _record(root: Path, table: str = "table3", run: str = "base") -> dict:
    return json.loads((root / "results" / table / f"{table}-{run}-smoke-seed0.json").read_text())


@dataclass
class TwoRanks:
    root: Path
    args: list[str]
    out: subprocess.CompletedProcess
    record: dict


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> TwoRanks:
    """Table 3's base at `smoke` (30 steps) on one node x 2 processes, never interrupted: what
    every other way of training it (killed and resumed, over two nodes) must equal."""
    root = tmp_path_factory.mktemp("two-ranks")
    args = ["table3", "--variant", "base", "--scale", "smoke"]
    out = cli({**_env(root), **WANDB_OFFLINE}, *args, "--devices", "2")
    return TwoRanks(root, args, out, _record(root, "table3"))


def test_two_processes_train_one_run_with_one_record_one_wandb_run_one_table(two_ranks):
    tmp_path, out = two_ranks.root, two_ranks.out
    records = list((tmp_path / "results" / "table3").glob("*.json"))
    assert [p.name for p in records] == ["table3-base-smoke-seed0.json"]
    record = json.loads(records[0].read_text())
    assert record["batch"]["world_size"] == 2 and record["batch"]["strategy"] == "ddp"
    assert record["batch"]["effective_tokens_per_step"] == 2 * record["batch"]["device_batch_tokens"]
    assert out.stdout.count("recorded ") == 1 and out.stdout.count("rendered ") == 1
    table = (tmp_path / "results" / "table3.md").read_text()
    assert "Devices: 2 CPU processes (DDP) x 1 accumulated x 256 tokens = 512 tokens per step" \
        in table
    work = tmp_path / "runs" / "table3" / "table3-base-smoke-seed0"
    assert len(list((work / "wandb").glob("offline-run-*"))) == 1
    assert claims.holder(work) is None
    assert "Traceback" not in out.stderr
    # The dev perplexity gathered over the ranks' shards is that of one process over all of dev.
    from reproduce.records.sweep import load_spec
    from reproduce.train import fit as training
    from reproduce.train.lit import TranslationModule

    run = load_spec("table3").plan(["base"], "smoke", [0])[0]
    _, data = training.build_data(run.config)
    data.setup()
    module = TranslationModule.load_from_checkpoint(work / "checkpoints" / "last.ckpt")
    import pytorch_lightning as pl

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    dev = trainer.validate(module, datamodule=data, verbose=False)[0]
    assert round(float(dev["dev/ppl"]), 3) == pytest.approx(record["metrics"]["dev_ppl"], abs=2e-3)
    module.eval_name = "train_sample"  # so is the NLL on the training sample
    fit = trainer.validate(module, dataloaders=data.train_sample_dataloader(), verbose=False)[0]
    assert float(fit["train_sample/nll"]) == pytest.approx(record["metrics"]["train_sample_nll"],
                                                           abs=2e-4)
    assert record["data"]["train_sample_pairs"] == len(data.dev_pairs)


def _rank_pid(payload: Path, local_rank: str) -> int | None:
    for pid, command, env, _ in processes():
        if "_rank-run" in command and str(payload) in command and \
                env.get("LOCAL_RANK") == local_rank:
            return pid
    return None


def test_a_killed_rank_stops_the_run_in_one_line_and_leaves_its_checkpoints(tmp_path, two_ranks):
    env = _env(tmp_path)
    args = [*two_ranks.args, "--devices", "2"]
    work = tmp_path / "runs" / "table3" / RUN
    proc = start(env, *args)
    deadline = time.time() + 300
    while not (work / "checkpoints" / "step5.ckpt").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)
    pid = _rank_pid(work / devices.PAYLOAD, "1")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    _, err = proc.communicate(timeout=120)
    assert time.time() - killed < 60
    assert proc.returncode != 0
    assert "rank 0 of 2 exited" in err and "resume" in err
    assert "Traceback" not in err
    assert claims.holder(work) is None
    assert not _ranks(work / devices.PAYLOAD)  # no rank left behind
    assert not (tmp_path / "results" / "table3" / f"{RUN}.json").exists()
    assert (work / "checkpoints" / "step5.ckpt").exists()  # what the next command resumes from


def test_ctrl_c_stops_every_rank(tmp_path):
    env = _env(tmp_path)
    spec = tmp_path / "mine.yaml"  # 300 steps at smoke
    spec.write_text("table: mine\nbase: {train_steps: 1000000}\nvariants: {base: {}}\n")
    work = tmp_path / "runs" / "mine" / "mine-base-smoke-seed0"
    # As from a terminal: a suite started in the background (`pytest &`) inherits SIGINT ignored,
    # and so would the command, which then trained to the end through the Ctrl-C.
    proc = start(env, "table3", "--spec", str(spec), "--scale", "smoke", "--devices", "2",
                 sigint=True)
    deadline = time.time() + 300
    while not (work / "checkpoints" / "step5.ckpt").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode != 0, (f"exit 0 {time.time() - sent:.1f} s after SIGINT; "
                                  f"checkpoints {sorted(p.name for p in (work / 'checkpoints').iterdir())}"
                                  f"\n{out[-2000:]}\n{err[-4000:]}")
    assert not _ranks(work / devices.PAYLOAD)
    assert claims.holder(work) is None
    assert not (tmp_path / "results" / "mine" / "mine-base-smoke-seed0.json").exists()
    # every rank ended its step and saved it, as for SIGTERM; one line says so
    saved = work / "checkpoints" / "preempted.ckpt"
    assert err.strip().splitlines()[-1] == (
        f"mine-base-smoke-seed0: stopped by SIGINT; its ranks saved the step they were at "
        f"({saved}): run the command again to resume from it"), err[-3000:]


def test_sigterm_then_kill_9_of_the_sweep_process_and_the_rerun_equals_an_uninterrupted_run(
        tmp_path, two_ranks):
    """SIGTERM to the process that started a 2-rank run: every rank saves the step it is at, one
    line, exit 1. Then kill -9 of that process (what the OOM killer does): both ranks die with it
    (none trains on unsupervised) and the claim is free. The same command then resumes to the
    record of a run never interrupted."""
    args, reference = [*two_ranks.args, "--devices", "2"], two_ranks.record
    env = _env(tmp_path)
    work = tmp_path / "runs" / "table3" / RUN
    payload = work / devices.PAYLOAD

    def start_and_wait_for(step: int):
        proc = start(env, *args)
        deadline = time.time() + 300
        while _newest_step(work) < step or len(_ranks(payload)) < 2:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.05)
        return proc

    proc = start_and_wait_for(6)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "stopped by SIGTERM; its ranks saved the step they were at" in err.strip().splitlines()[-1]
    saved = torch.load(work / "checkpoints" / "preempted.ckpt", map_location="cpu",
                       weights_only=False)["global_step"]
    assert saved >= 6 and not _ranks(payload)

    proc = start_and_wait_for(saved + 6)
    proc.kill()
    proc.wait()
    deadline = time.time() + 10
    while _ranks(payload):
        assert time.time() < deadline, "a rank lives on 10 s after the sweep's process died"
        time.sleep(0.1)
    assert claims.holder(work) is None
    assert not (tmp_path / "results" / "table3" / f"{RUN}.json").exists()
    cli(env, *args)
    record = _record(tmp_path, "table3")
    assert record["resumed"] and record["resumed_from"]["step"] >= saved + 6
    assert _comparable(record) == _comparable(reference)


def _ranks(payload: Path) -> list[int]:
    """The live rank processes of the run whose payload is ``payload``."""
    return [pid for pid, command, _, state in processes()
            if "_rank-run" in command and str(payload) in command and state != "Z"]


RUN = "table3-base-smoke-seed0"


def _comparable(record: dict) -> dict:
    m = record["metrics"]
    return {"metrics": {k: m[k] for k in ("dev_ppl", "dev_nll", "train_sample_nll", "dev_bleu",
                                          "test_bleu", "train_steps")},
            "curve": {k: [[p[0], p[2]] for p in v] for k, v in record["curve"].items()}}


def _newest_step(work: Path) -> int:
    steps = [int(p.stem[4:]) for p in (work / "checkpoints").glob("step*.ckpt")
             if p.stem[4:].isdigit()] if (work / "checkpoints").exists() else []
    return max(steps, default=-1)
