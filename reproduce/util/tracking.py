"""Where Weights & Biases logs go, one rule for training, tuning, tables and ``publish``: online
with an API key, offline without one (``wandb sync`` uploads later), nowhere with
``WANDB_MODE=disabled`` (W&B's own switch; ``dryrun`` is its old word for offline).

Online, an unreachable server is no outage: a run waits at most ``WANDB_INIT_TIMEOUT`` seconds
(default 30) for W&B, then logs offline (one warning line) and so does the rest of the command."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reproduce.errors import one_line

log = logging.getLogger("reproduce")
INIT_TIMEOUT_ENV = "WANDB_INIT_TIMEOUT"


def wandb_mode() -> str:
    """``online``, ``offline`` or ``disabled``, by the rule above."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode == "disabled":
        return "disabled"
    if os.environ.get("WANDB_API_KEY") and mode not in ("offline", "dryrun"):
        return "online"
    return "offline"


def project() -> str:
    """The W&B project: ``WANDB_PROJECT``, else ``reproduce``."""
    return os.environ.get("WANDB_PROJECT") or "reproduce"


def run_group(default: str) -> str:
    """A W&B run's group: ``WANDB_RUN_GROUP`` where the user set it, else ``default``."""
    return os.environ.get("WANDB_RUN_GROUP") or default


def wandb_dir(default: Path) -> Path:
    """Where a W&B run's folder goes (W&B adds ``wandb/`` under it): ``WANDB_DIR`` where the user
    set it, else ``default`` (a run's own folder: ``runs/<table>/<run>/``)."""
    return Path(os.environ["WANDB_DIR"]) if os.environ.get("WANDB_DIR") else default


def init_timeout() -> float:
    """Seconds an online run waits for W&B's server before going on offline; a value that is
    not a number of seconds above 0 is one line (``ConfigError``), not a silent default."""
    from reproduce.config import seconds_from_env

    return seconds_from_env(INIT_TIMEOUT_ENV, 30.0, "how long an online run waits for W&B "
                            "before logging offline")


def init_run(what: str, folder: Path, group: str, **kwargs: Any):
    """``wandb.init(**kwargs)`` in ``wandb_mode()``'s mode (never ``disabled``): online within
    ``init_timeout()`` seconds, else offline, with one warning line, for the rest of this command
    too (``WANDB_MODE=offline``: no second wait). In ``project()``, in ``run_group(group)``, its
    files under ``wandb_dir(folder)`` (made here). Returns the run."""
    where = wandb_dir(folder)
    where.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")  # its three lines a run: what records say
    with _masked_argv():  # W&B keeps the command line in its run files (wandb-metadata.json)
        return _init(what, project=project(), group=run_group(group), dir=str(where), **kwargs)


@contextmanager
def _masked_argv() -> Iterator[None]:
    """``sys.argv`` with passwords and credentials masked (``secrets.mask``) while W&B reads it."""
    from reproduce.util.secrets import mask

    saved = sys.argv
    sys.argv = [mask(arg) for arg in saved]
    try:
        yield
    finally:
        sys.argv = saved


def _init(what: str, **kwargs: Any):
    import wandb

    if wandb_mode() == "online":
        try:
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=init_timeout()),
                              **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure to reach W&B: log offline instead
            log.warning("%s: W&B is unreachable (%s); logging offline under %s instead "
                        "(`wandb sync` uploads it later), and so does the rest of this command",
                        what, one_line(e, 160), kwargs.get("dir", "wandb/"))
            os.environ["WANDB_MODE"] = "offline"
            wandb.teardown()  # the failed run still holds its id in W&B's service process
    return wandb.init(mode="offline", **kwargs)
