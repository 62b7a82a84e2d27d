"""Routing: session pins, placement through the store, health, failover.

The placement rule itself is :mod:`agent_cache.placement` (pure, no I/O);
``Policy`` is re-exported here because ``Router(policy=...)`` takes it.
"""

from agent_cache.placement import Policy
from agent_cache.routing.router import Placement, RouteRequest, Router

__all__ = ["Placement", "Policy", "RouteRequest", "Router"]
