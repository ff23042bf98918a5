"""Records in, Markdown tables out: one module per table of the paper, pure functions of the run
records (nothing here trains or edits), and the figures drawn from the same records."""

from __future__ import annotations

from reproduce.tables.table2 import render_table2
from reproduce.tables.table3 import render_table3
from reproduce.tables.table4 import render_table4

# By a spec's ``kind`` (``records.sweep.TABLES``, checked when the spec loads)
RENDERERS = {"table2": render_table2, "table3": render_table3, "table4": render_table4}
