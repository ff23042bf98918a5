"""Where Weights & Biases logs go, one rule for training, tuning, tables and ``publish``: online
with an API key, offline without one (``wandb sync`` uploads later), nowhere with
``WANDB_MODE=disabled`` (W&B's own switch; ``dryrun`` is its old word for offline)."""

from __future__ import annotations

import os


def wandb_mode() -> str:
    """``online``, ``offline`` or ``disabled``, by the rule above."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode == "disabled":
        return "disabled"
    if os.environ.get("WANDB_API_KEY") and mode not in ("offline", "dryrun"):
        return "online"
    return "offline"
