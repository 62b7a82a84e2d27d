"""The simulated worker's radix cache: matching, page alignment, eviction, locks, extra_key."""

from __future__ import annotations

import pytest

from agent_cache.sim.radix import RadixCache


def test_match_after_insert_and_partial_match() -> None:
    cache = RadixCache(1000)
    assert cache.insert([1, 2, 3, 4, 5]) == 5
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).length == 5
    assert cache.match_prefix([1, 2, 9]).length == 2  # splits the node
    assert cache.insert([1, 2, 9, 9]) == 2  # only the new suffix is stored
    assert cache.total_tokens == 7
    assert cache.match_prefix([7]).length == 0


def test_page_aligned_matching_and_insertion() -> None:
    cache = RadixCache(1000, page_size=4)
    assert cache.insert(list(range(10))) == 8  # the partial last page is not stored
    assert cache.match_prefix(list(range(10))).length == 8
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 7]).length == 4  # divergence inside page 2


def test_extra_key_isolates_namespaces() -> None:
    cache = RadixCache(1000)
    cache.insert([1, 2, 3], extra_key="tenant-a")
    assert cache.match_prefix([1, 2, 3], extra_key="tenant-b").length == 0
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.match_prefix([1, 2, 3], extra_key="tenant-a").length == 3


def test_lru_evicts_least_recently_used_leaf() -> None:
    cache = RadixCache(9)
    cache.insert([1, 1, 1])  # A
    cache.insert([2, 2, 2])  # B
    cache.insert([3, 3, 3])  # C
    cache.match_prefix([1, 1, 1])  # touch A: B is now the oldest
    cache.insert([4, 4, 4])  # D needs room for 3 tokens
    assert cache.match_prefix([2, 2, 2]).length == 0
    assert cache.match_prefix([1, 1, 1]).length == 3
    assert cache.match_prefix([3, 3, 3]).length == 3
    assert cache.match_prefix([4, 4, 4]).length == 3
    assert cache.total_tokens == 9
    assert cache.evicted_tokens == 3


def test_lfu_keeps_frequently_hit_leaf() -> None:
    cache = RadixCache(6, eviction_policy="lfu")
    cache.insert([1, 1, 1])
    cache.insert([2, 2, 2])
    for _ in range(3):
        cache.match_prefix([1, 1, 1])
    cache.match_prefix([2, 2, 2])  # most recent, but hit less often
    cache.insert([3, 3, 3])
    assert cache.match_prefix([1, 1, 1]).length == 3
    assert cache.match_prefix([2, 2, 2]).length == 0


def test_locked_path_is_never_evicted() -> None:
    cache = RadixCache(6)
    cache.insert([1, 1, 1])
    running = cache.match_prefix([1, 1, 1])
    cache.lock(running.node)
    cache.insert([2, 2, 2])
    cache.insert([3, 3, 3])  # must evict [2,2,2], the only unlocked leaf
    assert cache.match_prefix([1, 1, 1]).length == 3
    assert cache.match_prefix([2, 2, 2]).length == 0
    cache.unlock(running.node)
    assert cache.evictable_tokens == 6


def test_insert_stores_only_what_fits_when_all_else_is_locked() -> None:
    cache = RadixCache(5)
    cache.insert([1, 1, 1])
    node = cache.match_prefix([1, 1, 1]).node
    cache.lock(node)
    assert cache.insert([2, 2, 2, 2]) == 2
    assert cache.total_tokens == 5


def test_eviction_cascades_to_parent_after_children_go() -> None:
    cache = RadixCache(100)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])  # splits: [1,2] -> {[3,4], [5,6]}
    assert cache.evict(6) == 6
    assert cache.total_tokens == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixCache(10, eviction_policy="fifo")
    with pytest.raises(ValueError, match="capacity"):
        RadixCache(0)
