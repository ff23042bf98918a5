"""A sweep trained on this machine: in this process, or in ``--workers N`` processes
(``workers``), each run tuned first where asked (``train/tuning.py``) and executed
(``runner.execute``); then the table rendered from the records. A failed run still renders what
the records hold, and a command whose runs all had records says so and how to train your own."""

from __future__ import annotations

import logging
import os
import sys

from reproduce.launch import workers
from reproduce.launch.options import Options
from reproduce.plan.worker_count import auto_count, is_worker
from reproduce.train.devices import Layout, external_ranks

logger = logging.getLogger("reproduce")


def train_here(options: Options, argv: list[str], spec, runs: list, layout: Layout, tuning,
               report, out, log: bool) -> bool:
    """Train ``runs`` (tuned first with ``tuning``) here or in ``--workers`` processes, then
    render ``out`` from the records (logged to W&B with ``log``); ``report`` makes a finished
    run's line. Whether a run failed (diverged)."""
    from reproduce.data.hub import check_data
    from reproduce.records.store import finished, plan_state, record_path, recorded_command
    from reproduce.tables.render import render
    from reproduce.util.logs import quiet_libraries
    from reproduce.util.tracking import init_timeout, wandb_mode

    quiet_libraries()
    _check_writable()
    done = [plan_state(run) == "done" for run in runs]  # read once: records on disk
    # before any run starts, and before a table is rendered
    check_data(run.config for run, finished in zip(runs, done, strict=True) if not finished)
    if wandb_mode() == "online":
        init_timeout()  # a bad WANDB_INIT_TIMEOUT is found now, not when the first run logs
    command = recorded_command(argv)
    planned = list(runs)  # workers take runs over; the closing lines speak of all of them
    failed = False
    recorded = bool(runs) and all(done)
    try:
        n = options.workers
        if n == "auto":
            n = 1 if layout.devices > 1 else auto_count(runs, tuning=bool(tuning))
            if n > 1:
                print(f"--workers auto: {n} worker processes (one per core, at most one per "
                      "run; --workers 1 trains in this process)")
        if isinstance(n, int) and n > 1 and runs:
            if workers.launch(argv, runs, n, layout.devices):
                raise SystemExit(1)
            runs = []
        for run in workers.reorder(runs):
            if not tuning and not external_ranks() and (record := finished(run)) is not None:
                # as runner.execute answers it, without importing the trainer (Lightning, torch's
                # compiler: ~5 s of a core on a slow CPU); a cluster's ranks ask rank 0 (execute)
                logger.info("%s: finished earlier (%s), skipped", run.run_id, record_path(run))
                print(f"{run.run_id}: {report(record['metrics'])}")
                continue
            from reproduce.train import runner
            from reproduce.train.tuning import tune

            extra = None
            if tuning:
                run, summary = tune(run, tuning, options.trials, options.storage, run.seed)
                extra = {"tuning": summary}
                print(f"{summary['study']}: best of {summary['n_trials']} trial(s): "
                      f"{summary['metric']} {summary['best_value']:.3f} with "
                      f"{summary['best_params']}")
            outcome = runner.execute(run, spec.split, command, extra, layout)
            if outcome.record is None:  # not run now, and why
                print(f"{run.run_id}: {outcome.why}")
                failed |= outcome.failed
                continue
            print(f"{run.run_id}: {report(outcome.record['metrics'])}")
    except BaseException:
        if not is_worker():
            _render_after_failure(spec, out, log)
        raise  # the run's failure is what the command reports and exits with
    if not is_worker():  # workers leave the table to the process that started them
        render(spec, out, log=log)
    if recorded and not is_worker():
        _nothing_trained(spec, planned, argv)
    return failed


def _check_writable() -> None:
    """Refuse to train, in one line, where the records or the checkpoints could not be written:
    found now, not after the hours of training before the first write."""
    from reproduce.errors import ConfigError
    from reproduce.paths import results_dir, runs_dir
    from reproduce.util.files import writable

    for what, folder, how in (("results", results_dir(), "--results DIR writes them elsewhere"),
                              ("runs", runs_dir(), "REPRODUCE_RUNS=DIR puts them elsewhere")):
        if (error := writable(folder)) is not None:
            raise ConfigError(f"the {what} folder {folder} is not writable: {error.strerror} "
                              f"(nothing was trained; {how})")


def _render_after_failure(spec, out, log: bool) -> None:
    """Render what the records hold after a run failed; a failure here is one warning line, never
    the error the command reports (that is the run's)."""
    from reproduce.tables.render import render

    try:
        render(spec, out, log=log)
    except Exception as exc:  # noqa: BLE001 - reported, and the run's error re-raised by the caller
        print(f"warning: {spec.table}: the table was not rendered either ({type(exc).__name__}:"
              f" {exc})", file=sys.stderr)


def _nothing_trained(spec, runs: list, argv: list[str]) -> None:
    """The last lines of a command whose runs all had records: say so, and how to train them
    yourself (a fresh clone holds the project's committed records) or re-run one and compare."""
    from reproduce.paths import results_dir
    from reproduce.records.store import record_path

    folder = os.path.relpath(results_dir())
    print(f"All {len(runs)} run(s) already had a record in {folder}/: nothing was trained "
          "(a fresh clone holds the project's committed records; a record is never redone).")
    if "--results" not in argv:
        print("  to train them yourself, beside ours: python -m reproduce "
              + " ".join(argv + ["--results", "my-results"]))
    example = os.path.relpath(record_path(runs[0]))
    print(f"  to re-run one from nothing and compare with its record: python -m reproduce verify "
          f"{example}")
