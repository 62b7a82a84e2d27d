"""A call the worker rejects leaves nothing behind: no pin, no template mark or record, no KV estimate.

Real Redis and simulated workers with a short context length, so a long
prompt is refused with SGLang's 400 before any prefill.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import redis
from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.errors import ContextLengthError
from agent_cache.routing import Router
from agent_cache.sim import SimFleet
from agent_cache.store import RedisStore


@pytest.fixture(scope="module")
def short_fleet() -> Iterator[SimFleet]:
    with SimFleet(2, time_scale=0.0, context_length=2048) as fleet:
        yield fleet


def test_rejected_calls_leave_no_pin_mark_or_kv_estimate(short_fleet, redis_server, prefix) -> None:
    store = RedisStore(redis_server.url, prefix=prefix)
    router = Router(short_fleet.urls, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    model = ChatSGLang(model="sim", workers=short_fleet.urls, router=router, max_tokens=4, max_retries=0)
    too_long = "word " * 5000
    for i in range(10):
        with pytest.raises(ContextLengthError):
            model.invoke([SystemMessage("You are an agent."), HumanMessage(too_long)], session_id=f"big-{i}")
    model.close()  # writes whatever the model still owes the store
    stats = store.stats(0)
    for url in short_fleet.urls:
        w = stats["workers"].get(url, {})
        assert w.get("inflight", 0) == 0 and w.get("kv_tokens", 0) == 0, (url, w)
        assert w.get("sessions", 0) == 0 and w.get("live_sessions", 0) == 0, (url, w)
    assert all(not t["workers"] for t in stats["templates"].values()), stats["templates"]
    client = redis.Redis.from_url(redis_server.url)
    try:  # not one session record, not one template record
        assert not list(client.scan_iter(f"{{{prefix}}}:s:*")), "a rejected call left a session record"
        assert not list(client.scan_iter(f"{{{prefix}}}:ti:*")), "a rejected call recorded its template"
    finally:
        client.close()
    # a call that fits is placed and pinned as usual afterwards
    model = ChatSGLang(model="sim", workers=short_fleet.urls, router=router, max_tokens=4, max_retries=0)
    ok = model.invoke([SystemMessage("You are an agent."), HumanMessage("short")], session_id="big-0")
    assert ok.response_metadata["routing"].startswith("placed")
    assert store.get_session("default", "big-0", time.time())["worker"] == ok.response_metadata["worker"]
    model.close()
    router.close()
    store.close()


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_a_failure_the_request_causes_is_answered_and_counted_against_no_worker(redis_server, prefix, stream):
    from agent_cache.errors import BackendError

    with SimFleet(3, time_scale=0.0) as fleet:
        router = Router(fleet.urls, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
        good = ChatSGLang(model="sim", workers=fleet.urls, router=router, max_tokens=4, max_retries=2)
        pins = {f"p-{i}": good.invoke([HumanMessage("hello")], session_id=f"p-{i}").response_metadata["worker"]
                for i in range(4)}
        # a 500 every worker gives (the second worker asked gives it too), and a stream answered whole
        failing = ChatSGLang(model="sim", workers=fleet.urls, router=router, max_tokens=4, max_retries=2,
                             extra_body={"sim_fail_status": 500})
        whole = ChatSGLang(model="sim", workers=fleet.urls, router=router, max_tokens=4, max_retries=2,
                           extra_body={"sim_whole_answer": True})
        for i in range(12):
            model = failing if i % 2 == 0 or not stream else whole
            with pytest.raises(BackendError) as caught:
                if stream:
                    list(model.stream([HumanMessage("hello")], session_id=f"p-{i % 4}"))
                else:
                    model.invoke([HumanMessage("hello")], session_id=f"p-{i % 4}")
            assert caught.value.request_fault and not caught.value.retryable
            assert caught.value.status in (500, 200)
        assert router.health.down(fleet.urls) == set()
        assert all(router.health.state(u) == "closed" for u in fleet.urls)
        for s, worker in pins.items():  # no pin moved
            assert good.invoke([HumanMessage("again")], session_id=s).response_metadata["worker"] == worker
        for m in (good, failing, whole):
            m.close()
        router.close()
