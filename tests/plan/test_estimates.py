"""The cost model behind --dry-run and status: counted work, calibrated by finished records."""

import dataclasses
import json
from pathlib import Path

import pytest

from reproduce.plan import estimates
from reproduce.records.sweep import load_spec
from reproduce.util.machine import cpu_name

ROOT = Path(__file__).resolve().parents[2]


def _runs(table, variants, scale="paper"):
    return {r.variant: r for r in load_spec(table).plan(variants, scale, [0])}


def _record(run, seconds_per_step, threads=1, cpu=None):
    return {"run_id": run.run_id, "config": run.config.to_dict(), "scale": run.scale,
            "metrics": {"train_steps": 100, "train_seconds": 100 * seconds_per_step},
            "hardware": {"cpu": cpu or cpu_name(), "gpus": [], "torch_threads": threads},
            "batch": {"world_size": 1}}


def test_calibration_recovers_the_cost_of_flops_and_of_heads():
    """Synthetic records made by a known model: the fit finds it, and predicts a variant it never
    saw (more heads) from its counted work."""
    runs = _runs("table3", ["base", "A1", "A2", "A3", "A4", "B1", "C6"], "cpu")
    truth = estimates.CpuModel(a=2.0, b=3e5, fitted_on=0)
    rate = {1: 50.0, 2: 77.0}

    def seconds(run, threads=1):
        flops, blocks = estimates.step_work(run.config)
        return truth.seconds(flops, blocks, rate[threads])

    seen = [r for k, r in runs.items() if k != "A4"]
    records = [_record(r, seconds(r)) for r in seen] + [_record(runs["base"], seconds(runs["base"], 2),
                                                                threads=2)]
    records.append(_record(runs["A1"], 99.0, cpu="another CPU"))  # not this CPU's: ignored
    model = estimates.fit_cpu(records, rate.get)
    assert model.fitted_on == len(seen) + 1
    assert (model.a, model.b) == (pytest.approx(2.0, rel=1e-6), pytest.approx(3e5, rel=1e-6))
    flops, blocks = estimates.step_work(runs["A4"].config)
    assert model.seconds(flops, blocks, rate[1]) == pytest.approx(seconds(runs["A4"]), rel=1e-6)
    checked = estimates.check_against_records(list(runs.values()), {r["run_id"]: r for r in
                                                                    records[:len(seen)]},
                                              lambda run: model, rate.get)
    assert len(checked) == len(seen)
    assert "median error 0%" in estimates.error_line(checked)


def test_without_records_the_default_is_stated_as_a_guess():
    model = estimates.fit_cpu([], lambda k: 50.0)
    assert model.fitted_on == 0 and "GUESS" in model.source


def test_the_worker_layout_sets_the_threads_a_run_is_estimated_at(tmp_path, monkeypatch):
    monkeypatch.setattr(estimates, "probe", lambda threads, cache=None: 40.0)
    run = _runs("table3", ["base"], "cpu")["base"]
    model = estimates.CpuModel(2.0, 3e5, 5)
    alone = estimates.estimate(run, estimates.Target("cpu"), model, estimates.rate_at(2))
    shared = estimates.estimate(run, estimates.Target("cpu"), model, estimates.rate_at(1))
    # one of two 1-thread workers: slower per run than one 2-thread process, by 2 ** 0.62
    assert shared.hours / alone.hours == pytest.approx(2 ** estimates.THREAD_EXPONENT)
    assert dataclasses.replace(alone, steps=0).hours == 0


def test_a_tables_plan_is_fitted_to_this_cpus_records_of_every_table(tmp_path, monkeypatch,
                                                                      capsys):
    # Table 2's base is Table 3's base on other sentences: Table 3's records of this CPU price it.
    from reproduce.__main__ import main

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(estimates, "probe", lambda threads, cache=None: 40.0)
    (tmp_path / "results" / "table3").mkdir(parents=True)
    for run, seconds in zip(_runs("table3", ["base", "A4"], "cpu").values(), (1.0, 1.5),
                            strict=True):
        record = {"run_id": run.run_id, "config": run.config.to_dict(), "scale": "cpu",
                  "hardware": {"cpu": cpu_name(), "torch_threads": 1},
                  "metrics": {"train_steps": 100, "train_seconds": 100 * seconds}}
        (tmp_path / "results" / "table3" / f"{run.run_id}.json").write_text(json.dumps(record))
    assert main(["table2", "--variant", "base-en-de", "--scale", "cpu", "--workers", "1",
                 "--dry-run"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "tokens/step" in x)
    assert "fitted to 2 record(s) of this CPU" in line and "GUESS" not in line


def test_smoke_records_never_price_a_cpu_run(tmp_path, monkeypatch):
    """After the smoke check docs/first-steps.md asks for, a folder's smoke records (a smoke step
    is mostly evaluation and saves: 30 steps in 3.4 s here, 2026-12-02) priced row A at `cpu` at
    5.6 s a step from one fit over every record. Each scale is fitted to its own: beside our
    committed one-thread records of row A at `cpu`, every run's price is within 2x of the hours
    its records took; alone, the smoke records leave `cpu` to the stated guess, which is within
    2x too at this EPYC's probe (96-102 GFLOP/s at one thread), and the smoke plan says its fit
    is far from the probe."""
    monkeypatch.setattr(estimates, "probe", lambda threads, cache=None: 100.0)
    cpu = _runs("table3", ["base", "A1", "A2", "A3", "A4"], "cpu")
    took: dict[str, list[float]] = {}
    ours = []
    for path in sorted((ROOT / "results" / "table3").glob("table3-*-cpu-seed*.json")):
        record = json.loads(path.read_text())
        if record["variant"] in cpu and record["hardware"]["torch_threads"] == 1:
            record["hardware"]["cpu"] = cpu_name()  # the records' EPYC, whatever runs the test
            ours.append(record)
            took.setdefault(record["variant"], []).append(
                record["metrics"]["train_seconds"] / record["metrics"]["train_steps"] * 2500 / 3600)
    assert len(took) == 5 and len(ours) >= 10
    smoke = [_record(run, 3.4 / 30) for run in _runs("table3", list(cpu), "smoke").values()]
    for records, fitted in ((ours + smoke, len(ours)), (smoke, 0)):
        plan = estimates.plan_here(records, list(cpu.values()), tmp_path)
        assert plan.models["cpu"].fitted_on == fitted
        for variant, run in cpu.items():
            hours = plan.estimate(run, 1, 2500).hours
            real = sum(took[variant]) / len(took[variant])
            assert real / 2 <= hours <= 2 * real, (variant, fitted, hours, real)
    smoke_plan = estimates.plan_here(smoke, list(_runs("table3", ["base"], "smoke").values()),
                                     tmp_path)
    [warning] = smoke_plan.warnings(_runs("table3", ["base"], "smoke").values())
    assert warning.startswith("WARNING: at `smoke` the 5 record(s) fitted price")


def test_bf16_runs_are_priced_as_fp32_steps_times_their_timed_ratio(tmp_path, monkeypatch):
    """The fit holds fp32 steps only; a bf16-mixed record is checked, and a bf16-mixed plan
    priced, at the ratio its timing measured (the `cpu-wide` probe: 0.98 s against 2.07 s)."""
    from reproduce.train import precision

    runs = _runs("table3", ["base", "A1", "A2", "A4"], "cpu")
    truth = estimates.CpuModel(a=2.0, b=3e5, fitted_on=0)

    def seconds(run):
        return truth.seconds(*estimates.step_work(run.config), 50.0)

    timing = {"chosen": "bf16-mixed", "seconds_per_step": {"32-true": 2.07, "bf16-mixed": 0.98}}
    fp32 = [_record(runs[k], seconds(runs[k])) for k in ("base", "A1", "A2")]
    bf16 = {**_record(runs["A4"], seconds(runs["A4"]) * 0.98 / 2.07), "precision": "bf16-mixed",
            "precision_choice": timing}
    model = estimates.fit_cpu([*fp32, bf16], lambda k: 50.0)
    assert model.fitted_on == 3  # the bf16 record is not an fp32 step
    checked = estimates.check_against_records([runs["A4"]], {runs["A4"].run_id: bf16},
                                              lambda run: model,
                                              lambda k: 50.0)
    assert checked[0][1] == pytest.approx(checked[0][2], rel=1e-6)
    # A plan: the ratio cached for the table's base at the run's thread count, else 1.
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path))
    assert estimates.cpu_step_ratio(runs["A4"], 1) == 1.0
    monkeypatch.setattr(precision, "_read", lambda cache: {
        precision._key(runs["A4"].precision_from, 2048, 1): timing})
    assert estimates.cpu_step_ratio(runs["A4"], 1) == pytest.approx(0.98 / 2.07)
    assert estimates.cpu_step_ratio(runs["A4"], 2) == 1.0  # timed at one thread only
    e = estimates.estimate(runs["A4"], estimates.Target("cpu"), model, 50.0,
                           ratio=estimates.cpu_step_ratio(runs["A4"], 1))
    assert e.seconds_per_step == pytest.approx(seconds(runs["A4"]) * 0.98 / 2.07, rel=1e-6)
    assert "bf16-mixed at 0.47x an fp32 step, as timed" in e.source


def test_steps_timed_here_set_the_level_and_the_records_the_shape(tmp_path):
    """Records made under slower code (or beside other jobs) price every run too high; the fp32
    step ``precision.choose`` timed on this machine for the table's base rescales the fit, and
    the fit still prices a variant against base by its counted work."""
    from reproduce.train import precision

    runs = _runs("table3", ["base", "A1", "A2", "A4"], "cpu")
    truth = estimates.CpuModel(a=2.0, b=3e5, fitted_on=0)

    def seconds(run):
        return truth.seconds(*estimates.step_work(run.config), 50.0)

    slow = [_record(runs[k], 2 * seconds(runs[k])) for k in ("base", "A1", "A2")]
    model = estimates.fit_cpu(slow, lambda k: 50.0)
    cache = tmp_path / "precision.json"
    rate = {1: 50.0, 2: 77.0}.get
    assert estimates.level_from_timings(model, runs.values(), rate, [1, 2], cache) == model  # none
    timing = {"chosen": "32-true", "seconds_per_step": {"32-true": seconds(runs["base"]),
                                                        "bf16-mixed": 1.5 * seconds(runs["base"])}}
    key = precision._key(runs["A4"].precision_from, 2048, 1)
    cache.write_text(json.dumps({key: timing}))
    level = estimates.level_from_timings(model, runs.values(), rate, [1, 2], cache)
    assert level.level == pytest.approx(0.5) and level.timed_on == 1  # one model timed, not four
    assert "x0.50 to match 1 fp32 step time(s) measured here" in level.source
    e = estimates.estimate(runs["A4"], estimates.Target("cpu"), level, 50.0)
    assert e.seconds_per_step == pytest.approx(seconds(runs["A4"]), rel=1e-6)
    # timed at one thread, it sets the level of a plan at two too (each against its own probe)
    e2 = estimates.estimate(runs["A4"], estimates.Target("cpu"), level, 77.0)
    assert e2.seconds_per_step == pytest.approx(seconds(runs["A4"]) * 50 / 77, rel=1e-6)


def test_the_cpus_matmul_peak_is_measured_once_per_thread_count_in_a_process(monkeypatch):
    """A record's cost prices its hours at this CPU's fp32 matmul peak: the runs a sweep trains
    in one process share one measurement at each thread count, a new count measures again."""
    import torch

    from reproduce.util import machine

    timed: list[int] = []

    def seconds(dtype, n, budget, most):
        timed.append(torch.get_num_threads())
        return [0.01 * torch.get_num_threads()] * most

    monkeypatch.setattr(machine, "matmul_seconds", seconds)
    machine._measured_tflops.cache_clear()
    try:
        monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
        one = machine.measured_tflops()
        assert machine.measured_tflops() == one == round(2 * 1024 ** 3 / 0.01 / 1e12, 4)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
        assert machine.measured_tflops() == pytest.approx(one / 2, abs=1e-4)
        assert timed == [1, 2]
    finally:
        machine._measured_tflops.cache_clear()  # later tests measure for real, pass or fail
