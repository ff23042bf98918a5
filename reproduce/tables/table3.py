"""Table 3: the paper's variations on the architecture beside ours, one section per scale, with
each variant's change from base, our noise (seeds and sentences) and a verdict."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from reproduce.records.metrics import COMPARED, TEST_BLEU, Metric
from reproduce.records.schema import MetricName, Record, config_of
from reproduce.records.sweep import Spec
from reproduce.tables.agreement import agreement_lines
from reproduce.tables.common import (
    corpus_note,
    cost_line,
    devices_line,
    fmt,
    hours_note,
    mean_std,
    other_data,
    reference_line,
    scale_note,
    signed,
)
from reproduce.tables.followups import followup_section
from reproduce.tables.marks import verdict_cell
from reproduce.tables.noise import Noise, change_noise
from reproduce.tables.sentence_noise import sentence_variance

# Table 3's columns, in the paper's order: (header, config section, field).
SHAPE_COLUMNS = [("N", "model", "N"), ("d_model", "model", "d_model"), ("d_ff", "model", "d_ff"),
                 ("h", "model", "h"), ("d_k", "model", "d_k"), ("d_v", "model", "d_v"),
                 ("P_drop", "model", "p_drop"), ("eps_ls", "train", "eps_ls"),
                 ("train steps", "train", "train_steps")]


def _params(values: list[int]) -> str:
    if not values:
        return ""
    millions = values[0] / 1e6
    return f"{millions:.0f}" if millions >= 10 else f"{millions:.2f}"


def _shape_cells(spec: Spec, variant: str) -> list[str]:
    """The cells the paper prints: all of base's, only the overridden ones for a variant."""
    base = spec.resolve("base", "paper") if "base" in spec.variants else None
    overrides = spec.variants[variant].overrides
    cells = []
    for _, section, name in SHAPE_COLUMNS:
        if variant == "base" or name in overrides:
            value = getattr(getattr(spec.resolve(variant, "paper"), section), name)
            cells.append(f"{value // 1000}K" if name == "train_steps" else str(value))
        elif base is not None:
            cells.append("")
    if "positions" in overrides:
        cells[0] = f"{overrides['positions']} positions"
        cells[1:] = [""] * (len(cells) - 1)
    return cells


def render_table3(spec: Spec, records: list[Record]) -> str:
    """The paper's Table 3 with our PPL, BLEU and params beside its own, one table per scale."""
    lines = [f"# Table 3: {spec.caption}", "",
             "Rendered by `python -m reproduce table3` from the run records in "
             f"`results/{spec.table}/`; never edited by hand. *paper* columns are the paper's published "
             "figures (EN-DE newstest2013 dev); *ours* come from our runs. Empty cells: no record.",
             ""]
    by_scale: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_scale[r["scale"]].append(r)
    if not by_scale:
        lines.append("No runs recorded yet.")
    runs_by_scale = {scale: _by_variant(rs) for scale, rs in by_scale.items()}
    for scale in sorted(by_scale, key=lambda s: list(spec.scales).index(s)
                        if s in spec.scales else 99):
        lines += _scale_table(spec, scale, by_scale[scale], runs_by_scale)
    return "\n".join(lines) + "\n"


def configuration(spec: Spec, variant: str) -> str:
    """The paper's settings of a variant as one cell (at the paper's sizes): all of base's, only
    what a variant changes otherwise (the paper's layout: unlisted values equal base), and every
    other key it overrides by name (``warmup_steps 8000``, ``positions_init sinusoid``)."""
    headers = [h for h, _, _ in SHAPE_COLUMNS]
    cells = _shape_cells(spec, variant)
    shown = {name for _, _, name in SHAPE_COLUMNS} | {"positions"}
    others = [f"{k} {v}" for k, v in spec.variants[variant].overrides.items()
              if k.rsplit(".", 1)[-1] not in shown] if variant != "base" else []
    if cells and cells[0].endswith(" positions"):
        return ", ".join([cells[0], *others])
    return ", ".join([*(f"{h} {c}" if h != "train steps" else f"{c} steps"
                        for h, c in zip(headers, cells, strict=False) if c), *others])


def _by_variant(records: list[Record]) -> dict[str, list[Record]]:
    runs: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        runs[r["variant"]].append(r)
    return runs


def _scale_table(spec: Spec, scale: str, records: list[Record],
                 runs_by_scale: dict[str, dict[str, list[Record]]]) -> list[str]:
    sc = spec.scales.get(scale)
    runs = runs_by_scale[scale]
    signatures = sorted({r["bleu"]["dev"]["sacrebleu"]["signature"] for r in records})
    out = [f"## Scale `{scale}`", "", scale_note(sc, "the configurations below are the paper's"),
           ""]
    shorts = "; ".join(m.short for m in COMPARED)
    header = ["", "configuration (paper's sizes)",
              *(h for m in COMPARED for h in (f"{m.short} paper", f"{m.short} ours",
                                              f"Δ{m.short} paper / ours")),
              f"verdict {shorts}", f"noise of Δ {shorts}"]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    details = ["| | seeds | BLEU (test) ours | params ×10⁶ paper / ours | our d_model, d_ff, h, "
               "d_k, d_v | training hours (each; on a CPU unless named) |", "|---|---|---|---|---|---|"]
    groups = [("base", ["base"])] + list(spec.rows_at(scale).items())
    tally: dict[str, Counter[str]] = {m.short: Counter() for m in COMPARED}
    for row, names in groups:
        for i, name in enumerate(n for n in names if n in spec.variants):
            paper, ours = spec.variants[name].paper, runs.get(name, [])
            label = name if row == "base" or i else f"({row}) {name}"
            metric = [[r["metrics"][m.key] for r in ours] for m in (*COMPARED, TEST_BLEU)]
            test_bleu = metric[-1]
            verdicts = [compare_to_base(spec, runs, name, m) for m in COMPARED]
            apart = other_data(ours, runs.get("base", [])) if name != "base" else None
            for v in verdicts:
                tally[v.metric][v.verdict] += name != "base" and not apart
            delta = ["" if name == "base" else f"{v.paper_cell or '–'} / {v.ours_cell or '–'}"
                     for v in verdicts]
            cells = [label, configuration(spec, name),
                     *(c for m, values, d in zip(COMPARED, metric[:-1], delta, strict=True)
                       for c in (fmt(paper.get(m.paper_key or ""), m.paper_digits),
                                 mean_std(values, m.digits), d)),
                     "" if name == "base" else apart or verdict_cell(
                         spec, runs_by_scale, scale, name,
                         [(m, v.verdict) for m, v in zip(COMPARED, verdicts, strict=True)]),
                     "; ".join(v.noise_cell for v in verdicts) if any(v.noise for v in verdicts)
                     else ""]
            out.append("| " + " | ".join(cells) + " |")
            if ours:
                m = config_of(ours[0]).model
                details.append(
                    f"| {name} | {', '.join(str(r['seed']) for r in ours)} | "
                    f"{mean_std(test_bleu, TEST_BLEU.digits)} | {fmt(paper.get('params_m')) or '–'} / "
                    f"{_params([r['metrics']['params'] for r in ours])} | "
                    f"{m.d_model}, {m.d_ff}, {m.h}, {m.d_k}, {m.d_v} | "
                    + ", ".join(f"{r['metrics']['train_seconds'] / 3600:.2f}" + hours_note(r)
                                for r in ours)
                    + " |")
    out += ["", *_tally_lines(tally), "", LEGEND, "",
            "Corpus: " + corpus_note(records),
            f"BLEU: sacreBLEU on detokenized output, beam search as the paper; signature "
            f"`{'`, `'.join(signatures)}`. PPL: per word-piece on the dev split, our BPE "
            "vocabulary.", *reference_line(records), *devices_line(records),
            cost_line(records), "", *agreement_lines(spec, runs, scale),
            f"Details of our {sum(len(v) for v in runs.values())} runs (commands and configs are "
            "in each record):", "", *details, "", *gap_over_training(spec, runs, scale),
            *followup_section(spec, scale, runs, compare_to_base)]
    return out


# What the main table's cells mean: printed under every scale's table
LEGEND = ("PPL and BLEU are on the dev split; ours are mean ± std (n seeds). Δ: change from "
          "base (variant − base), the paper's / ours, with our noise (±: half-width of the "
          "95% confidence interval of the difference of means: seeds, Welch's t, and, where "
          "both arms' records keep per-sentence evidence, the dev sentences resampled 1,000 "
          "times alike for every run, the two variances added, Satterthwaite's degrees of "
          "freedom). *noise*: each source's half-width alone, the larger first by `>`/`<`; "
          "`seed noise only` where a record keeps no per-sentence evidence. *verdict*: `yes` "
          "when our change has the paper's sign and exceeds that noise; `no` when it exceeds "
          "it with the other sign, or where the paper's change is zero; `better` or `worse` "
          "(than base) for a variant without the paper's figure; `no effect` when it is within "
          "the noise; `n/a` with fewer than 2 seeds of either. *Marks* (from the records): "
          "`unsettled` where the same comparison calls otherwise (by sign beyond the seed "
          "noise, or inside it) at a dev evaluation in the last 40% of training (PPL) or at "
          "another scale with records of the variant and base; `outside the paper's range` "
          "where the scale puts a setting the variant changes outside the range the paper's "
          "variants span, while base's is inside (`reproduce/tables/marks.py`).")


def _tally_lines(tally: dict[str, Counter[str]]) -> list[str]:
    """A line per compared metric: how many verdicts of each kind the table holds."""
    out = []
    for name, counts in tally.items():
        judged = sum(counts[k] for k in ("yes", "no", "no effect", "better", "worse"))
        own = (f", `better` {counts['better']} and `worse` {counts['worse']} (no paper figure: "
               "against base)" if counts["better"] or counts["worse"] else "")
        out.append(f"- {name}, verdicts on {judged} variant(s): `yes` {counts['yes']} (a change "
                   f"in the paper's direction), `no` {counts['no']} (the other way), `no effect` "
                   f"{counts['no effect']} (within our noise){own}; `n/a` {counts['n/a']} (no "
                   "record of them or of base at this scale, or fewer than 2 seeds on a side, "
                   "which gives no seed-noise estimate).")
    return out


@dataclass(frozen=True)
class GapRow:
    """One variant's line of the gap over training, its seeds paired with base's."""

    variant: str
    label: str  # the variant, and its steps when they are not base's (``_row_label``)
    n: int  # (variant, base) pairs
    gaps: dict[int, list[float]]  # step -> dev PPL in % of base's, one per pair with that point
    end: list[float]  # final dev PPL in % of base's final, per pair
    dev_nll: list[float]  # final dev NLL, variant - base, nats
    train_loss: list[float] | None  # late training loss, variant - base; None: another loss
    train_nll: list[float]  # final weights on the training sample, variant - base


def gap_over_training(spec: Spec, runs: dict[str, list[Record]],
                      scale: str) -> list[str]:
    """Each variant's dev PPL against base's at every evaluation, in % of base, with seeds paired
    (a variant's seed s against base's seed s): whether a gap closes as training goes on, which
    a short schedule would hide, or widens. Beside it, the same pairs' gaps at the end in nats:
    dev NLL, and the training loss over the last fifth of the steps, which tell a variant that
    fits the training data faster (both gaps alike) from one that generalizes better from the
    same fit (a dev gap without a training one)."""
    base = {r["seed"]: r for r in runs.get("base", [])}
    rows, steps = [], set()
    for name in (n for names in spec.rows_at(scale).values() for n in names if n in runs):
        pairs = [(r, base[r["seed"]]) for r in runs[name] if r["seed"] in base]
        gaps: dict[int, list[float]] = defaultdict(list)
        for v, b in ((dev_ppl_curve(v), dev_ppl_curve(b)) for v, b in pairs):
            for s in set(v) & set(b):
                gaps[s].append(100 * (v[s] / b[s] - 1))
        # None: the variant changes what the training loss is (smoothing, dropout)
        fit = [tv - tb for tv, tb in ((late_train_loss(v), late_train_loss(b)) for v, b in pairs)
               if tv is not None and tb is not None] if all(same_loss(v, b) for v, b in pairs) \
            else None
        if gaps:
            end = [100 * (v["metrics"]["dev_ppl"] / b["metrics"]["dev_ppl"] - 1) for v, b in pairs]
            rows.append(GapRow(name, _row_label(name, pairs), len(pairs), gaps, end,
                               _paired(pairs, "dev_nll"), fit,
                               _paired(pairs, "train_sample_nll")))
            steps |= set(gaps)
    if not rows:
        return []
    steps_in = sorted(steps)
    sampled = any(row.train_nll for row in rows)  # records that scored a training sample
    out = ["Over training: dev PPL of each variant against base at each evaluation, in % of base "
           "(+: worse than base), mean over seeds paired with base's; n = pairs (a cell with "
           "fewer says so: a curve without that point). At the end: each run's final dev PPL "
           "against its base's, ours beside the paper's (a variant trained for more or fewer "
           "steps than base says so: the step columns are base's steps, its end is its own). "
           "The same pairs' gaps at the end in nats: dev NLL, and the training loss "
           "(label-smoothed, dropout on) averaged over the last fifth of the steps. Alike, the "
           "variant fits the training data faster or slower; a dev gap without a training one, "
           "it generalizes better or worse from the same fit."
           + (" Δ train NLL: the final weights on a fixed sample of training pairs as large as "
              "dev, scored as dev is (no smoothing, no dropout), in records that have it."
              if sampled else ""),
           "", "| | n | " + " | ".join(f"step {s}" for s in steps_in)
           + " | at the end, ours / paper | Δ dev NLL, end | Δ train loss, last fifth |"
           + (" Δ train NLL, end |" if sampled else ""),
           "|---|---|" + "---|" * (len(steps_in) + 3 + sampled)]
    paper_base = spec.variants["base"].paper.get("ppl") if "base" in spec.variants else None

    def nats(values: list[float], n: int) -> str:
        return (f"{statistics.mean(values):+.3f}" + (f" (n={len(values)})" if len(values) < n
                                                     else "")) if values else ""

    for row in rows:
        n, gap = row.n, row.gaps
        paper = spec.variants[row.variant].paper.get("ppl")
        out.append(f"| {row.label} | {n} | " + " | ".join(
            f"{statistics.mean(gap[s]):+.1f}%" + (f" (n={len(gap[s])})" if len(gap[s]) < n else "")
            if s in gap else "" for s in steps_in) + f" | {statistics.mean(row.end):+.1f}% / "
            + (f"{100 * (paper / paper_base - 1):+.1f}%" if paper and paper_base else "–")
            + f" | {nats(row.dev_nll, n)} | "
            + f"{'another loss' if row.train_loss is None else nats(row.train_loss, n)} |"
            + (f" {nats(row.train_nll, n)} |" if sampled else ""))
    return out + [""]


def _row_label(name: str, pairs: list[tuple[Record, Record]]) -> str:
    """A variant's row label: one trained for other steps than base (big: 3x) says so, since the
    step columns are base's and its end is not theirs."""
    def steps(r: Record) -> int:
        return config_of(r).train.train_steps

    ours, base = {steps(v) for v, _ in pairs}, {steps(b) for _, b in pairs}
    if len(ours) == 1 and len(base) == 1 and ours != base:
        return f"{name} ({ours.pop()} steps; base {base.pop()})"
    return name


def _paired(pairs: list[tuple[Record, Record]], key: MetricName) -> list[float]:
    """Variant minus base of metric ``key`` for each (variant, base) pair that both record."""
    return [v["metrics"][key] - b["metrics"][key] for v, b in pairs
            if key in v["metrics"] and key in b["metrics"]]


def same_loss(a: Record, b: Record) -> bool:
    """Whether two records' training losses measure the same thing: the same label smoothing and
    dropout (D1, D3, D4 and big change what the training loss is, not only how well it fits)."""
    def what(r: Record) -> tuple[float, float]:
        c = config_of(r)
        return c.train.eps_ls, c.model.p_drop
    return what(a) == what(b)


def late_train_loss(record: Record, fraction: float = 0.2) -> float | None:
    """The mean training loss logged over the last ``fraction`` of a record's steps (points are
    [step, seconds, loss]); None without a curve. One batch's loss is noisy: a mean over the
    last fifth compares runs, a last point does not."""
    points = record.get("curve", {}).get("train_loss") or []
    if not points:
        return None
    last = max(step for step, _, _ in points)
    late = [loss for step, _, loss in points if step > (1 - fraction) * last]
    return statistics.mean(late)


def dev_ppl_curve(record: Record) -> dict[int, float]:
    """{step: dev PPL} of a record's learning curve (points are [step, seconds, PPL])."""
    return {int(step): ppl for step, _, ppl in record.get("curve", {}).get("dev_ppl") or []}


# Our metric beside the paper's key for it (the spec's `paper:` figures): what a verdict compares.
@dataclass(frozen=True)
class Verdict:
    metric: str
    paper_cell: str
    ours_cell: str
    verdict: str  # yes | no | better | worse | no effect | n/a
    noise: Noise | None = None  # of our change: both sources (None: no verdict)
    paper_delta: float | None = None  # the paper's change from base, and ours (the cells' numbers)
    delta: float | None = None

    @property
    def noise_cell(self) -> str:
        """The noise's two sources, each alone: "seeds ±1.02 > sentences ±0.48", or "seed noise
        only" where either arm's records keep no per-sentence evidence."""
        n = self.noise
        if n is None:
            return ""
        if n.sentences is None:
            return "seed noise only" if n.seeds is not None else ""
        if n.seeds is None:
            return f"sentences ±{n.sentences:.2f}"
        order = ">" if n.dominant == "seeds" else "<"
        return f"seeds ±{n.seeds:.2f} {order} sentences ±{n.sentences:.2f}"


def compare_to_base(spec: Spec, runs: dict[str, list[Record]], variant: str,
                    metric: Metric) -> Verdict:
    """Our change from base beside the paper's, and whether the two agree in sign.

    A change inside our noise (the 95% confidence interval of the difference of the two means:
    seeds, Welch's t, and where both arms keep per-sentence evidence, the sample of sentences:
    ``noise.change_noise``) is "no effect", never agreement; with fewer than two seeds on
    either side there is no seed-noise estimate and no verdict. A variant without the paper's
    figure (a user's own, a follow-up) is ``better`` or ``worse`` than base, by the metric's
    direction, once the change exceeds the noise."""
    paper_key = metric.paper_key or ""
    paper_v, paper_b = (spec.variants[n].paper.get(paper_key) if n in spec.variants else None
                        for n in (variant, "base"))
    paper_delta = None if paper_v is None or paper_b is None else paper_v - paper_b
    ours_v = [r["metrics"][metric.key] for r in runs.get(variant, [])]
    ours_b = [r["metrics"][metric.key] for r in runs.get("base", [])]
    if variant == "base" or not ours_v or not ours_b:
        return Verdict(metric.short, "" if variant == "base" else signed(paper_delta), "", "n/a",
                       None, paper_delta)
    delta = statistics.mean(ours_v) - statistics.mean(ours_b)
    if len(ours_v) < 2 or len(ours_b) < 2:
        return Verdict(metric.short, signed(paper_delta), signed(delta), "n/a", None,
                       paper_delta, delta)
    noise = change_noise(ours_v, ours_b, sentence_variance(runs[variant], runs["base"], metric))
    assert noise is not None  # two seeds a side
    if abs(delta) <= noise.half_width:
        verdict = "no effect"
    elif paper_delta is None:
        verdict = "worse" if (delta > 0) == metric.lower_is_better else "better"
    else:
        verdict = "yes" if paper_delta != 0 and (delta > 0) == (paper_delta > 0) else "no"
    return Verdict(metric.short, signed(paper_delta), f"{signed(delta)} (±{noise.half_width:.2f})",
                   verdict, noise, paper_delta, delta)
