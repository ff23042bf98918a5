"""Where the project's folders are: the repository, its sweep specs, and the results, runs and
cache folders (each movable by an environment variable: tests and ``verify`` use scratch ones).

The one module that locates anything by its own file: every other module asks here, so moving a
module never moves a folder.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEPS = REPO / "sweeps"  # table2/3/4.yaml and scales.yaml
RESULTS_ENV = "REPRODUCE_RESULTS"
RUNS_ENV = "REPRODUCE_RUNS"
CACHE_ENV = "REPRODUCE_CACHE"


def results_dir() -> Path:
    """Records and rendered tables: ``$REPRODUCE_RESULTS``, else ``results/``."""
    return Path(os.environ.get(RESULTS_ENV, REPO / "results"))


def runs_dir() -> Path:
    """Checkpoints, claims, logs and W&B folders of runs: ``$REPRODUCE_RUNS``, else ``runs/``."""
    return Path(os.environ.get(RUNS_ENV, REPO / "runs"))


def cache_dir() -> Path:
    """BPE models, corpora and probes shared by every run: ``$REPRODUCE_CACHE``, else ``cache/``."""
    return Path(os.environ.get(CACHE_ENV) or REPO / "cache")
