"""Where Weights & Biases logs go, one rule for training, tuning, tables and ``publish``: online
with an API key, offline without one (``wandb sync`` uploads later), nowhere with
``WANDB_MODE=disabled`` (W&B's own switch; ``dryrun`` is its old word for offline)."""

from __future__ import annotations

import os

MODES = ("online", "offline", "disabled")


def wandb_mode() -> str:
    mode = os.environ.get("WANDB_MODE", "")
    if mode == "disabled":
        return "disabled"
    if os.environ.get("WANDB_API_KEY") and mode not in ("offline", "dryrun"):
        return "online"
    return "offline"
