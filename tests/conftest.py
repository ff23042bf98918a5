"""Offline, quiet and contained: W&B offline into a temp dir, no hub access, one torch thread
per test process (tests that start the CLI run one subprocess at a time)."""

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def offline_environment(tmp_path_factory):
    root = tmp_path_factory.mktemp("env")
    env = {
        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(root / "wandb"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"), "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
    }
    for key, value in env.items():
        os.environ[key] = value
    for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        os.makedirs(env[key], exist_ok=True)
    torch.set_num_threads(1)
    yield
