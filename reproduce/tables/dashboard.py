"""The sweep's page on Weights & Biases: the rendered table as a W&B table, the figures as images.

Each training run logs itself (``train.wandb_run.wandb_logger``: grouped by table/row, tagged with scale
and seed). After a sweep renders its Markdown, one more W&B run of job type ``table`` logs the
same rows so that the project page shows the table. Offline unless an API key is set; offline runs
sync later with ``wandb sync <dir>``; nothing with ``WANDB_MODE=disabled`` (``tracking``; the
callers check). Nothing here needs an account.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from reproduce.records.metrics import (
    COMPARED,
    DEV_BLEU,
    DEV_PPL,
    PARAMS,
    TEST_BLEU,
    TEST_BLEU_TOKENIZED,
    TRAIN_SECONDS,
    TRAIN_STEPS,
)
from reproduce.records.schema import Record
from reproduce.records.sweep import Spec
from reproduce.util.files import write_atomic
from reproduce.util.tracking import init_run, wandb_mode

# wandb is imported where it is used: 1.3 s that rendering without logging never needs.
# ours, then the paper's figures for what Table 3 compares (paper_ppl, paper_bleu)
OURS = (DEV_PPL, DEV_BLEU, TEST_BLEU, TEST_BLEU_TOKENIZED, PARAMS, TRAIN_STEPS, TRAIN_SECONDS)
COLUMNS: list[str | int] = ["variant", "scale", "seed", *(m.key for m in OURS),
                            *(f"paper_{m.paper_key}" for m in COMPARED), "run_id"]


def table_rows(spec: Spec, records: list[Record]) -> list[list[Any]]:
    """One row per record, the paper's figures beside ours (None where a value is missing)."""
    rows = []
    for r in sorted(records, key=lambda r: (r["scale"], r["variant"], r["seed"])):
        m, paper = r["metrics"], spec.variants.get(r["variant"])
        figures = paper.paper if paper else {}
        rows.append([r["variant"], r["scale"], r["seed"], *(m.get(o.key) for o in OURS),
                     *(figures.get(c.paper_key or "") for c in COMPARED), r["run_id"]])
    return rows


def log_table(spec: Spec, records: list[Record], markdown: Path, figures: list[Path],
              directory: Path) -> dict[str, Any]:
    """Log the rendered table, its rows and figures as one W&B run; returns where it went."""
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    run = init_run(f"{spec.table}'s table", project=os.environ.get("WANDB_PROJECT", "reproduce"),
                   dir=str(directory), name=f"{spec.table}-table", group=spec.table,
                   job_type="table", reinit="finish_previous",
                   tags=[spec.table, "table"] + sorted({f"scale:{r['scale']}" for r in records}))
    online = not run.offline
    run.log({f"{spec.table}/runs": wandb.Table(columns=COLUMNS, data=table_rows(spec, records)),
             f"{spec.table}/markdown": wandb.Html(f"<pre>{markdown.read_text()}</pre>"),
             **{f"{spec.table}/{p.stem}": wandb.Image(str(p)) for p in figures}})
    info = {"id": run.id, "mode": "online" if online else "offline", "dir": run.dir}
    run.finish()
    return info


def _record_hash(record: Record) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def publish(spec: Spec, records: list[Record], markdown: Path, figures: list[Path],
            directory: Path) -> dict[str, Any]:
    """Log every record as its own W&B run (config, learning curve, metrics, example outputs,
    cost; grouped by table/row, tagged with scale and seed), then the table and figures.

    Idempotent: each record's run id is fixed by its content (``<run_id>-<hash>``) and
    ``<directory>/published.json`` lists what was logged, so a second call logs nothing new, and
    a record that changed is logged as a new run. Offline unless an API key is set."""
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    ledger_path = directory / "published.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else {}
    done, skipped = [], []
    for r in sorted(records, key=lambda r: r["run_id"]):
        wandb_id = f"{r['run_id']}-{_record_hash(r)}".replace(".", "_")
        if ledger.get(r["run_id"], {}).get("id") == wandb_id:
            skipped.append(r["run_id"])
            continue
        run = init_run(
            r["run_id"], project=os.environ.get("WANDB_PROJECT", "reproduce"), dir=str(directory),
            id=wandb_id, name=r["run_id"], group=f"{r['table']}/{r['row']}",
            job_type=r["variant"], resume="allow",
            tags=[r["table"], f"row:{r['row']}", f"scale:{r['scale']}", f"seed:{r['seed']}",
                  "published"] + (["reused-training"] if r.get("trained_by") else []),
            config={**{f"{section}.{k}": v for section, values in r["config"].items()
                       for k, v in values.items()},
                    "table": r["table"], "row": r["row"], "variant": r["variant"],
                    "scale": r["scale"], "precision": r.get("precision"),
                    "commit": r.get("commit", {}).get("sha"), "hardware": r.get("hardware"),
                    # another run's training, evaluated (sharing): its curve and cost are that run's
                    "trained_by": r["trained_by"]["run_id"] if "trained_by" in r else None},
            reinit="finish_previous")
        curve = r.get("curve", {})
        for step, seconds, loss in curve.get("train_loss", []):
            run.log({"train/loss": loss, "train/seconds": seconds}, step=int(step))
        for step, seconds, ppl in curve.get("dev_ppl", []):
            run.log({"dev/ppl": ppl, "train/seconds": seconds}, step=int(step))
        examples = [[split, e["source"], e["reference"], e["output"]]
                    for split, b in r.get("bleu", {}).items() for e in b.get("examples", [])]
        if examples:
            run.log({"examples": wandb.Table(columns=["split", "source", "reference", "output"],
                                             data=examples)})
        for key, value in {**r["metrics"], **{f"cost/{k}": v for k, v in r.get("cost", {}).items()
                                              if isinstance(v, (int, float))}}.items():
            run.summary[f"final/{key}"] = value
        run.finish()
        ledger[r["run_id"]] = {"id": wandb_id, "dir": os.path.relpath(run.dir, directory)}
        done.append(r["run_id"])
        write_atomic(ledger_path, (json.dumps(ledger, indent=1) + "\n").encode())
    content = hashlib.sha256(markdown.read_bytes() + "".join(sorted(
        ledger[r["run_id"]]["id"] for r in records)).encode()).hexdigest()[:16]
    table = None
    if ledger.get("__table__", {}).get("content") != content:
        table = log_table(spec, records, markdown, figures, directory)
        ledger["__table__"] = {"content": content, "id": table["id"]}
        write_atomic(ledger_path, (json.dumps(ledger, indent=1) + "\n").encode())
    return {"published": done, "unchanged": skipped, "mode": wandb_mode(),  # after any fallback
            "table": table}
