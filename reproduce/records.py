"""Reading run records (``results/<table>/<run_id>.json``), damaged ones included.

A record that does not parse, or parses to something that is not a run's record (a truncated
copy, a file edited by hand, a merge conflict), is never taken for a result and never blocks the
others: whoever meets it says so in one line and moves it to ``results/<table>/damaged/``
(nothing is deleted). The sweep command then redoes that run; render and ``status`` name it and
exit non-zero.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .files import write_atomic

log = logging.getLogger("reproduce")

DAMAGED = "damaged"
REQUIRED = ("run_id", "config", "metrics")


class DamagedRecord(ValueError):
    """A record file that cannot be read as a run's record."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: damaged record ({why})")
        self.path = path


class DamagedRecords(Exception):
    """Damaged records were set aside while rendering or counting: the command exits non-zero."""


def read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path``; None if there is none; ``DamagedRecord`` if it is not one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DamagedRecord(path, str(e)) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise DamagedRecord(path, f"not valid JSON: {e}") from None
    if not isinstance(record, dict) or any(key not in record for key in REQUIRED):
        raise DamagedRecord(path, f"not a run's record: it needs the keys {', '.join(REQUIRED)}")
    return record


def set_aside(path: Path) -> Path:
    """Move a damaged record to ``<its folder>/damaged/<name>.<time>.json``; return where."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    moved = path.parent / DAMAGED / f"{path.stem}.{stamp}.json"
    moved.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, moved)
    return moved


def load_records(table: str, results: Path,
                 damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """Every record of ``table``. Damaged files are set aside, and a line saying which and where
    they went is appended to ``damaged`` (logged as a warning when no list is given)."""
    records = []
    for path in sorted((results / table).glob("*.json")):
        try:
            records.append(read_record(path))
        except DamagedRecord as e:
            try:
                line = f"{e}; moved to {set_aside(path)}; its run will be redone"
            except FileNotFoundError:  # another process set it aside first
                continue
            if damaged is None:
                log.warning("%s", line)
            else:
                damaged.append(line)
    return records


OUTPUTS = "outputs"


def _lines(texts: list[str]) -> bytes:
    """One sentence a line (a line break inside one would shift every line after it)."""
    return gzip.compress("".join(t.replace("\n", " ") + "\n" for t in texts).encode(), mtime=0)


def write_outputs(folder: Path, run_id: str, split: str, hypotheses: list[str],
                  references: list[str]) -> dict[str, str]:
    """Keep a split's outputs beside the records, so anyone can recompute its BLEU:
    ``outputs/<run_id>.<split>.hyp.gz`` and the references once per content,
    ``outputs/refs/<sha256>.ref.gz``. Returns the two paths relative to ``folder`` (the table's
    records folder); for example
    ``sacrebleu <(zcat REF) -i <(zcat HYP)`` gives the recorded sacreBLEU."""
    refs = _lines(references)
    digest = hashlib.sha256(gzip.decompress(refs)).hexdigest()[:16]
    ref_path = Path(OUTPUTS) / "refs" / f"{digest}.ref.gz"
    hyp_path = Path(OUTPUTS) / f"{run_id}.{split}.hyp.gz"
    if not (folder / ref_path).exists():
        write_atomic(folder / ref_path, refs)
    write_atomic(folder / hyp_path, _lines(hypotheses))
    return {"hypotheses": str(hyp_path), "references": str(ref_path)}
