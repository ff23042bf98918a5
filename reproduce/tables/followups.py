"""Follow-ups (a spec whose variants carry a ``question``: ``sweeps/table3-followups.yaml``), as a
section of their table: "What our disagreements mean". Each question beside what the records say
of it: the variant's change from its own base (both noise sources, ``table3.compare_to_base``),
the means of the runs it is read against (``against``: this spec's variants, or ``table/variant``
and ``table/variant@scale`` of another table's records), and the outcome written before it ran;
then a grid of dev PPL by heads and head width over every record at that scale. Nothing here is
judged by hand: the outcome stays the spec's sentence, the figures are the records'."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from reproduce.paths import results_dir
from reproduce.records.metrics import COMPARED, DEV_PPL
from reproduce.records.schema import Record, config_of
from reproduce.records.store import load_records, read_evidence
from reproduce.records.sweep import Spec
from reproduce.tables.common import mean_std
from reproduce.tables.noise import change_noise
from reproduce.tables.sentence_noise import sentence_variance


def _against(spec: Spec, name: str, scale: str, runs: dict[str, list[Record]]
             ) -> tuple[str, list[Record]]:
    """The records an ``against`` entry names: a variant of this spec, or ``table/variant`` (at
    ``scale``, or ``@scale``) of another table."""
    if "/" not in name:
        return name, runs.get(name, [])
    table, variant = name.split("/", 1)
    variant, _, at = variant.partition("@")
    at = at or scale
    records = [r for r in load_records(table, results_dir(), move=False)
               if r["variant"] == variant and r["scale"] == at]
    return f"{table}'s {variant}" + (f" at `{at}`" if at != scale else ""), records


def _means(records: list[Record]) -> str:
    return ", ".join(f"{m.label} {mean_std([r['metrics'][m.key] for r in records], m.digits)}"
                     for m in COMPARED if records) or "no records yet"


def _difference(ours: list[Record], theirs: list[Record]) -> str:
    """Ours minus the other runs' means, each with its noise (seeds, and sentences where both
    keep evidence): how far a fresh base drifted from a committed one, say."""
    parts = []
    for m in COMPARED:
        a, b = ([r["metrics"][m.key] for r in rs] for rs in (ours, theirs))
        noise = change_noise(a, b, sentence_variance(ours, theirs, m)) if a and b else None
        if noise is not None:
            parts.append(f"Δ{m.short} {statistics.mean(a) - statistics.mean(b):+.2f} "
                         f"(±{noise.half_width:.2f})")
    return f"; ours minus theirs {', '.join(parts)}" if parts else ""


def _past_training(records: list[Record]) -> str:
    """For learned positions: the share of decoded dev pieces beyond the longest sentence
    training saw (``max_tokens_per_sentence``), whose rows of the table never trained; from each
    record's evidence (``decoded_pieces``). Empty for sinusoids or without evidence."""
    if not records or config_of(records[0]).model.positions != "learned":
        return ""
    kept = [read_evidence(results_dir() / r["table"], r, "dev") for r in records]
    pieces = [p for k in kept if k and "decoded_pieces" in k for p in k["decoded_pieces"]]
    if not pieces:
        return ""
    limit = config_of(records[0]).train.max_tokens_per_sentence
    past = sum(max(0, p - limit) for p in pieces)
    return (f"decoded dev pieces beyond position {limit} (rows of the table no training sentence "
            f"reached): {100 * past / max(sum(pieces), 1):.2f}% of {sum(pieces)}, over "
            f"{len(records)} run(s); the longest output {max(pieces)} pieces")


def followup_section(spec: Spec, scale: str, runs: dict[str, list[Record]],
                     compare: Callable[..., Any]) -> list[str]:
    """The section for ``scale``'s rows: one entry per variant with a question and records here
    (``compare``:
    ``table3.compare_to_base``, passed in by the table it is a section of)."""
    asked = [n for n in ("base", *(v for vs in spec.rows_at(scale).values() for v in vs))
             if spec.variants.get(n) and spec.variants[n].question and runs.get(n)]
    if not asked:
        return []
    out = [f"### What our disagreements mean (`{scale}`)", "",
           "Each follow-up's question, the runs it is read against and the outcome that settles "
           "it were written in the spec before it ran; the figures are the records'.", ""]
    for name in asked:
        q = spec.variants[name].question
        ours = runs.get(name, [])
        out.append(f"- **{name}**: {q['asks']}")
        out.append(f"  - ours ({len(ours)} seed(s)): {_means(ours)}")
        if name != "base":
            verdicts = [compare(spec, runs, name, m) for m in COMPARED]
            out.append("  - against this spec's base: " + "; ".join(
                f"Δ{v.metric} {v.ours_cell or 'n/a'}: {v.verdict}"
                + (f" ({v.noise_cell})" if v.noise_cell else "") for v in verdicts))
        for other in q["against"]:
            label, records = _against(spec, other, scale, runs)
            if other != "base":
                out.append(f"  - {label} ({len(records)} seed(s)): {_means(records)}"
                           + _difference(ours, records))
        if reach := _past_training(ours):
            out.append(f"  - {reach}")
        out.append(f"  - settled if: {q['settled_if']}")
    return out + ["", *head_grid(spec, scale, runs)]


# What a record must share with base to sit in the grid: all but h, d_k and d_v of what a row
# of Table 3 varies, and the data it trained on
SAME = ("N", "d_model", "d_ff", "p_drop", "eps_ls", "train_steps", "positions", "positions_init",
        "corpus", "train_every", "max_train_pairs")


def head_grid(spec: Spec, scale: str, runs: dict[str, list[Record]]) -> list[str]:
    """Dev PPL (mean over seeds) by heads h and head width d_k, at ``scale``, over this table's
    records and Table 3's, where a variant changes nothing but h, d_k and d_v."""
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    others = [r for r in load_records("table3", results_dir(), move=False) if r["scale"] == scale]
    base = spec.resolve("base", scale)
    for r in [r for rs in runs.values() for r in rs] + (others if spec.table != "table3" else []):
        c = config_of(r)
        if any(c.value(name) != base.value(name) for name in SAME):
            continue
        cells[(c.model.h, c.model.d_k)].append(r["metrics"][DEV_PPL.key])
    if len(cells) < 2:
        return []
    heads, widths = sorted({h for h, _ in cells}), sorted({d for _, d in cells})
    out = [f"Dev PPL by heads (rows) and head width d_k (columns) at `{scale}`, every record of "
           "Table 3 and of these follow-ups whose model differs from base in h, d_k and d_v only "
           "(mean over seeds, n in brackets):", "",
           "| h \\ d_k | " + " | ".join(map(str, widths)) + " |",
           "|---|" + "---|" * len(widths)]
    for h in heads:
        out.append(f"| {h} | " + " | ".join(
            f"{statistics.mean(cells[(h, d)]):.2f} (n={len(cells[(h, d)])})" if (h, d) in cells
            else "" for d in widths) + " |")
    return out + [""]
