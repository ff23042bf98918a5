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

from tests import helpers


@pytest.fixture(scope="session", autouse=True)
def offline_environment(tmp_path_factory):
    root = tmp_path_factory.mktemp("env")
    env = {
        "WANDB_MODE": "disabled", "WANDB_SILENT": "true", "WANDB_DIR": str(root / "wandb"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"), "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        # A process a test gives two threads (workers sharing the cores) shares them with the
        # other file's tests: an OpenMP thread that waits then sleeps instead of spinning on a
        # core another process needs (the same numbers; the workers test took 0.82x the CPU
        # seconds beside a busy core)
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    for key, value in env.items():
        os.environ[key] = value
    # Compiled kernels shared by every test and CLI (a run's own default, the project's cache, is
    # a new folder in most tests: each would compile afresh). Torch's default is what importing
    # its compiler sets, not a user's choice.
    from reproduce.train.step_time import INDUCTOR_CACHE_ENV, user_compile_cache

    if user_compile_cache() is None:
        os.environ[INDUCTOR_CACHE_ENV] = default_cache_dir() + "-tests"
    for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
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


def pytest_collection_modifyitems(config, items):
    """The slow tests (the real CLI) first, so no long one is left alone at the end; each test
    file runs on one worker (``--dist loadfile``, pyproject.toml), its module fixtures built
    once."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first
