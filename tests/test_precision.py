"""precision: auto is chosen by a timed training step of the run's model, cached, and recorded."""

import json

import pytest
import torch

from reproduce import precision
from reproduce.sweep import load_spec


@pytest.fixture
def config():
    return load_spec("table3").resolve("base", "smoke").overrides(precision="auto")


@pytest.fixture
def cpu_bf16_screen_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "bf16_matmul_not_slower", lambda: True)


@pytest.mark.parametrize("fp32, bf16, chosen", [
    (1.0, 0.5, "bf16-mixed"),   # bf16 2x faster
    (1.0, 0.95, "32-true"),     # a near tie stays fp32 (margin 1.1x)
    (0.7, 1.0, "32-true"),      # the avx512_bf16-without-AMX case: bf16 slower per step
])
def test_the_faster_step_is_chosen_with_a_margin_for_bf16(config, tmp_path,
                                                         cpu_bf16_screen_passes, fp32, bf16,
                                                         chosen):
    timer = lambda c, tokens: {"32-true": fp32, "bf16-mixed": bf16}  # noqa: E731
    got, how = precision.choose(config, 1024, tmp_path / "p.json", timer=timer)
    assert got == chosen and how["chosen"] == chosen and not how["cached"]
    assert how["seconds_per_step"] == {"32-true": fp32, "bf16-mixed": bf16}


def test_the_answer_is_cached_per_model_and_threads(config, tmp_path, cpu_bf16_screen_passes):
    cache = tmp_path / "p.json"
    precision.choose(config, 1024, cache, timer=lambda c, t: {"32-true": 1.0, "bf16-mixed": 0.5})

    def never(c, t):
        raise AssertionError("timed again")

    got, how = precision.choose(config, 1024, cache, timer=never)
    assert got == "bf16-mixed" and how["cached"]
    assert precision.cached(config, 1024, cache) == "bf16-mixed"
    # Another model shape is another entry, timed afresh.
    other = config.overrides(d_model=config.model.d_model * 2)
    got, _ = precision.choose(other, 1024, cache, timer=lambda c, t: {"32-true": 0.5,
                                                                      "bf16-mixed": 1.0})
    assert got == "32-true" and len(json.loads(cache.read_text())) == 2


def test_no_step_is_timed_where_a_bf16_matmul_is_slower(config, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "bf16_matmul_not_slower", lambda: False)

    def never(c, t):
        raise AssertionError("timed a bf16 step on a CPU without fast bf16")

    got, how = precision.choose(config, 1024, tmp_path / "p.json", timer=never)
    assert got == "32-true" and how["seconds_per_step"] is None


def test_a_set_precision_is_taken_as_it_is(config, tmp_path):
    got, how = precision.choose(config.overrides(precision="32-true"), 1024, None)
    assert got == "32-true" and how == {"asked": "32-true", "how": "set in the config"}


def test_a_real_timing_of_both_precisions(config):
    seconds = precision.step_seconds(config, 256, rounds=1)
    assert set(seconds) == {"32-true", "bf16-mixed"} and all(s > 0 for s in seconds.values())
