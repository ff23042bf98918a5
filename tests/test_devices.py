"""Several devices without a GPU: DDP over CPU processes (gloo) through the real CLI, at `smoke`.

One run whatever the world size (one record, one W&B run, one table), the paper's batch kept by
accumulation (2 ranks x 1 = 1 rank x 2 accumulated, to float tolerance), resume across device
counts, a killed rank, and bad device options."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from reproduce.errors import ConfigError
from reproduce.runs import claims
from reproduce.train import devices
from reproduce.util import machine
from tests import slurm_sim
from tests.helpers import cli, cli_env

pytestmark = pytest.mark.slow


def _env(root: Path) -> dict[str, str]:
    return cli_env(root, threads=2)


def _spec(path: Path, **base) -> Path:
    """A one-variant spec of table `mine`; smoke multiplies train_steps by 0.0003."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("table: mine\nbase: " + json.dumps(base) + "\nvariants: {base: {}}\n")
    return path


def _record(root: Path, table: str = "mine", run: str = "base") -> dict:
    return json.loads((root / "results" / table / f"{table}-{run}-smoke-seed0.json").read_text())


def _weights(root: Path, table: str = "mine", run: str = "base") -> dict:
    ckpt = torch.load(root / "runs" / table / f"{table}-{run}-smoke-seed0" / "checkpoints" /
                      "last.ckpt", map_location="cpu", weights_only=False)
    return ckpt


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
    out = cli(_env(root), *args, "--devices", "2")
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
    assert "Devices: 2 CPU processes (DDP) x 1 accumulated x 512 tokens = 1024 tokens per step" \
        in table
    work = tmp_path / "runs" / "table3" / "table3-base-smoke-seed0"
    assert len(list((work / "wandb").glob("offline-run-*"))) == 1
    assert claims.holder(work) is None
    assert "Traceback" not in out.stderr
    # The dev perplexity gathered over the ranks' shards is that of one process over all of dev.
    from reproduce.runs.sweep import load_spec
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


def test_two_ranks_equal_one_rank_accumulating_two_micro_batches(tmp_path):
    """Same global batches (512-token micro-batches, 1024 per step), no dropout: the same weights
    after 3 optimizer steps, and the schedule counts optimizer steps in both."""
    spec = _spec(tmp_path / "mine.yaml", p_drop=0.0, device_batch_tokens=512, train_steps=10000)
    a, b = tmp_path / "a", tmp_path / "b"
    cli(_env(a), "table3", "--spec", str(spec), "--scale", "smoke", "--devices", "2")
    cli(_env(b), "table3", "--spec", str(spec), "--scale", "smoke", "--devices", "1")
    ra, rb = _record(a), _record(b)
    assert (ra["batch"]["world_size"], ra["batch"]["accumulate"]) == (2, 1)
    assert (rb["batch"]["world_size"], rb["batch"]["accumulate"]) == (1, 2)
    assert ra["batch"]["effective_tokens_per_step"] == rb["batch"]["effective_tokens_per_step"]
    ca, cb = _weights(a), _weights(b)
    assert ca["global_step"] == cb["global_step"] == 3
    assert ca["lr_schedulers"][0]["last_epoch"] == cb["lr_schedulers"][0]["last_epoch"] == 3
    for name, wa in ca["state_dict"].items():
        if name.endswith("w_k.bias"):
            # Softmax ignores a bias added to every key, so its gradient is 0 up to rounding, and
            # Adam turns that rounding into lr-sized steps that differ run to run: noise only.
            assert wa.abs().max() < 1e-2 and cb["state_dict"][name].abs().max() < 1e-2
            continue
        torch.testing.assert_close(wa, cb["state_dict"][name], rtol=1e-4, atol=1e-5, msg=name)
    assert ra["metrics"]["dev_ppl"] == pytest.approx(rb["metrics"]["dev_ppl"], rel=1e-4)


def test_a_run_resumes_on_another_number_of_devices_both_ways(tmp_path):
    """12 steps on 2 devices, continued to 24 on 1, then to 36 on 2 again."""
    env = _env(tmp_path)
    for steps, devices_now, before in ((12, 2, None), (24, 1, 2), (36, 2, 1)):
        spec = _spec(tmp_path / str(steps) / "mine.yaml", train_steps=steps * 10000 // 3)
        cli(env, "table3", "--spec", str(spec), "--scale", "smoke", "--devices", str(devices_now))
        record = _record(tmp_path)
        assert record["metrics"]["train_steps"] == steps
        assert record["batch"]["world_size"] == devices_now
        if before is not None:
            assert record["resumed"] and record["resumed_from"]["step"] == steps - 12
            assert record["resumed_from"]["world_size"] == before
        assert _weights(tmp_path)["lr_schedulers"][0]["last_epoch"] == steps


def _rank_pid(payload: Path, local_rank: str) -> int | None:
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"_rank-run" in cmd and str(payload).encode() in cmd and \
                f"LOCAL_RANK={local_rank}".encode() in env:
            return int(proc.name)
    return None


def test_a_killed_rank_stops_the_run_in_one_line_and_the_next_command_resumes(tmp_path,
                                                                              two_ranks):
    env = _env(tmp_path)
    args = [*two_ranks.args, "--devices", "2"]
    work = tmp_path / "runs" / "table3" / RUN
    proc = subprocess.Popen([sys.executable, "-m", "reproduce", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (work / "checkpoints" / "step6.ckpt").exists():
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
    cli(env, *args)
    record = _record(tmp_path, "table3")
    assert record["resumed"] and record["resumed_from"]["step"] >= 6
    assert _comparable(record) == _comparable(two_ranks.record)


def test_checkpoint_averaging_after_ddp_training(tmp_path):
    cli(_env(tmp_path), "table2", "--variant", "base-en-de", "--scale", "smoke", "--devices", "2")
    record = _record(tmp_path, "table2", "base-en-de")
    assert record["batch"]["world_size"] == 2
    assert len(record["averaged_checkpoints"]) > 1


@pytest.mark.parametrize("args, message", [
    (["--devices", "0"], "argument --devices: expected a positive number or 'auto', got '0'"),
    (["--devices", "abc"], "argument --devices: expected a positive number or 'auto'"),
    (["--devices", "4096"], "--devices 4096: on a CPU each device is a process"),
    (["--accelerator", "tpu"], "argument --accelerator: invalid choice"),
])
def test_bad_device_options_are_one_line_and_touch_nothing(tmp_path, args, message):
    out = cli(_env(tmp_path), "table3", "--variant", "base", "--scale", "smoke", *args,
              check=False)
    assert out.returncode == 2
    assert message in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a GPU-less machine")
def test_accelerator_gpu_without_a_gpu_is_refused():
    with pytest.raises(ConfigError, match="--accelerator gpu: this machine has no GPU"):
        devices.resolve("gpu", None)


def test_the_dry_run_shows_devices_accumulation_and_the_effective_batch(tmp_path):
    args = ["table2", "--variant", "base-en-de", "--scale", "smoke", "--devices", "2", "--dry-run"]
    out = cli({**_env(tmp_path), devices.TIMEOUT_ENV: "90"}, *args)
    assert "each run on 2 CPU processes (DDP, gloo)" in out.stdout
    assert "1024 tokens/step (2 device(s) x 1 accumulated x 512)" in out.stdout
    assert f"collective (or on a rank that never joins) after 90 s ({devices.TIMEOUT_ENV} sets it" \
        in out.stdout
    bad = cli({**_env(tmp_path), devices.TIMEOUT_ENV: "soon"}, *args, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert f"{devices.TIMEOUT_ENV}='soon': allowed values are seconds above 0" in bad.stderr


def test_layout_resolution():
    from reproduce.__main__ import build_parser

    accelerator = next(a for a in build_parser()._subparsers._group_actions[0].choices["table3"]
                       ._actions if a.dest == "accelerator")
    assert list(accelerator.choices) == list(devices.ACCELERATORS)  # --help names what runs take
    assert devices.resolve("cpu", None, 1) == devices.Layout("cpu", 1)
    assert devices.resolve("cpu", None, "auto").devices == 1  # auto on a CPU: one process
    if machine.cores() >= 2:
        assert devices.resolve("auto", 2, 1) == devices.Layout("cpu", 2)  # --devices wins
    with pytest.raises(ConfigError, match="--accelerator bogus: allowed values are auto, cpu"):
        devices.resolve("bogus", None)


def test_ctrl_c_stops_every_rank(tmp_path):
    env = _env(tmp_path)
    spec = _spec(tmp_path / "mine.yaml", train_steps=1000000)  # 300 steps
    work = tmp_path / "runs" / "mine" / "mine-base-smoke-seed0"
    # As from a terminal: a suite started in the background (`pytest &`) inherits SIGINT ignored,
    # and so would the command, which then trained to the end through the Ctrl-C.
    proc = subprocess.Popen([sys.executable, "-m", "reproduce", "table3", "--spec", str(spec),
                             "--scale", "smoke", "--devices", "2"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not (work / "checkpoints" / "step6.ckpt").exists():
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU-less path of bench --gpu")
def test_the_gpu_check_says_there_is_no_gpu_and_checks_the_code_path_on_the_cpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "reproduce", "bench", "--gpu"], cwd=tmp_path,
                         capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("no GPU: torch")
    lines = [line for line in out.stdout.splitlines() if "(smoke)" in line]
    assert [line.split()[0] for line in lines] == ["base-en-de", "big-en-de"]
    assert all("accumulate 2" in line and "target tokens/s" in line for line in lines)
    assert not (tmp_path / "results").exists()


def test_table4_decodes_constrained_after_ddp_training(tmp_path):
    from tests.test_table4 import TEST, write_wsj

    wsj = write_wsj(tmp_path / "wsj")
    spec = tmp_path / "table4.yaml"  # the shipped spec, constrained at smoke as at `cpu`
    text = (Path(__file__).resolve().parent.parent / "sweeps" / "table4.yaml").read_text()
    spec.write_text(text.replace("beam: 2, max_len_offset: 100}",
                                 "beam: 2, max_len_offset: 100, constrained: true}", 1))
    cli(_env(tmp_path), "table4", "--spec", str(spec), "--scale", "smoke", "--treebank", str(wsj),
        "--variant", "wsj_only", "--devices", "2")
    path = tmp_path / "results" / "table4" / "table4-wsj_only-smoke-seed0-ptb.json"
    record = json.loads(path.read_text())
    assert record["batch"]["world_size"] == 2
    assert record["config"]["decode"]["constrained"]
    assert record["evalb"]["test"]["sentences"] == len(TEST)  # every sentence, on rank 0
    assert "test_f1_free" in record["metrics"] and 0.0 <= record["metrics"]["test_f1"] <= 100.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's cores are what is checked")
def test_workers_times_devices_must_fit_the_cores():
    from reproduce.plan import workers
    from reproduce.runs.sweep import load_spec

    runs = load_spec("table3").plan(["base", "A1"], "smoke", [0])
    with pytest.raises(ConfigError, match=r"--workers 2 --devices \d+: on a CPU each device"):
        workers.launch(["table3"], runs, 2, devices=machine.cores())


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

    def start_and_wait_for(step: int) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "reproduce", *args], env=env, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if b"_rank-run" in cmd and str(payload).encode() in cmd and state != "Z":
            found.append(int(proc.name))
    return found


RUN = "table3-base-smoke-seed0"


def _comparable(record: dict) -> dict:
    m = record["metrics"]
    return {"metrics": {k: m[k] for k in ("dev_ppl", "dev_nll", "train_sample_nll", "dev_bleu",
                                          "test_bleu", "train_steps")},
            "curve": {k: [[p[0], p[2]] for p in v] for k, v in record["curve"].items()}}


def test_one_run_over_two_simulated_nodes_equals_two_processes_on_one_and_usr2_requeues_it(
        tmp_path, two_ranks):
    """`--launcher slurm --nodes 2`: one run over two nodes' tasks (simulated on this machine,
    `tests/slurm_sim.py`) trains what 1 node x 2 processes trains: same metrics, same curve. USR2
    (the time limit is near) saves the step in flight, rank 0 requeues the job (`scontrol`) and
    the requeued start resumes from that step exactly."""
    args, reference = two_ranks.args, two_ranks.record
    root = tmp_path / "cluster"
    env = {**cli_env(root, threads=1), **slurm_sim.install(root / "slurm")}
    out = cli(env, *args, "--launcher", "slurm", "--nodes", "2")
    assert f"{RUN}: 2 nodes x 1 task(s)" in out.stdout
    [job] = slurm_sim.jobs(root / "slurm")
    assert f"{RUN}: job {job}\n" in out.stdout
    work = root / "runs" / "table3" / RUN
    first = slurm_sim.start(root / "slurm", job, env)
    deadline = time.time() + 300
    while _newest_step(work) < 9:
        assert first.poll() is None and time.time() < deadline, _task_logs(root)
        time.sleep(0.05)
    os.kill(slurm_sim.srun_pid(root / "slurm", job), signal.SIGUSR2)
    assert first.wait(timeout=120) != 0
    assert slurm_sim.requeued(root / "slurm") == [f"requeue {job}"], _task_logs(root)
    saved = work / "checkpoints" / "preempted.ckpt"
    step = torch.load(saved, map_location="cpu", weights_only=False)["global_step"]
    assert 9 <= step < 30
    assert not (root / "results" / "table3" / f"{RUN}.json").exists()

    again = slurm_sim.start(root / "slurm", job, env, restart=1)
    assert again.wait(timeout=300) == 0, _task_logs(root)
    record = _record(root, "table3")
    assert record["resumed_from"]["step"] == step
    assert (record["batch"]["nodes"], record["batch"]["world_size"]) == (2, 2)
    assert _comparable(record) == _comparable(reference)
    cli(env, *args, "--render")
    assert "Devices: 2 nodes x 1 CPU process (DDP) x 1 accumulated" in \
        (root / "results" / "table3.md").read_text()


def _newest_step(work: Path) -> int:
    steps = [int(p.stem[4:]) for p in (work / "checkpoints").glob("step*.ckpt")
             if p.stem[4:].isdigit()] if (work / "checkpoints").exists() else []
    return max(steps, default=-1)


def _task_logs(root: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text()[-3000:]}"
                     for p in sorted((root / "runs").rglob("*_log.err")))
