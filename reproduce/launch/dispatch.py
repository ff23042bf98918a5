"""What a table command launches, in one call (``launch_table``): the table rendered from its
records (``--render``), the plan (``--dry-run``), array tasks on SLURM (``--launcher slurm``,
``submission``), or the runs trained here (``local``)."""

from __future__ import annotations

from reproduce.launch.options import Options


def launch_table(options: Options, argv: list[str], spec, runs: list, scale: str, tuning,
                 report) -> bool:
    """Do what ``options`` say with ``runs`` (tuned first with ``tuning``, a search space or None)
    at ``scale``; ``report`` makes a finished run's line. Whether a run failed (diverged)."""
    from reproduce.errors import DamagedRecords
    from reproduce.paths import results_dir
    from reproduce.tables.render import render
    from reproduce.train import devices

    layout = devices.resolve(options.accelerator, options.devices, spec.scale(scale).devices)
    out = results_dir() / f"{spec.table}.md"
    log = not options.dry_run  # the rendered table to W&B (with its figures; Table 4 has none)
    if options.render:
        if render(spec, out, log=log):
            raise DamagedRecords(f"{spec.table}: damaged record(s) set aside (above); the table "
                                 "shows the rest; the sweep command redoes their runs")
        return False
    if options.launcher == "slurm":
        from reproduce.launch.submission import submit_sweep
        submit_sweep(options, argv, spec, runs, scale, options.trials if tuning else 0)
        return False
    if options.dry_run:
        from reproduce.plan.dry_run import print_plan
        print_plan(spec, runs, layout, options.on, options.devices, options.workers)
        return False
    from reproduce.launch.local import train_here
    return train_here(options, argv, spec, runs, layout, tuning, report, out, log)
