"""train.device_batch_tokens: auto: the fewest passes a step whose measured peak memory fits, cached
for every rank and later run; a CPU takes one pass; a run that chose is found finished again."""

import json

import pytest

from reproduce.config import ConfigError, parse_sets
from reproduce.records.sweep import load_spec
from reproduce.train import micro_batch
from tests.helpers import cli, cli_env

GIB = 2**30


def linear_peak(fixed_gib: float, bytes_per_token: float, out_of_memory_over: int = 10**9):
    """A device whose step takes ``fixed_gib`` plus ``bytes_per_token`` a token, and runs out of
    memory (None) past ``out_of_memory_over`` tokens; the sizes asked, in order."""
    asked: list[int] = []

    def peak(tokens: int):
        asked.append(tokens)
        return None if tokens > out_of_memory_over else int(fixed_gib * GIB + bytes_per_token * tokens)
    return peak, asked


@pytest.mark.parametrize("fixed, per_token, oom_over, passes, tokens", [
    (2, 1e6, 10**9, 1, 25000),      # 2 GiB + 25 GB: within 85 % of 80 GiB, one pass
    (2, 4e6, 10**9, 2, 12500),      # 100 GB at once: two passes of 12,500 (52 GB)
    (2, 4e6, 9000, 3, 8334),        # the model says 2 passes fit, the device ran out: three
    (62, 1e6, 10**9, 4, 6250),      # most of the memory taken before the first token
])
def test_the_fewest_passes_whose_peak_fits(fixed, per_token, oom_over, passes, tokens):
    peak, asked = linear_peak(fixed, per_token, oom_over)
    got = micro_batch.fewest_passes(25000, peak, 80 * GIB)
    assert got[:2] == (passes, tokens)
    assert asked == [-(-25000 // k) for k in range(1, passes + 1)]  # one pass first, then more
    assert set(got[2]) == set(asked) and (got[2][tokens] or 0) <= micro_batch.HEADROOM * 80 * GIB


def test_a_step_that_fits_in_no_pass_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"train.device_batch_tokens = auto: 25000 tokens a step "
                       r"do not fit this device's memory \(8.0 GiB\) in 64 passes; lower "
                       "train.batch_tokens or train on more devices"):
        micro_batch.fewest_passes(25000, lambda tokens: 9 * GIB, 8 * GIB)


def test_the_choice_is_measured_once_cached_and_a_cpu_takes_one_pass(tmp_path):
    config = load_spec("table3").resolve("base", "paper").overrides(device_batch_tokens="auto")
    cache = tmp_path / "micro-batch.json"
    peak, asked = linear_peak(2, 4e6)
    tokens, how = micro_batch.choose(config, 1, "bf16-mixed", "gpu", cache, peak=peak,
                                     total=80 * GIB)
    assert (tokens, how["measured"]["passes"], how["cached"]) == (12500, 2, False)
    assert how["how"].startswith("2 pass(es) of 12500 tokens a step: peak 48.6 GiB of 80.0 free")

    def never(tokens):
        raise AssertionError("measured again")

    again, how = micro_batch.choose(config, 1, "bf16-mixed", "gpu", cache, peak=never,
                                    total=80 * GIB)
    assert again == 12500 and how["cached"] and len(json.loads(cache.read_text())) == 1
    # two devices: 12,500 tokens each, another entry, measured afresh (one pass fits)
    assert micro_batch.choose(config, 2, "bf16-mixed", "gpu", cache, peak=peak,
                              total=80 * GIB)[0] == 12500
    assert len(json.loads(cache.read_text())) == 2
    assert micro_batch.choose(config, 1, "32-true", "cpu", cache) == (
        25000, {"asked": "auto", "how": "one pass a step: a CPU's memory is not measured"})
    assert micro_batch.choose(config.overrides(device_batch_tokens=5000), 1, "32-true", "gpu",
                              cache) == (5000, {"asked": 5000, "how": "set in the config"})
    # dropout keeps its masks: another model to measure
    micro_batch.choose(config.overrides(p_drop=0.0), 1, "bf16-mixed", "gpu", cache, peak=peak,
                       total=80 * GIB)
    assert len(json.loads(cache.read_text())) == 3


def test_a_run_keeps_the_micro_batch_it_started_with(tmp_path, monkeypatch):
    """Resumed, or read by a cluster's other ranks: the run folder's answer, not a new one (a
    GPU measured again, or another one, could answer otherwise and change the batches
    mid-epoch); another count of devices is another step split, chosen again."""
    from reproduce.paths import RUNS_ENV
    from reproduce.records.sweep import PlannedRun
    from reproduce.train.devices import Layout

    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    config = load_spec("table3").resolve("base", "paper").overrides(device_batch_tokens="auto")
    run = PlannedRun("table3", "base", "base", "paper", 0, config)
    answers = iter([(12500, {"asked": "auto", "how": "first"}), (6250, {"how": "second"})])
    monkeypatch.setattr(micro_batch, "choose", lambda *args: next(answers))
    one, two = Layout("gpu", 1), Layout("gpu", 2)
    first = micro_batch.resolve(run, one, "bf16-mixed", tmp_path / "work")
    assert first.config.train.device_batch_tokens == 12500
    assert first.config.train.split_batch(1) == (2, 12500)
    again = micro_batch.resolve(run, one, "bf16-mixed", tmp_path / "work")
    assert again.config == first.config and again.micro_batch_choice["how"] == "first"
    assert micro_batch.resolve(run, two, "bf16-mixed", tmp_path / "work").micro_batch_choice[
        "how"] == "second"
    assert micro_batch.resolve(first, one, "bf16-mixed", tmp_path / "w2") is first  # a number


def test_auto_is_a_value_of_the_setting_and_others_are_named_in_the_error():
    config = load_spec("table3").resolve("base", "smoke")
    assert config.overrides(**parse_sets(["train.device_batch_tokens=auto"])).train.split_batch(
        2) == (1, 256)  # before it is measured: one pass
    for bad in ("sometimes", -1, True):
        with pytest.raises(ConfigError, match=f"train.device_batch_tokens = {bad!r}: allowed "
                           r"values are an integer >= 0 \(0: one pass a step\) or auto"):
            config.overrides(device_batch_tokens=bad)


@pytest.mark.slow
def test_a_run_on_auto_records_its_choice_and_is_found_finished_again(tmp_path):
    env = cli_env(tmp_path)
    args = ("table3", "--variant", "base", "--scale", "smoke", "--set",
            "train.device_batch_tokens=auto")
    cli(env, *args)
    record = json.loads((tmp_path / "results" / "table3" /
                         "table3-base-smoke-seed0.json").read_text())
    assert record["config"]["train"]["device_batch_tokens"] == 512  # what it trained with
    assert (record["batch"]["accumulate"], record["batch"]["device_batch_tokens"]) == (1, 512)
    assert record["batch"]["micro_batch_choice"] == {
        "asked": "auto", "how": "one pass a step: a CPU's memory is not measured"}
    # the eager path's steady step reads back from its device: the loss's boolean mask
    # (3 ops) and more (step_census; the fast path's: tests/train/test_fast_step.py)
    census = record["batch"]["step_census"]
    assert census["step"] == 12 and census["host_waits"] >= 3 and census["ops"] > 0, census
    again = cli(env, *args)
    assert "finished earlier" in again.stderr + again.stdout


def test_a_config_asking_auto_is_the_record_of_the_number_it_chose():
    """Found finished (``same_config``), and its training evaluated by a twin asking auto
    (``same_training``); a number asked is still held to the number recorded."""
    from reproduce.records.sharing import same_training
    from reproduce.records.store import same_config

    asked = load_spec("table3").resolve("base", "smoke").overrides(device_batch_tokens="auto")
    stored = asked.overrides(device_batch_tokens=512).to_dict()
    assert same_config(stored, asked) and same_training(stored, asked)
    other = asked.overrides(device_batch_tokens=256)
    assert not same_config(stored, other) and not same_training(stored, other)
