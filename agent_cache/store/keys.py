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

from collections.abc import Callable
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


def _tenant_key(suffix: str, doc: str = "") -> Callable[[str, str, str], str]:
    """A key per tenant's session or template: ``{prefix}:<suffix>:<tenant>:<id>``."""

    def key(prefix: str, tenant: str, ident: str) -> str:
        return f"{tag(prefix)}:{suffix}:{member(tenant, ident)}"

    key.__doc__ = doc
    return key


def _named_key(suffix: str, doc: str) -> Callable[[str, str], str]:
    """A key per named thing (worker URL, router source): ``{prefix}:<suffix>:<name>``."""

    def key(prefix: str, name: str) -> str:
        return f"{tag(prefix)}:{suffix}:{name}"

    key.__doc__ = doc
    return key


def _deployment_key(suffix: str, doc: str) -> Callable[[str], str]:
    """The deployment's one key of its kind: ``{prefix}:<suffix>``."""

    def key(prefix: str) -> str:
        return f"{tag(prefix)}:{suffix}"

    key.__doc__ = doc
    return key


session = _tenant_key("s", "Hash: a pinned session's worker, epoch, cached-token history and footprint.")
template = _tenant_key("t", "Sorted set: worker -> last time it served the template (ms).")
template_stats = _tenant_key("ts", "Hash: prompt and cached token totals of the calls on the template.")
template_info = _tenant_key("ti", "Hash: when the template was first seen and its token length.")
template_sessions = _tenant_key("tis", "HyperLogLog of session ids that used the template (bounded memory).")

worker = _named_key("w", "Hash: state, capacity, live session count, prompt and cached token totals.")
lease = _named_key("lease", "Hash: worker URL -> calls one router (source) has in flight there.")

inflight = _deployment_key("inflight", "Hash: worker URL -> calls in flight (one read gives the whole pool's load).")
leases = _deployment_key("leases", "Sorted set: router source -> when its lease on its in-flight counts ends (ms).")
kv_tokens = _deployment_key(
    "kv", "Hash: worker URL -> footprint, the KV tokens held by its live sessions (used within the live window)."
)
live_sessions = _deployment_key("an", "Hash: worker URL -> sessions counted in its footprint.")
live = _deployment_key(
    "live", "Sorted set: every pinned session (tenant-namespaced) -> last use (ms); the route script expires from it."
)
active = _deployment_key(
    "act", "Sorted set: the sessions counted in a footprint -> last use (ms); quiet ones leave the count."
)
workers_set = _deployment_key("workers", "Set: the URL of every worker a session was ever pinned to.")
templates_in_use = _deployment_key(
    "tu", "Sorted set: template member -> last use (ms); members past the template retention are dropped."
)
outcomes = _deployment_key("outcomes", "Hash: routing outcome -> decisions that had it.")
usage = _deployment_key("use", "Hash: ``uncached`` prompt tokens of every reported call, summed, and ``calls`` reported.")
