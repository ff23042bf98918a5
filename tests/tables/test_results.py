"""Records in, tables out: atomic writes, round trips and rendering."""

import json
from pathlib import Path

import pytest

from reproduce.records.store import load_records, write_record
from reproduce.records.sweep import load_spec
from reproduce.tables.table3 import render_table3


def record(variant, scale="smoke", seed=0, ppl=9.5, bleu=1.5, params=123456):
    return {"run_id": f"table3-{variant}-{scale}-seed{seed}", "table": "table3", "variant": variant,
            "scale": scale, "seed": seed, "data": {"corpus": "bible-en-de"},
            "metrics": {"dev_ppl": ppl, "dev_bleu": bleu, "test_bleu": bleu + 1, "params": params,
                        "train_seconds": 60.0},
            "config": {"model": {"d_model": 32, "d_ff": 128, "h": 8, "d_k": 4, "d_v": 4}},
            "bleu": {"dev": {"sacrebleu": {"signature": "nrefs:1|tok:13a"}}},
            "hardware": {"cpu": "test CPU", "gpus": []}}


def test_record_round_trip_is_atomic(tmp_path):
    r = record("A1")
    path = tmp_path / "table3" / "x.json"
    write_record(path, r)
    assert load_records("table3", tmp_path) == [r]
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp file left behind
    write_record(path, {**r, "seed": 1})
    assert json.loads(path.read_text())["seed"] == 1


def _row(table: str, variant: str) -> list[str]:
    """The main table's cells of ``variant`` (its first cell is the name, after a row label)."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 10 and cells[0].split(" ")[-1] == variant:
            return cells
    raise AssertionError(f"no row {variant}")


def test_every_committed_record_loads_as_the_typed_record():
    from reproduce import paths
    from reproduce.records.schema import Record, problems
    from reproduce.records.store import read_record

    found = sorted(paths.REPO.glob("results/table*/*.json"))
    assert len(found) >= 90
    keys = set(Record.__annotations__) | {"run_id", "config", "metrics"}
    for path in found:
        r = read_record(path)  # a DamagedRecord if it broke the schema
        assert not problems(r), path
        assert set(r) <= keys, f"{path}: keys the schema does not declare: {set(r) - keys}"


def test_no_committed_record_holds_an_absolute_path():
    from reproduce import paths

    def strings(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    for path in paths.REPO.glob("results/**/*.json"):
        # A benchmark's record beside the tables (results/paper-run.json) names the corpus its
        # seeded generator wrote under /tmp, where `verify` needs it again; no other path.
        scratch = path.parent == paths.REPO / "results"
        absolute = [s for s in strings(json.loads(path.read_text())) if s.startswith("/")
                    and not (scratch and s.startswith("/tmp/"))]
        assert not absolute, f"{path}: {absolute[:2]}"


def test_migrate_makes_a_wandb_folder_relative_to_the_runs_root(tmp_path):
    from reproduce.records.store import migrate, read_record

    r = {**record("A1"), "wandb": {"dir": "/elsewhere/runs/table3/x/wandb/files", "id": "x"}}
    write_record(tmp_path / "table3" / "x.json", r)
    write_record(tmp_path / "table3" / "superseded" / "y.json", r)
    assert len(migrate(tmp_path)) == 2
    moved = read_record(tmp_path / "table3" / "x.json")
    assert moved["wandb"]["dir"] == "runs/table3/x/wandb/files"
    assert {**moved, "wandb": r["wandb"]} == r  # nothing else changed
    assert migrate(tmp_path) == []  # once


def test_a_record_of_the_wrong_shape_is_named_damaged(tmp_path):
    from reproduce.records.schema import problems
    from reproduce.records.store import DamagedRecord, read_record

    assert problems({"run_id": "x", "config": {}, "metrics": {}, "seed": 0}) == []
    assert problems({"run_id": "x", "config": {}, "metrics": [], "seed": "0"}) == [
        "'metrics' is a list, not <class 'reproduce.records.schema.Metrics'>",
        "'seed' is a str, not <class 'int'>"]
    path = tmp_path / "table3" / "x.json"
    write_record(path, {"run_id": "x", "config": {}})
    with pytest.raises(DamagedRecord, match="not a run's record: it needs the key 'metrics'"):
        read_record(path)


def test_rendering_puts_ours_beside_the_papers():
    spec = load_spec("table3")
    table = render_table3(spec, [record("base", ppl=7.25, bleu=3.0, params=2_500_000),
                                 record("A1", ppl=8.5)])
    base = _row(table, "base")
    assert base[0] == "base" and base[2:4] == ["4.92", "7.25"] and base[5:7] == ["25.8", "3.0"]
    assert base[1].startswith("N 6, d_model 512, d_ff 2048, h 8, d_k 64")
    a1 = _row(table, "A1")
    assert a1[:4] == ["(A) A1", "h 1, d_k 512, d_v 512", "5.29", "8.50"] and a1[5] == "24.9"
    a2 = _row(table, "A2")
    assert a2[3] == "" and a2[6] == "" and a2[4] == "+0.08 / –"  # no record: ours stay empty
    assert a2[2] == "5.00"  # the paper's PPL as it prints it (YAML reads 5.00 as 5.0)
    assert _row(table, "E")[1] == "learned positions"
    details = table.split("Details of our 2 runs")[1]
    assert "| base | 0 | 4.0 | 65 / 2.50 |" in details and "| A2 |" not in details
    assert "Not comparable with WMT" in table and "nrefs:1|tok:13a" in table
    assert "Cost: 0.0 worker-hours of training for 2 runs on" in table


def test_the_details_name_the_gpu_a_run_trained_on():
    gpu = record("A1", seed=1)
    gpu["hardware"] = {"cpu": "Xeon", "gpus": ["NVIDIA H200"]}
    table = render_table3(load_spec("table3"), [record("base"), record("A1"), gpu])
    details = table.split("Details of our 3 runs")[1]
    assert "| A1 | 0, 1 |" in details and "| 0.02, 0.02 (H200) |" in details
    assert "| 0.02 |" in details  # base: a CPU run, unnamed
    assert "1x NVIDIA H200" in table.split("Cost:")[1]


def test_scales_are_never_mixed_and_seeds_are_summarised():
    spec = load_spec("table3")
    table = render_table3(spec, [record("base", "cpu", 0, ppl=6.0), record("base", "cpu", 1, ppl=8.0),
                                 record("base", "smoke", 0, ppl=100.0)])
    cpu, smoke = table.split("## Scale `cpu`")[1].split("## Scale `smoke`")
    assert "7.00 ± 1.41 (n=2)" in cpu and "100.00" not in cpu
    assert "100.00" in smoke and "7.00" not in smoke


def test_a_scale_that_names_its_rows_renders_only_them():
    table = render_table3(load_spec("table3"), [record("base", "cpu-wide"), record("A1", "cpu-wide"),
                                                record("base", "cpu")])
    wide = table.split("## Scale `cpu-wide`")[1]
    assert _row(wide, "A4")[3] == "" and "This scale runs row A only." in wide
    assert "| (B) B1 |" not in wide and "`n/a` 4 (no record" in wide
    assert "| (B) B1 |" in table.split("## Scale `cpu-wide`")[0]  # cpu runs every row


def test_no_records_renders_an_empty_table():
    assert "No runs recorded yet." in render_table3(load_spec("table3"), [])


def test_seed_noise_is_a_95_percent_welch_interval_not_two_standard_errors():
    from reproduce.tables.noise import difference_noise, t_quantile

    # Student's t 97.5% points (tables): 12.706 (1 df), 4.303 (2), 2.776 (4), 2.042 (30)
    for df, t in [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (30, 2.042)]:
        assert t_quantile(0.975, df) == pytest.approx(t, abs=2e-3)
    base, variant = [10.0, 10.1, 10.2], [10.2, 10.3, 10.4]  # +0.2, each side's std 0.1
    se = (2 * 0.01 / 3) ** 0.5
    assert 2 * se < 0.2 < difference_noise(variant, base) == pytest.approx(2.776 * se, rel=1e-3)
    # unequal spreads: Welch's degrees of freedom fall towards the noisier side's n - 1
    wide = difference_noise([9.0, 10.0, 11.0], [10.0, 10.01, 10.02])
    assert wide == pytest.approx(4.303 * (1 / 3 + 0.0001 / 3) ** 0.5, rel=1e-2)
    assert difference_noise([1.0, 1.0], [2.0, 2.0]) == 0.0


def test_the_t_distribution_matches_its_closed_forms():
    """1 and 2 degrees of freedom have closed forms (Cauchy's, and x / (2 sqrt(2 + x^2))); a huge
    df approaches the normal's 1.95996 from above by (z^3 + z) / (4 df)."""
    import math

    from reproduce.tables.noise import t_cdf, t_quantile

    for x in (1e-6, 0.3, 1.0, 4.2, 60.0):
        assert t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi, abs=1e-13)
        assert t_cdf(-x, 2) == pytest.approx(0.5 - x / (2 * math.sqrt(2 + x * x)), abs=1e-13)
    for p in (0.6, 0.9, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (1 - (2 * p - 1) ** 2)),
                                                 rel=1e-10)
    z = 1.959963984540054
    assert t_quantile(0.975, 1e6) == pytest.approx(z + (z ** 3 + z) / 4e6, rel=1e-9)


def test_changes_from_base_agree_only_beyond_seed_noise():
    spec = load_spec("table3")
    recs = [record("base", "cpu", s, ppl=p, bleu=b) for s, p, b in
            [(0, 10.0, 3.0), (1, 10.2, 3.2), (2, 10.1, 3.1)]]
    recs += [record("A1", "cpu", s, ppl=p, bleu=b) for s, p, b in   # worse, as the paper's
             [(0, 12.0, 2.0), (1, 12.1, 2.1), (2, 12.2, 2.2)]]
    recs += [record("A2", "cpu", s, ppl=p, bleu=b) for s, p, b in   # inside the noise
             [(0, 10.1, 3.1), (1, 10.0, 3.0), (2, 10.2, 3.2)]]
    recs += [record("C3", "cpu", s, ppl=p, bleu=b) for s, p, b in   # paper: PPL down; ours up
             [(0, 11.0, 3.6), (1, 11.1, 3.7), (2, 11.2, 3.8)]]
    recs += [record("D1", "cpu", 0, ppl=9.0, bleu=3.5)]             # one seed: no verdict
    table = render_table3(spec, recs)
    e = render_table3(spec, recs[:3] + [record("E", "cpu", s, ppl=p, bleu=b) for s, p, b in
                                        [(0, 11.0, 3.1), (1, 11.1, 3.0), (2, 11.2, 3.2)]])
    assert _row(e, "E")[8] == "no; no effect"  # the paper's PPL does not move (4.92); ours does
    a1 = _row(table, "A1")
    # the 95% Welch interval: t(0.975, 4 df) = 2.776 x SE 0.0816 (three seeds a side, std 0.1)
    assert [a1[4], a1[7], a1[8]] == ["+0.37 / +2.00 (±0.23)", "-0.90 / -1.00 (±0.23)", "yes; yes"]
    # no per-sentence evidence in these records: the seeds' noise alone, and said so
    assert a1[9] == "seed noise only; seed noise only"
    assert _row(table, "A2")[8] == "no effect; no effect"
    c3 = _row(table, "C3")
    assert [c3[4], c3[7], c3[8]] == ["-0.04 / +1.00 (±0.23)", "-0.30 / +0.60 (±0.23)", "no; no"]
    assert ("- PPL, verdicts on 3 variant(s): `yes` 1 (a change in the paper's direction), `no` 1 "
            "(the other way), `no effect` 1 (within our noise); `n/a` 16 (no record") in table
    assert "or where the paper's change is zero" in table
    assert _row(table, "D1")[8:] == ["n/a; n/a", ""]


def test_the_table_and_its_figure_go_to_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    from reproduce.tables.dashboard import log_table, table_rows
    from reproduce.tables.figures import plot_table, rows_with_runs

    spec = load_spec("table3")
    recs = [record("base", "cpu", 0, ppl=7.0, bleu=3.0),
            {**record("A1", "cpu", 0, ppl=8.0, bleu=2.0),
             "curve": {"dev_ppl": [[100, 10.0, 50.0], [200, 20.0, 20.0]]}}]
    rows = table_rows(spec, recs)
    assert rows[0][:5] == ["A1", "cpu", 0, 8.0, 2.0] and rows[0][10:12] == [5.29, 24.9]
    figures = plot_table(spec, recs, tmp_path)
    assert [p.name for p in figures] == ["table3-cpu.png", "table3-cpu-curves.png"]
    assert rows_with_runs(spec, recs) == [("A", ["A1", "A2", "A3", "A4"])]  # no panel of base alone
    assert rows_with_runs(spec, recs[:1]) == [("base", [])]
    md = tmp_path / "table3.md"
    md.write_text(render_table3(spec, recs))
    where = log_table(spec, recs, md, figures, tmp_path / "wandb")
    assert where["mode"] == "offline"
    run_dir = Path(where["dir"]).parent
    assert list(run_dir.glob("*.wandb")), "the offline run holds no data to sync"


def test_reference_perplexities_are_stated_when_the_records_agree_on_them():
    spec = load_spec("table3")
    ref = {"unigram": 799.51, "bigram": 150.19}
    with_ref = record("base")
    with_ref["data"] = {**with_ref["data"], "reference_ppl": ref}
    table = render_table3(spec, [with_ref, record("A1")])  # A1 predates them: ignored
    assert "unigram model of the training targets scores 799.5" in table
    assert "bigram model 150.2" in table
    other = record("A2")
    other["data"] = {**other["data"], "reference_ppl": {"unigram": 50.0, "bigram": 9.0}}
    assert "unigram model" not in render_table3(spec, [with_ref, other])  # two vocabularies
    assert "unigram model" not in render_table3(spec, [record("base")])


def test_the_changes_figure_survives_a_base_of_zero_bleu(tmp_path):
    """Smoke runs score BLEU 0: no relative change to draw, and no crash."""
    from reproduce.tables.figures import plot_table

    recs = [record("base", bleu=0.0), record("A1", bleu=0.0), record("A1", seed=1, bleu=0.0)]
    paths = plot_table(load_spec("table3"), recs, tmp_path)
    assert [p.name for p in paths] == ["table3-smoke.png", "table3-smoke-curves.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_base_alone_has_no_changes_figure_and_one_left_from_its_rows_goes(tmp_path):
    from reproduce.tables.figures import plot_table

    left = tmp_path / "table3-smoke.png"  # drawn while row A's records were there
    left.write_bytes(b"\x89PNG")
    paths = plot_table(load_spec("table3"), [record("base")], tmp_path)
    assert [p.name for p in paths] == ["table3-smoke-curves.png"] and not left.exists()


def test_the_figure_marks_a_change_where_the_paper_has_none(tmp_path, monkeypatch):
    import matplotlib.axes

    from reproduce.tables.figures import plot_changes

    marks = []
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate",
                        lambda self, text, *a, **k: marks.append(text))
    recs = [record("base", "cpu", s, ppl=10.0 + s / 10) for s in range(3)]
    recs += [record(v, "cpu", s, ppl=12.0 + s / 10) for v in ("E", "C3") for s in range(3)]
    plot_changes(load_spec("table3"), recs, tmp_path / "f.png", "cpu")
    assert "✗ paper: no change (n=3)" in marks  # E: the paper's PPL is base's
    assert "✗ opposite (n=3)" in marks  # C3: the paper's PPL goes down, ours up


def test_the_gap_over_training_pairs_each_seed_with_bases():
    def curved(variant, seed, ppls, losses=(4.0, 3.0), **metrics):
        r = record(variant, "cpu", seed, ppl=ppls[-1] if ppls else 50.0)
        r["metrics"].update(metrics)
        # train loss at steps 200, 400, ..., 1000: the last fifth (after step 800) is the last
        return {**r, "curve": {"dev_ppl": [[500 * (i + 1), 10.0 * i, p] for i, p in enumerate(ppls)],
                               "train_loss": [[200 * (i + 1), 1.0, losses[0]] for i in range(4)]
                               + [[1000, 1.0, losses[1]]]}}

    recs = [curved("base", 0, [100.0, 50.0], dev_nll=3.0), curved("base", 1, [200.0, 40.0],
                                                                   dev_nll=3.2),
            curved("A1", 0, [110.0, 40.0], (5.0, 2.9), dev_nll=2.9),
            curved("A1", 1, [220.0, 32.0], (5.0, 2.7), dev_nll=3.0),
            curved("A4", 2, [90.0, 45.0]),  # no base of seed 2: no pair, no row
            curved("B1", 0, [100.0]),        # one point: only the steps it shares
            curved("A2", 0, [100.0, 55.0]), curved("A2", 1, [])]  # a curve without the points
    d1 = curved("D1", 0, [90.0, 45.0], (3.0, 2.0))
    d1["config"] = {**d1["config"], "model": {**d1["config"]["model"], "p_drop": 0.0}}
    table = render_table3(load_spec("table3"), recs + [d1])
    lines = table.splitlines()
    header = next(x for x in lines if x.startswith("| | n | step 500"))
    assert header.endswith("| step 1000 | at the end, ours / paper | Δ dev NLL, end | Δ train "
                           "loss, last fifth |")
    # seed 1 against base 1, not base 0; nats: dev (2.9 - 3.0 + 3.0 - 3.2) / 2, training loss
    # over the last fifth (2.9 - 3.0 + 2.7 - 3.0) / 2, the earlier points left out
    # at the end: each run's final dev PPL against its base's (40/50, 32/40)
    assert "| A1 | 2 | +10.0% | -20.0% | -20.0% / +7.5% | -0.150 | -0.200 |" in lines
    # no dev_nll in its records; its end (100) is not a curve point of base's last step
    assert "| B1 | 1 | +0.0% |  | +100.0% / +4.9% |  | +0.000 |" in lines
    assert "| A2 | 2 | +0.0% (n=1) | +10.0% (n=1) | +17.5% / +1.6% |  | +0.000 |" in lines
    assert "| D1 | 1 | -10.0% | -10.0% | -10.0% / +17.3% |  | another loss |" in lines  # no dropout
    assert not any(x.startswith("| A4 | ") for x in lines[lines.index(header):])
    assert "Δ train NLL" not in table
    # with a training-sample NLL in both records of a pair, its own column
    recs[0]["metrics"]["train_sample_nll"], recs[2]["metrics"]["train_sample_nll"] = 2.5, 2.25
    lines = render_table3(load_spec("table3"), recs).splitlines()
    assert "| A1 | 2 | +10.0% | -20.0% | -20.0% / +7.5% | -0.150 | -0.200 | -0.250 (n=1) |" in lines
    # a variant trained longer than base: its row says so, its end is its own last step
    big = curved("big", 0, [80.0, 30.0, 20.0])
    for r, n in ((big, 3000), *((b, 1000) for b in recs[:2])):
        r["config"] = {**r["config"], "train": {"train_steps": n}}
    lines = render_table3(load_spec("table3"), recs[:2] + [big]).splitlines()
    assert "| big (3000 steps; base 1000) | 1 | -20.0% | -40.0% | -60.0% / -12.0% |" in "\n".join(lines)


def test_the_corpus_line_says_how_many_training_pairs_were_used_and_how_taken():
    from reproduce.tables.common import corpus_note

    full = record("base")
    full["data"]["train_pairs"] = 29043
    assert corpus_note([full]).endswith("Training pairs used: 29043.")
    half = record("A1", seed=1)
    half["data"]["train_pairs"] = 14522
    half["config"]["data"] = {"train_every": 2}
    first = record("A2")
    first["data"]["train_pairs"] = 2000
    first["config"]["data"] = {"max_train_pairs": 2000}
    assert corpus_note([full, half, first]).endswith(
        "Training pairs used: 2000, 14522, 29043 (every 2nd pair; the first 2000 of the training "
        "split).")
    assert "Training pairs" not in corpus_note([record("A3")])  # older records: not said


def test_the_front_page_quotes_the_committed_records():
    # README's results are rendered from results/ (tables.summary), never typed: a record that
    # changes without a re-render fails here
    import re

    from reproduce import paths
    from reproduce.tables.summary import END, START, summary

    readme = (paths.REPO / "README.md").read_text()
    block = re.search(re.escape(START) + "\n(.*)\n" + re.escape(END), readme, flags=re.S)
    assert block and block.group(1) == summary(paths.REPO / "results")
    assert "| A | A1: h 1, d_k 512, d_v 512 |" in block.group(1)
    assert len(readme.splitlines()) <= 130  # a front page; details live in docs/


def test_the_front_page_says_which_verdicts_agree_as_its_table_calls_them():
    """The line under README's Table 3 counts the table's own verdicts: for each metric, how many
    go the paper's way, and names every other variant with its marks."""
    import re

    from reproduce import paths
    from reproduce.tables.summary import summary

    block = summary(paths.REPO / "results")
    rows = [line.split(" | ") for line in block.splitlines() if re.match(r"\| [A-Ebig]+ \| ", line)]
    said = block.split("**What agrees:** ", 1)[1].split(" **Their limits:**")[0]
    for i, short in enumerate(("PPL", "BLEU")):
        calls = {row[1].split(":")[0]: row[6].split("; ")[i].rstrip("‡") for row in rows}
        sentence = said.split(f"{short}: ", 1)[1].split(". ", 1)[0].rstrip(".")
        yes = [v for v, c in calls.items() if c.rstrip("†") == "yes"]
        assert sentence.startswith(f"{len(yes)} of {len(calls)} go the paper's way"), sentence
        for variant, call in calls.items():
            if variant not in yes:
                assert re.search(rf"\b{re.escape(variant)}†?‡?([,;]|$)", sentence), (variant, call)


def test_verify_says_when_a_record_keeps_no_hypotheses():
    from reproduce.train.replay import _without_outputs

    kept = {"bleu": {"dev": {"outputs": {"hypotheses": "x"}}, "test": {"outputs": {"h": "y"}}}}
    assert _without_outputs(kept) == ""
    assert _without_outputs({"evalb": {}}) == ""  # parsing: no BLEU to recompute
    assert "keeps no hypotheses" in _without_outputs({"bleu": {"dev": {}, "test": {}}})


def test_each_metric_s_facts_live_in_one_table():
    """records/metrics.py: every metric there is a key of a record's metrics, and each one Table 3
    compares has the paper's figure in the spec's base, under its paper key."""
    from reproduce.records.metrics import COMPARED, METRICS
    from reproduce.records.schema import METRIC_NAMES

    assert set(METRICS) <= set(METRIC_NAMES)
    base = load_spec("table3").variants["base"].paper
    assert all(m.paper_key in base for m in COMPARED), base
    assert [m.lower_is_better for m in COMPARED] == [True, False]  # PPL down, BLEU up is better
