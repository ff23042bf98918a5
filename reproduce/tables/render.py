"""A table's page: its Markdown and figures rendered from the records in ``results/``, and
logged to W&B beside them."""

from __future__ import annotations

import sys
from pathlib import Path

from reproduce import paths
from reproduce.paths import results_dir, runs_dir
from reproduce.records.store import load_records
from reproduce.records.sweep import Spec
from reproduce.tables import RENDERERS
from reproduce.tables.dashboard import log_table
from reproduce.tables.figures import plot_table
from reproduce.tables.summary import update_readme
from reproduce.util.tracking import wandb_mode


def render(spec: Spec, out: Path, log: bool) -> list[str]:
    """Render ``out`` (and the table's figures, logged to W&B with the table when ``log``) from
    records; return a line per damaged record set aside (the rest are rendered)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    damaged: list[str] = []
    records = load_records(spec.table, results_dir(), damaged)
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    out.write_text(RENDERERS[spec.kind](spec, records))
    print(f"rendered {out}" + (f" without {len(damaged)} damaged record(s)" if damaged else ""))
    if records:
        figures = plot_table(spec, records, results_dir())
        for path in figures:
            print(f"plotted {path}")
        if figures and log and wandb_mode() != "disabled":
            where = log_table(spec, records, out, figures, runs_dir() / spec.table / "tables")
            print(f"logged the table to W&B ({where['mode']}, {where['dir']})")
    if paths.REPO is not None and results_dir() == paths.REPO / "results" \
            and spec.table in ("table2", "table3", "table4") and spec.path.parent == paths.SWEEPS:
        # the front page quotes the project's own results of the shipped Tables 2, 3 and 4
        if update_readme(paths.REPO / "README.md", results_dir()):
            print(f"updated the results in {paths.REPO / 'README.md'}")
    return damaged
