"""Validation of the router's worker list, pool fractions, tenants and session ids."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agent_cache.backends.request_check import check_text
from agent_cache.backends.sglang import normalize_worker_url
from agent_cache.errors import ConfigError
from agent_cache.placement.rule import Policy
from agent_cache.values import DEFAULT_POOL

DEFAULT_PROBE_INTERVAL = 5.0  # seconds between active /health probes (Router, ChatSGLang with several workers, serve)
DEFAULT_MAX_ATTEMPTS = 3  # tries of a call across workers (Router, serve; ChatSGLang's max_retries is this less one)
# A session id is part of every store key of its session (three times in
# Redis); a longer one is stored as its SHA-256, never raw.
MAX_SESSION_ID = 256
# A tenant names keys, template ids and the worker's cache namespace (extra_key).
MAX_TENANT = 128


@dataclass(frozen=True)
class WorkerConfig:
    url: str
    pool: str = DEFAULT_POOL


def parse_workers(workers: Sequence[str | Mapping[str, Any]], *, allow_empty: bool = False) -> list[WorkerConfig]:
    """Plain URLs (pool ``default``) or ``{"url": ..., "pool": ...}`` dicts (none only with ``allow_empty``)."""
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        raise ConfigError("workers", f"expected a list of worker URLs or dicts, got {type(workers).__name__}")
    if not workers and not allow_empty:
        raise ConfigError("workers", "at least one worker is needed")
    out: list[WorkerConfig] = []
    seen: set[str] = set()
    for i, w in enumerate(workers):
        out.append(parse_worker(w, f"workers[{i}]"))
        if out[-1].url in seen:
            raise ConfigError(f"workers[{i}]", f"duplicate worker {out[-1].url}")
        seen.add(out[-1].url)
    return out


def parse_worker(w: str | Mapping[str, Any], field: str) -> WorkerConfig:
    if isinstance(w, str):
        return WorkerConfig(normalize_worker_url(w, field))
    if isinstance(w, Mapping):
        unknown = set(w) - {"url", "pool"}
        if unknown:
            raise ConfigError(field, f"unknown key(s) {sorted(unknown)}; known: pool, url")
        if "url" not in w:
            raise ConfigError(field, "missing 'url'")
        pool = w.get("pool", DEFAULT_POOL)
        if not isinstance(pool, str) or not pool:
            raise ConfigError(f"{field}.pool", f"expected a non-empty string, got {pool!r}")
        return WorkerConfig(normalize_worker_url(w["url"], field), pool)
    raise ConfigError(field, f"expected a URL string or a dict, got {type(w).__name__}")


def check_policy(policy: Policy) -> Policy:
    """``policy`` if its values make sense (ConfigError naming the field otherwise)."""
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if not math.isfinite(value):
            raise ConfigError(f"policy.{f.name}", f"must be a finite number, got {value}")
        if value < 0:
            raise ConfigError(f"policy.{f.name}", f"must not be negative, got {value}")
    if not policy.live_window > 0:
        raise ConfigError("policy.live_window", f"must be positive, got {policy.live_window}")
    if not policy.balance_factor >= 1:
        raise ConfigError("policy.balance_factor", f"must be at least 1 (the mean itself), got {policy.balance_factor}")
    return policy


def parse_pools(pools: Mapping[str, float] | None, known: set[str]) -> dict[str, float] | None:
    """Fractions of new sessions per pool; they must name known pools and sum to 1."""
    if pools is None:
        return None
    if not isinstance(pools, Mapping) or not pools:
        raise ConfigError("pools", "expected a non-empty mapping of pool name -> fraction")
    out: dict[str, float] = {}
    for name, frac in pools.items():
        if name not in known:
            raise ConfigError("pools", f"pool {name!r} has no workers; pools with workers: {sorted(known)}")
        if not isinstance(frac, (int, float)) or not 0 <= frac <= 1 or math.isnan(frac):
            raise ConfigError("pools", f"fraction of {name!r} must be within [0, 1], got {frac!r}")
        out[name] = float(frac)
    if abs(sum(out.values()) - 1.0) > 1e-6:
        raise ConfigError("pools", f"fractions must sum to 1, got {sum(out.values())}")
    return out


def check_tenant(tenant: object, field: str = "tenant") -> str:
    """A tenant: a non-empty string of printable characters, at most :data:`MAX_TENANT` long."""
    if not isinstance(tenant, str) or not tenant:
        raise ConfigError(field, f"expected a non-empty string, got {tenant!r}")
    if len(tenant) > MAX_TENANT:
        raise ConfigError(field, f"at most {MAX_TENANT} characters, got {len(tenant)}")
    if not tenant.isprintable():  # refuses lone surrogates too (not UTF-8): a configuration error, not a request's
        raise ConfigError(field, f"must not contain control characters, got {tenant!r}")
    return tenant


def session_key(session_id: str) -> str:
    """The id a session is stored under: itself, or ``sha256:<hex>`` when longer than :data:`MAX_SESSION_ID`."""
    check_text(session_id, "session_id")
    if len(session_id) <= MAX_SESSION_ID:
        return session_id
    return "sha256:" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def check_router_args(max_attempts: int, probe_interval: float | None, release_delay: float, lease: float) -> None:
    """A :class:`~agent_cache.routing.router.Router`'s numeric arguments, each named when it is wrong."""
    if max_attempts < 1:
        raise ConfigError("max_attempts", f"must be >= 1, got {max_attempts}")
    if probe_interval is not None and probe_interval <= 0:
        raise ConfigError("probe_interval", f"must be > 0 or None, got {probe_interval}")
    if not isinstance(release_delay, (int, float)) or release_delay < 0:
        raise ConfigError("release_delay", f"must be a number of seconds >= 0, got {release_delay!r}")
    if not isinstance(lease, (int, float)) or lease <= 0:
        raise ConfigError("lease", f"must be a number of seconds > 0, got {lease!r}")
