"""Within-row agreement: for each row of Table 3, the pairs of its variants (base among them) that
the paper tells apart, and whether ours tell them apart the same way.

One verdict per variant compares each with base only; a row's shape (1 head worst, 8 and 16
best, 32 worse) is in the pairs. A pair counts where the paper's figures differ by at least the
metric's ``min_paper_gap`` (0.1 PPL, 0.3 BLEU: the paper prints PPL to 0.01 and BLEU to 0.1) and
both sides have 2 seeds: *concordant* when our difference has the paper's sign and exceeds our
noise (``noise.change_noise``, seeds and, where kept, sentences), *discordant* when it exceeds it
with the other sign, *unresolved* inside it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from itertools import combinations

from reproduce.records.metrics import COMPARED, Metric
from reproduce.records.schema import Record
from reproduce.records.sweep import Spec
from reproduce.tables.noise import change_noise
from reproduce.tables.sentence_noise import sentence_variance

KINDS = ("concordant", "discordant", "unresolved")


def pair_call(spec: Spec, runs: dict[str, list[Record]], a: str, b: str,
              metric: Metric) -> str | None:
    """How our ``a`` - ``b`` compares with the paper's (``KINDS``); None where the pair does not
    count: the paper's figures missing or too close, or fewer than 2 seeds of either."""
    key = metric.paper_key or ""
    pa, pb = (spec.variants[n].paper.get(key) for n in (a, b))
    if pa is None or pb is None or abs(pa - pb) < metric.min_paper_gap - 1e-9:
        return None
    ours = [[r["metrics"][metric.key] for r in runs.get(n, [])] for n in (a, b)]
    if min(len(ours[0]), len(ours[1])) < 2:
        return None
    delta = statistics.mean(ours[0]) - statistics.mean(ours[1])
    noise = change_noise(ours[0], ours[1], sentence_variance(runs[a], runs[b], metric))
    assert noise is not None  # two seeds a side
    if abs(delta) <= noise.half_width:
        return "unresolved"
    return "concordant" if (delta > 0) == (pa > pb) else "discordant"


def row_agreement(spec: Spec, runs: dict[str, list[Record]], scale: str
                  ) -> dict[str, dict[str, Counter[str]]]:
    """{metric short name: {row: counts of KINDS}} over the rows run at ``scale``."""
    out: dict[str, dict[str, Counter[str]]] = {m.short: {} for m in COMPARED}
    for row, names in spec.rows_at(scale).items():
        members = [n for n in ("base", *names) if n in spec.variants]
        for metric in COMPARED:
            calls = Counter(call for a, b in combinations(members, 2)
                            if (call := pair_call(spec, runs, a, b, metric)) is not None)
            if calls:
                out[metric.short][row] = calls
    return out


def counts(calls: Counter[str]) -> str:
    return ", ".join(f"{calls[k]} {k}" for k in KINDS)


def agreement_lines(spec: Spec, runs: dict[str, list[Record]], scale: str) -> list[str]:
    """The lines under a scale's table: per metric, each row's counts and their sum."""
    agreement = row_agreement(spec, runs, scale)
    if not any(agreement.values()):
        return []
    gaps = " or ".join(f"{m.min_paper_gap:g} {m.short}" for m in COMPARED)
    out = [f"Within rows: pairs of a row's variants (base among them) whose paper figures differ "
           f"by at least {gaps}, both with 2 or more seeds: *concordant* (our difference has "
           "the paper's sign, beyond our noise), *discordant* (the other sign, beyond it), "
           "*unresolved* (inside it).", ""]
    for name, rows in agreement.items():
        if rows:
            total = sum(rows.values(), Counter())
            out.append(f"- {name}: " + "; ".join(f"{row} {counts(c)}" for row, c in rows.items())
                       + f"; all rows {counts(total)}.")
    return out + [""]
