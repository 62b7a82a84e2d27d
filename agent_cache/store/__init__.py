"""Metadata stores: the ``MetadataStore`` protocol, an in-process store and Redis.

The Redis store (and the redis client library) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_cache.lazy import lazy_exports

from agent_cache.store.base import (
    DEFAULT_PREFIX,
    DEFAULT_SESSION_TTL,
    DEFAULT_TEMPLATE_WINDOW,
    AsyncMetadataStore,
    Lease,
    MetadataStore,
    ReleaseBatch,
    RouteQuery,
    RouteResult,
    WorkerSpec,
)
from agent_cache.store.memory import MemoryStore
from agent_cache.store.stats import format_stats, stats_snapshot

if TYPE_CHECKING:
    from agent_cache.store.redis_store import RedisStore, validate_redis_url

__getattr__ = lazy_exports(__name__, globals(), {"RedisStore": "agent_cache.store.redis_store",
                                                 "validate_redis_url": "agent_cache.store.redis_store"})


def open_store(url: str | None = None, **options: Any) -> MemoryStore | RedisStore:
    """``None`` or ``"memory"``: an in-process store; otherwise a Redis URL."""
    if url is None or url == "memory":
        return MemoryStore(**options)
    from agent_cache.store.redis_store import RedisStore

    return RedisStore(url, **options)


__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SESSION_TTL",
    "DEFAULT_TEMPLATE_WINDOW",
    "AsyncMetadataStore",
    "Lease",
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
