"""Redis key layout.

Every key of one deployment shares the hash tag ``{<prefix>}``, so each Lua
script touches a single Redis Cluster slot. Trade-off: one deployment lives on
one shard (no write scaling inside a deployment; a single Redis core handles
far more decisions per second than a fleet makes), in exchange for global
per-worker load counters that every tenant's decision reads atomically.
Separate deployments (prefixes) spread over shards.

Tenants are percent-encoded so ``:`` in a tenant cannot collide with the
separator; session and template ids follow the last separator verbatim.

Every key of a deployment is named here, the gateway's rate limits and the
fleet board included, and the Lua scripts build none of their own (``lua.py``
writes their key layout from this module).
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import quote

from agent_cache.errors import ConfigError


def tag(prefix: str) -> str:
    return "{" + prefix + "}"


def check_prefix(prefix: str) -> str:
    """``prefix`` if it can name a deployment (non-empty, no braces: it is the hash tag); else ConfigError."""
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ConfigError("prefix", f"prefix must be non-empty without braces, got {prefix!r}")
    return prefix


def member(tenant: str, ident: str) -> str:
    """A tenant-namespaced id: used inside keys and as a set member."""
    return _quoted(tenant) + ":" + ident


@lru_cache(maxsize=4096)
def _quoted(tenant: str) -> str:  # a handful of tenants, quoted on every decision
    return quote(tenant, safe="")


class _Key:
    """A kind of key: ``{prefix}:<suffix>...``; ``suffix`` is also what the Lua scripts build such keys with
    (store/lua.py). Each kind below names its keys its own way."""

    def __init__(self, suffix: str, doc: str) -> None:
        self.suffix = suffix
        self.__doc__ = doc


class _TenantKey(_Key):
    """A key per tenant's session or template: ``{prefix}:<suffix>:<tenant>:<id>``."""

    def __call__(self, prefix: str, tenant: str, ident: str) -> str:
        return f"{tag(prefix)}:{self.suffix}:{member(tenant, ident)}"


class _NamedKey(_Key):
    """A key per named thing (worker URL, router source): ``{prefix}:<suffix>:<name>``."""

    def __call__(self, prefix: str, name: str) -> str:
        return f"{tag(prefix)}:{self.suffix}:{name}"


class _DeploymentKey(_Key):
    """The deployment's one key of its kind: ``{prefix}:<suffix>``."""

    def __call__(self, prefix: str) -> str:
        return f"{tag(prefix)}:{self.suffix}"


class _TenantWideKey(_Key):
    """A key per tenant: ``{prefix}:<suffix>:<tenant>:`` (the tenant-namespaced empty id)."""

    def __call__(self, prefix: str, tenant: str) -> str:
        return f"{tag(prefix)}:{self.suffix}:{member(tenant, '')}"


session = _TenantKey("s", "Hash: a pinned session's worker, epoch, cached-token history and footprint.")
template = _TenantKey("t", "Sorted set: worker -> last time it served the template (ms).")
template_stats = _TenantKey("ts", "Hash: prompt and cached token totals of the calls on the template.")
template_info = _TenantKey("ti", "Hash: when the template was first seen and its token length.")
template_sessions = _TenantKey("tis", "HyperLogLog of session ids that used the template (bounded memory).")

worker = _NamedKey("w", "Hash: state, capacity, live session count, prompt and cached token totals.")
lease = _NamedKey("lease", "Hash: worker URL -> calls one router (source) has in flight there.")
releases_applied = _NamedKey(
    "rel", "Hash: worker URL -> the last running release total applied from one router (source): a batch sent "
           "twice counts once."
)

inflight = _DeploymentKey("inflight", "Hash: worker URL -> calls in flight (one read gives the whole pool's load).")
leases = _DeploymentKey("leases", "Sorted set: router source -> when its lease on its in-flight counts ends (ms).")
kv_tokens = _DeploymentKey(
    "kv", "Hash: worker URL -> footprint, the KV tokens held by its live sessions (used within the live window)."
)
live_sessions = _DeploymentKey("an", "Hash: worker URL -> sessions counted in its footprint.")
live = _DeploymentKey(
    "live", "Sorted set: every pinned session (tenant-namespaced) -> last use (ms); the route script expires from it."
)
active = _DeploymentKey(
    "act", "Sorted set: the sessions counted in a footprint -> last use (ms); quiet ones leave the count."
)
workers_set = _DeploymentKey("workers", "Set: the URL of every worker a session was ever pinned to.")
templates_in_use = _DeploymentKey(
    "tu", "Sorted set: template member -> last use (ms); members past the template retention are dropped."
)
outcomes = _DeploymentKey("outcomes", "Hash: routing outcome -> decisions that had it.")
usage = _DeploymentKey("use", "Hash: ``uncached`` prompt tokens of every reported call, summed, and ``calls`` reported.")
fleet = _DeploymentKey(
    "fleet", "Hash: worker URL -> its fleet board entry (pool, state, since, source; store/fleet_board.py)."
)

rate_requests = _TenantWideKey("rl:r", "Hash: second -> requests of the tenant admitted then (gateway/ratelimit.py).")
rate_tokens = _TenantWideKey("rl:t", "Hash: second -> tokens of the tenant's calls admitted then.")
rate_replicas = _DeploymentKey("rl:replicas", "Sorted set: gateway replica -> until when it counts in the shares (ms).")

# The store scripts' keys (store/lua.py writes their Lua side from these, so each layout is defined once).
# Fixed keys are declared: every script call gets these first, in this order (``K.<name>`` in Lua), so
# Redis Cluster and ACL key patterns see each fixed key a script touches; the script's own keys follow.
SCRIPT_KEYS: dict[str, _DeploymentKey] = {
    "inflight": inflight, "leases": leases, "kv_tokens": kv_tokens, "live_sessions": live_sessions, "live": live,
    "active": active, "workers_set": workers_set, "templates_in_use": templates_in_use, "outcomes": outcomes,
    "usage": usage,
}
# Keys a script names only as it runs (a purged session, its worker, another router's lease): built there on
# the hash tag by one function per kind, ``<name>_key(name)``; they share the declared keys' Cluster slot.
SCRIPT_FAMILIES: dict[str, _TenantKey | _NamedKey] = {
    "session": session, "worker": worker, "template": template, "template_stats": template_stats,
    "template_info": template_info, "template_sessions": template_sessions, "lease": lease,
    "releases_applied": releases_applied,
}


@lru_cache(maxsize=64)
def script_keys(prefix: str) -> tuple[str, ...]:
    """The declared keys of every store script call of the deployment ``prefix``, in ``SCRIPT_KEYS`` order."""
    return tuple(key(prefix) for key in SCRIPT_KEYS.values())
