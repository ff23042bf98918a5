"""Secrets never stored: a password inside a URL, as an optuna ``--storage`` may hold one, is
written ``***`` in records, logs, W&B and tables, in either place a URL carries it: before the
host (``postgresql://user:secret@host/db`` -> ``user:***@host``) or in its query
(``...?password=secret``, ``?sslpassword=``, ``?token=``: the parameters libpq and the common
drivers read). The value of a credential in the environment (``WANDB_API_KEY``, ``HF_TOKEN``, any
variable named ``*KEY``, ``*TOKEN``, ``*PASSWORD``, ``*SECRET``) is ``***`` wherever it shows up too."""

from __future__ import annotations

import os
import re

_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s@/]*(?P<at>@)")
# a query parameter that holds a credential, in a URL's query (after "?" or "&")
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&](?:password|passwd|pwd|sslpassword|secret|token|access_token|api_key|apikey|key)=)"
    r"[^&#\s]*", flags=re.IGNORECASE)


_SECRET_NAME = re.compile(r"(KEY|TOKEN|PASSWORD|PASSWD|SECRET)$", flags=re.IGNORECASE)


def environment_secrets() -> list[str]:
    """Values of the environment's credentials (6 characters or more, longest first)."""
    return sorted({v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= 6},
                  key=len, reverse=True)


def mask(text: str) -> str:
    """``text`` with every password of a URL in it, and every credential of the environment,
    replaced by ``***``."""
    for value in environment_secrets():
        text = text.replace(value, "***")
    return _QUERY_SECRET.sub(r"\g<head>***", _PASSWORD.sub(r"\g<head>***\g<at>", text))
