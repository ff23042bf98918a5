"""The precision a table's records trained in at a scale: later runs with ``precision: auto``
follow it (``train.precision.choose_precision``), and plans and status estimate with it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from reproduce.records.schema import Record, config_of
from reproduce.records.store import load_records
from reproduce.records.sweep import PlannedRun


def trained_in(records: Iterable[Record], scale: str, exclude: str | None = None
               ) -> dict[str, int]:
    """How many of ``records`` at ``scale`` with ``precision: auto`` (other than the run
    ``exclude``) trained in each precision."""
    counts: dict[str, int] = {}
    for r in records:
        if (r.get("scale") == scale and r["run_id"] != exclude and (precision := r.get("precision"))
                and config_of(r).train.precision == "auto"):
            counts[precision] = counts.get(precision, 0) + 1
    return counts


def most_common(counts: dict[str, int]) -> str | None:
    """The precision most runs trained in (ties: the first by name); None without any."""
    return max(sorted(counts), key=counts.__getitem__) if counts else None


def settled(run: PlannedRun, results: Path) -> tuple[str, dict[str, int]] | None:
    """The precision ``auto`` resolved to in the records of ``run``'s table at its scale (other
    runs than ``run`` itself, with ``precision: auto``): (the precision most of them trained in,
    how many trained in each), or None without such records."""
    counts = trained_in(load_records(run.table, results, move=False), run.scale, run.run_id)
    most = most_common(counts)
    return (most, counts) if most is not None else None
