"""What the command line prints: our progress lines on stdout, the libraries' chatter silenced
(one list, used by every command that trains)."""

from __future__ import annotations

import logging
import sys
import warnings

from reproduce.util.secrets import mask

LIBRARY_LOGGERS = ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric")
# Warnings that say nothing to a user of this harness: our loaders batch in the main process by
# design, ranks sync dev metrics we already gathered, a torch/lightning deprecation notice, a
# resume finding its own checkpoints, and Lightning's advice to prepend `srun` on a machine with
# SLURM (a local run is local by choice; `--launcher slurm` submits).
IGNORED_WARNINGS = (".*does not have many workers.*", ".*on_validation_epoch_end.*sync_dist.*",
                    ".*all_gather is deprecated.*", ".*GPU available but not used.*",
                    ".*no `val_dataloader`.*", ".*LeafSpec.*is deprecated.*",
                    "Checkpoint directory .* exists and is not empty",
                    "The `srun` command is available on your system but is not used")


class MaskSecrets(logging.Filter):
    """Every line logged goes out with its secrets as ``***`` (``secrets.mask``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = mask(record.getMessage()), None
        return True


def quiet_libraries(level: int = logging.WARNING) -> None:
    """Our log lines (logger ``reproduce``) as plain lines on stdout; libraries at ``level``."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, MaskSecrets) for f in handler.filters):
            handler.addFilter(MaskSecrets())
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for message in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
