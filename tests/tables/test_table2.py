"""Table 2: the spec's figures, batch accumulation arithmetic, the rendered table and the plan."""

import re
import socket

import pytest

from reproduce.__main__ import main
from reproduce.config import TrainConfig
from reproduce.plan import step_probe as cost
from reproduce.records.sweep import load_spec
from reproduce.tables.table2 import render_table2


def test_spec_reads_scientific_figures_as_numbers():
    spec = load_spec("table2")  # YAML 1.1 would read 3.3e18 as a string
    assert spec.variants["base-en-de"].paper["flops"] == pytest.approx(3.3e18)
    assert all(isinstance(v, float) for row in spec.cited for k, v in row.items()
               if k.startswith("flops"))
    big_fr = spec.resolve("big-en-fr", "paper")
    assert big_fr.model.p_drop == 0.1 and big_fr.train.average_last == 20
    assert spec.resolve("big-en-de", "paper").model.p_drop == 0.3


@pytest.mark.parametrize("batch, limit, devices, expected", [
    (25000, 12500, 1, (2, 12500)),   # one GPU: two micro-batches per step
    (25000, 12500, 8, (1, 3125)),    # the paper's 8 GPUs: no accumulation
    (25000, 0, 2, (1, 12500)),       # no per-device limit: the whole share at once
    (25000, 4000, 1, (7, 3572)),     # the share is split into equal micro-batches
    (4096, 4096, 3, (1, 1366)),
])
def test_accumulation_reaches_the_papers_batch(batch, limit, devices, expected):
    accumulate, micro = TrainConfig(batch_tokens=batch, device_batch_tokens=limit).split_batch(devices)
    assert (accumulate, micro) == expected
    assert devices * accumulate * micro >= batch           # never smaller than asked
    assert devices * accumulate * (micro - 1) < batch      # and not a micro-batch more
    assert not limit or micro <= limit


def _record(variant, tokenized, sacre, flops, counted, seed=0):
    sig = {"sacrebleu": {"signature": "nrefs:1|tok:13a"},
           "tokenized": {"signature": "tok:moses|compound:##AT##-##AT##"}}
    return {"run_id": f"table2-{variant}-smoke-seed{seed}", "table": "table2", "variant": variant,
            "scale": "smoke", "seed": seed, "data": {"corpus": "bible-en-de"},
            "metrics": {"test_bleu": sacre, "test_bleu_tokenized": tokenized, "train_seconds": 36.0},
            "bleu": {"test": sig},
            "cost": {"paper_method_flops": flops, "analytic_flops": counted, "devices": 1,
                     "tflops_per_device": 0.18, "tflops_source": "measured"},
            "batch": {"effective_tokens_per_step": 1024, "accumulate": 2},
            "averaged_checkpoints": ["a", "b", "c"], "hardware": {"cpu": "test CPU", "gpus": []}}


def test_table2_shows_both_bleus_and_both_costs_labelled():
    spec = load_spec("table2")
    chrf = _record("big-en-fr", 2.5, 2.0, 7.5e13, 3.5e12)
    chrf["metrics"]["test_chrf"] = 21.5  # recorded by a run since chrF was
    table = render_table2(spec, [_record("base-en-de", 4.25, 3.75, 6.5e12, 1.25e12), chrf])
    ours = [line for line in table.splitlines() if ", ours," in line]
    assert ours == ["| Transformer (base), ours, scale `smoke` on bible, not WMT | 4.25 |  | 6.5e+12 |  |",
                    "| Transformer (big), ours, scale `smoke` on bible, not WMT |  | 2.50 |  | 7.5e+13 |"]
    assert "| ConvS2S | 25.16 | 40.46 | 9.6e+18 | 1.5e+20 |" in table
    # no chrF recorded and no outputs kept to rescore: an empty cell
    assert "| base-en-de (seed 0) | 4.25 | 3.75 |  | 6.5e+12 | 1.2e+12 | 0.01 h |" in table
    assert "| big-en-fr (seed 0) | 2.50 | 2.00 | 21.50 | 7.5e+13 |" in table
    assert "2048" not in table and "1024 (2 accumulated)" in table
    assert "`nrefs:1|tok:13a`" in table and "compound" in table


def test_a_record_without_chrf_is_rescored_from_its_kept_outputs(tmp_path, monkeypatch):
    """chrF for a record made before it was recorded: sacreBLEU's chrF of its kept test
    hypotheses and references, marked as rescored."""
    import sacrebleu

    from reproduce.records.store import write_outputs

    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path))
    hyps, refs = ["Und Gott sprach", "Es ward Licht"], ["Und Gott sagte", "Es wurde Licht"]
    record = _record("base-en-de", 4.25, 3.75, 6.5e12, 1.25e12)
    record["bleu"]["test"]["outputs"] = write_outputs(tmp_path / "table2", record["run_id"],
                                                      "test", hyps, refs)
    table = render_table2(load_spec("table2"), [record])
    expected = f"{sacrebleu.corpus_chrf(hyps, [refs]).score:.2f}*"
    assert f"| base-en-de (seed 0) | 4.25 | 3.75 | {expected} |" in table
    assert "* rescored here from the record's kept hypotheses" in table


def test_table2_says_which_steps_were_averaged_and_what_averaging_bought():
    averaged = {**_record("base-en-de", 4.0, 3.0, 6e12, 1e12),
                "averaged_checkpoints": [f"step{s}.ckpt" for s in (30, 24, 27)],
                "metrics": {"test_bleu": 3.0, "test_bleu_tokenized": 4.0, "train_seconds": 36.0,
                            "train_steps": 30, "dev_ppl": 41.5},
                "curve": {"dev_ppl": [[20, 1.0, 60.0], [30, 2.0, 43.25]]}}
    table = render_table2(load_spec("table2"), [averaged, _record("base-en-fr", 9.0, 8.0, 7e12, 1e12)])
    assert "| 3 (steps 24-30) | 43.25 -> 41.50 |" in table
    assert "| 3 | – |" in table  # names that are not steps, no curve: nothing made up


def test_table2_summarises_seeds_and_says_what_has_not_run():
    table = render_table2(load_spec("table2"), [
        _record("base-en-de", 4.0, 3.0, 6e12, 1e12, seed=0),
        _record("base-en-de", 5.0, 4.0, 8e12, 1e12, seed=1),
        _record("base-en-fr", 9.0, 8.0, 7e12, 1e12)])
    assert ("| Transformer (base), ours, scale `smoke` on bible, not WMT | 4.50 ± 0.71 (n=2) | "
            "9.00 | 7.0e+12 | 7.0e+12 |") in table
    assert "Transformer (big), ours" not in table
    assert "Not run at this scale yet: big-en-de, big-en-fr (" in table
    assert "Cost: 0.0 worker-hours of training for 3 runs on test CPU" in table


def test_paper_dry_run_prints_the_plan_without_network_or_training(tmp_path, monkeypatch, capsys):
    # its CPU probe is cached in the runs folder: this test's, not the checkout's runs/, where a
    # probe timed beside the suite would price a user's later plans
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))

    def no_network(*args, **kwargs):
        raise AssertionError("the dry run touched the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(cost, "measure_step_seconds", lambda config, tokens, **kw: 0.01 * tokens / 512)
    assert main(["table2", "--scale", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan = [line for line in out.splitlines() if "tokens/step" in line]
    assert len(plan) == 4
    assert sum("100000 steps x 25000 tokens/step" in line for line in plan) == 2
    assert sum("300000 steps x 25000 tokens/step" in line for line in plan) == 2
    assert "corpus=wmt14-en-de" in out and "corpus=wmt14-en-fr" in out
    assert "p_drop=0.1" in out and "p_drop=0.3" in out  # base and big
    # one run after another: the wall clock is the sum of the runs' hours (not of device-hours)
    hours = [float(m[1]) for line in plan if (m := re.search(r"-> ([\d.]+) h,", line))]
    total = re.search(r"about ([\d.]+) h of wall clock", out)
    assert len(hours) == 4 and float(total[1]) == pytest.approx(sum(hours), rel=0.01)
    # disk: big keeps 20 step files of weights alone (a third of a full checkpoint with Adam's
    # two moments) and one full last.ckpt; the largest need is stated with the free space
    disk = re.search(r"disk: table2-big-en-(de|fr)-paper-seed0's checkpoints need up to ([\d.]+) GB"
                     r" on disk \(20 step file\(s\) of ([\d.]+) MB, weights only; last.ckpt of "
                     r"([\d.]+) GB\); .* has .* free", out)
    assert disk, out
    peak, step, full = float(disk[2]), float(disk[3]) / 1000, float(disk[4])
    assert step * 3 == pytest.approx(full, rel=0.01) and peak == pytest.approx(21 * step + 3 * full, rel=0.01)


def test_the_measured_step_extrapolates_along_the_measured_line(monkeypatch):
    """cost.step_seconds (how --workers balances runs between workers)."""
    # 0.5 s fixed per step (launches, optimizer) + 1 ms per token: the paper's base at 12500
    # tokens per micro-batch and 2 micro-batches per step costs 2 x (0.5 + 12.5) = 26 s, where a
    # ratio from one 256-token probe would say 2 x 0.756 x 12500 / 256 = 73.8 s; in one pass
    # (auto, on a CPU) 0.5 + 25 s.
    monkeypatch.setattr(cost, "measure_step_seconds", lambda config, tokens, **kw: 0.5 + tokens / 1000)
    run = load_spec("table2").plan(["base-en-de"], "paper", [0])[0]
    assert cost.step_seconds(run.config) == pytest.approx(25.5)
    two = run.config.overrides(device_batch_tokens=12500)
    assert cost.step_seconds(two) == pytest.approx(26.0)


def test_the_figure_sets_our_bleu_against_cost_beside_every_cited_system(tmp_path):
    from reproduce.tables.figures import _paper_points, plot_table

    spec = load_spec("table2")
    recs = [{**_record("base-en-de", 4.0, 3.0, 6e12, 1e12, seed=s), "metrics": {
        "test_bleu": 3.0, "test_bleu_tokenized": 4.0 + s, "train_seconds": 36.0, "dev_bleu": 3.0,
        "params": 1000}, "curve": {"dev_ppl": [[10, 1.0, 300.0], [20, 2.0, 200.0]]}}
            for s in (0, 1)]
    [path] = plot_table(spec, recs, tmp_path)
    assert path.name == "table2-smoke.png" and path.stat().st_size > 10_000
    points = _paper_points(spec)
    assert ("Transformer (big)", "en_fr", 2.3e19, 41.8) in points
    assert len(points) == sum(bool(r.get(f"bleu_{lang}") and r.get(f"flops_{lang}"))
                              for r in spec.cited for lang in ("en_de", "en_fr"))
