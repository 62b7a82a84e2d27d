"""Routing: session pins, template-aware bounded-load placement, health, failover.

``Router`` is imported lazily: :mod:`agent_cache.store` depends on
:mod:`agent_cache.routing.placement`, and the router depends on the store.
"""

from __future__ import annotations

from typing import Any

from agent_cache.routing.placement import Decision, Policy, Snapshot, WorkerView, choose_worker

_LAZY = {"Router", "RouteRequest", "Placement"}

__all__ = ["Decision", "Placement", "Policy", "RouteRequest", "Router", "Snapshot", "WorkerView", "choose_worker"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from agent_cache.routing import router

        return getattr(router, name)
    raise AttributeError(name)
