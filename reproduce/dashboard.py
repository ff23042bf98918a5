"""The sweep's page on Weights & Biases: the rendered table as a W&B table, the figures as images.

Each training run logs itself (``runner.wandb_logger``: grouped by table/row, tagged with scale
and seed). After a sweep renders its Markdown, one more W&B run of job type ``table`` logs the
same rows so that the project page shows the table. Offline unless an API key is set; offline runs
sync later with ``wandb sync <dir>``. Nothing here needs an account.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .sweep import Spec

COLUMNS = ["variant", "scale", "seed", "dev_ppl", "dev_bleu", "test_bleu", "test_bleu_tokenized",
           "params", "train_steps", "train_seconds", "paper_ppl", "paper_bleu", "run_id"]


def table_rows(spec: Spec, records: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per record, the paper's figures beside ours (None where a value is missing)."""
    rows = []
    for r in sorted(records, key=lambda r: (r["scale"], r["variant"], r["seed"])):
        m, paper = r["metrics"], spec.variants.get(r["variant"])
        figures = paper.paper if paper else {}
        rows.append([r["variant"], r["scale"], r["seed"], m.get("dev_ppl"), m.get("dev_bleu"),
                     m.get("test_bleu"), m.get("test_bleu_tokenized"), m.get("params"),
                     m.get("train_steps"), m.get("train_seconds"), figures.get("ppl"),
                     figures.get("bleu"), r["run_id"]])
    return rows


def log_table(spec: Spec, records: list[dict[str, Any]], markdown: Path, figures: list[Path],
              directory: Path) -> dict[str, Any]:
    """Log the rendered table, its rows and figures as one W&B run; returns where it went."""
    import wandb

    online = bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") != "offline"
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "reproduce"), dir=str(directory),
                     name=f"{spec.table}-table", group=spec.table, job_type="table",
                     tags=[spec.table, "table"] + sorted({f"scale:{r['scale']}" for r in records}),
                     mode="online" if online else "offline", reinit="finish_previous")
    run.log({f"{spec.table}/runs": wandb.Table(columns=COLUMNS, data=table_rows(spec, records)),
             f"{spec.table}/markdown": wandb.Html(f"<pre>{markdown.read_text()}</pre>"),
             **{f"{spec.table}/{p.stem}": wandb.Image(str(p)) for p in figures}})
    info = {"id": run.id, "mode": "online" if online else "offline", "dir": run.dir}
    run.finish()
    return info
