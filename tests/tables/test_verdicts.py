"""Verdicts with two noise sources (seeds, and the sample of dev sentences), and verdicts on rows
of one's own (no paper figure): what they say when one source or the other is the larger."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import Result, _paired_bs_test

from reproduce.paper.sentence_scores import perplexity, sentence_stats
from reproduce.records.metrics import DEV_BLEU, DEV_PPL
from reproduce.records.store import write_evidence
from reproduce.records.sweep import load_spec
from reproduce.tables.noise import change_noise
from reproduce.tables.sentence_noise import sentence_variance
from reproduce.tables.table3 import compare_to_base, configuration, render_table3

SENTENCES, TOKENS = 300, 20


def _run(folder, variant: str, seed: int, nll: list[float], bleu_stats=None) -> dict:
    """A table3 record of ``variant`` whose dev PPL is its sentences' (``nll`` per sentence)."""
    run_id = f"table3-{variant}-cpu-seed{seed}"
    kept = {"sentences": len(nll), "nll": nll, "tokens": [TOKENS] * len(nll),
            "stats": {"sacrebleu": bleu_stats} if bleu_stats else {}}
    path = write_evidence(folder / "table3", run_id, "dev", kept)
    return {"run_id": run_id, "table": "table3", "variant": variant, "scale": "cpu",
            "seed": seed, "metrics": {"dev_ppl": perplexity(nll, kept["tokens"])},
            "bleu": {"dev": {"outputs": {"evidence": path}}}}


def _arms(folder, spread_seeds: float, spread_sentences: float, shift: float):
    """Base and A1, 3 seeds each: each sentence's NLL per token is 2 + a sentence's own
    difficulty; A1 adds ``shift`` plus a sentence's own ``spread_sentences`` (so how much A1's
    change depends on which sentences are drawn) and each run ``spread_seeds`` of its own."""
    rng = random.Random(0)
    hard = [rng.gauss(0, 0.5) for _ in range(SENTENCES)]
    own = [rng.gauss(0, spread_sentences) for _ in range(SENTENCES)]
    runs: dict[str, list[dict]] = {"base": [], "A1": []}
    for seed in range(3):
        for variant, extra in (("base", [0.0] * SENTENCES), ("A1", [shift + o for o in own])):
            jitter = rng.gauss(0, spread_seeds)
            nll = [TOKENS * (2 + h + e + jitter) for h, e in zip(hard, extra, strict=True)]
            runs[variant].append(_run(folder, variant, seed, nll))
    return runs


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path))
    return tmp_path


def test_seeds_that_agree_on_noisy_sentences_are_no_effect(results):
    """A1 is 0.05 nats a token worse on average, every seed alike (seed noise ~0.002), but its
    change varies by sentence (sd 1 nat): on another 300 sentences it could be either sign."""
    spec, runs = load_spec("table3"), _arms(results, 0.001, 1.0, 0.05)
    verdict = compare_to_base(spec, runs, "A1", DEV_PPL)
    noise = verdict.noise
    assert noise is not None and noise.seeds is not None and noise.sentences is not None
    assert noise.dominant == "sentences" and noise.seeds < noise.sentences / 10
    assert verdict.verdict == "no effect"
    assert verdict.noise_cell.startswith("seeds ±") and " < sentences ±" in verdict.noise_cell
    delta = float(verdict.ours_cell.split()[0])
    assert abs(delta) > noise.seeds  # the seeds alone would have called it
    assert noise.half_width == pytest.approx(math.hypot(noise.seeds, noise.sentences), rel=0.3)


def test_seeds_that_disagree_on_steady_sentences_are_no_effect(results):
    """The converse: A1's change is the same on every sentence, but the seeds scatter."""
    spec, runs = load_spec("table3"), _arms(results, 0.2, 0.0, 0.05)
    verdict = compare_to_base(spec, runs, "A1", DEV_PPL)
    assert verdict.verdict == "no effect" and verdict.noise is not None
    assert verdict.noise.dominant == "seeds" and " > sentences ±" in verdict.noise_cell


def test_a_change_beyond_both_sources_is_a_verdict(results):
    spec, runs = load_spec("table3"), _arms(results, 0.001, 0.05, 0.05)
    verdict = compare_to_base(spec, runs, "A1", DEV_PPL)
    assert verdict.verdict == "yes"  # worse PPL, as the paper's A1 (+0.37)
    # a run without evidence: the seeds alone, and said so
    del runs["base"][0]["bleu"]
    without = compare_to_base(spec, runs, "A1", DEV_PPL)
    assert without.noise is not None and without.noise.sentences is None
    assert without.noise_cell == "seed noise only"


def test_one_seed_a_side_agrees_with_sacrebleus_paired_bootstrap(results):
    """With one run a side the noise is the sentences' alone; its call (change beyond the 95%
    half-width) is sacreBLEU's paired bootstrap's (p < 0.05), for a clear and a slight change."""
    rng = random.Random(1)
    words = [f"w{i}" for i in range(300)]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 20))) for _ in range(400)]

    def system(error: float) -> list[str]:
        return [" ".join(w if rng.random() > error else rng.choice(words) for w in r.split())
                for r in refs]

    base = system(0.30)
    bl_stats = sentence_stats("sacrebleu", base, refs)
    bl = BLEU()
    baseline = {"BLEU": (bl_stats, Result(bl.corpus_score(base, [refs]).score, None, None, None))}
    for error, significant in ((0.40, True), (0.305, False)):
        other = system(error)
        stats = sentence_stats("sacrebleu", other, refs)
        runs = [_run(results, "A1", 0, [1.0] * len(refs), stats)]
        bases = [_run(results, "base", 0, [1.0] * len(refs), bl_stats)]
        variance = sentence_variance(runs, bases, DEV_BLEU)
        delta = BLEU().corpus_score(other, [refs]).score - baseline["BLEU"][1].score
        noise = change_noise([delta], [0.0], variance)
        assert noise is not None and noise.seeds is None and noise.sentences is not None
        _, result = _paired_bs_test(baseline, "sys", other, [refs], {"BLEU": BLEU()},
                                    n_samples=1000, seed=12345)
        assert (abs(delta) > noise.half_width) == significant == (result["BLEU"].p_value < 0.05)


def test_rows_of_ones_own_get_an_interval_and_a_verdict(tmp_path):
    """A spec's own rows without the paper's figures: an interval and `better`/`worse` once
    both sides have 2 seeds; the configuration names every key a row overrides."""
    spec_file = tmp_path / "mine.yaml"
    spec_file.write_text("table: table3\nvariants:\n  base: {}\n"
                         "  attn: {set: {p_attn: 0.1, adam_eps: 1.0e-6}}\n"
                         "  wide: {set: {d_ff: 4096}}\n  deep: {set: {N: 8}}\n"
                         "rows: {mine: [attn, wide, deep]}\n")
    spec = load_spec(str(spec_file))
    assert configuration(spec, "attn") == "p_attn 0.1, adam_eps 1e-06"

    def rec(variant: str, seed: int, ppl: float, bleu: float) -> dict:
        return {"run_id": f"table3-{variant}-smoke-seed{seed}", "table": "table3",
                "variant": variant, "scale": "smoke", "seed": seed,
                "data": {"corpus": "bible-en-de"},
                "metrics": {"dev_ppl": ppl, "dev_bleu": bleu, "test_bleu": bleu, "params": 1,
                            "train_seconds": 1.0},
                "config": {"model": {"d_model": 32, "d_ff": 128, "h": 8, "d_k": 4, "d_v": 4}},
                "bleu": {"dev": {"sacrebleu": {"signature": "s"}}},
                "hardware": {"cpu": "test CPU", "gpus": []}}

    records = [rec("base", s, 10.0 + s / 10, 3.0 + s / 10) for s in (0, 1)]
    records += [rec("attn", s, 12.0 + s / 10, 2.0 + s / 10) for s in (0, 1)]  # worse, both
    records += [rec("wide", s, 9.0 + s / 10, 4.0 + s / 10) for s in (0, 1)]  # better, both
    records += [rec("deep", 0, 9.0, 4.0)]  # one seed: no verdict
    runs: dict[str, list[dict]] = {}
    for r in records:
        runs.setdefault(r["variant"], []).append(r)
    attn = [compare_to_base(spec, runs, "attn", m) for m in (DEV_PPL, DEV_BLEU)]
    assert [v.verdict for v in attn] == ["worse", "worse"]
    assert attn[0].ours_cell.startswith("+2.00 (±") and attn[0].paper_cell == ""
    assert [compare_to_base(spec, runs, "wide", m).verdict for m in (DEV_PPL, DEV_BLEU)] == \
        ["better", "better"]
    assert compare_to_base(spec, runs, "deep", DEV_PPL).verdict == "n/a"
    table = render_table3(spec, records)
    assert "`better` 1 and `worse` 1 (no paper figure: against base)" in table
    assert "fewer than 2 seeds on a side" in table
    assert np.isfinite(attn[0].noise.half_width) if attn[0].noise else False


def test_within_row_pairs_count_concordant_discordant_and_unresolved(tmp_path):
    """Row A's pairs the paper tells apart in PPL (>= 0.1): base-A1, A1-A2, A1-A3, A1-A4,
    A3-A4. Ours: A1 worse than base (concordant), better than A2 (discordant: the paper's A2 is
    better), worse than A3 (concordant), level with A4 (unresolved), A4 worse than A3
    (concordant). A variant with one seed counts in no pair."""
    from reproduce.tables.agreement import agreement_lines, row_agreement

    spec = load_spec("table3")
    means = {"base": 10.0, "A1": 12.0, "A2": 12.5, "A3": 9.0, "A4": 12.05}
    runs = {name: [{"run_id": f"{name}-{s}", "table": "table3",
                    "metrics": {"dev_ppl": m + (s - 1) / 10, "dev_bleu": 3.0 + (s - 1) / 10}}
                   for s in range(3)] for name, m in means.items()}
    runs["C1"] = runs["base"][:1]  # one seed: none of row C's pairs count
    counted = row_agreement(spec, runs, "cpu")
    assert counted["PPL"]["A"] == {"concordant": 3, "discordant": 1, "unresolved": 1}
    assert "C" not in counted["PPL"]
    lines = agreement_lines(spec, runs, "cpu")
    assert "- PPL: A 3 concordant, 1 discordant, 1 unresolved; all rows 3 concordant" in \
        "\n".join(lines)


def _curved(variant: str, scale: str, seed: int, points: dict[int, float]) -> dict:
    """A record whose dev PPL curve is ``points`` (its last point is its final dev PPL)."""
    return {"run_id": f"{variant}-{scale}-{seed}", "table": "table3", "variant": variant,
            "scale": scale, "seed": seed, "metrics": {"dev_ppl": points[max(points)]},
            "curve": {"dev_ppl": [[s, 0.0, v] for s, v in sorted(points.items())]}}


def test_a_verdict_that_flips_late_in_training_or_at_another_scale_is_unsettled():
    from reproduce.tables.marks import unsettled, verdict_cell

    spec = load_spec("table3")

    def arm(variant: str, scale: str, at: dict[int, float]) -> list[dict]:
        return [_curved(variant, scale, s, {k: v + s / 20 for k, v in at.items()})
                for s in range(3)]

    base = arm("base", "cpu", {500: 60, 1000: 50, 1500: 45, 2000: 41, 2500: 38})
    # D1 leads at 1500, is level by 2500 (as our D1): a call that changes in the last 40%
    early = arm("D1", "cpu", {500: 55, 1000: 44, 1500: 40, 2000: 39, 2500: 38.02})
    steady = arm("D2", "cpu", {500: 62, 1000: 53, 1500: 48, 2000: 44, 2500: 41})
    by_scale = {"cpu": {"base": base, "D1": early, "D2": steady}}
    assert unsettled(by_scale, "cpu", "D1", DEV_PPL)
    assert not unsettled(by_scale, "cpu", "D2", DEV_PPL)
    # the same steady D2 against base at another scale, the other way: unsettled there too
    by_scale["cpu-quarter-data"] = {"base": arm("base", "cpu-quarter-data", {2500: 78}),
                                    "D2": arm("D2", "cpu-quarter-data", {2500: 70})}
    assert unsettled(by_scale, "cpu", "D2", DEV_PPL)
    cell = verdict_cell(spec, by_scale, "cpu", "D2", [(DEV_PPL, "yes"), (DEV_BLEU, "n/a")])
    assert cell == "yes (unsettled); n/a"
    short = verdict_cell(spec, by_scale, "cpu", "D2", [(DEV_PPL, "yes"), (DEV_BLEU, "n/a")],
                         short=True)
    assert short == "yes†; n/a"


def test_a_setting_the_scale_puts_outside_the_papers_range_is_marked():
    """The paper's d_k spans 16-512: at `cpu` (widths x 0.25) base's is 16, A3's 8, A4's 4. A
    limit of every run at the scale (d_model 128 below the paper's 256; 2500 steps) is not."""
    from reproduce.tables.marks import outside_range

    spec = load_spec("table3")
    assert outside_range(spec, "cpu", "A4") == ["d_k 4", "d_v 4"]
    assert outside_range(spec, "cpu", "B2") == ["d_k 8"]
    assert outside_range(spec, "cpu", "C4") == ["d_k 8", "d_v 8"]  # not d_model: base's is out
    assert outside_range(spec, "cpu", "A1") == outside_range(spec, "cpu", "big") == []
    assert outside_range(spec, "paper", "A4") == []


def test_status_prints_the_marks_the_table_renders(tmp_path):
    """`status` names each marked variant with the table's own marks (tables.marks.marks_of over
    the committed records); A4 at `cpu` is outside the paper's range by its spec and scale."""
    from reproduce import paths
    from reproduce.launch.progress import table_status

    rows = {row["scale"]: row for row in table_status("table3", paths.REPO / "results", tmp_path)}
    marks = rows["cpu"]["marks"]
    assert "outside the paper's range (d_k 4, d_v 4)" in marks["A4"]
    assert "A1" not in marks or all("outside" not in m for m in marks["A1"])
    table = (paths.REPO / "results" / "table3.md").read_text()
    for variant, said in marks.items():
        line = next(x for x in table.splitlines()
                    if x.startswith("|") and x.split("|")[1].strip().endswith(variant))
        assert ("(unsettled)" in line) == any(m.startswith("unsettled") for m in said), variant


def test_the_follow_ups_render_their_questions_beside_the_records(results):
    """sweeps/table3-followups.yaml's section: each asked variant with its records' means, its
    change from the spec's own base, the runs it is read against (Table 3's A2 among them) and
    the outcome written before it ran; and the heads x width grid over both tables."""
    from reproduce.records.store import write_record

    def rec(table: str, variant: str, seed: int, ppl: float, h: int, d_k: int) -> dict:
        return {"run_id": f"{table}-{variant}-cpu-seed{seed}", "table": table,
                "variant": variant, "scale": "cpu", "seed": seed,
                "data": {"corpus": "bible-en-de"},
                "metrics": {"dev_ppl": ppl + seed / 10, "dev_bleu": 12.0, "test_bleu": 11.0,
                            "params": 1, "train_seconds": 1.0},
                "config": {"model": {"h": h, "d_k": d_k, "d_v": d_k, "d_model": 128,
                                     "d_ff": 512}, "train": {"train_steps": 2500}},
                "bleu": {"dev": {"sacrebleu": {"signature": "s"}}},
                "hardware": {"cpu": "test CPU", "gpus": []}}

    ours = [rec("table3-followups", v, s, p, h, d) for v, p, h, d in
            (("base", 37.0, 8, 16), ("W2", 35.0, 2, 64), ("W8", 34.9, 8, 64)) for s in range(3)]
    for r in ours + [rec("table3", "A2", s, 35.2, 4, 32) for s in range(2)]:
        write_record(results / r["table"] / f"{r['run_id']}.json", r)
    spec = load_spec("table3-followups")
    page = render_table3(spec, ours)
    assert "### What our disagreements mean (`cpu`)" in page
    assert "- **W2**: Does head width explain row A?" in page
    assert "  - ours (3 seed(s)): dev PPL 35.10 ± 0.10 (n=3)" in page
    assert "  - against this spec's base: ΔPPL -2.00 (±" in page and ": better" in page
    assert "  - table3's A2 (2 seed(s)): dev PPL 35.25 ± 0.07 (n=2)" in page
    assert "; ours minus theirs ΔPPL -0.15 (±" in page  # W2's 35.10 against A2's 35.25
    assert "  - table3's A1 (0 seed(s)): no records yet" in page
    assert "  - settled if: W2 and W8 are level" in page
    assert "| h \\ d_k | 16 | 32 | 64 |" in page
    assert "| 2 |  |  | 35.10 (n=3) |" in page and "| 4 |  | 35.25 (n=2) |  |" in page


def test_table3_s_columns_come_from_the_metric_table(monkeypatch):
    """A metric added to COMPARED (here chrF, which new records hold) gets its paper / ours / Δ
    columns, a verdict and a noise cell, with no other change to the renderer."""
    from reproduce.records.metrics import DEV_CHRF
    from reproduce.tables import table3

    monkeypatch.setattr(table3, "COMPARED", (DEV_PPL, DEV_BLEU, DEV_CHRF))

    def rec(variant: str, seed: int, ppl: float, chrf: float) -> dict:
        return {"run_id": f"table3-{variant}-smoke-seed{seed}", "table": "table3",
                "variant": variant, "scale": "smoke", "seed": seed,
                "data": {"corpus": "bible-en-de"},
                "metrics": {"dev_ppl": ppl, "dev_bleu": 3.0, "dev_chrf": chrf, "test_bleu": 3.0,
                            "params": 1, "train_seconds": 1.0},
                "config": {"model": {"d_model": 32, "d_ff": 128, "h": 8, "d_k": 4, "d_v": 4}},
                "bleu": {"dev": {"sacrebleu": {"signature": "s"}}},
                "hardware": {"cpu": "test CPU", "gpus": []}}

    records = [rec("base", s, 10 + s / 10, 30 + s / 10) for s in (0, 1)]
    records += [rec("A1", s, 12 + s / 10, 25 + s / 10) for s in (0, 1)]
    page = table3.render_table3(load_spec("table3"), records)
    assert ("| PPL paper | PPL ours | ΔPPL paper / ours | BLEU paper | BLEU ours | ΔBLEU paper / "
            "ours | chrF paper | chrF ours | ΔchrF paper / ours | verdict PPL; BLEU; chrF |") in page
    row = next(line for line in page.splitlines() if line.startswith("| (A) A1 |"))
    assert "| 25.1 ± 0.1 (n=2) | – / -5.00 (±" in row and "; worse" in row


def test_the_follow_ups_say_how_far_decoding_reached_past_the_trained_positions(results):
    """E-sin's runs keep each dev output's decoded pieces: the section gives the share beyond
    max_tokens_per_sentence (128 at `cpu`), the rows of a learned table training never reached."""
    spec = load_spec("table3-followups")
    records = []
    for variant, pieces in (("base", [40, 50]), ("E-sin", [100, 130, 200])):
        run_id = f"table3-followups-{variant}-cpu-seed0"
        kept = {"sentences": len(pieces), "nll": [1.0] * len(pieces), "tokens": [10] * len(pieces),
                "stats": {}, "decoded_pieces": pieces}
        path = write_evidence(results / "table3-followups", run_id, "dev", kept)
        config = spec.resolve(variant, "cpu").to_dict()
        records.append({"run_id": run_id, "table": "table3-followups", "variant": variant,
                        "scale": "cpu", "seed": 0, "data": {"corpus": "bible-en-de"},
                        "metrics": {"dev_ppl": 40.0, "dev_bleu": 10.0, "test_bleu": 9.0,
                                    "params": 1, "train_seconds": 1.0}, "config": config,
                        "bleu": {"dev": {"outputs": {"evidence": path},
                                         "sacrebleu": {"signature": "s"}}},
                        "hardware": {"cpu": "test CPU", "gpus": []}})
    page = render_table3(spec, records)
    # (130 - 128) + (200 - 128) = 74 of 430 pieces
    assert ("  - decoded dev pieces beyond position 128 (rows of the table no training sentence "
            "reached): 17.21% of 430, over 1 run(s); the longest output 200 pieces") in page
    assert page.count("decoded dev pieces beyond") == 1  # not for base's sinusoids
