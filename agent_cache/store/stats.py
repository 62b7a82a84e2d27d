"""A read-only summary of a store for humans and the ``agent-cache stats`` command."""

from __future__ import annotations

import time
from typing import Any

from agent_cache.store.base import MetadataStore


def _rate(cached: int, prompt: int) -> float | None:
    return cached / prompt if prompt else None


def stats_snapshot(store: MetadataStore, now: float | None = None) -> dict[str, Any]:
    """Workers, live sessions, templates and hit rates (cached / prompt tokens)."""
    raw = store.stats(time.time() if now is None else now)
    for w in raw["workers"].values():
        w["hit_rate"] = _rate(w["cached_tokens"], w["prompt_tokens"])
    for t in raw["templates"].values():
        t["hit_rate"] = _rate(t["cached_tokens"], t["prompt_tokens"])
    prompt = sum(w["prompt_tokens"] for w in raw["workers"].values())
    cached = sum(w["cached_tokens"] for w in raw["workers"].values())
    raw["hit_rate"] = _rate(cached, prompt)
    moves = {k.split(":", 1)[1]: v for k, v in raw["outcomes"].items() if k.startswith("moved:")}
    raw["moves"] = moves
    return raw


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_stats(snapshot: dict[str, Any]) -> str:
    """Plain-text tables of :func:`stats_snapshot` output."""
    lines = [f"sessions: {snapshot['sessions']}   hit rate: {_pct(snapshot['hit_rate'])}", "", "workers:"]
    lines.append(f"  {'url':40} {'state':9} {'sessions':>8} {'inflight':>8} {'kv_tokens':>10} {'hit':>7}")
    for url, w in sorted(snapshot["workers"].items()):
        lines.append(
            f"  {url:40} {w['state']:9} {w['sessions']:>8} {w['inflight']:>8} {w['kv_tokens']:>10} "
            f"{_pct(w['hit_rate']):>7}"
        )
    shown, total = len(snapshot["templates"]), snapshot.get("templates_in_window", len(snapshot["templates"]))
    lines += ["", "templates:" if shown == total else f"templates ({shown} most recently used of {total}):"]
    for name, t in sorted(snapshot["templates"].items()):
        lines.append(f"  {name:40} hit {_pct(t['hit_rate']):>7}  workers: {', '.join(t['workers']) or '-'}")
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(snapshot["outcomes"].items())) or "-"
    lines += ["", f"decisions: {outcomes}"]
    return "\n".join(lines)
