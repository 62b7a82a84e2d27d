"""Credentials out of anything shown: URLs with a password become ``user:***@host``."""

from __future__ import annotations

import re

# userinfo "user:password@" (or ":password@") before the last "@" of the authority, and
# password=... in a query string
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@]*):(?P<secret>[^/]*)@")
_QUERY = re.compile(r"(?P<key>[?&](?:password|sentinel_password)=)(?P<secret>[^&#]*)", re.IGNORECASE)


def redact_url(url: object) -> str:
    """``url`` as text with any password replaced by ``***`` (safe for errors, logs and CLI output)."""
    text = str(url)
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _QUERY.sub(lambda m: f"{m['key']}***", text)
