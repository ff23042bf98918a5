"""GPU plans (``plan.gpu_prices``): every figure from a GPU measurement, phase by phase, and a GPU
never measured priced from the one that was, never faster than its peak and bandwidth allow."""

import json
import shutil

import pytest

from reproduce import paths
from reproduce.__main__ import main
from reproduce.errors import ConfigError
from reproduce.paper.flops import BF16_DENSE_TFLOPS, MEMORY_TBS, SUSTAINED_TFLOPS, lookup
from reproduce.plan import gpu_prices
from reproduce.records.sweep import load_spec

COMMITTED = paths.REPO / "results"
# The H200 measurement of 2026-11-27 (results/gpu.json, results/paper-run.json), kept here so that
# a later GPU window, which replaces results/, leaves what these tests assert standing.
H200 = paths.REPO / "tests" / "golden" / "gpu"


@pytest.fixture(autouse=True)
def _the_h200(monkeypatch):
    monkeypatch.setenv("REPRODUCE_RESULTS", str(H200))


def _record() -> dict:
    return json.loads((H200 / gpu_prices.CLI_RUN).read_text())


def test_the_plan_of_the_measured_cli_run_is_within_15_percent_of_what_it_took():
    """The run in results/paper-run.json (whichever GPU measured it last), planned for its own
    config, steps and corpus on its GPU: its training and the whole command within 15 % (they are
    what the plan is made from, so a larger gap is a fault in how the phases are read or added
    up)."""
    checked = gpu_prices.check(json.loads((COMMITTED / gpu_prices.CLI_RUN).read_text()),
                               COMMITTED)
    for phase in ("training", "the command"):
        planned, took = checked[phase]
        assert abs(planned - took) <= 0.15 * took, (phase, planned, took)
    assert set(checked) >= {"data", "averaging", "perplexity", "beam search", "start-up"}


def _curve_record(accumulate: int, every: int, save: float, evaluation: float, first: float,
                  quiet: float = 0.1, steps: int = 300, **train) -> dict:
    """A record whose curve known costs made, logged as TrainClock logs it: a point every
    ``every`` steps after the step (at step 0 after the first micro-batch), then that step's
    save (every 50) and dev evaluation (every 100)."""
    config = load_spec("table3").resolve("base", "smoke").to_dict()
    config["train"].update(train_steps=steps, ckpt_every_steps=50, ckpt_every_minutes=0,
                           val_every_steps=100, **train)
    clock, curve = first, []
    if accumulate > 1:
        curve.append([0, round(clock + quiet / accumulate, 4), 5.0])
    for s in range(1, steps + 1):
        clock += quiet
        if s % every == 0:
            curve.append([s, round(clock, 4), 5.0])
        clock += (save if s % config["train"]["ckpt_every_steps"] == 0 else 0) + (
            evaluation if s % config["train"]["val_every_steps"] == 0 else 0)
    return {"config": config, "batch": {"accumulate": accumulate},
            "curve": {"train_loss": curve}, "metrics": {"train_seconds": clock}}


@pytest.mark.parametrize("accumulate, every", [(2, 15), (1, 15), (1, 50)])
def test_saves_and_evaluations_are_read_from_the_curve(accumulate, every):
    """Curves made by known costs (a quiet step, a save every 50 steps, a dev evaluation every
    100, an extra first step), with and without a point at step 0: the fit finds each; a curve
    with a save in every interval is refused."""
    r = _curve_record(accumulate, every, save=2.0, evaluation=0.5, first=0.7)
    if every == 50:  # a save in every interval: nothing tells the step from the saves
        with pytest.raises(ValueError, match="quiet step cannot be told"):
            gpu_prices.fit_curve(r)
    else:
        assert gpu_prices.fit_curve(r) == pytest.approx((0.1, 0.7, 2.0, 0.5), abs=1e-3)


def test_a_cli_run_that_cannot_price_plans_is_one_line(tmp_path):
    """Profiled, compiled, several devices, resumed: the record's step is not the eager step of
    one device in one sitting, so it prices nothing, and says why."""
    shutil.copy(H200 / gpu_prices.BENCH, tmp_path)
    for change, why in ((("profiled", True), "cProfile"), (("compile", True), "compiled"),
                        (("resumed", True), "resumed")):
        (tmp_path / gpu_prices.CLI_RUN).write_text(json.dumps(dict([*_record().items(), change])))
        with pytest.raises(ConfigError, match=f"paper-run.json: cannot price GPU runs from it: .*"
                                              f"{why}"):
            gpu_prices.Measured.load(tmp_path)
    broken = {**_record(), "curve": {"train_loss": []}}
    (tmp_path / gpu_prices.CLI_RUN).write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match="cannot price GPU runs from them"):
        gpu_prices.Measured.load(tmp_path)


def _plans(gpu: str, variants=("base", "big", "A1", "B1", "C1", "C3")):
    runs = load_spec("table3").plan(list(variants), "paper", [0])
    target = gpu_prices.parse_on(gpu)
    return {r.variant: gpu_prices.price(r.config, target, 1000, pairs=0) for r in runs}


def test_a_gpu_never_measured_is_never_priced_faster_than_a_measured_one_it_does_not_beat():
    """The H100 has the H200's dense peak and less bandwidth: no run is cheaper on it. The same
    for every GPU in the tables with no more peak and no more bandwidth than the measured one."""
    measured = gpu_prices.Measured.load()
    assert measured is not None and "H200" in measured.gpu
    on_h200 = _plans("H200")
    on_h100 = _plans("H100")
    for variant, e in on_h100.items():
        assert e.seconds_per_step >= on_h200[variant].seconds_per_step, variant
        assert e.command_hours >= on_h200[variant].command_hours, variant
    h100 = gpu_prices.parse_on("H100").gpu
    assert not h100.is_measured and h100.factor == pytest.approx(4.8 / 3.35)
    assert h100.source.startswith("SCALED from NVIDIA H200, not measured") and "x1.43" in \
        h100.source
    peak, bandwidth = BF16_DENSE_TFLOPS["H200"], MEMORY_TBS["H200"]
    for name in BF16_DENSE_TFLOPS:
        if BF16_DENSE_TFLOPS[name] <= peak and MEMORY_TBS[name] <= bandwidth:
            e = _plans(name, ("big",))["big"]
            assert e.seconds_per_step >= on_h200["big"].seconds_per_step, name


def test_no_gpu_is_priced_above_its_own_peak():
    """The GPU part of big's step (its counted FLOPs over the scaled rate) never beats the GPU's
    own peak: bf16's, or fp32's on a GPU without bf16 tensor cores (a P100 priced from a bf16
    H200 step once ran 3.7x its peak)."""
    for name in sorted(set(BF16_DENSE_TFLOPS) | set(SUSTAINED_TFLOPS)):
        g = gpu_prices.parse_on(name).gpu
        peak = lookup(name, BF16_DENSE_TFLOPS) or lookup(name, SUSTAINED_TFLOPS)
        assert g.measured.device_tflops / g.factor <= peak, name
    p100 = gpu_prices.parse_on("P100").gpu
    assert "bf16 peak over its fp32 peak" in p100.source


def test_the_step_is_the_longer_of_the_host_and_the_gpu():
    """Base on the H200 is the host's step (as bench --gpu measured it, 8 % MFU); big the GPU's.
    Two micro-batches cost the host twice one; a shallower model less."""
    m = gpu_prices.Measured.load()
    spec = load_spec("table3")
    base, big, c1 = (spec.resolve(v, "paper") for v in ("base", "big", "C1"))
    step, host, device = m.step(base, 1)
    assert host > device and step == pytest.approx(host * m.cli_factor)
    step, host, device = m.step(big, 1)
    assert device > host and step == pytest.approx(device * m.cli_factor)
    assert m.step(c1, 1)[1] < m.step(base, 1)[1]  # N = 2: fewer layers to issue
    two = base.overrides(device_batch_tokens=12500)  # paper's auto takes one pass where it fits
    assert m.step(base, 1)[1] == pytest.approx(m.step(two, 1)[1] / 2)


def test_a_micro_batch_too_large_for_the_gpu_is_said_with_what_fits():
    """Base's micro-batch of 200,000 tokens fitted on the H200 (bench --gpu's search): the plan
    agrees, and says an A100 of 40 GB cannot hold it, with a size that fits."""
    (run,) = load_spec("table2").plan(["base-en-de"], "paper", [0])
    config = run.config.overrides(device_batch_tokens=200000, batch_tokens=200000)
    bench = json.loads((H200 / gpu_prices.BENCH).read_text())
    assert bench["parts"]["base, largest micro-batch"]["largest_fitting_tokens"] == 200000
    h200 = gpu_prices.price(config, gpu_prices.parse_on("H200"), 10, pairs=0)
    assert "DOES NOT FIT" not in h200.source
    a100 = gpu_prices.price(config, gpu_prices.parse_on("A100"), 10, pairs=0)
    assert "DOES NOT FIT: a micro-batch of 200000 tokens needs" in a100.source
    fits = int(a100.source.split("train.device_batch_tokens=")[1].split()[0])
    assert 0 < fits < 200000
    smaller = config.overrides(device_batch_tokens=fits, batch_tokens=fits)
    assert "DOES NOT FIT" not in gpu_prices.price(smaller, gpu_prices.parse_on("A100"), 10,
                                                  pairs=0).source


def test_a_new_measurement_prices_the_plan_without_a_code_change(tmp_path, monkeypatch):
    """A results folder whose gpu.json and paper-run.json come from an H100: --on H100 is
    measured there and the H200 is scaled from it; a folder with neither is priced from the
    project's."""
    bench = json.loads((H200 / gpu_prices.BENCH).read_text())
    run = _record()
    bench["gpu"] = "NVIDIA H100 80GB HBM3"
    run["hardware"]["gpus"] = [bench["gpu"]]
    bench["parts"]["base"]["seconds_per_step"] *= 2  # a slower host
    (tmp_path / gpu_prices.BENCH).write_text(json.dumps(bench))
    (tmp_path / gpu_prices.CLI_RUN).write_text(json.dumps(run))
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path))
    h100 = gpu_prices.parse_on("H100").gpu
    assert h100.is_measured and "NVIDIA H100 80GB HBM3" in h100.source
    h200 = gpu_prices.parse_on("H200").gpu
    assert h200.source.startswith("SCALED from NVIDIA H100 80GB HBM3") and h200.factor == 1.0
    assert h100.measured.host_s == pytest.approx(2 * gpu_prices.Measured.load(H200).host_s)
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "elsewhere"))
    committed = json.loads((COMMITTED / gpu_prices.BENCH).read_text())["gpu"]
    assert committed in gpu_prices.parse_on("H200").gpu.source  # the project's, whichever
    shutil.rmtree(tmp_path)
    with pytest.raises(ConfigError, match="no GPU measured to price it from"):
        gpu_prices.gpu("H100", tmp_path)


def test_unknown_hardware_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"--on '8xZ9000': unknown device 'Z9000'; known: .*H100"):
        gpu_prices.parse_on("8xZ9000")
    assert gpu_prices.parse_on(None).kind == "cpu"
    assert gpu_prices.parse_on("A100").devices == 1


def test_counts_follow_the_config():
    """No dev evaluation during training without val_every_steps (fit validates none; the end's
    pass is priced as perplexity); saves every tenth of the run without a save setting, as fit
    saves; several GPUs say what one GPU's measurement leaves out."""
    (run,) = load_spec("table2").plan(["base-en-de"], "paper", [0])
    config = run.config.overrides(ckpt_every_minutes=0, ckpt_every_steps=0, val_every_steps=0,
                                  train_steps=1000)
    e = gpu_prices.price(config, gpu_prices.parse_on("H200"), 1000, pairs=0)
    assert "10 save(s)" in e.source and "0 dev evaluation(s)" in e.source
    eight = gpu_prices.price(config, gpu_prices.parse_on("8xH200"), 1000, pairs=0)
    assert "8 GPUs' gradient all-reduce not priced" in eight.source


def test_a_gpu_named_without_a_scale_plans_the_papers_and_says_so(capsys):
    assert main(["table2", "--variant", "base-en-de", "--dry-run", "--on", "8xH100"]) == 0
    out = capsys.readouterr().out
    assert "at scale `paper` (default for --on 8xH100; --scale to change)" in out
    assert "table2-base-en-de-paper-seed0: 100000 steps" in out
    assert main(["table2", "--variant", "base-en-de", "--dry-run", "--on", "cpu"]) == 0
    assert "(default for this machine; --scale to change)" in capsys.readouterr().out


def test_the_dry_run_on_a_gpu_names_its_source_and_every_phase(capsys):
    assert main(["table2", "--variant", "base-en-de", "--scale", "paper", "--dry-run", "--on",
                 "H100"]) == 0
    out = capsys.readouterr().out
    assert "SCALED from NVIDIA H200, not measured" in out and "x1.43" in out
    assert "GUESS" not in out
    line = next(x for x in out.splitlines() if "around training:" in x)
    for phase in ("start-up", "compile", "averaging", "beam search", "the command"):
        assert phase in line


def test_the_committed_plan_check_is_what_the_records_give_now():
    """results/plan-check.md (docs/planning.md quotes it) regenerated from the committed records
    and the pricing as it is: a change to either without a rerun of the script fails here."""
    import sys

    sys.path.insert(0, str(paths.REPO / "benchmarks"))
    try:
        from plan_check import report
    finally:
        sys.path.remove(str(paths.REPO / "benchmarks"))
    assert report(COMMITTED) == (COMMITTED / "plan-check.md").read_text(), \
        "rerun python benchmarks/plan_check.py"


def test_without_a_measurement_a_slurm_run_keeps_its_scales_limit(tmp_path, monkeypatch):
    """An installed package has no results/ to price --on from: a run's time limit is its scale's
    default, said so, not an error."""
    from reproduce.launch import slurm as launch

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path))
    monkeypatch.setattr(gpu_prices, "REPO", None)  # not a checkout
    launch.gpu_target.cache_clear()
    try:
        (run,) = load_spec("table3").plan(["base"], "paper", [0])
        cluster = launch.Cluster(gpus_per_node=8, on="H100")
        minutes, why = launch.time_limit(run, cluster, launch.resources(run, cluster))
        assert why == "the scale's default (no GPU measured to price --on from)"
        assert minutes == launch.RESOURCES["paper"]["timeout_min"]
    finally:
        launch.gpu_target.cache_clear()
