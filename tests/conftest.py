"""Offline, quiet and contained: W&B off, no hub access, one torch thread per test process and
per CLI it starts unless a test asks for more. W&B costs a CLI run ~3 s to start its service, so
it is off (``WANDB_MODE=disabled``) where a test is about something else; the tests of what goes
to W&B turn it on, offline into a temp dir (``helpers.WANDB_OFFLINE``): the rows of Table 3, two
ranks, W&B unreachable, the installed wheel, secrets in a study, publish and the table's log.
Test files run side by side on one pytest-xdist worker per core (pyproject.toml), so a second
thread would fight another file's process for a core: two torch threads on a busy core run
several times slower than one."""

import os

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from tests import helpers, spawner


@pytest.fixture(scope="session", autouse=True)
def offline_environment(tmp_path_factory):
    root = tmp_path_factory.mktemp("env")
    env = {
        # no WANDB_DIR: where a user sets it, runs log there (test_sharing), else in their folders
        "WANDB_MODE": "disabled", "WANDB_SILENT": "true",
        "WANDB_CACHE_DIR": str(root / "wandb-cache"), "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        # A process a test gives two threads (workers sharing the cores) shares them with the
        # other file's tests: an OpenMP thread that waits then sleeps instead of spinning on a
        # core another process needs (the same numbers; the workers test took 0.82x the CPU
        # seconds beside a busy core)
        "OMP_WAIT_POLICY": "PASSIVE",
        # a file for each Python a CLI starts that tests/spawner.py forks (helpers.processes)
        spawner.REGISTRY_ENV: str(root / "spawned"),
    }
    for key, value in env.items():
        os.environ[key] = value
    # Compiled kernels shared by every test and CLI (a run's own default, the project's cache, is
    # a new folder in most tests: each would compile afresh). Torch's default is what importing
    # its compiler sets, not a user's choice.
    from reproduce.train.step_time import INDUCTOR_CACHE_ENV, user_compile_cache

    if user_compile_cache() is None:
        os.environ[INDUCTOR_CACHE_ENV] = default_cache_dir() + "-tests"
    os.environ.pop("WANDB_DIR", None)
    for key in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", spawner.REGISTRY_ENV):
        os.makedirs(env[key], exist_ok=True)
    torch.set_num_threads(1)
    helpers.SESSION_ENV.update(os.environ)  # the CLI's zygotes start from it (helpers.cli)
    yield
    helpers.close_zygotes()


@pytest.fixture(autouse=True)
def own_wandb_service(monkeypatch):
    """Every test starts without ``WANDB_SERVICE``. A test that logs to W&B in the pytest process
    leaves that variable pointing at its service; a CLI started later would share the service,
    which outlives the CLI when a test kills it and then refuses the resumed run's id ("run ID
    ... is in use"). pytest-xdist mixes test files on a worker, so the order that hid this is gone."""
    monkeypatch.delenv("WANDB_SERVICE", raising=False)


# The files the workers start first, in this order (``--dist loadfile`` deals whole files, in the
# order of the collected items: ``--no-loadscope-reorder``, pyproject.toml; each worker starts with
# two, then takes the next as one ends). The SLURM tests first: for much of their ~6 minutes they
# wait on SLURM's timers, cron's minute and paced steps, so the other worker starts with the files
# that run two or more processes at once (ranks, workers, pip), which fill both cores meanwhile;
# the fault tests, which wait on paced steps themselves, come after them (beside the SLURM file
# they left the machine 16% idle). Then the longest, so no long one is left alone at the end.
# Sizes from a timeline of the suite (a 2-core AMD EPYC, 2026-12-03); the order decides only when
# a file runs, never what it runs or proves.
FIRST = ("end_to_end/test_slurm_cluster.py", "train/test_devices.py", "train/test_fast_step.py",
         "launch/test_workers.py", "end_to_end/test_rank_faults.py", "end_to_end/test_install.py",
         "end_to_end/test_faults.py", "train/test_tuning.py", "train/test_compiling.py",
         "end_to_end/test_first_steps.py", "speed/test_gpu_window.py",
         "end_to_end/test_offline_kit.py", "data/test_hub_snapshot.py")


def pytest_collection_modifyitems(config, items):
    """Files in the order of ``FIRST``, then those with slow tests (the real CLI), then the rest;
    within a file, its slow tests first. Each test file runs on one worker (``--dist loadfile``),
    its module fixtures built once."""
    slow_files = {_file(item) for item in items if item.get_closest_marker("slow")}

    def order(item) -> tuple[int, bool]:
        file = _file(item)
        rank = FIRST.index(file) if file in FIRST else len(FIRST) + (file not in slow_files)
        return rank, item.get_closest_marker("slow") is None

    items.sort(key=order)  # stable: the collection's order within each


def _file(item) -> str:
    return item.nodeid.split("::")[0].removeprefix("tests/")
