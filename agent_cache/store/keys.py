"""Redis key layout.

Every key of one deployment shares the hash tag ``{<prefix>}``, so each Lua
script touches a single Redis Cluster slot. Trade-off: one deployment lives on
one shard (no write scaling inside a deployment; a single Redis core handles
far more decisions per second than a fleet makes), in exchange for global
per-worker load counters that every tenant's decision reads atomically.
Separate deployments (prefixes) spread over shards.

Tenants are percent-encoded so ``:`` in a tenant cannot collide with the
separator; session and template ids follow the last separator verbatim.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import quote


def tag(prefix: str) -> str:
    return "{" + prefix + "}"


def member(tenant: str, ident: str) -> str:
    """A tenant-namespaced id: used inside keys and as a set member."""
    return _quoted(tenant) + ":" + ident


@lru_cache(maxsize=4096)
def _quoted(tenant: str) -> str:  # a handful of tenants, quoted on every decision
    return quote(tenant, safe="")


def session(prefix: str, tenant: str, session_id: str) -> str:
    return f"{tag(prefix)}:s:{member(tenant, session_id)}"


def template(prefix: str, tenant: str, template_id: str) -> str:
    """Sorted set: worker -> last time it served the template (ms)."""
    return f"{tag(prefix)}:t:{member(tenant, template_id)}"


def template_stats(prefix: str, tenant: str, template_id: str) -> str:
    return f"{tag(prefix)}:ts:{member(tenant, template_id)}"


def template_info(prefix: str, tenant: str, template_id: str) -> str:
    return f"{tag(prefix)}:ti:{member(tenant, template_id)}"


def template_sessions(prefix: str, tenant: str, template_id: str) -> str:
    """HyperLogLog of session ids that used the template (bounded memory)."""
    return f"{tag(prefix)}:tis:{member(tenant, template_id)}"


def worker(prefix: str, url: str) -> str:
    """Hash: state, capacity, live session count, prompt and cached token totals."""
    return f"{tag(prefix)}:w:{url}"


def inflight(prefix: str) -> str:
    """Hash: worker URL -> calls in flight (one read gives the whole pool's load)."""
    return f"{tag(prefix)}:inflight"


def leases(prefix: str) -> str:
    """Sorted set: router source -> when its lease on its in-flight counts ends (ms)."""
    return f"{tag(prefix)}:leases"


def lease(prefix: str, source: str) -> str:
    """Hash: worker URL -> calls one router (source) has in flight there."""
    return f"{tag(prefix)}:lease:{source}"


def kv_tokens(prefix: str) -> str:
    """Hash: worker URL -> footprint, the KV tokens held by its live sessions (used within the live window)."""
    return f"{tag(prefix)}:kv"


def live_sessions(prefix: str) -> str:
    """Hash: worker URL -> sessions counted in its footprint."""
    return f"{tag(prefix)}:an"


def live(prefix: str) -> str:
    """Sorted set: every pinned session (tenant-namespaced) -> last use (ms); the route script expires from it."""
    return f"{tag(prefix)}:live"


def active(prefix: str) -> str:
    """Sorted set: the sessions counted in a footprint -> last use (ms); quiet ones leave the count."""
    return f"{tag(prefix)}:act"


def workers_set(prefix: str) -> str:
    return f"{tag(prefix)}:workers"


def templates_in_use(prefix: str) -> str:
    """Sorted set: template member -> last use (ms); members past the template retention are dropped."""
    return f"{tag(prefix)}:tu"


def outcomes(prefix: str) -> str:
    return f"{tag(prefix)}:outcomes"


def usage(prefix: str) -> str:
    """Hash: ``uncached`` prompt tokens of every reported call, summed, and ``calls`` reported."""
    return f"{tag(prefix)}:use"
