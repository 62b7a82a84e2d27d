"""The ``AGENT_CACHE_*`` environment variables: the one place they are read (table in docs/configuration.md).

Each is a default only: an option given in code or on the command line wins.
"""

from __future__ import annotations

import os

BASE_URL = "AGENT_CACHE_BASE_URL"  # one worker URL
WORKERS = "AGENT_CACHE_WORKERS"  # comma-separated worker URLs
API_KEY = "AGENT_CACHE_API_KEY"  # bearer token for the workers
REDIS_URL = "AGENT_CACHE_REDIS_URL"  # the metadata store


def value(name: str) -> str | None:
    """The variable's value, or None when it is unset or blank."""
    raw = os.environ.get(name, "").strip()
    return raw or None


def workers() -> list[str] | None:
    """``AGENT_CACHE_WORKERS`` as a list of URLs, or None."""
    raw = value(WORKERS)
    if raw is None:
        return None
    urls = [u.strip() for u in raw.split(",") if u.strip()]
    return urls or None
