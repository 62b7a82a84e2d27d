"""Validation of the router's worker list and pool fractions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agent_cache.backends.sglang import normalize_worker_url
from agent_cache.errors import ConfigError

DEFAULT_POOL = "default"


@dataclass(frozen=True)
class WorkerConfig:
    url: str
    pool: str = DEFAULT_POOL


def parse_workers(workers: Sequence[str | Mapping[str, Any]]) -> list[WorkerConfig]:
    """Plain URLs (pool ``default``) or ``{"url": ..., "pool": ...}`` dicts."""
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        raise ConfigError("workers", f"expected a list of worker URLs or dicts, got {type(workers).__name__}")
    if not workers:
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
