"""``--dry-run``: what each run of a sweep will do and take, on this machine with the worker
layout the same command would use, or on ``--on`` hardware; the estimates beside what recorded
runs took. Counted, not timed: nothing is built or stepped but a short matmul probe (cached)."""

from __future__ import annotations

import dataclasses

import torch

from reproduce import paths
from reproduce.data.hub import check_data
from reproduce.paper.flops import counted_how
from reproduce.paths import results_dir, runs_dir
from reproduce.plan import estimates, gpu_prices, worker_count
from reproduce.records import disk, footprint
from reproduce.records.checkpoints import steps_left
from reproduce.records.precision_history import most_common, trained_in
from reproduce.records.sharing import reuse_lines, twins
from reproduce.records.store import every_table_records, load_records, plan_state
from reproduce.records.sweep import PlannedRun
from reproduce.train.devices import TIMEOUT_ENV, Layout, timeout_seconds
from reproduce.util import machine


def print_plan(spec, runs: list, layout: Layout, on: str | None = None,
               devices: int | str | None = None, n_workers: int | str = "auto") -> dict[str, float]:
    """Print the plan of ``runs`` and return its total device-hours and wall-clock hours.
    ``on``, ``devices`` and ``n_workers``: the command's ``--on``, ``--devices``, ``--workers``."""
    target = gpu_prices.parse_on(on)
    if target.kind == "gpu" and devices not in (None, "auto"):
        target = dataclasses.replace(target, devices=int(devices))
    if target.kind == "cpu" and layout.devices > 1:  # one run over CPU processes
        target = dataclasses.replace(target, devices=layout.devices)
    states = {run.run_id: plan_state(run) for run in runs}
    everything = every_table_records(results_dir())
    # runs that will evaluate another run's training (``sharing``) instead of training: what the
    # runner does with them, as status says it
    reuses = reuse_lines([run for run in runs
                          if states[run.run_id] == "train" and steps_left(run)],
                         records=everything)
    todo = [run for run in runs if states[run.run_id] != "done" and run.run_id not in reuses]
    check_data(run.config for run in todo)  # a missing folder is one line, not ~0 pairs below
    # steps each still needs on a CPU, after the checkpoint it would resume from (read once: the
    # worker count and each run's estimate both come from it)
    to_go = ({run.run_id: steps_left(run) for run in todo} if target.kind == "cpu"
             else {run.run_id: run.config.train.train_steps for run in todo})
    n = 1
    if target.kind == "cpu":
        n = n_workers if isinstance(n_workers, int) else (
            1 if layout.devices > 1 else worker_count.auto_count(todo, to_go=to_go))
    ranks = target.devices if target.kind == "cpu" else 1
    threads = max(1, min(machine.cores(), torch.get_num_threads()) // max(n * ranks, 1))
    records = {r["run_id"]: r for r in load_records(spec.table, results_dir(), move=False)}
    # per scale, the precision its records trained in, which `auto` runs follow
    settled = {scale: most_common(trained_in(records.values(), scale))
               for scale in {run.scale for run in runs}}
    # Fitted to every table's records of this CPU at each scale: one model code, one training step.
    here = estimates.plan_here(everything, runs, runs_dir()) if target.kind == "cpu" else None
    where = (f"this CPU ({machine.cpu_name()}), {n} worker(s) x {ranks} rank(s) of {threads} "
             "thread(s)" if target.kind == "cpu" else target.label)
    print(f"each run on {layout.describe() if target.kind == 'cpu' else target.label}; plan on "
          f"{where}; counted FLOPs per step, no model built:")
    for line in here.warnings(todo) if here else []:
        print(f"  {line}")
    if layout.world > 1 or target.devices > 1:
        print(f"  ranks give up on a collective (or on a rank that never joins) after "
              f"{timeout_seconds():.0f} s ({TIMEOUT_ENV} sets it; a rank that dies is noticed at "
              "once)")
    total = serial = 0.0  # device-hours; hours one run after another
    largest: tuple[int, str, disk.Need] | None = None
    read: set[tuple] = set()  # corpora a run before this one reads and encodes
    for run in runs:
        state = states[run.run_id]
        if state == "done":
            print(f"  {run.run_id}: done (its record is kept; not run again)")
            continue
        if run.run_id in reuses:
            print(f"  {run.run_id}: {reuses[run.run_id]}")
            continue
        if state.startswith("redo: "):
            print(f"  {run.run_id}: will be redone: {state[6:]}")
        corpus = _corpus(run.config)
        e = (here.estimate(run, threads, to_go[run.run_id], settled[run.scale], target) if here
             else gpu_prices.price(run.config, target, to_go[run.run_id], run_id=run.run_id,
                                   pairs=0 if corpus in read else None))
        read.add(corpus)
        paper = estimates.paper_method_flops(e, target)
        total += e.command_hours * e.devices  # a GPU is held for the whole command
        serial += e.command_hours
        need = disk.need(run.config)
        largest = max(largest or (0, "", need), (need.peak, run.run_id, need))
        _print_run(run, e, paper, need)
    wall = serial / (n if target.kind == "cpu" else 1)
    print(f"total: {total:.3g} device-hours, about {hours(wall)} of wall clock "
          + (f"with {n} worker(s)" if target.kind == "cpu" else "one run after another"))
    _print_data(todo)
    if largest is not None:
        _, run_id, need = largest
        print(f"disk: {run_id}'s {need.describe()}; {runs_dir()} has {disk.size(disk.free(runs_dir()))}"
              f" free (a run is not started without room for its own; --skip-disk-check)")
    if here is not None:
        checked = estimates.check_against_records(runs, records, here.model_for, here.rate)
        print("  " + estimates.error_line(checked))
    return {"device_hours": total, "wall_hours": wall}


def _corpus(config) -> tuple:
    """What makes two runs read the same training pairs: one corpus to read and encode."""
    d = config.data
    return d.corpus, d.data_dir, d.max_train_pairs, d.train_every


def _print_data(runs: list[PlannedRun]) -> None:
    """A line for each corpus the runs will read (``records.footprint``): what it takes on disk and
    the first run's minutes, beside the cache's free space."""
    seen = set()
    for run in runs:
        if (key := _corpus(run.config)) in seen:
            continue
        seen.add(key)
        if (f := footprint.footprint(run.config)) is not None:
            print(f"data: {f.describe()}" + ("" if f.built else
                  f"; {paths.cache_dir()} has {disk.size(disk.free(paths.cache_dir()))} free"))


def _print_run(run: PlannedRun, e: estimates.Estimate, paper: float | None,
               need: disk.Need) -> None:
    """A run's line of the plan: steps, batch, time, FLOPs and disk; and the twin whose training
    it would share (``sharing``)."""
    accumulate, micro = run.config.train.split_batch(e.devices)
    print(f"  {run.run_id}: {e.steps} steps x {micro * e.devices * accumulate} tokens/step "
          f"({e.devices} device(s) x {accumulate} accumulated x {micro}"
          f"{'; auto: measured at the start' if run.config.train.device_batch_tokens == 'auto' else ''}), "
          f"{e.seconds_per_step:.3g} s/step -> {hours(e.hours)}, {e.device_hours:.3g} "
          f"device-hours; {e.flops:.2g} FLOPs counted"
          + (f" ({how})" if (how := counted_how(run.config.model)) else "")
          + (f", {paper:.2g} by the paper's method" if paper else "") + f" [{e.source}]; "
          f"checkpoints up to {disk.size(need.peak)} on disk")
    if e.around:
        print("    around training: " + ", ".join(f"{k} {_seconds(v)}" for k, v in e.around.items()
                                                   if v >= 0.05)
              + f"; the command {hours(e.command_hours)}")
    fed_by, feeds = twins(run)
    if fed_by:
        print(f"    the same training as {', '.join(t.run_id for t in fed_by)}: run that "
              "table first and this run only evaluates its checkpoints")
    elif feeds:
        print(f"    {', '.join(t.run_id for t in feeds)}, run after this one, will evaluate its "
              "training instead of training again")


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 600 else hours(s / 3600)


def hours(h: float) -> str:
    """A duration in hours, or in minutes below a tenth of an hour (a GPU run of a small model)."""
    return f"{h:.2f} h" if h >= 0.1 else f"{h * 60:.1f} min"
