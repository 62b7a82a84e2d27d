"""The placement rule and the hashing every process shares: pure functions, no I/O.

At the bottom of the package: the stores (:mod:`agent_cache.store`) and the
router (:mod:`agent_cache.routing`) both import it, and it imports neither.
"""

from agent_cache.placement.hashing import pool_for_session, rendezvous_pick, rendezvous_score
from agent_cache.placement.rule import (
    DOWN,
    DRAINING,
    UP,
    Decision,
    PinView,
    Policy,
    Scale,
    Snapshot,
    WorkerView,
    choose_worker,
    cost,
    expected_footprint,
    mean_session,
    projected,
    quiet_after,
    scale_of,
)

__all__ = [
    "DOWN", "DRAINING", "UP", "Decision", "PinView", "Policy", "Scale", "Snapshot", "WorkerView", "choose_worker",
    "cost", "expected_footprint", "mean_session", "pool_for_session", "projected", "quiet_after", "rendezvous_pick",
    "rendezvous_score", "scale_of",
]
