"""What W&B shows of a table, from the functions that render its Markdown: each record's summary
fields (``fields``: the paper's figures and, in Table 3, its variant's change from base for every
compared metric with both noise terms, the verdict and its marks, as ``compare_to_base`` and
``verdict_cell`` give them to the Markdown table), and the rendered Markdown's own tables as rows
(``markdown_tables``: the same columns and cells, for a W&B Table each)."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from reproduce.records.metrics import COMPARED
from reproduce.records.schema import Record
from reproduce.records.sweep import Spec


def fields(spec: Spec, records: list[Record]) -> dict[str, dict[str, Any]]:
    """Each record's summary fields, by run id: ``paper/<key>`` for every figure the spec gives
    its variant; in a Table 3, ``compare/<metric>/...`` (the paper's change and ours, the
    interval's half-width, each noise term alone and the larger, the verdict) and
    ``compare/verdict`` (every metric's verdict with its marks, the Markdown's cell)."""
    by_scale: dict[str, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_scale[r["scale"]][r["variant"]].append(r)
    out = {}
    for r in records:
        variant = spec.variants.get(r["variant"])
        out[r["run_id"]] = {f"paper/{k}": v for k, v in (variant.paper if variant else {}).items()}
        if spec.kind == "table3" and r["variant"] != "base":
            out[r["run_id"]].update(_comparison(spec, by_scale, r["scale"], r["variant"]))
    return out


def _comparison(spec: Spec, by_scale: dict[str, dict[str, list[Record]]], scale: str,
                variant: str) -> dict[str, Any]:
    from reproduce.tables.marks import verdict_cell
    from reproduce.tables.table3 import compare_to_base

    out: dict[str, Any] = {}
    verdicts = []
    for metric in COMPARED:
        v = compare_to_base(spec, by_scale[scale], variant, metric)
        verdicts.append((metric, v.verdict))
        n = v.noise
        out.update({f"compare/{metric.short}/{k}": value for k, value in {
            "paper_change": v.paper_delta, "our_change": v.delta,
            "half_width": n.half_width if n else None, "seed_noise": n.seeds if n else None,
            "sentence_noise": n.sentences if n else None, "dominant": n.dominant if n else None,
            "verdict": v.verdict}.items()})
    out["compare/verdict"] = verdict_cell(spec, by_scale, scale, variant, verdicts)
    return out


_HEADING = re.compile(r"^#+\s+(.*)$")


def markdown_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every table of a rendered Markdown page: (a name from the heading above it and its place
    under that heading, the header's cells, the rows' cells), in order. An empty header cell is
    named ``column <i>`` (W&B needs a name)."""
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    heading, count = "table", 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if match := _HEADING.match(lines[i]):
            heading, count = match[1].strip(), 0
        elif lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [c or f"column {k}" for k, c in enumerate(_cells(lines[i]))]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            count += 1
            tables.append((f"{heading} ({count})" if count > 1 else heading, header, rows))
            continue
        i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split("|")]
