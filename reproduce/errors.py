"""The errors a user sees as one line (``error: ...``, exit 2): what is wrong and what is allowed."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot be built; the message is one line naming the field and what is allowed."""


class DataError(ValueError):
    """A corpus, file or setting that cannot be used; the one-line message says what is allowed."""


class SpecError(ConfigError):
    """A sweep spec that cannot be used; the message names the file and the key."""


class ParsingDataError(DataError):
    """A treebank that cannot be found or read."""


class DamagedRecords(Exception):
    """Damaged records were set aside while rendering or counting: the command exits non-zero."""


class RankFailure(RuntimeError):
    """A multi-device run stopped because one of its ranks failed or was killed."""
