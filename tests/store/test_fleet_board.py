"""The fleet board: entries written only over what the writer read, in one process or shared through Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from agent_cache.errors import StoreUnavailableError
from agent_cache.store.fleet_board import DRAINING, GONE, UP, FleetEntry, MemoryFleetBoard, RedisFleetBoard


@pytest.fixture(params=["memory", "redis"])
def boards(request, redis_url):
    """Two handles on one board (two replicas of one deployment)."""
    if request.param == "memory":
        board = MemoryFleetBoard()
        yield board, board
        return
    prefix = f"fb-{uuid.uuid4().hex[:8]}"
    a, b = RedisFleetBoard(redis_url, prefix), RedisFleetBoard(redis_url, prefix)
    yield a, b
    a.close()
    b.close()


def test_a_write_lands_only_over_the_entry_the_writer_read(boards):
    a, b = boards
    up = FleetEntry("http://w1:30000", "default", UP, 100.0, "admin")
    assert a.replace(up, None) and b.entries() == {up.url: up}
    assert not b.replace(up, None)  # the other replica read "no entry": too late
    draining = FleetEntry(up.url, "default", DRAINING, 101.0, "admin")
    assert b.replace(draining, up)
    gone = FleetEntry(up.url, "default", GONE, 102.0, "admin")
    assert not a.replace(gone, up)  # a stale read does not undo the drain
    assert a.replace(gone, draining) and a.entries()[up.url] == gone


def test_the_redis_board_is_one_hash_of_the_deployment_and_skips_what_it_cannot_read(redis_url):
    prefix = f"fb-{uuid.uuid4().hex[:8]}"
    board = RedisFleetBoard(redis_url, prefix)
    entry = FleetEntry("http://w2:30000", "big", UP, 5.0, "dns")
    assert board.replace(entry, None)
    client = redis.Redis.from_url(redis_url)
    assert client.hgetall("{" + prefix + "}:fleet") == {
        b"http://w2:30000": b'{"pool": "big", "since": 5.0, "source": "dns", "state": "up"}'}
    client.hset("{" + prefix + "}:fleet", "http://w3:30000", "not json")
    assert board.entries() == {entry.url: entry}
    client.close()
    board.close()


def test_an_unreachable_redis_is_a_store_unavailable_error(free_port_factory):
    board = RedisFleetBoard(f"redis://127.0.0.1:{free_port_factory()}/0", "x")
    with pytest.raises(StoreUnavailableError):
        board.entries()
