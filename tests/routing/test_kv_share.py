"""Sessions' prefix fingerprints shared by router processes through a real Redis stream (routing/kv_share.py):
what one process learns, another knows; older steps never undo newer ones; missed records forget everything."""

from __future__ import annotations

import random
import time
import uuid
from contextlib import ExitStack

import redis

from agent_cache.bench.realfleet import wait_until
from agent_cache.routing.kv_share import KvShare
from agent_cache.routing.kv_state import KvState
from agent_cache.store import keys
from agent_cache.store.redis_store import RedisStore
from tests.routing.kv_publisher import W0, PublishingCache, random_tokens


def _process(stack: ExitStack, url: str, prefix: str, **kw) -> tuple[KvState, KvShare]:
    """What one router process holds: its state, shared through its own store client."""
    store = RedisStore(url, prefix=prefix)
    stack.callback(store.close)
    state = KvState()
    share = KvShare(state, store, poll=0.01, **kw).start()
    stack.callback(share.close)
    return state, share


def test_a_session_learnt_in_one_process_is_known_in_another_and_seen_evicted_there(redis_server, stack) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, share_a), (b, share_b) = _process(stack, redis_server.url, prefix), _process(stack, redis_server.url, prefix)
    fleet = PublishingCache(20_000, a, b)
    rng = random.Random(1)
    head, tail = random_tokens(rng, 400), random_tokens(rng, 400)
    fleet.insert(head + random_tokens(rng, 500) + tail)
    at = time.time()
    a.learn_session("default", "s1", tail, W0, head_ids=head, head_text=7, at=at)
    share_a.publish("default", "s1", at)
    wait_until(lambda: b.session_print("default", "s1") is not None, [], "the record adopted", timeout=5.0)
    assert b.session_print("default", "s1") == a.session_print("default", "s1")
    assert b.session_print("default", "s1").tail  # an anchored fingerprint, not an empty one
    assert b.session_prefix("default", "s1", W0) == "held"
    assert (share_a.shared, share_b.adopted, share_a.adopted) == (1, 1, 0)  # its own record is not adopted again
    fleet.insert(random_tokens(rng, 19_500))  # everything of s1 evicted
    assert b.session_prefix("default", "s1", W0) == "gone"
    # a later step forgotten in A (its ask failed) is forgotten in B too
    a.forget_session("default", "s1", at=at + 1)
    share_a.publish("default", "s1", at + 1)
    wait_until(lambda: b.session_print("default", "s1") is None, [], "the forget adopted", timeout=5.0)


def test_an_older_step_never_replaces_a_later_one_learnt_elsewhere(redis_server, stack) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, share_a), (b, _) = _process(stack, redis_server.url, prefix), _process(stack, redis_server.url, prefix)
    rng = random.Random(2)
    old_tail, new_tail = random_tokens(rng, 400), random_tokens(rng, 400)
    b.learn_session("default", "s1", new_tail, W0, at=200.0)  # step 2, served and learnt by B
    a.learn_session("default", "s1", old_tail, W0, at=100.0)  # step 1, learnt late by A
    share_a.publish("default", "s1", 100.0)
    a.learn_session("default", "s2", old_tail, W0, at=100.0)  # written after s1's: read once s1's was
    share_a.publish("default", "s2", 100.0)
    wait_until(lambda: b.session_print("default", "s2") is not None, [], "s2 adopted", timeout=5.0)
    assert b.session_print("default", "s1").at == 200.0
    assert b.session_print("default", "s1") != a.session_print("default", "s1")
    b.forget_session("default", "s1", at=150.0)  # a forget of an older step leaves the later one
    assert b.session_print("default", "s1").at == 200.0


def test_a_restarted_process_reads_what_the_stream_holds(redis_server, stack) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    a, share_a = _process(stack, redis_server.url, prefix)
    rng = random.Random(3)
    for i in range(5):
        a.learn_session("acme", f"s{i}", random_tokens(rng, 400), W0, at=float(i))
        share_a.publish("acme", f"s{i}", float(i))
    wait_until(lambda: share_a.shared == 5, [], "five records appended", timeout=5.0)
    c, _ = _process(stack, redis_server.url, prefix)  # started after: reads them from the stream
    wait_until(lambda: c.sessions == 5, [], "the stream read at start", timeout=5.0)
    assert [c.session_print("acme", f"s{i}") for i in range(5)] == [a.session_print("acme", f"s{i}") for i in range(5)]
    other, _ = _process(stack, redis_server.url, f"t-{uuid.uuid4().hex[:8]}")  # another deployment
    time.sleep(0.2)
    assert other.sessions == 0


def test_records_lost_with_the_store_make_every_session_forgotten_then_read_again(redis_server, stack) -> None:
    """Redis restarts without persistence: its stream is gone, so records may have been missed. Every session
    known (even one learnt here) is forgotten, and what is appended afterwards is adopted again."""
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, share_a), (b, share_b) = _process(stack, redis_server.url, prefix), _process(stack, redis_server.url, prefix)
    rng = random.Random(4)
    a.learn_session("default", "s1", random_tokens(rng, 400), W0, at=1.0)
    share_a.publish("default", "s1", 1.0)
    b.learn_session("default", "mine", random_tokens(rng, 400), W0, at=1.0)  # learnt in B, not shared
    wait_until(lambda: b.sessions == 2, [], "s1 adopted", timeout=5.0)
    redis_server.stop()
    time.sleep(0.3)
    redis_server.start()
    wait_until(lambda: share_b.resets >= 1, [], "a reset once the store answers again", timeout=10.0)
    assert b.session_print("default", "mine") is None
    assert b.session_print("default", "s1") is None
    a.learn_session("default", "s2", random_tokens(rng, 400), W0, at=2.0)
    share_a.publish("default", "s2", 2.0)
    wait_until(lambda: b.session_print("default", "s2") is not None, [], "s2 adopted after the reset", timeout=10.0)


def test_the_stream_keeps_about_its_cap_of_records(redis_server, stack) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    a, share_a = _process(stack, redis_server.url, prefix, max_records=100)
    rng = random.Random(5)
    tail = random_tokens(rng, 400)
    for i in range(1_000):
        a.learn_session("default", f"s{i}", tail, W0, at=float(i))
        share_a.publish("default", f"s{i}", float(i))
    wait_until(lambda: share_a.shared + share_a.dropped == 1_000, [], "every record appended", timeout=20.0)
    client = redis.Redis.from_url(redis_server.url)
    try:
        length = client.xlen(keys.kv_sessions(prefix))
    finally:
        client.close()
    assert 100 <= length < 300  # about the cap (trimmed whole nodes at a time)
    assert share_a.dropped == 0


def test_a_store_refusing_the_stream_commands_leaves_each_process_with_its_own_sessions(redis_server, stack) -> None:
    """ACL rules without XADD / XRANGE: nothing is shared, the refusals are counted, and what a process
    learnt itself still serves its routes."""
    admin = redis.Redis.from_url(redis_server.url)
    stack.callback(admin.close)
    admin.execute_command("ACL", "SETUSER", "narrow", "on", ">pw", "~*", "+@all", "-xadd", "-xrange")
    url = f"redis://narrow:pw@127.0.0.1:{redis_server.port}/0"
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    (a, share_a), (b, share_b) = _process(stack, url, prefix), _process(stack, url, prefix)
    rng = random.Random(6)
    a.learn_session("default", "s1", random_tokens(rng, 400), W0, at=1.0)
    share_a.publish("default", "s1", 1.0)
    wait_until(lambda: share_a.dropped == 1, [], "the refused append counted", timeout=5.0)
    time.sleep(0.2)
    assert (share_a.shared, b.sessions, a.sessions) == (0, 0, 1)
    assert share_b._thread.is_alive()  # still trying, once a second


def test_records_that_are_not_a_sessions_are_skipped_and_the_reader_goes_on(redis_server, stack) -> None:
    """Anyone with write access to the stream may append anything: each bad record is counted and skipped,
    the reader lives, and a process started later reads past them too."""
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(redis_server.url)
    stack.callback(admin.close)
    key = keys.kv_sessions(prefix)
    poison = ["{}", "[1, 2]", "[" * 100_000 + "]" * 100_000, "null", '["a", "t", "s", "not a time"]']
    for record in poison:
        admin.xadd(key, {"r": record})
    admin.xadd(key, {"other": "field"})
    a, share_a = _process(stack, redis_server.url, prefix)
    rng = random.Random(5)
    a.learn_session("acme", "s1", random_tokens(rng, 400), W0, at=1.0)
    share_a.publish("acme", "s1", 1.0)
    b, share_b = _process(stack, redis_server.url, prefix)
    wait_until(lambda: b.session_print("acme", "s1") is not None, [], "the good record adopted", timeout=5.0)
    assert share_b.bad == len(poison) + 1 and share_b._thread.is_alive() and share_a._thread.is_alive()
