"""What a table command asks of launching: its arguments as one typed value, so that launching
reads no ``argparse`` namespace and a command passes one thing to ``launch_table``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    """A table command's launching arguments (``commands/table.py`` documents each flag)."""

    render: bool = False  # render the table from the records only
    dry_run: bool = False  # print the plan only
    launcher: str = "local"  # local: here (``workers``); slurm: array tasks
    on: str | None = None  # --on: hardware to plan for, or the GPU SLURM's nodes hold
    accelerator: str = "auto"
    devices: int | str | None = None  # one run's devices: N, "auto", None (the scale's)
    workers: int | str = "auto"  # local worker processes: N or "auto"
    trials: int = 10  # with tuning: trials to add per run
    storage: str | None = None  # with tuning: optuna's storage
    nodes: int = 1  # SLURM: nodes a run trains on
    gpus: int | None = None  # SLURM: GPUs per node (None: the scale's)
    partition: str | None = None  # SLURM partition
    slurm: tuple[str, ...] = ()  # SLURM: --slurm KEY=VALUE options
