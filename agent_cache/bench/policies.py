"""Routing policies compared by the fleet simulation (named, and built, by :mod:`agent_cache.bench.registry`).

Every policy answers one question per call: which worker? Baselines with
local state (round-robin counters, least-load in-flight views) run as K
router replicas, each with its own view; calls are assigned to replicas
round-robin, as a load balancer in front of K router pods would.

``agent-cache`` is not a model of the product: it is the product's own
:class:`~agent_cache.routing.Router`, one per replica, over one shared
metadata store (the in-process :class:`~agent_cache.store.MemoryStore`, or
Redis with its Lua scripts), on the simulation's virtual clock. It learns
only what a deployment learns: each call's template id and template length
from the real Templater, and each finished call's reported prompt and
cached tokens; worker capacities are what ``/server_info`` would report.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import uuid
from typing import Any, Protocol, Sequence

from agent_cache.kv import KvView
from agent_cache.kv.events import KVEventBatch
from agent_cache.placement.rule import Policy
from agent_cache.routing.config import session_key
from agent_cache.routing.router import Placement, RouteRequest, Router
from agent_cache.store.base import MetadataStore
from agent_cache.store.memory import MemoryStore


class FleetView(Protocol):
    """What an oracle may observe of the fleet: true in-flight calls per worker."""

    n: int

    def inflight(self, i: int) -> int: ...


class Dispatch:
    """One call as a router sees it when it is sent; ``handle`` is the policy's own record of it."""

    __slots__ = ("session_id", "tenant", "template_id", "template_tokens", "replica", "handle", "template_token_ids",
                 "last_message_ids", "first_message_ids")

    def __init__(self, session_id: str, tenant: str, template_id: str, template_tokens: int, replica: int) -> None:
        self.session_id = session_id
        self.tenant = tenant
        self.template_id = template_id
        self.template_tokens = template_tokens
        self.replica = replica
        self.handle: Any = None
        self.template_token_ids: Sequence[int] = ()  # the template's token ids (given to policies with kv_events)
        self.last_message_ids: Sequence[int] = ()  # the prompt's last message's token ids (ditto)
        self.first_message_ids: Sequence[int] = ()  # ... and its first message's after the template (ditto)


class RoutingPolicy:
    """Base: ``form`` is the prompt form sent ("raw" or "tmpl"); ``cache`` the worker cache model."""

    name = "base"  # the registry's name, set by make_policies
    form = "raw"
    cache = "radix"  # radix | none | oracle
    kv_events = False  # True: the workers publish KV events to the policy (kv_batch)

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        self.workers = workers
        self.replicas = max(1, replicas)
        self.seed = seed
        self.now = 0.0  # the fleet's virtual clock, set before every call into the policy
        self.moves: dict[str, int] = {}  # pin moves by reason
        self.placements: dict[str, int] = {}  # new sessions by outcome (placed_template, placed_least_load)

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        raise NotImplementedError

    def completed(self, call: Dispatch, worker: int, prompt_tokens: int, cached_tokens: int) -> None:
        """The call returned; its usage is what the worker reported."""

    def session_done(self, session_id: str) -> None:
        """The session ended (a stateless policy forgets it; agent-cache's pins expire by TTL)."""

    def close(self) -> None:
        """Release what the policy holds (stores, connections)."""

    def kv_batch(self, worker: int, events: list[Any]) -> None:
        """One batch of a worker's KV events, when the worker would publish it (``kv_events`` policies)."""

    def kv_counts(self) -> dict[str, int]:
        """What the policy counted of the workers' KV events (``kv_events`` policies)."""
        return {}


class RoundRobin(RoutingPolicy):

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        self._next = [0] * self.replicas

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        i = self._next[call.replica]
        self._next[call.replica] = (i + 1) % self.workers
        return i


class RandomChoice(RoutingPolicy):

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        self._rng = random.Random(seed)

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        return self._rng.randrange(self.workers)


class LeastLoad(RoutingPolicy):
    """Fewest in-flight calls, as each replica counts its own dispatches."""


    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        self._inflight = [[0] * workers for _ in range(self.replicas)]

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        view = self._inflight[call.replica]
        i = view.index(min(view))
        view[i] += 1
        return i

    def completed(self, call: Dispatch, worker: int, prompt_tokens: int, cached_tokens: int) -> None:
        self._inflight[call.replica][worker] -= 1


def _hash(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class ConsistentHash(RoutingPolicy):
    """Session id on a hash ring (100 virtual nodes per worker); stateless."""

    vnodes = 100

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0) -> None:
        super().__init__(workers, replicas, seed)
        ring = sorted((_hash(f"w{w}#{v}"), w) for w in range(workers) for v in range(self.vnodes))
        self._keys = [k for k, _ in ring]
        self._owners = [w for _, w in ring]
        self._memo: dict[str, int] = {}

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        w = self._memo.get(call.session_id)
        if w is None:
            i = bisect.bisect(self._keys, _hash(call.session_id)) % len(self._keys)
            w = self._memo[call.session_id] = self._owners[i]
        return w

    def session_done(self, session_id: str) -> None:
        self._memo.pop(session_id, None)  # stateless in effect: the memo only saves rehashing


class AgentCache(RoutingPolicy):
    """The product: one real Router per replica over one shared store, on the fleet's virtual clock."""

    form = "tmpl"
    url_pattern = "http://worker-{i}"

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0, *, capacity: int = 400_000,
                 redis_url: str | None = None, policy: Policy | None = None) -> None:
        super().__init__(workers, replicas, seed)
        self.urls = [self.url_pattern.format(i=i) for i in range(workers)]
        self.capacity = capacity
        self._index = {u: i for i, u in enumerate(self.urls)}
        self._redis = redis_url
        self._prefix = f"agent-cache-bench-{uuid.uuid4().hex[:8]}"
        self.store: MetadataStore
        if redis_url is not None:
            from agent_cache.store.redis_store import RedisStore

            self.store = RedisStore(redis_url, prefix=self._prefix)
        else:
            self.store = MemoryStore()
        # release_delay=0: a finished call is released at once (no timer thread on a virtual clock);
        # no router dies here, and a lease renewed in real time would lapse on the virtual clock
        self.routers = [Router(self.urls, store=self.store, policy=policy, probe_interval=None, release_delay=0,
                               capacities={u: capacity for u in self.urls}, clock=self._clock, lease=1e9)
                        for _ in range(self.replicas)]

    def _clock(self) -> float:
        return self.now

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        request = RouteRequest(call.session_id, template_id=call.template_id, tenant=call.tenant,
                               prompt_tokens_estimate=call.template_tokens)
        placement = self.routers[call.replica].route(request)
        if placement.outcome.startswith("moved:"):
            reason = placement.outcome.split(":", 1)[1]
            self.moves[reason] = self.moves.get(reason, 0) + 1
        elif placement.outcome.startswith("placed_"):
            self.placements[placement.outcome] = self.placements.get(placement.outcome, 0) + 1
        call.handle = placement
        return self._index[placement.worker]

    def completed(self, call: Dispatch, worker: int, prompt_tokens: int, cached_tokens: int) -> None:
        placement: Placement = call.handle
        router = self.routers[call.replica]
        router.done(placement)
        router.report(placement, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens)

    def close(self) -> None:
        for r in self.routers:
            r.close()
        if self._redis is not None:
            from agent_cache.store.redis_store import delete_deployment

            delete_deployment(self._redis, self._prefix)  # this run's keys only


class AgentCacheKv(AgentCache):
    """The same Router fed the workers' KV events (exact template holders, sessions' evicted prefixes)."""

    kv_events = True

    def __init__(self, workers: int, replicas: int = 1, seed: int = 0, *, capacity: int = 400_000,
                 redis_url: str | None = None, policy: Policy | None = None) -> None:
        super().__init__(workers, replicas, seed, capacity=capacity, redis_url=redis_url, policy=policy)
        self.kv = KvView()  # fed here as its subscriber and its token learner would feed it
        for r in self.routers:
            r.kv_events = self.kv  # one view, as every replica's would build alike from the same events
        self._seq = [0] * workers
        self._learnt: set[str] = set()

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        tid = call.template_id
        if tid and tid not in self._learnt and call.template_token_ids:
            self._learnt.add(tid)
            self.kv.learn_template_ids(tid, call.template_token_ids)
        return super().route(call, fleet)

    def completed(self, call: Dispatch, worker: int, prompt_tokens: int, cached_tokens: int) -> None:
        super().completed(call, worker, prompt_tokens, cached_tokens)
        # what the gateway learns from the worker's /tokenize of the call's last message (KvView.learn)
        self.kv.learn_session_ids(call.tenant, session_key(call.session_id), self.urls[worker],
                                  call.last_message_ids, call.first_message_ids)

    def kv_batch(self, worker: int, events: list[Any]) -> None:
        self.kv.apply(self.urls[worker], self._seq[worker], KVEventBatch(self.now, events))
        self._seq[worker] += 1

    def kv_counts(self) -> dict[str, int]:
        return {"event_gaps": self.kv.state.gaps, "prefixes_gone": self.kv.state.prefixes_gone}

    def close(self) -> None:
        super().close()
        self.kv.close()


class AgentCacheRenamed(AgentCache):
    """The same Router, its workers named otherwise: only the hash that breaks ties differs, so any
    difference from ``agent-cache`` is chance (the noise floor a claimed difference must clear)."""

    url_pattern = "http://gpu-{i}.renamed"


class AgentCacheNoTemplates(AgentCache):
    """The same Router; prompts sent raw, template ids from ``Templater("off")``."""

    form = "raw"


class Oracle(LeastLoad):
    """Upper bound: one infinite cache every worker shares; routed by true load."""

    form = "tmpl"
    cache = "oracle"

    def route(self, call: Dispatch, fleet: FleetView) -> int:
        loads = [fleet.inflight(i) for i in range(self.workers)]
        return loads.index(min(loads))

    def completed(self, call: Dispatch, worker: int, prompt_tokens: int, cached_tokens: int) -> None:
        pass


class NoCache(Oracle):
    """Floor: prefix caching disabled on every worker; routed by true load."""

    form = "raw"
    cache = "none"
