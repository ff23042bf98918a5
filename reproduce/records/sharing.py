"""One training, several records: a run whose training is a finished run's (any table) is
evaluated from that run's checkpoints instead of being trained again.

Two runs train the same weights when their configs differ only in decoding and in how many
checkpoints are averaged at the end: the paper's Table 3 base and big are its Table 2 base and big
EN-DE models, evaluated on the dev set without averaging. So once Table 2 has trained them, Table
3's base and big (seed 0, the seed Table 2 runs) cost only their evaluation, at every scale. The
donor must have kept the checkpoints the run averages (Table 2's big keeps its last 20, enough for
any Table 3 run), which a Table 3 run does not keep for Table 2: train Table 2 first.

A reused run's record names the training (``trained_by``) and carries its cost, curve, precision,
batch and hardware, so the tables show what the training took; its evaluation ran here
(``evaluated_on``). Costs count each training once (``records.device_hours``, the cost lines).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from reproduce.config import Config
from reproduce.paths import results_dir, runs_dir
from reproduce.records.checkpoints import LAST, NoCheckpoints, last_checkpoints, unreadable
from reproduce.records.claims import holder
from reproduce.records.schema import MetricName, Record, TrainedBy
from reproduce.records.store import as_asked, every_table_records, finished, stored_config
from reproduce.records.sweep import PlannedRun, load_spec, shipped_specs

# What a reused run's record takes from its donor's: everything about the training.
TRAINING_FIELDS = ("precision", "precision_choice", "batch", "curve", "cost", "hardware",
                   "resumed", "resumed_from")
TRAINING_METRICS: tuple[MetricName, ...] = ("params", "train_steps", "train_seconds",
                                            "train_cpu_seconds")


@dataclass(frozen=True)
class Donor:
    """A finished run whose training another run reuses: its record and checkpoint folder."""

    record: Record
    checkpoints: Path

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST

    def describe(self) -> TrainedBy:
        r = self.record
        return {"table": r["table"], "run_id": r["run_id"],
                "record": f"{r['table']}/{r['run_id']}.json", "commit": r.get("commit")}


def same_training(stored: dict[str, Any] | None, config: Config) -> bool:
    """Whether a stored config (a record's) trains exactly the weights ``config`` trains: equal
    but for decoding, ``average_last`` and ``pick_on_dev``, which act after training."""
    rebuilt = stored_config(stored)
    if rebuilt is None:
        return False
    rebuilt = as_asked(rebuilt, config)
    rebuilt = replace(rebuilt, decode=config.decode,
                      train=replace(rebuilt.train, average_last=config.train.average_last,
                                    pick_on_dev=config.train.pick_on_dev))
    return rebuilt == config


def _enough(folder: Path, config: Config) -> bool:
    """Whether ``folder`` (a finished training's: its run has a record) holds the final weights
    and the last checkpoints it averages or weighs on dev (``kept_checkpoints``), every one
    readable."""
    k = config.train.kept_checkpoints()
    if not (folder / LAST).is_file():
        return False
    needed = [folder / LAST]
    if k > 1:
        try:
            steps = last_checkpoints(folder, k)
        except NoCheckpoints:
            return False
        if len(steps) < k:  # the donor's last ones (at `paper`, every 10 minutes, not at its end)
            return False
        needed += steps
    return all(unreadable(p) is None for p in needed)


def find_donor(run: PlannedRun, results: Path | None = None, runs: Path | None = None,
               records: list[Record] | None = None) -> Donor | None:
    """The finished run (of any table, with its checkpoints still under ``runs/``) whose training
    ``run`` would repeat, or None. Runs that themselves reused a training are not donors: the
    training's own run is. ``records``: every table's records, when the caller has read them."""
    runs = runs or runs_dir()
    if records is None:
        records = every_table_records(results or results_dir())
    for r in sorted(records, key=lambda r: (str(r.get("table")), r["run_id"])):
        if r["run_id"] == run.run_id or r.get("trained_by") or not r.get("table"):
            continue
        if not same_training(r.get("config"), run.config):
            continue
        folder = runs / r["table"] / r["run_id"] / "checkpoints"
        if _enough(folder, run.config):
            return Donor(r, folder)
    return None


def take_training(record: Record, donor: Donor) -> None:
    """Give a reused run's ``record`` what its training took, from its donor's record: the
    entries of ``TRAINING_FIELDS`` and the metrics of ``TRAINING_METRICS``."""
    theirs, ours = cast(dict[str, Any], donor.record), cast(dict[str, Any], record)
    ours.update({k: theirs[k] for k in TRAINING_FIELDS if k in theirs})  # names: test_types
    for k in TRAINING_METRICS:
        if k in donor.record["metrics"]:
            record["metrics"][k] = donor.record["metrics"][k]


def twins(run: PlannedRun) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """The shipped tables' runs that train the same weights as ``run`` (same scale and seed):
    (those whose training ``run`` could evaluate, keeping the checkpoints it averages; those that
    could evaluate ``run``'s). What a plan says, so that the training is done once."""
    fed_by, feeds = [], []
    k = run.config.train.kept_checkpoints()
    for path in shipped_specs():
        spec = load_spec(path.stem)
        if spec.table == run.table or run.scale not in spec.scales:
            continue
        for other in spec.plan(spec.variants_at(run.scale), run.scale, [run.seed]):
            if not same_training(other.config.to_dict(), run.config):
                continue
            if other.config.train.kept_checkpoints() >= k:
                fed_by.append(other)
            if k >= other.config.train.kept_checkpoints():
                feeds.append(other)
    return fed_by, feeds


def twin_in_training(run: PlannedRun, runs: Path | None = None) -> PlannedRun | None:
    """A twin whose training ``run`` could evaluate and that a live worker is training now (it
    holds the twin's claim and the twin has no record yet), or None: then ``run`` waits for it
    rather than train the same weights beside it."""
    runs = runs or runs_dir()
    for twin in twins(run)[0]:
        if holder(runs / twin.table / twin.run_id) is not None and finished(twin) is None:
            return twin
    return None


def reuse(run: PlannedRun, runs: Path | None = None,
          records: list[Record] | None = None) -> Donor | PlannedRun | None:
    """What ``run``, whose own training is not done, evaluates instead of training: a finished
    run's training (its ``Donor``), or a twin a live worker is training now (``run`` waits for
    it), or None (it trains). The runner acts on it; ``status`` says it."""
    return find_donor(run, runs=runs, records=records) or twin_in_training(run, runs)


def reuse_line(reused: Donor | PlannedRun) -> str:
    """What a run whose training is ``reused`` (``reuse``'s answer) will do, as the dry run and
    ``status`` both say it."""
    if isinstance(reused, Donor):
        return (f"evaluates {reused.record['run_id']}'s training (the same training, finished; "
                "no training left)")
    return (f"waits for {reused.run_id}'s training, which a worker is training now (the same "
            "training; no training left)")


def reuse_lines(runs: list[PlannedRun], folder: Path | None = None,
                records: list[Record] | None = None) -> dict[str, str]:
    """For each of ``runs`` (their own training not done) that will evaluate another's training
    instead of training, by run id: what it will do (``reuse_line``)."""
    return {run.run_id: reuse_line(reused) for run in runs
            if (reused := reuse(run, folder, records)) is not None}
