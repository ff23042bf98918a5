"""Where the project's folders are: the sweep specs, and the results, runs and cache folders.

The one module that locates anything by its own file: every other module asks here, so moving a
module never moves a folder. Two ways to be installed:

* a checkout (``pip install -e .``, or running from the source tree): the specs are ``sweeps/``,
  and results, runs and cache are the project's ``results/``, ``runs/`` and ``cache/``;
* an installed package (a wheel, ``pip install .`` or ``git+...``): the specs are the package's
  data (``reproduce/sweeps``); results and runs go to the current folder (``./results``,
  ``./runs``), and caches to one root shared by every project (``$XDG_CACHE_HOME/reproduce``,
  else ``~/.cache/reproduce``).

Each folder also moves by an environment variable (``--results DIR`` sets the first; tests and
``verify`` set all three).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_SOURCE = PACKAGE.parent
# A source tree holds its package beside sweeps/ and pyproject.toml; an installed one does not.
CHECKOUT = (_SOURCE / "sweeps" / "scales.yaml").is_file() and (_SOURCE / "pyproject.toml").is_file()
REPO = _SOURCE if CHECKOUT else None  # the project's checkout, when running from one
SWEEPS = _SOURCE / "sweeps" if CHECKOUT else PACKAGE / "sweeps"  # table2/3/4.yaml, scales.yaml
RESULTS_ENV = "REPRODUCE_RESULTS"
RUNS_ENV = "REPRODUCE_RUNS"
CACHE_ENV = "REPRODUCE_CACHE"


def _home() -> Path:
    """Where results and runs go without a variable: the checkout, or the current folder."""
    return REPO if REPO is not None else Path.cwd()


def results_dir() -> Path:
    """Records and rendered tables: ``$REPRODUCE_RESULTS``, else ``results/``."""
    return Path(os.environ.get(RESULTS_ENV) or _home() / "results")


def runs_dir() -> Path:
    """Checkpoints, claims, logs and W&B folders of runs: ``$REPRODUCE_RUNS``, else ``runs/``."""
    return Path(os.environ.get(RUNS_ENV) or _home() / "runs")


def cache_dir() -> Path:
    """BPE models, corpora and probes shared by every run: ``$REPRODUCE_CACHE``, else the
    checkout's ``cache/`` or the user's cache root."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if REPO is not None:
        return REPO / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reproduce"


def use_results(folder: str | Path) -> Path:
    """``--results DIR``: this process and those it starts keep records, tables and figures in
    ``DIR`` and their runs (checkpoints, logs) in ``DIR/runs``, unless ``$REPRODUCE_RUNS`` says
    otherwise: a sweep of one's own beside the project's results, never mixed into them."""
    folder = Path(folder).resolve()
    os.environ[RESULTS_ENV] = str(folder)
    os.environ.setdefault(RUNS_ENV, str(folder / "runs"))
    return folder
