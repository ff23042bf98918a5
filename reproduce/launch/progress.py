"""``python -m reproduce status``: per table and scale, what is done, running, stopped and missing,
and what the finished runs cost. Reads records, claims and run folders; changes nothing.

*stale*: a record made with another config than the spec resolves to now (a scale or spec edited
since), or on a corpus whose files have changed since (``records.data_changed``); the next sweep
command moves it to ``superseded/`` and redoes the run. *running*: a live
worker holds the run's claim. *stopped*: the run has a folder (and perhaps
checkpoints) but no record and no live worker: crashed or interrupted; the next sweep command
resumes it. *missing*: planned by the spec (at a scale and seed this table has been run at) but
never started. *queued*: its SLURM array task waits in the queue (``queue``: the submission's
ledger and ``squeue``); a task there that runs is *running* too, and one that left the queue
without a record is shown with its log's last line and path. A stopped or missing run whose
training another finished run has done (``sharing``) is said to evaluate that run's training and
counts no training time left (so does one whose twin a worker is training now, which it will
evaluate); one that needs data only the user can provide (Table 4's silver trees) is said to
wait for it, and is not counted.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from reproduce.data import missing_input
from reproduce.launch import queue
from reproduce.plan import estimates
from reproduce.plan.worker_count import auto_count
from reproduce.records.checkpoints import steps_left
from reproduce.records.claims import holder
from reproduce.records.diverged import diverged_with
from reproduce.records.precision_history import most_common, trained_in
from reproduce.records.schema import Record
from reproduce.records.sharing import reuse_lines
from reproduce.records.store import device_hours, every_table_records, is_current, load_records
from reproduce.records.sweep import PlannedRun, load_spec, shipped_specs
from reproduce.tables.marks import marks_of
from reproduce.util import machine


def table_status(table: str, results: Path, runs: Path,
                 damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per scale: the run ids in each state and the cost of the finished ones. Damaged
    records are set aside (``records.load_records``; a line each in ``damaged``): their runs
    count as stopped or missing."""
    spec = load_spec(table)
    records = {r["run_id"]: r for r in load_records(spec.table, results, damaged)}
    folders = {p.name: p for p in (runs / spec.table).glob(f"{spec.table}-*") if p.is_dir()}
    tasks = queue.tasks(runs / spec.table / "slurm")  # submitted to SLURM: queued, running, ended
    seen: dict[str, set[int]] = defaultdict(set)
    # <table>-<variant>-<scale>-seed<k>; variants and scales may hold hyphens (base-en-de, cpu-wide)
    named = re.compile("-(" + "|".join(map(re.escape, sorted(spec.scales, key=len, reverse=True)))
                       + r")-seed(\d+)$")
    for run_id in set(records) | set(folders) | set(tasks):
        if match := named.search(run_id):
            seen[match.group(1)].add(int(match.group(2)))
    everything = every_table_records(results) if seen else []  # donors, cost model: all scales
    by_scale: dict[str, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for r in records.values():  # Table 3's marks compare scales (tables.marks)
        by_scale[r.get("scale", "")][r.get("variant", "")].append(r)
    rows = []
    for scale in sorted(seen):
        if scale not in spec.scales:
            continue
        planned = [_with_sets(run, records.get(run.run_id), tasks.get(run.run_id))
                   for run in spec.plan(spec.variants_at(scale), scale, sorted(seen[scale]))]
        state: dict[str, list[str]] = {"done": [], "stale": [], "queued": [], "running": [],
                                       "stopped": [], "missing": [], "diverged": []}
        ended: dict[str, queue.Task] = {}  # SLURM tasks gone from the queue without a record
        for run in planned:
            run_id, task = run.run_id, tasks.get(run.run_id)
            state[_state_of(run, records.get(run_id), folders.get(run_id), task)].append(run_id)
            if task is not None and task.ended and run_id not in records:
                ended[run_id] = task
        done = [records[i] for i in state["done"]]
        trained = [r for r in done if not r.get("trained_by")]  # each training counted once
        flops = [r.get("cost", {}).get("paper_method_flops") for r in trained]
        unfinished = (state["stale"] + state["queued"] + state["running"] + state["stopped"]
                      + state["missing"])
        left = [run for run in planned if run.run_id in unfinished]
        # steps each still needs after the checkpoint it would resume from (read once: the
        # started ones' checkpoint steps and the time left both come from it)
        to_go = {run.run_id: steps_left(run, runs) for run in left}
        # what the next command will evaluate instead of training (runner.execute's decision:
        # not for a run whose own training is done, nor one a worker holds)
        reuses = reuse_lines([run for run in left if to_go[run.run_id] and run.run_id not in
                              state["running"] + state["stale"] + state["queued"]], runs, everything)
        # what cannot start without data the user provides (Table 4's silver trees): not "left"
        blocked = {run.run_id: why for run in left
                   if (why := missing_input(run.config.data.corpus, run.config.data.extra_trees))}
        left = [run for run in left if run.run_id not in reuses and run.run_id not in blocked]
        started = set(state["running"] + state["stopped"])
        saved = {run.run_id: (run.config.train.train_steps - to_go[run.run_id],
                              run.config.train.train_steps) for run in left if run.run_id in started}
        # what the finished runs trained in (shown); the runs still to come with `precision:
        # auto` follow what those with `auto` trained in (records.precision_history.settled), whatever this
        # machine would choose
        shown: dict[str, int] = defaultdict(int)
        for r in done:
            shown[r.get("precision") or "unrecorded"] += 1
        rows.append({"table": spec.table, "scale": scale, "seeds": sorted(seen[scale]), **state,
                     "checkpoint_steps": saved, "precision": dict(shown), "reuses": reuses,
                     "blocked": blocked, "ended": ended,
                     "marks": marks_of(spec, by_scale, scale) if spec.kind == "table3" else {},
                     "jobs": {i: t.job_id + (f", requeued {t.restarts} time(s)" if t.restarts
                                             else "")
                              for i, t in tasks.items() if t.queued or t.running},
                     # --tune on SLURM: each run's trial tasks still in the queue
                     "trials": Counter(t.run_id for i, t in tasks.items()
                                       if i != t.run_id and (t.queued or t.running)),
                     "left": _time_left(left, to_go, everything, runs,
                                        settled=most_common(trained_in(done, scale))),
                     "train_hours": sum(r["metrics"]["train_seconds"] for r in trained) / 3600,
                     "device_hours": sum(device_hours(r) for r in done),
                     "paper_method_flops": sum(f for f in flops if f)})
    return rows


def _state_of(run: PlannedRun, record: Record | None, folder: Path | None,
              task: queue.Task | None) -> str:
    """done, stale, diverged, queued, running, stopped or missing (the module's words)."""
    if record is not None:  # stale: made under settings, or on files, since changed: redone
        return "done" if is_current(record, run.config) else "stale"
    if folder is not None and diverged_with(folder, run.config):
        return "diverged"  # not trained again with this config
    if task is not None and task.queued:
        return "queued"
    if (folder is not None and holder(folder) is not None) or (task is not None and task.running):
        return "running"
    return "stopped" if folder is not None else "missing"


def _with_sets(run: PlannedRun, record: Record | None, task: queue.Task | None) -> PlannedRun:
    """``run`` as it was trained or submitted: with the ``--set`` values its record holds, or
    those of its last SLURM task (a run submitted with more steps counts its own steps)."""
    sets = (record.get("set") if record else None) or (task.sets if task is not None else {})
    return replace(run, config=run.config.overrides(**sets), sets=dict(sets)) if sets else run


def _time_left(left: list, to_go: dict[str, int], records: list[Record],
               runs: Path, settled: str | None = None) -> dict[str, Any]:
    """What the runs not yet finished (``to_go``: steps left after their checkpoints) should take
    on this CPU, with the worker layout ``--workers auto`` would pick (``estimates``: counted
    FLOPs, the cached probe, the fit to this CPU's records of every table at the runs' scale).
    ``settled``: the precision the scale's finished runs trained in, which ``auto`` runs follow;
    fp32 steps are estimated as fp32 whatever this machine timed."""
    if not left:
        return {"device_hours": 0.0, "wall_hours": 0.0, "workers": 0, "source": ""}
    n = auto_count(left, to_go=to_go)
    threads = max(1, min(machine.cores(), torch.get_num_threads()) // n)
    here = estimates.plan_here(records, left, runs)
    hours = sum(here.estimate(run, threads, to_go[run.run_id], settled).hours for run in left)
    return {"device_hours": hours, "wall_hours": hours / n, "workers": n,
            "source": here.model_for(left[0]).source}


def _counts(precisions: dict[str, int]) -> str:
    """``32-true``, or ``32-true (10), bf16-mixed (2)`` when the runs differ."""
    if len(precisions) == 1:
        return next(iter(precisions))
    return ", ".join(f"{p} ({n})" for p, n in sorted(precisions.items()))


def report(results: Path, runs: Path, verbose: bool = False,
           damaged: list[str] | None = None, specs: list[str] | None = None) -> str:
    """Every table's lines: the shipped specs', or those of ``specs`` (files of one's own)."""
    lines = []
    for spec in specs or [str(p) for p in shipped_specs()]:
        rows = table_status(spec, results, runs, damaged)
        if not rows:
            lines.append(f"{load_spec(spec).table}: nothing run yet")
            continue
        for row in rows:
            counts = ", ".join(f"{len(row[k])} {k}" for k in (
                "done", "stale", "queued", "running", "stopped", "missing") if row[k] or k != "queued")
            if row["diverged"]:
                counts += f", {len(row['diverged'])} diverged"
            lines.append(f"{row['table']} at `{row['scale']}` (seeds {row['seeds']}): {counts}; "
                         f"spent {row['train_hours']:.2f} h training ({row['device_hours']:.2f} "
                         f"device-hours, {row['paper_method_flops']:.2g} FLOPs by the paper's "
                         "method)" + (f"; trained in {_counts(row['precision'])}"
                                      if row["precision"] else ""))
            left = row["left"]
            if left["workers"]:
                lines.append(f"  left: about {left['device_hours']:.1f} h of training on this CPU,"
                             f" {left['wall_hours']:.1f} h with {left['workers']} worker(s) "
                             f"({left['source']})")
            for variant, marks in row["marks"].items():
                lines.append(f"  marked   {variant}: {'; '.join(marks)}")
            for run_id, why in row["blocked"].items():
                lines.append(f"  waits    {run_id}: {why}")
            for run_id in row["diverged"]:
                lines.append(f"  diverged {run_id}: not trained again with this config "
                             "(docs/records.md, diverged runs)")
            for run_id, task in row["ended"].items():
                how = f"ended {task.ending()}" if task.ending() else "left the queue"
                lines.append(f"  ended    {run_id}: its SLURM task {task.job_id} {how} without "
                             f"a record: {task.last_words()} (log {task.stderr})")
            for key in ("stale", "queued", "running", "stopped") + (("missing",) if verbose else ()):
                for run_id in row[key]:
                    if run_id in row["blocked"]:
                        continue  # said above
                    step, steps = row["checkpoint_steps"].get(run_id, (None, None))
                    lines.append(f"  {key:8} {run_id}" + (
                        f": {row['reuses'][run_id]}" if run_id in row["reuses"] else
                        f" (checkpoint at step {step} of {steps})"
                        if step else " (no checkpoint yet)" if step == 0 else "")
                        + (f" (SLURM job {row['jobs'][run_id]})" if run_id in row["jobs"] else "")
                        + (f", after {row['trials'][run_id]} trial task(s) still in the queue"
                           if row["trials"].get(run_id) else ""))
    return "\n".join(lines)
