"""Run records (``results/<table>/<run_id>.json``): where they live, writing them atomically,
reading them (damaged ones included), whether one is a finished run of a config, retiring those of
an earlier config, and the outputs kept beside them.

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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch

from reproduce.config import Config
from reproduce.errors import ConfigError
from reproduce.paths import results_dir, runs_dir
from reproduce.records.checkpoints import newest_readable
from reproduce.records.schema import Record, problems
from reproduce.records.sweep import PlannedRun
from reproduce.util.files import DAMAGED, move_aside, write_atomic
from reproduce.util.secrets import mask

COMMAND_ENV = "REPRODUCE_COMMAND"  # set by a parent (--workers): the user's command

log = logging.getLogger("reproduce")



class DamagedRecord(ValueError):
    """A record file that cannot be read as a run's record."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: damaged record ({why})")
        self.path = path


def read_record(path: Path) -> Record | None:
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
    if not isinstance(record, dict):
        raise DamagedRecord(path, f"not a run's record: a JSON {type(record).__name__}")
    if wrong := problems(record):
        raise DamagedRecord(path, "not a run's record: " + "; ".join(wrong))
    return cast(Record, record)  # problems() checked its keys against Record


def set_aside(path: Path) -> Path:
    """Move a damaged record to ``<its folder>/damaged/<name>.<time>.json``; return where."""
    return move_aside(path, path.parent / DAMAGED / f"{path.stem}.{{time}}.json")


def _moved_line(e: DamagedRecord) -> str | None:
    """Set the damaged record aside; the line that says so, or None when another process set it
    aside first."""
    try:
        return f"{e}; moved to {set_aside(e.path)}"
    except FileNotFoundError:
        return None


def load_records(table: str, results: Path, damaged: list[str] | None = None,
                 move: bool = True) -> list[Record]:
    """Every record of ``table``. Damaged files are set aside, and a line saying which and where
    they went is appended to ``damaged`` (logged as a warning when no list is given); with
    ``move=False`` (a dry run, which changes nothing) they are only skipped."""
    records: list[Record] = []
    for path in sorted((results / table).glob("*.json")):
        try:
            if (record := read_record(path)) is not None:  # None: removed since listed
                records.append(record)
        except DamagedRecord as e:
            if not move or (line := _moved_line(e)) is None:
                continue
            line += "; its run will be redone"
            if damaged is None:
                log.warning("%s", line)
            else:
                damaged.append(line)
    return records


def every_table_records(results: Path) -> list[Record]:
    """The readable records of every table under ``results`` (damaged ones skipped, not moved):
    what a cost model of one machine learns from, whichever table a plan is for."""
    tables = sorted(p.name for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
    return [r for t in tables for r in load_records(t, results, move=False)]


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


def write_lines(folder: Path, run_id: str, name: str, lines: list[str]) -> str:
    """Keep ``lines`` (a split's outputs) compressed beside the records,
    ``outputs/<run_id>.<name>``; returns that path relative to ``folder``."""
    path = Path(OUTPUTS) / f"{run_id}.{name}"
    write_atomic(folder / path, _lines(lines))
    return str(path)


def read_lines(folder: Path, path: str) -> list[str]:
    """What ``write_lines`` kept at ``path`` (relative to ``folder``)."""
    try:
        return gzip.decompress((folder / path).read_bytes()).decode().splitlines()
    except (OSError, ValueError) as e:
        raise DamagedRecord(folder / path, f"cannot be read: {e}") from None


def read_outputs(folder: Path, record: Record, split: str) -> tuple[list[str], list[str]] | None:
    """A record's kept hypotheses and references of ``split`` (``write_outputs``), or None where
    it keeps none."""
    kept = record.get("bleu", {}).get(split, {}).get("outputs", {})
    if not kept.get("hypotheses"):
        return None
    hyps, refs = (gzip.decompress((folder / kept[k]).read_bytes()).decode().splitlines()
                  for k in ("hypotheses", "references"))
    return hyps, refs


def write_evidence(folder: Path, run_id: str, split: str, evidence: dict[str, Any]) -> str:
    """Keep a split's per-sentence evidence (``train.evaluate.evidence``: each metric's sufficient
    statistics, the NLL and target tokens of every sentence) beside its hypotheses,
    ``outputs/<run_id>.<split>.evidence.json.gz``; returns that path relative to ``folder``."""
    path = Path(OUTPUTS) / f"{run_id}.{split}.evidence.json.gz"
    write_atomic(folder / path, gzip.compress(json.dumps(evidence, separators=(",", ":"))
                                              .encode(), mtime=0))
    return str(path)


def read_evidence(folder: Path, record: Record, split: str) -> dict[str, Any] | None:
    """A record's per-sentence evidence of ``split`` (``write_evidence``), or None where the
    record keeps none (made before evidence was kept, or a parsing record)."""
    kept = record.get("bleu", {}).get(split, {}).get("outputs", {}).get("evidence")
    if not kept:
        return None
    try:
        return json.loads(gzip.decompress((folder / kept).read_bytes()))
    except (OSError, ValueError) as e:
        raise DamagedRecord(folder / kept, f"{record['run_id']}'s evidence of {split} cannot "
                            f"be read: {e}") from None


def device_hours(record: Record) -> float:
    """Hours of device time a record's training took: its hours x its devices, a share of one
    GPU where several of a command's workers trained side by side on it (``gpu_shared_by``);
    none for a run evaluated from another run's training (``sharing``), counted there."""
    if record.get("trained_by"):
        return 0.0
    cost = record.get("cost", {})
    return (record["metrics"]["train_seconds"] * cost.get("devices", 1)
            / cost.get("gpu_shared_by", 1) / 3600)



def record_path(run: PlannedRun, results: Path | None = None) -> Path:
    return (results or results_dir()) / run.table / f"{run.run_id}.json"


def write_record(path: Path, data: Record) -> None:
    """Write JSON so that a reader sees the old file or the whole new one, never a part."""
    write_atomic(path, (json.dumps(data, indent=1, sort_keys=False) + "\n").encode())


def load_record(path: Path) -> Record | None:
    """The record at ``path``, or None when there is none or it is damaged (then set aside, in
    one line: the run is redone)."""
    try:
        return read_record(path)
    except DamagedRecord as e:
        if (line := _moved_line(e)) is not None:
            log.warning("%s; the run will be redone", line)
        return None


def plan_state(run: PlannedRun) -> str:
    """What the sweep command will do with ``run``, without changing anything: ``done`` (a
    record of its config), ``redo: ...`` (a record it will not trust, and why) or ``train``."""
    path = record_path(run)
    try:
        record = read_record(path)
    except DamagedRecord as e:
        return f"redo: {e}"
    if record is None:
        return "train"
    if not same_config(record.get("config"), run.config):
        return f"redo: {path} was made with another config (it will move to superseded/)"
    if why := data_changed(record, run.config):
        return f"redo: {path}: {why} (it will move to superseded/)"
    return "done"


def stored_config(stored: dict[str, Any] | None) -> Config | None:
    """A config as a record or checkpoint stores it (a dict, through JSON), rebuilt with
    ``Config.from_dict``; None when there is none or it no longer validates."""
    if stored is None:
        return None
    try:
        return Config.from_dict(json.loads(json.dumps(stored)))
    except (ConfigError, TypeError, AttributeError):
        return None


def as_asked(stored: Config, config: Config) -> Config:
    """``stored`` (a record's config) with ``device_batch_tokens: auto`` where ``config`` asks it:
    a record holds the number auto chose (``train.micro_batch``), which is what auto asked."""
    if config.train.device_batch_tokens != "auto":
        return stored
    return replace(stored, train=replace(stored.train, device_batch_tokens="auto"))


def same_config(stored: dict[str, Any] | None, config: Config, training_only: bool = False) -> bool:
    """Whether a config stored in a record or checkpoint is ``config``: the stored dict (through
    JSON, as a record holds it) is rebuilt with ``Config.from_dict`` and compared as a Config.

    A field added to the config since the record was written counts at its default, which is
    what that run did (new fields default to the old behaviour); a field since removed, or any
    stored value that no longer validates, makes the stored config a different one.
    ``training_only``: what a checkpoint of ``config`` may differ in and still be resumed as one:
    decoding settings (weights do not depend on them), ``train_steps`` (the learning-rate
    schedule does not depend on it either, so a run given more steps continues exactly where it
    stopped; the caller checks that the checkpoint is not past the new step count) and
    ``device_batch_tokens`` (the micro-batch: the tokens per step are the same, accumulated, as
    when a run resumes on another number of devices) and ``pick_on_dev`` (which kept weights are
    scored). A ``config`` that asks ``auto`` of it
    matches the number a run chose (``train.micro_batch``).
    """
    rebuilt = stored_config(stored)
    if rebuilt is None:
        return False
    rebuilt = as_asked(rebuilt, config)
    if training_only:  # the micro-batch too: where it trains (lowered after running out of memory)
        rebuilt = replace(rebuilt, decode=config.decode,
                          train=replace(rebuilt.train, train_steps=config.train.train_steps,
                                        device_batch_tokens=config.train.device_batch_tokens,
                                        pick_on_dev=config.train.pick_on_dev))
    return rebuilt == config


def finished(run: PlannedRun) -> Record | None:
    """The record of ``run`` if it finished with exactly ``run``'s resolved config, on the data
    its files hold now, else None.

    A record made under other settings (a scale or spec edited since), or on files since changed
    (``data_changed``), is not this run: it is retired by ``execute`` when the run is redone,
    never shown as this run's result."""
    record = load_record(record_path(run))
    return record if record is not None and is_current(record, run.config) else None


def is_current(record: Record, config: Config) -> bool:
    """Whether ``record`` is of ``config`` and of the data its files hold now."""
    return same_config(record.get("config"), config) and not data_changed(record, config)


def data_changed(record: Record, config: Config, fetch: bool = False) -> str | None:
    """How the data of ``record`` differs from what its corpus's files hold now, or None. Only
    a corpus read from files (``data_dir``: a user's own files, a Hub download) can change under
    the same config; each file's SHA-256 is compared with the record's (``files_now``)."""
    then = (record.get("data") or {}).get("files")
    now = files_now(config, fetch) if then else None
    if not then or now is None:
        return None
    for split, files in sorted(now.items()):
        old = (then.get(split) or {}).get("sha256")
        if old is not None and old != files["sha256"]:
            return (f"its {split} data ({files['file']}) changed since it was trained (sha256 "
                    f"{old[:12]} -> {files['sha256'][:12]})")
    return None


def retire_stale(run: PlannedRun, work: Path) -> None:
    """Move aside what an earlier config of ``run``, or its files as they were (``data_changed``),
    left: its record (to ``results/<table>/superseded/``) and its checkpoints (to
    ``<work>/superseded-<time>/``), so a changed config or corpus neither reuses nor resumes them,
    and nothing is deleted."""
    path = record_path(run)
    record = load_record(path)
    if record is not None and not same_config(record.get("config"), run.config):
        moved = move_aside(path, path.parent / "superseded" / f"{run.run_id}.{{time}}.json")
        log.warning("%s: its record was made with another config; moved to %s", run.run_id, moved)
    elif record is not None and (why := data_changed(record, run.config, fetch=True)):
        # trained on the files as they were: its record and its checkpoints both go aside
        moved = move_aside(path, path.parent / "superseded" / f"{run.run_id}.{{time}}.json")
        log.warning("%s: %s; its record moved to %s", run.run_id, why, moved)
        if (work / "checkpoints").exists():
            aside = move_aside(work / "checkpoints", work / "superseded-{time}" / "checkpoints")
            log.warning("%s: its checkpoints moved to %s", run.run_id, aside.parent)
    _retire_checkpoints_of_other_data(run, work)
    last = newest_readable(work / "checkpoints")
    if last is not None:
        saved = torch.load(last, map_location="cpu", weights_only=True)
        config = saved.get("hyper_parameters", {}).get("config")
        # Only what shaped the weights counts: a run whose decoding changed (beam, alpha, ...)
        # keeps its checkpoints and is evaluated again without retraining; one given more steps
        # trains on from its last checkpoint.
        behind = int(saved.get("global_step", 0)) <= run.config.train.train_steps
        if config is not None and not (behind and same_config(config, run.config,
                                                              training_only=True)):
            moved = move_aside(work / "checkpoints", work / "superseded-{time}" / "checkpoints")
            log.warning("%s: its checkpoints were made with another config; moved to %s",
                        run.run_id, moved.parent)


DATA_FILE = "data.json"  # in a run's folder: the SHA-256 of each file its checkpoints trained on


def files_now(config: Config, fetch: bool = False) -> dict[str, dict[str, Any]] | None:
    """What the files of ``config``'s corpus hold now (``data.hub.local_files``: per split, the
    file and its SHA-256, hashed once per process while its size and modification time stay the
    same), or None: a corpus not read from files, or files that cannot be read now (the run that
    needs them says what is wrong). Files are a ``data_dir`` (treebanks aside) or, for a Hub
    corpus named without one, the snapshot of it on this machine that a run would read now
    (``data.hub.hub_download``): a later download is a new snapshot. ``fetch``: as a run about
    to train reads it, downloaded first where the Hub is reachable (so the SHA-256 its folder
    notes are those of what it trains on); else never downloading (``status``)."""
    from reproduce.data import is_treebank
    from reproduce.data.hub import hub_download, local_files
    from reproduce.errors import DataError

    c = config.data
    if is_treebank(c.corpus):
        return None
    try:
        data_dir = c.data_dir or hub_download(c.corpus, local_only=not fetch)
        return None if data_dir is None else local_files(c.corpus, str(data_dir))
    except (DataError, OSError):
        return None


def _retire_checkpoints_of_other_data(run: PlannedRun, work: Path) -> None:
    """A run on files (``data_dir``) notes their SHA-256 in its folder before it trains; its
    checkpoints from files since changed (stopped before the edit, no record yet) go aside."""
    files = files_now(run.config, fetch=True)
    if files is None:
        return
    c = run.config.data
    now = {split: f["sha256"] for split, f in files.items()}
    path = work / DATA_FILE
    try:
        then = json.loads(path.read_text())
    except (OSError, ValueError):
        then = None
    if then is not None and then != now and (work / "checkpoints").exists():
        aside = move_aside(work / "checkpoints", work / "superseded-{time}" / "checkpoints")
        log.warning("%s: its checkpoints were trained on %s as it was before an edit; moved to "
                    "%s", run.run_id, c.data_dir or files["train"]["file"], aside.parent)
    if then != now:
        work.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(now, indent=1).encode())


def recorded_command(argv: Sequence[str]) -> str:
    """The command a record stores: the user's, also when a worker of ``--workers`` made it."""
    return mask(os.environ.get(COMMAND_ENV) or "python -m reproduce " + " ".join(argv))


def wandb_folder(where: Path) -> str:
    """A run's W&B folder as its record keeps it: ``runs/<table>/<run>/wandb/...``, relative to
    the runs root (``paths.runs_dir``), so the record reads the same on any machine; absolute
    only for a folder outside it."""
    where = Path(where).resolve()
    root = runs_dir().resolve()
    return str("runs" / where.relative_to(root)) if where.is_relative_to(root) else str(where)


def migrate(results: Path) -> list[str]:
    """Bring every record under ``results`` to what records now keep, in place (atomically),
    changing nothing else: a W&B folder recorded as an absolute path (older runs, and runs made
    with another runs root) becomes relative to the runs root, from its last ``runs/``. Records
    set aside as superseded are kept history and migrated too; damaged ones are not read.
    Returns a line per record changed."""
    changed = []
    for path in sorted(p for p in results.rglob("*.json") if DAMAGED not in p.parts):
        try:
            record = read_record(path)
        except DamagedRecord:
            continue  # the sweep commands set it aside and redo its run
        if record is None:
            continue
        folder = record.get("wandb", {}).get("dir")
        if not folder or not Path(folder).is_absolute() or "/runs/" not in folder:
            continue
        record["wandb"]["dir"] = "runs/" + folder.rsplit("/runs/", 1)[1]
        write_record(path, record)
        changed.append(f"{path}: wandb.dir {folder} -> {record['wandb']['dir']}")
    return changed
