"""Several devices without a GPU: DDP over CPU processes (gloo) through the real CLI, at `smoke`.

The paper's batch kept by accumulation (2 ranks x 1 = 1 rank x 2 accumulated, to float
tolerance), resume across device counts, averaging and Table 4 after DDP training, and bad device
options. One run on two ranks, and how it stops and resumes: `tests/end_to_end/test_rank_faults.py`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reproduce.errors import ConfigError
from reproduce.train import devices
from reproduce.train.step_time import COMPILE_BACKEND_ENV
from reproduce.util import machine
from tests import spawner
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


def test_two_ranks_equal_one_rank_accumulating_two_micro_batches(tmp_path):
    """Same global batches (256-token micro-batches, 512 per step), no dropout: the same weights
    after 3 optimizer steps, and the schedule counts optimizer steps in both."""
    spec = _spec(tmp_path / "mine.yaml", p_drop=0.0, device_batch_tokens=256, train_steps=10000)
    a, b = tmp_path / "a", tmp_path / "b"
    cli(_env(a), "table3", "--spec", str(spec), "--scale", "smoke", "--devices", "2")
    # both ranks forked with the CLI's imports done (tests/spawner.py), not fresh Pythons
    if os.environ.get("REPRODUCE_TEST_SPAWNER") != "0":
        payload = str(a / "runs" / "mine" / "mine-base-smoke-seed0" / devices.PAYLOAD)
        forked = [json.loads(p.read_text())
                  for p in Path(os.environ[spawner.REGISTRY_ENV]).glob("[0-9]*[0-9]")]
        assert sorted(f["env"].get("LOCAL_RANK", "0") for f in forked
                      if f["command"][-2:] == ["_rank-run", payload]) == ["0", "1"]
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


def test_two_ranks_on_the_fast_path_train_as_one_eager_rank_accumulating(tmp_path):
    """DDP with the fast path (``train.compile=on``: fused projections, padded loss, compiled
    whole): each rank compiles one graph and never again, and after 3 steps the weights and dev
    PPL are eager's (one rank accumulating the same two micro-batches, which the test above
    holds equal to two eager ranks). One layer (N=1): the same code path, a third of the
    compiling. Compiled by dynamo's capture alone (``REPRODUCE_COMPILE_BACKEND=eager``): what DDP
    changes is dynamo's (the graphs, the recompiles, the ranks' gradients through them);
    inductor's code for this graph is a rank's own, held to the golden losses in
    tests/train/test_fast_step.py, and compiling it cold on both ranks took ~45 s of CPU more."""
    spec = _spec(tmp_path / "mine.yaml", N=1, p_drop=0.0, device_batch_tokens=256,
                 train_steps=10000)
    fast, eager = tmp_path / "fast", tmp_path / "eager"
    cli({**_env(fast), COMPILE_BACKEND_ENV: "eager"}, "table3", "--spec", str(spec), "--scale",
        "smoke", "--devices", "2", "--set", "train.compile=on")
    cli(_env(eager), "table3", "--spec", str(spec), "--scale", "smoke", "--devices", "1")
    rf, re_ = _record(fast), _record(eager)
    assert (rf["batch"]["world_size"], re_["batch"]["accumulate"]) == (2, 2)
    assert rf["compile"] is True and re_["compile"] is False
    assert rf["compile_choice"]["in_training"]["backend"] == "eager", rf["compile_choice"]
    assert rf["compile_choice"]["in_training"]["graphs"] == 1, rf["compile_choice"]
    assert rf["compile_choice"]["in_training"]["recompiles"] == 0, rf["compile_choice"]
    assert rf["compile_choice"]["in_training"]["seconds"] > 0, rf["compile_choice"]
    cf, ce = _weights(fast), _weights(eager)
    assert cf["global_step"] == ce["global_step"] == 3
    for name, wf in cf["state_dict"].items():
        if name.endswith("w_k.bias"):  # noise only: see the test above
            continue
        torch.testing.assert_close(wf, ce["state_dict"][name], rtol=1e-4, atol=1e-5, msg=name)
    assert rf["metrics"]["dev_ppl"] == pytest.approx(re_["metrics"]["dev_ppl"], rel=1e-4)


def test_a_run_resumes_on_another_number_of_devices_both_ways(tmp_path):
    """6 steps on 1 device, continued to 12 on 2, then to 18 on 1 again (one run on 2: its
    ranks are two more Pythons to start, ~6 s of a core each)."""
    env = _env(tmp_path)
    for steps, devices_now, before in ((6, 1, None), (12, 2, 1), (18, 1, 2)):
        spec = _spec(tmp_path / str(steps) / "mine.yaml", train_steps=steps * 10000 // 3)
        cli(env, "table3", "--spec", str(spec), "--scale", "smoke", "--devices", str(devices_now))
        record = _record(tmp_path)
        assert record["metrics"]["train_steps"] == steps
        assert record["batch"]["world_size"] == devices_now
        if before is not None:
            assert record["resumed"] and record["resumed_from"]["step"] == steps - 6
            assert record["resumed_from"]["world_size"] == before
        assert _weights(tmp_path)["lr_schedulers"][0]["last_epoch"] == steps


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
    assert "512 tokens/step (2 device(s) x 1 accumulated x 256)" in out.stdout
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU-less path of bench --gpu")
def test_the_gpu_check_says_there_is_no_gpu_and_checks_the_code_path_on_the_cpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "reproduce", "bench", "--gpu"], cwd=tmp_path,
                         capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("no GPU: torch")
    lines = out.stdout.splitlines()[1:]
    assert [line.split(":")[0] for line in lines] == [
        "base, compiled", "big, compiled", "base, compiled, two passes", "nn.Transformer",
        "nn.Transformer, compiled", "base", "big", "beam search", "base, tf32",
        "base, largest micro-batch"]
    compiled = [lines[i] for i in (0, 1, 2, 4)]  # inductor compiles for minutes on a CPU
    assert all(line.endswith("(or with REPRODUCE_COMPILE_BACKEND=eager: a rehearsal)")
               for line in compiled)
    steps = [lines[i] for i in (3, 5, 6, 8)]  # the peer too, on the device measured
    assert all("(accumulate 1 x " in line and "target tokens/s" in line for line in steps)
    assert lines[9].endswith("on a GPU only")
    assert "sentences/s (8 sentences of 27 pieces" in lines[7]
    assert not (tmp_path / "results").exists()


def test_table4_decodes_constrained_after_ddp_training(tmp_path):
    from tests.tables.test_table4 import TEST, write_wsj

    wsj = write_wsj(tmp_path / "wsj")
    spec = tmp_path / "table4.yaml"  # the shipped spec, constrained at smoke as at `cpu`
    text = (Path(__file__).resolve().parents[2] / "sweeps" / "table4.yaml").read_text()
    spec.write_text(text.replace("pick_on_dev: 2, vocabulary: words}",
                                 "pick_on_dev: 2, vocabulary: words, constrained: true}", 1))
    cli(_env(tmp_path), "table4", "--spec", str(spec), "--scale", "smoke", "--treebank", str(wsj),
        "--variant", "wsj_only", "--devices", "2")
    path = tmp_path / "results" / "table4" / "table4-wsj_only-smoke-seed0-ptb.json"
    record = json.loads(path.read_text())
    assert record["batch"]["world_size"] == 2
    assert record["config"]["decode"]["constrained"]
    assert record["evalb"]["test"]["sentences"] == len(TEST)  # every sentence, on rank 0
    assert "test_f1_free" in record["metrics"] and 0.0 <= record["metrics"]["test_f1"] <= 100.0
    assert len(record["pick"]["candidates"]) == 3  # weighed on dev on both ranks alike


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's cores are what is checked")
def test_workers_times_devices_must_fit_the_cores():
    from reproduce.launch import workers
    from reproduce.records.sweep import load_spec

    runs = load_spec("table3").plan(["base", "A1"], "smoke", [0])
    with pytest.raises(ConfigError, match=r"--workers 2 --devices \d+: on a CPU each device"):
        workers.launch(["table3"], runs, 2, devices=machine.cores())
