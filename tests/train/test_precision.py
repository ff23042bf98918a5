"""precision: auto is chosen by a timed training step of the table's base, cached, and recorded."""

import dataclasses
import json

import pytest
import torch

from reproduce.records.sweep import load_spec
from reproduce.train import precision, step_time, timings


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
    got, how = precision.choose(config, config.train.batch_tokens, tmp_path / "p.json", timer=timer)
    assert got == chosen and how["chosen"] == chosen and not how["cached"]
    assert how["seconds_per_step"] == {"32-true": fp32, "bf16-mixed": bf16}


def test_the_answer_is_cached_per_model_and_threads(config, tmp_path, cpu_bf16_screen_passes):
    cache, tokens = tmp_path / "p.json", config.train.batch_tokens
    precision.choose(config, tokens, cache, timer=lambda c, t: {"32-true": 1.0, "bf16-mixed": 0.5})

    def never(c, t):
        raise AssertionError("timed again")

    got, how = precision.choose(config, tokens, cache, timer=never)
    assert got == "bf16-mixed" and how["cached"]
    assert precision.timed(config, torch.get_num_threads(), cache)["chosen"] == "bf16-mixed"
    # Another model shape is another entry, timed afresh.
    other = config.overrides(d_model=config.model.d_model * 2)
    got, _ = precision.choose(other, tokens, cache, timer=lambda c, t: {"32-true": 0.5,
                                                                        "bf16-mixed": 1.0})
    assert got == "32-true" and len(json.loads(cache.read_text())) == 2


def test_every_variant_of_a_table_trains_in_the_precision_its_base_was_timed_in(
        tmp_path, monkeypatch, cpu_bf16_screen_passes, caplog):
    # Timed alone, row A's single 128-wide head (A1) would take bf16; base and 32 heads would not.
    monkeypatch.setattr(precision, "runs_dir", lambda: tmp_path)
    monkeypatch.setattr(step_time, "seconds_by_precision", lambda c, t: {
        "32-true": 1.0, "bf16-mixed": 0.5 if c.model.h == 1 else 1.2})
    runs = [dataclasses.replace(r, config=r.config.overrides(precision="auto"))
            for r in load_spec("table3").plan(["base", "A1", "A4"], "smoke", [0])]
    with caplog.at_level("INFO", logger=precision.log.name):
        chosen = [precision.choose_precision(r) for r in runs]
    assert [p for p, _ in chosen] == ["32-true"] * 3
    # the log says which answers were timed by an earlier run, not by this one
    lines = [m for m in caplog.messages if "precision auto" in m]
    assert len(lines) == 3 and "cached" not in lines[0]
    assert all("cached from an earlier run of the same model: timed" in m for m in lines[1:])
    assert all("table3's base at `smoke`" in how["how"] for _, how in chosen)
    assert all(how["timed_model"].startswith("table3's base at `smoke`") for _, how in chosen)
    assert len(json.loads((tmp_path / timings.TIMINGS).read_text())) == 1  # timed once
    # Without its table's base, A1 is timed as itself: the choice this prevents.
    alone = dataclasses.replace(runs[1], precision_from=None)
    assert precision.choose_precision(alone)[0] == "bf16-mixed"


def _record(folder, run_id, scale, trained_in, asked="auto"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{run_id}.json").write_text(json.dumps({
        "run_id": run_id, "scale": scale, "precision": trained_in, "metrics": {},
        "config": {"train": {"precision": asked}}}))


def test_a_table_with_records_at_a_scale_keeps_their_precision_on_another_machine(
        tmp_path, monkeypatch, cpu_bf16_screen_passes, caplog):
    # This machine times bf16 2x faster (as an Intel CPU with AMX would, or a GPU takes bf16), but
    # the table's base already trained in fp32 at this scale: the variants must follow it.
    monkeypatch.setattr(precision, "runs_dir", lambda: tmp_path / "runs")
    monkeypatch.setattr(precision, "results_dir", lambda: tmp_path / "results")
    monkeypatch.setattr(step_time, "seconds_by_precision", lambda c, t: {"32-true": 1.0,
                                                                  "bf16-mixed": 0.5})
    base, a1 = [dataclasses.replace(r, config=r.config.overrides(precision="auto"))
                for r in load_spec("table3").plan(["base", "A1"], "smoke", [0])]
    assert precision.choose_precision(a1)[0] == "bf16-mixed"  # no records yet: this machine's

    folder = tmp_path / "results" / "table3"
    _record(folder, base.run_id, "smoke", "32-true")
    _record(folder, "table3-A2-cpu-seed0", "cpu", "bf16-mixed")     # another scale
    _record(folder, "table3-A3-smoke-seed0", "smoke", "bf16-mixed", asked="bf16-mixed")  # set
    with caplog.at_level("INFO", logger=precision.log.name):
        chosen, how = precision.choose_precision(a1)
    assert chosen == "32-true" and how["chosen"] == "32-true" and how["here"] == "bf16-mixed"
    assert how["records"] == {"32-true": 1}
    assert "as 1 record(s) of table3 at `smoke` trained" in how["how"]
    assert precision.step_ratio(how) == 1.0  # estimates: an fp32 step
    assert any("precision auto -> 32-true" in m and "this machine alone would take bf16-mixed"
               in m for m in caplog.messages)
    # A run's own earlier record (stale, to be redone) does not decide for it.
    assert precision.choose_precision(base)[0] == "bf16-mixed"
    # Records that disagree: the most common precision, with a warning.
    _record(folder, "table3-A4-smoke-seed0", "smoke", "bf16-mixed")
    _record(folder, "table3-A4-smoke-seed1", "smoke", "bf16-mixed")
    with caplog.at_level("WARNING", logger=precision.log.name):
        assert precision.choose_precision(a1)[0] == "bf16-mixed"
    assert any("trained in several precisions (32-true 1, bf16-mixed 2)" in m
               for m in caplog.messages)
    # A run without a table (precision_from None: a config of its own) is not bound by any.
    assert precision.choose_precision(dataclasses.replace(a1, precision_from=None))[0] \
        == "bf16-mixed"


def test_a_gpu_follows_the_precision_of_its_tables_records(tmp_path, monkeypatch):
    # The CUDA answer of `choose` has no "chosen" key: the first sweep on an H200 failed here.
    monkeypatch.setattr(precision, "runs_dir", lambda: tmp_path / "runs")
    monkeypatch.setattr(precision, "results_dir", lambda: tmp_path / "results")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    base, c1 = [dataclasses.replace(r, config=r.config.overrides(precision="auto"))
                for r in load_spec("table3").plan(["base", "C1"], "smoke", [0])]
    _record(tmp_path / "results" / "table3", base.run_id, "smoke", "32-true")
    chosen, how = precision.choose_precision(c1)
    assert chosen == "32-true" and how["here"] == "bf16-mixed"
    assert "this machine alone would take bf16-mixed: CUDA (NVIDIA H200)" in how["how"]


def test_no_step_is_timed_where_a_bf16_matmul_is_slower(config, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "bf16_matmul_not_slower", lambda: False)

    def never(c, t):
        raise AssertionError("timed a bf16 step on a CPU without fast bf16")

    got, how = precision.choose(config, config.train.batch_tokens, tmp_path / "p.json", timer=never)
    assert got == "32-true" and how["seconds_per_step"] is None


def test_a_set_precision_is_taken_as_it_is(config, tmp_path):
    got, how = precision.choose(config.overrides(precision="32-true"), config.train.batch_tokens, None)
    assert got == "32-true" and how == {"asked": "32-true", "how": "set in the config"}


def test_a_real_timing_of_both_precisions(config):
    seconds = step_time.seconds_by_precision(config, 256, rounds=1)
    assert set(seconds) == {"32-true", "bf16-mixed"} and all(s > 0 for s in seconds.values())
