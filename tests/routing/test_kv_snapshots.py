"""Workers' resident runs shared by router processes through a real Redis (routing/kv_snapshots.py): a process
that hears a worker from the middle of its events takes up another's snapshot and then follows on its own."""

from __future__ import annotations

import json
import random
import time
import uuid
from contextlib import ExitStack
from typing import Callable

import httpx
import pytest
import redis

from agent_cache.bench.realfleet import free_port, wait_until
from agent_cache.errors import StoreError
from agent_cache.kv_events import KVEventBatch
from agent_cache.routing.kv_indexer import KvIndexer, parse_sources
from agent_cache.routing.kv_snapshots import KvSnapshots, decode, encode
from agent_cache.routing.kv_state import KvState
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.store.redis_store import RedisStore
from tests.routing.kv_publisher import W0, PublishingCache, random_tokens


def _process(stack: ExitStack, url: str, prefix: str) -> tuple[KvState, KvSnapshots]:
    """One router process: its own state and store client; its snapshot pass driven by the test."""
    store = RedisStore(url, prefix=prefix)
    stack.callback(store.close)
    state = KvState()
    return state, KvSnapshots(state, store, [W0], interval=0.05)


def test_a_store_refusing_set_and_get_leaves_the_late_process_unknown_and_counts_it(redis_server, stack) -> None:
    """ACL rules without SET / GET: no snapshot goes through; the thread counts the refusals and goes on,
    and the late process stays unknown (as without sharing) while the first follows the worker."""
    admin = redis.Redis.from_url(redis_server.url)
    stack.callback(admin.close)
    admin.execute_command("ACL", "SETUSER", "nosnap", "on", ">pw", "~*", "+@all", "-set", "-get")
    url = f"redis://nosnap:pw@127.0.0.1:{redis_server.port}/0"
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, snaps_a), (b, snaps_b) = _process(stack, url, prefix), _process(stack, url, prefix)
    worker, rng = PublishingCache(6_000), random.Random(4)
    worker.subscribers.append(a)
    worker.insert(random_tokens(rng, 300))
    worker.subscribers.append(b)
    worker.insert(random_tokens(rng, 300))
    for snaps in (snaps_a, snaps_b):
        snaps.start()
        stack.callback(snaps.close)
    wait_until(lambda: snaps_a.failed >= 2 and snaps_b.failed >= 2, [], "the refusals counted", timeout=5.0)
    assert (snaps_a.written, snaps_b.installed) == (0, 0) and snaps_b._thread.is_alive()
    assert a.known(W0) and not b.known(W0) and a.cached_tokens(W0) == 600


def _soon(ready: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    return ready()


def _runs(state: KvState) -> list[tuple[int, int]]:
    snap = state.snapshot(W0)
    assert snap is not None
    return sorted(snap.pages)


def test_a_process_that_joins_late_takes_up_a_snapshot_and_then_follows_evictions(redis_server, stack) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, snaps_a), (b, snaps_b) = _process(stack, redis_server.url, prefix), _process(stack, redis_server.url, prefix)
    worker, rng = PublishingCache(6_000), random.Random(3)
    system = random_tokens(rng, 600)
    a.learn_template("sys", system)
    b.learn_template("sys", system)
    worker.subscribers.append(a)
    for _ in range(4):
        worker.insert(system + random_tokens(rng, 300))
    worker.subscribers.append(b)  # b hears the worker from here on: no reset among its batches
    worker.insert(random_tokens(rng, 200))
    assert a.known(W0) and not b.known(W0) and b.holders("sys", [W0]) == (frozenset(), frozenset())
    snaps_b.step()  # nothing written yet: b stays unknown
    assert not b.known(W0) and snaps_b.installed == 0

    snaps_a.step()
    snaps_a.step()  # unchanged since: not written again
    assert snaps_a.written == 1
    snaps_b.step()
    assert snaps_b.installed == 1 and b.known(W0)
    assert b.cached_tokens(W0) == a.cached_tokens(W0) > 0 and _runs(b) == _runs(a)
    assert b.holders("sys", [W0]) == ({W0}, {W0})

    for _ in range(12):  # past the cache's capacity: evictions b matches as a does
        worker.insert(random_tokens(rng, 900))
    assert b.cached_tokens(W0) == a.cached_tokens(W0) <= 6_000 and _runs(b) == _runs(a)
    assert b.holders("sys", [W0]) == a.holders("sys", [W0]) == (frozenset(), {W0})
    snaps_b.step()  # b, known now, takes its turn as a writer when a's claim has lapsed
    time.sleep(0.06)
    snaps_b.step()
    assert snaps_b.written == 1


def test_a_snapshot_is_taken_up_only_at_a_batch_received_here_and_of_the_same_run_of_the_worker() -> None:
    rng = random.Random(5)
    worker, a = PublishingCache(6_000), KvState()
    worker.subscribers.append(a)
    for _ in range(3):
        worker.insert(random_tokens(rng, 300))
    snap = a.snapshot(W0)
    assert snap is not None and snap.seq == 2

    late = KvState()
    late.keep_pending_s = 10.0  # as KvSnapshots sets it
    worker.subscribers.append(late)
    for _ in range(2):
        worker.insert(random_tokens(rng, 300))
    assert late.install(W0, snap) == "stale"  # taken before the batches kept here: wait for a newer one
    newer = a.snapshot(W0)
    assert newer is not None
    previous_run = newer._replace(ts=newer.ts - 100.0)
    assert late.install(W0, previous_run) == "stale" and not late.known(W0)
    assert late.install(W0, newer._replace(seq=newer.seq + 1)) == "ahead"
    assert late.install(W0, decode(encode(newer))) == "installed"
    assert late.cached_tokens(W0) == a.cached_tokens(W0) and late.install(W0, newer) == "known"

    small = KvState(max_tokens=500)
    small.keep_pending_s = 10.0
    worker.subscribers.append(small)
    worker.insert(random_tokens(rng, 100))
    latest = a.snapshot(W0)
    assert latest is not None and small.install(W0, latest) == "too_large" and not small.known(W0)
    with pytest.raises(StoreError, match="undecodable"):
        decode(b"\x93\x01\x02")


def test_an_indexer_started_late_without_replay_knows_the_worker_from_the_other_processes(redis_server) -> None:
    """Real sim worker publishing over ZeroMQ; two indexers with Redis stores. The first fetches the worker's
    start-up reset from the replay endpoint; the late one is given none, so it never sees a reset: without the
    snapshot it would stay unknown."""
    pub, replay = free_port(), free_port()
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0, kv_events_config=json.dumps(config)))
    worker.start()
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    stores = [RedisStore(redis_server.url, prefix=prefix) for _ in range(2)]
    with_replay = parse_sources(f"{worker.url}=tcp://127.0.0.1:{pub}|tcp://127.0.0.1:{replay}")
    without_replay = parse_sources(f"{worker.url}=tcp://127.0.0.1:{pub}")
    first, late = KvState(), KvState()
    indexers = [KvIndexer(first, with_replay, store=stores[0], snapshot_interval=0.05).start()]
    try:
        with httpx.Client(base_url=worker.url, timeout=10) as client:
            def call(i: int) -> None:
                body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"task {i} " * 50}]}
                client.post("/v1/chat/completions", json=body).raise_for_status()

            i, deadline = 0, time.time() + 15
            while time.time() < deadline and not _soon(lambda: first.known(worker.url), 0.2):
                call(i := i + 1)  # a batch after the subscriber connected: the gap before it is replayed
            assert first.known(worker.url)
            call(i := i + 1)
            indexers.append(KvIndexer(late, without_replay, store=stores[1], snapshot_interval=0.05).start())
            deadline = time.time() + 15
            while time.time() < deadline and not late.known(worker.url):
                call(i := i + 1)  # the late subscriber's batches: the snapshot is taken up at one of them
                time.sleep(0.05)
            assert late.known(worker.url) and indexers[1].snapshots is not None
            assert indexers[1].snapshots.installed == 1
            call(i + 1)
            assert _soon(lambda: late.cached_tokens(worker.url) == first.cached_tokens(worker.url) > 0, 5)
    finally:
        for indexer in indexers:
            indexer.close()
        for store in stores:
            store.close()
        worker.stop()


def test_a_worker_restarted_at_the_same_batch_number_is_written_again_and_taken_up(redis_server, stack) -> None:
    """The writer names a snapshot by its batch's number and timestamp: a restarted worker numbers from 0
    again, and its run's batch N is not the previous run's."""
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, snaps_a), (b, snaps_b) = _process(stack, redis_server.url, prefix), _process(stack, redis_server.url, prefix)
    rng = random.Random(7)
    first = PublishingCache(6_000)
    first.subscribers.append(a)
    for _ in range(3):
        first.insert(random_tokens(rng, 300))
    snaps_a.step()
    assert snaps_a.written == 1
    time.sleep(0.06)  # a's claim lapses

    restarted = PublishingCache(6_000)  # a new process: its first batch carries the start-up reset, numbered 0
    restarted.subscribers.append(a)
    restarted.insert(random_tokens(rng, 300))
    restarted.subscribers.append(b)  # b hears the new run from its batch 1 on
    for _ in range(2):
        restarted.insert(random_tokens(rng, 300))
    assert restarted.seq - 1 == 2 and a.known(W0) and not b.known(W0)  # batch 2 again, of another run
    snaps_b.step()  # the previous run's snapshot: not the batch b holds
    assert snaps_b.installed == 0 and not b.known(W0)
    snaps_a.step()
    assert snaps_a.written == 2
    snaps_b.step()
    assert snaps_b.installed == 1 and b.cached_tokens(W0) == a.cached_tokens(W0) == 900


def test_an_unknown_workers_batches_are_kept_only_for_snapshots_and_only_the_latest() -> None:
    rng = random.Random(8)
    worker, plain, kept = PublishingCache(6_000), KvState(), KvState()
    kept.keep_pending_s = 10.0
    worker.insert(random_tokens(rng, 300))  # the reset goes out before either listens
    worker.subscribers += [plain, kept]
    worker.insert(random_tokens(rng, 300))
    assert plain.pending() == [] and kept.pending() == [W0]  # without snapshots nothing is kept

    kept.max_pending_weight = 1_300  # two batches: 300 one-token events each, weighing 600 with their tokens
    for _ in range(3):
        worker.insert(random_tokens(rng, 300))
    assert [seq for seq, _ in kept._workers[W0].pending] == [3, 4]
    later = KVEventBatch(worker.sent[-1][1].ts + 11.0, [])  # 11 s on: the batches before are past keeping
    kept.apply(W0, 5, later)
    assert [seq for seq, _ in kept._workers[W0].pending] == [5]
