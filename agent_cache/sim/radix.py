"""A radix tree over token ids, as SGLang's RadixCache keeps its KV cache.

Behaviour copied from SGLang (``srt/mem_cache/radix_cache.py``):

* keys are token-id sequences; matches and insertions are page-aligned
  (``page_size``): only whole pages are matched or stored;
* ``extra_key`` namespaces the tree: the same tokens under another key do not
  match (SGLang puts ``extra_key`` in every child key);
* running requests hold a lock reference on their matched path, so it is
  never evicted mid-request;
* when the tree is over capacity, unreferenced leaves are evicted by LRU
  (``last_access``) or LFU (``hit_count``, then LRU), as
  ``--radix-eviction-policy`` chooses;
* the KV pool is shared with tokens that live outside the tree (a running
  request's decode tokens and its prompt while it is prefilled):
  ``outside_tokens`` counts them against the same capacity, and
  ``evictable_tokens`` is kept up to date on every lock and unlock, as
  SGLang's ``evictable_size_``;
* with ``enable_kv_events``, every store, eviction and reset is queued as
  SGLang's KV events for :meth:`RadixCache.take_events`, in the release's
  format (``kv_format``; see :mod:`agent_cache.kv.events`): 0.5.4's per-page
  events with a page's own hash, a split sent as a removal and two stores;
  from 0.5.6, SHA-256 chain hashes and nothing on a split (0.5.6's removal
  of a split node's pages is not copied); from 0.5.15 and 0.5.18,
  consecutive removals and stores merged as those releases' recorders do.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Sequence

from agent_cache.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventFormat,
    KVEvent,
    block_hash,
    chain_digest,
    digest_to_int64,
)

EVICTION_POLICIES = ("lru", "lfu")

# a child's key: (extra_key, the first page of its token ids)
_ChildKey = tuple[str | None, tuple[int, ...]]


@dataclass(eq=False)
class _Node:
    key: list[int]
    parent: "_Node | None"
    extra_key: str | None = None
    children: dict[_ChildKey, _Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: float = 0.0
    hit_count: int = 0
    digests: list[bytes] = field(default_factory=list)  # chain formats: each page's SHA-256, for its events


@dataclass(frozen=True)
class MatchResult:
    """``length`` cached tokens, ending at ``node`` (hold it with :meth:`RadixCache.lock`)."""

    length: int
    node: _Node


class RadixCache:
    """Prefix cache over token ids with capacity in tokens and leaf eviction."""

    def __init__(self, capacity_tokens: int, *, page_size: int = 1, eviction_policy: str = "lru",
                 enable_kv_events: bool = False, kv_format: EventFormat = EventFormat()) -> None:
        if capacity_tokens <= 0:
            raise ValueError("capacity_tokens must be positive")
        if page_size <= 0:
            raise ValueError("page_size must be positive")
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"eviction_policy must be one of {EVICTION_POLICIES}, got {eviction_policy!r}")
        self.capacity = capacity_tokens
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        self._clock = itertools.count(1)  # logical time: deterministic LRU order
        self.kv_events: list[KVEvent] | None = [] if enable_kv_events else None
        self.kv_format = kv_format
        self._chained = kv_format.chained
        self._medium = kv_format.medium
        self.reset()

    def reset(self) -> None:
        """Drop everything (``/flush_cache``)."""
        self.root = _Node(key=[], parent=None)
        self.root.lock_ref = 1
        self.total_tokens = 0
        self.evicted_tokens = 0
        self.evictable_tokens = 0  # tree tokens no running request holds
        self.outside_tokens = 0  # pool tokens held outside the tree (set by the scheduler)
        if self.kv_events is not None:
            self.kv_events.append(AllBlocksCleared())

    # --- KV events (radix_cache.py _record_store_event / _record_remove_event) ------

    def _record_store(self, node: _Node) -> None:
        assert self.kv_events is not None
        ps = self.page_size
        if not self._chained:
            parent: int | None = None  # SGLang 0.5.4 never links a node's first page to its parent
            for start in range(0, len(node.key), ps):
                page = node.key[start : start + ps]
                h = block_hash(page)
                self.kv_events.append(BlockStored([h], parent, page, len(page), None))
                parent = h
            return
        above = node.parent
        prior = above.digests[-1] if above is not None and above.digests else None
        parent = None if prior is None else digest_to_int64(prior)
        node.digests = []
        for start in range(0, len(node.key), ps):
            page = node.key[start : start + ps]
            prior = chain_digest(page, prior)
            node.digests.append(prior)
            h = digest_to_int64(prior)
            self._queue(BlockStored([h], parent, page, ps, None, self._medium))
            parent = h

    def _record_remove(self, node: _Node) -> None:
        assert self.kv_events is not None
        if not self._chained:
            for start in range(0, len(node.key), self.page_size):
                self.kv_events.append(BlockRemoved([block_hash(node.key[start : start + self.page_size])]))
            return
        for d in node.digests:
            self._queue(BlockRemoved([digest_to_int64(d)], self._medium))

    def _queue(self, event: KVEvent) -> None:
        """Queue an event; 0.5.23's publisher merges it into the last one when it continues it."""
        assert self.kv_events is not None
        tail = self.kv_events[-1] if self.kv_events else None
        fmt = self.kv_format
        if fmt.merge_stores and isinstance(event, BlockStored) and isinstance(tail, BlockStored) \
                and event.parent_block_hash == tail.block_hashes[-1] and event.block_size == tail.block_size:
            tail.block_hashes.extend(event.block_hashes)
            tail.token_ids.extend(event.token_ids)
            return
        if fmt.merge_removes and isinstance(event, BlockRemoved) and isinstance(tail, BlockRemoved):
            tail.block_hashes.extend(event.block_hashes)
            return
        self.kv_events.append(event)

    def take_events(self) -> list[KVEvent]:
        """The events queued since the last call (none without ``enable_kv_events``)."""
        if not self.kv_events:
            return []
        out, self.kv_events = self.kv_events, []
        return out

    @property
    def free_tokens(self) -> int:
        """Pool slots neither in the tree nor held outside it (SGLang's ``available_size``)."""
        return self.capacity - self.total_tokens - self.outside_tokens

    # --- lookup ---------------------------------------------------------------

    def _child_key(self, key: Sequence[int], extra_key: str | None) -> _ChildKey:
        return (extra_key, tuple(key[: self.page_size]))

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached, page-aligned prefix of ``key``; touches the path."""
        key = list(key[: len(key) // self.page_size * self.page_size])
        node = self.root
        now = next(self._clock)
        node.last_access = now
        matched = 0
        while matched < len(key):
            child = node.children.get(self._child_key(key[matched:], extra_key))
            if child is None:
                break
            n = self._common_length(child.key, key, matched)
            child.last_access = now
            if n < len(child.key):
                if n == 0:
                    break
                child = self._split(child, n)
                matched += n
                node = child
                break
            matched += n
            node = child
        if matched:
            node.hit_count += 1
        return MatchResult(length=matched, node=node)

    def _common_length(self, node_key: list[int], key: list[int], offset: int) -> int:
        limit = min(len(node_key), len(key) - offset)
        if node_key[:limit] == key[offset : offset + limit]:
            n = limit
        else:
            n = 0
            while n < limit and node_key[n] == key[offset + n]:
                n += 1
        return n // self.page_size * self.page_size

    def _split(self, child: _Node, n: int) -> _Node:
        """Split ``child`` after ``n`` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None
        if self.kv_events is not None and not self._chained:
            self._record_remove(child)
        upper = _Node(
            key=child.key[:n],
            parent=parent,
            extra_key=child.extra_key,
            lock_ref=child.lock_ref,
            last_access=child.last_access,
            hit_count=child.hit_count,
        )
        parent.children[self._child_key(upper.key, child.extra_key)] = upper
        child.key = child.key[n:]
        child.parent = upper
        upper.children[self._child_key(child.key, child.extra_key)] = child
        if self._chained:  # 0.5.9+ send nothing: the pages keep their hashes, split between the two nodes
            upper.digests, child.digests = child.digests[: n // self.page_size], child.digests[n // self.page_size :]
        elif self.kv_events is not None:
            self._record_store(upper)
            self._record_store(child)
        return upper

    # --- insert ---------------------------------------------------------------

    def insert(self, key: Sequence[int], extra_key: str | None = None) -> int:
        """Store the page-aligned part of ``key``; returns the number of new tokens.

        Evicts unreferenced leaves first if the new tokens do not fit; stores
        only what fits when everything left is locked.
        """
        key = list(key[: len(key) // self.page_size * self.page_size])
        match = self.match_prefix(key, extra_key)
        new = key[match.length :]
        if not new:
            return 0
        overflow = len(new) - self.free_tokens
        if overflow > 0:
            self.lock(match.node)  # the path we extend must survive its own eviction pass
            try:
                self.evict(overflow)
            finally:
                self.unlock(match.node)
            room = self.free_tokens // self.page_size * self.page_size
            new = new[: max(0, room)]
            if not new:
                return 0
        node = _Node(key=new, parent=match.node, extra_key=extra_key, last_access=next(self._clock))
        match.node.children[self._child_key(new, extra_key)] = node
        self.total_tokens += len(new)
        self.evictable_tokens += len(new)
        if self.kv_events is not None:
            self._record_store(node)
        return len(new)

    # --- references -----------------------------------------------------------

    def lock(self, node: _Node) -> None:
        """A running request now uses the path from the root to ``node``."""
        while node is not None:
            if node.lock_ref == 0:
                self.evictable_tokens -= len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: _Node) -> None:
        while node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_tokens += len(node.key)
            node = node.parent  # type: ignore[assignment]

    # --- eviction -------------------------------------------------------------

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    def _priority(self, node: _Node) -> tuple[float, ...]:
        if self.eviction_policy == "lfu":
            return (node.hit_count, node.last_access)
        return (node.last_access,)

    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` from unreferenced leaves; returns how many went."""
        if num_tokens <= 0:
            return 0
        heap = [(self._priority(n), id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, node.extra_key)]
            freed += len(node.key)
            if self.kv_events is not None:
                self._record_remove(node)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self._priority(parent), id(parent), parent))
        self.total_tokens -= freed
        self.evictable_tokens -= freed
        self.evicted_tokens += freed
        return freed
