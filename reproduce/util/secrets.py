"""Secrets never stored: a password inside a URL (``postgresql://user:secret@host/db``, as an
optuna ``--storage`` may be) is written ``user:***@host`` in records, logs, W&B and tables."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s@/]*(?P<at>@)")


def mask(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _PASSWORD.sub(r"\g<head>***\g<at>", text)
