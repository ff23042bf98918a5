"""Secrets never stored: a password inside a URL, as an optuna ``--storage`` may hold one, is
written ``***`` in records, logs, W&B and tables, in either place a URL carries it: before the
host (``postgresql://user:secret@host/db`` -> ``user:***@host``) or in its query
(``...?password=secret``, ``?sslpassword=``, ``?token=``: the parameters libpq and the common
drivers read)."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s@/]*(?P<at>@)")
# a query parameter that holds a credential, in a URL's query (after "?" or "&")
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&](?:password|passwd|pwd|sslpassword|secret|token|access_token|api_key|apikey|key)=)"
    r"[^&#\s]*", flags=re.IGNORECASE)


def mask(text: str) -> str:
    """``text`` with every password of a URL in it replaced by ``***``."""
    return _QUERY_SECRET.sub(r"\g<head>***", _PASSWORD.sub(r"\g<head>***\g<at>", text))
