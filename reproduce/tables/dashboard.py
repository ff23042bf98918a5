"""The sweep's page on Weights & Biases: the rendered table as a W&B table, the figures as images.

Each training run logs itself (``train.wandb_run.wandb_logger``: grouped by table/row, tagged with scale
and seed). After a sweep renders its Markdown, one more W&B run of job type ``table`` logs the
same tables so that the project page shows them; ``publish`` completes every record's own run
with the comparison the tables make (``wandb_fields``). Offline unless an API key is set; offline runs
sync later with ``wandb sync <dir>``; nothing with ``WANDB_MODE=disabled`` (``tracking``; the
callers check). Nothing here needs an account.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, cast

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
from reproduce.tables.wandb_fields import fields, markdown_tables
from reproduce.util.files import write_atomic
from reproduce.util.tracking import init_run, wandb_mode

# wandb is imported where it is used: 1.3 s that rendering without logging never needs.
# ours, then the paper's figures for what Table 3 compares (paper_ppl, paper_bleu)
OURS = (DEV_PPL, DEV_BLEU, TEST_BLEU, TEST_BLEU_TOKENIZED, PARAMS, TRAIN_STEPS, TRAIN_SECONDS)
COLUMNS: list[str | int] = ["variant", "scale", "seed", *(m.key for m in OURS),
                            *(f"paper_{m.paper_key}" for m in COMPARED), "run_id"]


def _even(rows: list[list[str]], header: list[str]) -> list[list[str]]:
    """Rows as long as the header (a W&B Table refuses ragged rows)."""
    return [(row + [""] * len(header))[:len(header)] for row in rows]


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
              directory: Path, results: Path | None = None) -> dict[str, Any]:
    """Log the rendered table as one W&B run: its Markdown, each of its tables as a W&B Table
    with the same columns (``wandb_fields.markdown_tables``), a row per record, and the
    figures; returns where it went. One W&B run per table and results folder, updated each
    time (``wandb_id``)."""
    import wandb

    from reproduce.paths import results_dir
    from reproduce.train.wandb_run import wandb_id

    run = init_run(f"{spec.table}'s table", directory, spec.table, resume="allow",
                   id=wandb_id(f"{spec.table}-table", results or results_dir(), {}),
                   name=f"{spec.table}-table", job_type="table", reinit="finish_previous",
                   tags=[spec.table, "table"] + sorted({f"scale:{r['scale']}" for r in records}))
    online = not run.offline
    text = markdown.read_text()
    run.log({f"{spec.table}/runs": wandb.Table(columns=COLUMNS, data=table_rows(spec, records)),
             f"{spec.table}/markdown": wandb.Html(f"<pre>{text}</pre>"),
             **{f"{spec.table}/{name}": wandb.Table(columns=header, data=_even(rows, header))
                for name, header, rows in markdown_tables(text)},
             **{f"{spec.table}/{p.stem}": wandb.Image(str(p)) for p in figures}})
    info = {"id": run.id, "mode": "online" if online else "offline", "dir": run.dir}
    run.finish()
    return info


def _content(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_wandb_id(record: Record, results: Path) -> str:
    """The W&B run of ``record``: the one its training logged to, else (trained with W&B off)
    one made from the results folder, the run and its config (``wandb_run.wandb_id``)."""
    from reproduce.train.wandb_run import wandb_id

    return (record.get("wandb") or {}).get("id") or wandb_id(record["run_id"], results,
                                                             record["config"])


def publish(spec: Spec, records: list[Record], markdown: Path, figures: list[Path],
            directory: Path, results: Path, superseded: list[Record] | None = None
            ) -> dict[str, Any]:
    """Complete each record's own W&B run (``record_wandb_id``: never a second run of it) with its
    config, the comparison with base and the paper (``wandb_fields.fields``), its metrics, cost
    and example outputs, and its learning curve where its training logged none; tag the runs of
    ``superseded`` records (redone since) ``superseded``, but where a record's W&B id is a
    current record's (ids made before each run had its own, ``wandb_run.run_id``: the redone run
    went on in the same W&B run), which would tag the current one; then the table's run: the Markdown's
    tables as W&B Tables, the figures. Idempotent: ``<directory>/published.json`` keeps what
    each run was given, and publishing the same again logs nothing. Offline unless an API key
    is set."""
    directory.mkdir(parents=True, exist_ok=True)
    ledger_path = directory / "published.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else {}
    summaries = fields(spec, records)
    done, skipped, shared = [], [], []
    current = {record_wandb_id(r, results) for r in records}
    for r, old in [*((r, False) for r in records), *((r, True) for r in superseded or [])]:
        wid = record_wandb_id(r, results)
        if old and wid in current:  # an id from before runs had their own: the redo's run too
            shared.append(r["run_id"])
            continue
        what = _what(r, summaries.get(r["run_id"], {}), old)
        key = f"{r['run_id']}@{wid}" if old else r["run_id"]
        if ledger.get(key) == {"id": wid, "content": _content(what)}:
            skipped.append(key)
            continue
        _log_record(r, wid, what, directory)
        ledger[key] = {"id": wid, "content": _content(what)}
        done.append(key)
        write_atomic(ledger_path, (json.dumps(ledger, indent=1) + "\n").encode())
    content = hashlib.sha256(markdown.read_bytes() + "".join(sorted(
        ledger[r["run_id"]]["id"] for r in records)).encode()).hexdigest()[:16]
    table = None
    if ledger.get("__table__", {}).get("content") != content:
        table = log_table(spec, records, markdown, figures, directory, results)
        ledger["__table__"] = {"content": content, "id": table["id"]}
        write_atomic(ledger_path, (json.dumps(ledger, indent=1) + "\n").encode())
    return {"published": done, "unchanged": skipped, "mode": wandb_mode(),  # after any fallback
            "table": table, "superseded_sharing": shared}


def _what(r: Record, compared: dict[str, Any], superseded: bool) -> dict[str, Any]:
    """What ``publish`` gives a record's W&B run: tags, config, summary, and the curve where its
    training logged none."""
    from reproduce.train.wandb_run import flat_config, shared_training

    shared = shared_training(r.get("trained_by"))
    summary = {**{f"final/{k}": v for k, v in r["metrics"].items()},
               **{f"cost/{k}": v for k, v in r.get("cost", {}).items() if isinstance(v, (int, float))},
               **compared}
    return {
        "tags": [r["table"], f"row:{r['row']}", f"scale:{r['scale']}", f"seed:{r['seed']}",
                 "published", *shared["tags"], *(["superseded"] if superseded else [])],
        "config": {**flat_config(r["config"]), "table": r["table"], "row": r["row"], "variant": r["variant"],
                   "scale": r["scale"], "precision": r.get("precision"),
                   "commit": r.get("commit", {}).get("sha"), **shared["config"]},
        "summary": summary,
        "curve": None if (r.get("wandb") or {}).get("id") else r.get("curve", {}),
        "examples": [[split, e["source"], e.get("reference", ""), e["output"]]
                     for task in ("bleu", "evalb")
                     for split, b in cast(dict[str, Any], r.get(task) or {}).items()
                     for e in b.get("examples", [])]}


def _log_record(r: Record, wid: str, what: dict[str, Any], directory: Path) -> None:
    import wandb

    run = init_run(r["run_id"], directory, f"{r['table']}/{r['row']}", id=wid, name=r["run_id"],
                   job_type=r["variant"], resume="allow", tags=what["tags"],
                   config=what["config"], reinit="finish_previous")
    points: dict[int, dict[str, float]] = {}  # in step order: W&B drops a step below its last
    for key, series in (("train/loss", "train_loss"), ("dev/ppl", "dev_ppl")):
        for step, seconds, value in (what["curve"] or {}).get(series, []):
            points.setdefault(int(step), {"train/seconds": seconds})[key] = value
    for step in sorted(points):
        run.log(points[step], step=step)
    if what["examples"]:
        run.summary["examples"] = wandb.Table(columns=["split", "source", "reference", "output"],
                                              data=what["examples"])
    for key, value in what["summary"].items():
        run.summary[key] = value
    run.finish()
