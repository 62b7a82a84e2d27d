"""Routing policies compared by the fleet simulation.

Every policy answers one question per call: which worker? Policies with
local state (round-robin counters, least-load in-flight views) run as K
router replicas, each with its own view; calls are assigned to replicas
round-robin, as a load balancer in front of K router pods would. agent-cache
shares one store across replicas (Redis in production), so its replicas see
one state and are modelled as one.

``agent-cache`` calls the real placement rule
(:func:`agent_cache.routing.placement.choose_worker`) on a snapshot of the
simulated fleet, with template ids from the real Templater.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from typing import Protocol, Sequence

from agent_cache.routing.placement import PinView, Policy, Snapshot, WorkerView, choose_worker


class FleetView(Protocol):
    """What a router may observe of the fleet (the store's counters, for agent-cache)."""

    n: int
    capacity: int

    def inflight(self, i: int) -> int: ...

    def kv_tokens(self, i: int) -> int: ...


class RoutingPolicy:
    """Base: ``form`` is the prompt form sent ("raw" or "tmpl"); ``cache`` the worker cache model."""

    name = "base"
    form = "raw"
    cache = "radix"  # radix | none | oracle
    moves = 0

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        self.workers = workers
        self.replicas = max(1, replicas)
        self.seed = seed

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        raise NotImplementedError

    def completed(self, replica: int, worker: int, session_id: str, cached: int) -> None:
        """A call dispatched by ``replica`` to ``worker`` returned with ``cached`` prompt tokens."""

    def session_done(self, session_id: str) -> None:
        """The session ended (pins expire)."""


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        self._next = [0] * self.replicas

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        i = self._next[replica]
        self._next[replica] = (i + 1) % self.workers
        return i


class RandomChoice(RoutingPolicy):
    name = "random"

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        self._rng = random.Random(seed)

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        return self._rng.randrange(self.workers)


class LeastLoad(RoutingPolicy):
    """Fewest in-flight calls, as each replica counts its own dispatches."""

    name = "least-load"

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        self._inflight = [[0] * workers for _ in range(self.replicas)]

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        view = self._inflight[replica]
        i = view.index(min(view))
        view[i] += 1
        return i

    def completed(self, replica: int, worker: int, session_id: str, cached: int) -> None:
        self._inflight[replica][worker] -= 1


def _hash(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class ConsistentHash(RoutingPolicy):
    """Session id on a hash ring (100 virtual nodes per worker); stateless."""

    name = "consistent-hash"
    vnodes = 100

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        ring = sorted((_hash(f"w{w}#{v}"), w) for w in range(workers) for v in range(self.vnodes))
        self._keys = [k for k, _ in ring]
        self._owners = [w for _, w in ring]
        self._memo: dict[str, int] = {}

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        w = self._memo.get(session_id)
        if w is None:
            i = bisect.bisect(self._keys, _hash(session_id)) % len(self._keys)
            w = self._memo[session_id] = self._owners[i]
        return w

    def session_done(self, session_id: str) -> None:
        self._memo.pop(session_id, None)


class AgentCache(RoutingPolicy):
    """The real placement rule over one shared store: pins, template holders, fleet load."""

    name = "agent-cache"
    form = "tmpl"

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0, policy: Policy = Policy()) -> None:
        super().__init__(workers, replicas, seed)
        self.policy = policy
        self._urls = [f"w{i}" for i in range(workers)]
        self._index = {u: i for i, u in enumerate(self._urls)}
        self._pins: dict[str, PinView] = {}
        self._templates: dict[str, set[str]] = {}
        self.moves = 0

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        views = tuple(WorkerView(u, inflight=fleet.inflight(i), kv_tokens=fleet.kv_tokens(i), capacity=fleet.capacity)
                      for i, u in enumerate(self._urls))
        pin = self._pins.get(session_id)
        holders = self._templates.setdefault(template_id, set())
        d = choose_worker(Snapshot(views, pin, frozenset(holders)), session_id, self.policy)
        assert d.worker is not None  # every simulated worker is up
        if d.outcome.startswith("moved"):
            self.moves += 1
        if pin is None or pin.worker != d.worker:
            self._pins[session_id] = PinView(d.worker, d.epoch, 0, 0)
        holders.add(d.worker)
        return self._index[d.worker]

    def completed(self, replica: int, worker: int, session_id: str, cached: int) -> None:
        pin = self._pins.get(session_id)
        if pin is not None:
            self._pins[session_id] = PinView(pin.worker, pin.epoch, cached, pin.last_cached)

    def session_done(self, session_id: str) -> None:
        self._pins.pop(session_id, None)


class AgentCacheNoTemplates(AgentCache):
    """Same rule; prompts sent raw, template ids from ``Templater("off")``."""

    name = "agent-cache-no-templates"
    form = "raw"


class Oracle(LeastLoad):
    """Upper bound: one infinite cache every worker shares; routed by true load."""

    name = "oracle"
    form = "tmpl"
    cache = "oracle"

    def route(self, session_id: str, template_id: str, fleet: FleetView, replica: int) -> int:
        loads = [fleet.inflight(i) for i in range(self.workers)]
        return loads.index(min(loads))

    def completed(self, replica: int, worker: int, session_id: str, cached: int) -> None:
        pass


class NoCache(Oracle):
    """Floor: prefix caching disabled on every worker; routed by true load."""

    name = "no-cache"
    form = "raw"
    cache = "none"


POLICIES: dict[str, type[RoutingPolicy]] = {p.name: p for p in (
    RoundRobin, RandomChoice, LeastLoad, ConsistentHash, AgentCache, AgentCacheNoTemplates, Oracle, NoCache)}


def make_policies(names: Sequence[str], workers: int, replicas: int, seed: int) -> list[RoutingPolicy]:
    return [POLICIES[n](workers, replicas, seed) for n in names]
