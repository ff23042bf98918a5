"""Marks on a Table 3 verdict where its evidence is thin, computed from the records alone.

- *unsettled*: our change from base, called by sign beyond the noise (+, -, or inside it), is not
  the same call at every dev evaluation over the last ``LATE`` of training (dev PPL, the metric the
  curves hold; seed noise at each point), or at another scale whose records run the same variant
  beside base: a later step or another size could flip it.
- *outside the paper's range*: a setting the variant overrides is, at this scale, outside the
  range the paper's own variants span, where base's is inside it (the paper's d_k runs from 16 to
  512; at `cpu` base's is 16 and A4's 4).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from reproduce.records.metrics import DEV_PPL, Metric
from reproduce.records.schema import Record
from reproduce.records.sweep import Spec
from reproduce.tables.noise import change_noise

LATE = 0.4  # the share of a run's steps, at its end, whose dev evaluations a mark compares
UNSETTLED, OUTSIDE = "unsettled", "outside the paper's range"


def call(variant: list[float], base: list[float]) -> int | None:
    """+1 or -1 where mean(variant) - mean(base) exceeds its seed noise that way, 0 inside it;
    None with fewer than 2 values a side."""
    noise = change_noise(variant, base)
    if noise is None:
        return None
    delta = statistics.mean(variant) - statistics.mean(base)
    return 0 if abs(delta) <= noise.half_width else (1 if delta > 0 else -1)


def late_calls(variant: list[Record], base: list[Record]) -> dict[int, int]:
    """{step: call} of dev PPL at each evaluation in the last ``LATE`` of training that every run
    of both arms has on its curve."""
    curves = [{int(p[0]): p[2] for p in r.get("curve", {}).get("dev_ppl") or []}
              for r in (*variant, *base)]
    if not curves or not all(curves):
        return {}
    last = min(max(c) for c in curves)
    steps = sorted(s for s in set.intersection(*(set(c) for c in curves))
                   if s >= (1 - LATE) * last)
    n = len(variant)
    calls = {s: call([c[s] for c in curves[:n]], [c[s] for c in curves[n:]]) for s in steps}
    return {s: c for s, c in calls.items() if c is not None}


def unsettled(runs_by_scale: Mapping[str, Mapping[str, list[Record]]], scale: str, variant: str,
              metric: Metric) -> bool:
    """Whether ``variant``'s call against base at ``scale`` is not the same over its late dev
    evaluations (dev PPL) or at another scale with records of it and of base."""
    runs = runs_by_scale.get(scale, {})
    values = {s: [[r["metrics"][metric.key] for r in by.get(n, []) if metric.key in r["metrics"]]
                  for n in (variant, "base")] for s, by in runs_by_scale.items()}
    here = call(*values[scale]) if scale in values else None
    if here is None:
        return False
    calls = {here} | {c for s, (v, b) in values.items() if s != scale
                      if (c := call(v, b)) is not None}
    if metric.key == DEV_PPL.key:
        calls |= set(late_calls(runs.get(variant, []), runs.get("base", [])).values())
    return len(calls) > 1


def outside_range(spec: Spec, scale: str, variant: str) -> list[str]:
    """The settings ``variant`` overrides that ``scale`` puts outside the range of the spec's
    variants at the paper's sizes where base's stays inside it, as "d_k 4" (a limit of every
    run at the scale, as `cpu`'s d_model 128 below the paper's 256, is the scale's note)."""
    if variant == "base" or "paper" not in spec.scales:
        return []
    out = []
    for key in spec.variants[variant].overrides:
        name = key.rsplit(".", 1)[-1]
        paper = [spec.resolve(v, "paper").value(name) for v in spec.variants]
        here, base = (spec.resolve(v, scale).value(name) for v in (variant, "base"))
        numbers = [p for p in paper if isinstance(p, (int, float)) and not isinstance(p, bool)]
        if numbers and all(isinstance(v, (int, float)) for v in (here, base)):
            low, high = min(numbers), max(numbers)
            if low <= base <= high and not low <= here <= high:
                out.append(f"{name} {here}")
    return out


def verdict_cell(spec: Spec, runs_by_scale: Mapping[str, Mapping[str, list[Record]]], scale: str,
                 variant: str, verdicts: list[tuple[Metric, str]], short: bool = False) -> str:
    """The verdicts of one variant ("no; no effect") with their marks: "(unsettled)" after a
    verdict, and what the scale puts outside the paper's range after all; ``short``: the front
    page's "†" (unsettled) and "‡" (outside)."""
    cells = [verdict + (("†" if short else f" ({UNSETTLED})")
                        if verdict != "n/a" and unsettled(runs_by_scale, scale, variant, metric)
                        else "")
             for metric, verdict in verdicts]
    outside = outside_range(spec, scale, variant) if any(v != "n/a" for _, v in verdicts) else []
    return "; ".join(cells) + (("‡" if short else f" · {OUTSIDE}: {', '.join(outside)}")
                               if outside else "")


def marks_of(spec: Spec, runs_by_scale: Mapping[str, Mapping[str, list[Record]]],
             scale: str) -> dict[str, list[str]]:
    """Each variant's marks at ``scale`` as `status` prints them: {"A3": ["unsettled (PPL)",
    "outside the paper's range (d_k 8, d_v 8)"]}; variants without a verdict have none."""
    from reproduce.records.metrics import COMPARED

    out: dict[str, list[str]] = {}
    runs = runs_by_scale.get(scale, {})
    for variant in (v for v in runs if v != "base" and v in spec.variants):
        judged = [m for m in COMPARED
                  if call(*([r["metrics"][m.key] for r in runs.get(n, [])]
                            for n in (variant, "base"))) is not None]
        flipped = [m.short for m in judged if unsettled(runs_by_scale, scale, variant, m)]
        outside = outside_range(spec, scale, variant) if judged else []
        marks = ([f"{UNSETTLED} ({', '.join(flipped)})"] if flipped else []) + (
            [f"{OUTSIDE} ({', '.join(outside)})"] if outside else [])
        if marks:
            out[variant] = marks
    return out
