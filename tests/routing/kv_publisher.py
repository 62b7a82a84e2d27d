"""A worker's radix cache with KV events on, without sockets: each insert's batch is applied to the router
processes' states subscribed at the time, as ZeroMQ PUB fans it out to the subscribers connected then."""

from __future__ import annotations

import random
import time

from agent_cache.kv_events import KVEventBatch
from agent_cache.routing.kv_state import KvState
from agent_cache.sim.radix import RadixCache

W0 = "http://w0"


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100_000) for _ in range(n)]


class PublishingCache:
    """Worker ``W0``'s cache; ``sent`` keeps every (sequence number, batch) it published."""

    def __init__(self, capacity: int, *subscribers: KvState) -> None:
        self.cache = RadixCache(capacity, enable_kv_events=True)
        self.subscribers = list(subscribers)
        self.seq = 0
        self.sent: list[tuple[int, KVEventBatch]] = []

    def insert(self, tokens: list[int]) -> None:
        self.cache.insert(tokens)
        batch = KVEventBatch(time.time(), self.cache.take_events())
        self.sent.append((self.seq, batch))
        for state in self.subscribers:
            state.apply(W0, self.seq, batch)
        self.seq += 1
