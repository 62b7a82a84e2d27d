"""Metadata stores: the ``MetadataStore`` protocol, an in-process store and Redis."""

from __future__ import annotations

from typing import Any

from agent_cache.store.base import (
    DEFAULT_PREFIX,
    DEFAULT_SESSION_TTL,
    DEFAULT_TEMPLATE_WINDOW,
    AsyncMetadataStore,
    MetadataStore,
    ReleaseBatch,
    RouteQuery,
    RouteResult,
    WorkerSpec,
)
from agent_cache.store.memory import MemoryStore
from agent_cache.store.redis_store import RedisStore, validate_redis_url
from agent_cache.store.stats import format_stats, stats_snapshot


def open_store(url: str | None = None, **options: Any) -> MemoryStore | RedisStore:
    """``None`` or ``"memory"``: an in-process store; otherwise a Redis URL."""
    if url is None or url == "memory":
        return MemoryStore(**options)
    return RedisStore(url, **options)


__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SESSION_TTL",
    "DEFAULT_TEMPLATE_WINDOW",
    "AsyncMetadataStore",
    "MemoryStore",
    "MetadataStore",
    "RedisStore",
    "ReleaseBatch",
    "RouteQuery",
    "RouteResult",
    "WorkerSpec",
    "format_stats",
    "open_store",
    "stats_snapshot",
    "validate_redis_url",
]
