"""ChatSGLang with the real router: shared pins in Redis, failover, tenants, degraded mode."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.errors import ConfigError, InvalidRequestError
from agent_cache.routing import Router
from agent_cache.sim import SimFleet
from agent_cache.store import RedisStore

SYSTEM = "You are a support agent for a logistics company. Answer from the knowledge base. " * 25

_STEP = r"""
import json, sys
from langchain_core.messages import HumanMessage, SystemMessage
from agent_cache import ChatSGLang
workers, redis_url, step = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
model = ChatSGLang(model="sim", workers=workers, redis_url=redis_url, max_tokens=8)
history = [SystemMessage(sys.argv[4])] + [HumanMessage(f"step {i}") for i in range(step + 1)]
msg = model.invoke(history, session_id="shared-session")
print(json.dumps({"worker": msg.response_metadata["worker"], "routing": msg.response_metadata["routing"],
                  "cache_read": msg.usage_metadata["input_token_details"]["cache_read"]}))
"""


def _step_in_new_process(workers: list[str], redis_url: str, step: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _STEP, json.dumps(workers), redis_url, str(step), SYSTEM],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_one_session_through_three_processes_stays_on_one_worker(redis_server_factory, prefix) -> None:
    redis_url = redis_server_factory().url
    with SimFleet(4) as fleet:
        steps = [_step_in_new_process(fleet.urls, redis_url, step) for step in range(3)]
    assert len({s["worker"] for s in steps}) == 1
    assert [s["routing"] for s in steps] == ["placed_least_load", "pinned", "pinned"]
    assert steps[0]["cache_read"] == 0 and steps[1]["cache_read"] > 0 and steps[2]["cache_read"] > steps[1]["cache_read"]


def test_worker_killed_mid_session_next_step_succeeds_elsewhere() -> None:
    with SimFleet(2) as fleet:
        model = ChatSGLang(model="sim", workers=fleet.urls, max_tokens=8, max_retries=2)
        first = {}
        for sid in ("s-a", "s-b", "s-c", "s-d"):
            first[sid] = model.invoke([SystemMessage(SYSTEM), HumanMessage("step 0")], session_id=sid).response_metadata
        victim = first["s-a"]["worker"]
        fleet.stop_worker(fleet.urls.index(victim))
        after = {sid: model.invoke([SystemMessage(SYSTEM), HumanMessage("step 0"), HumanMessage("step 1")],
                                   session_id=sid).response_metadata for sid in first}
        survivor = next(u for u in fleet.urls if u != victim)
        assert all(m["worker"] == survivor for m in after.values())
        for sid, meta in first.items():
            expected = "pinned" if meta["worker"] == survivor else "moved:unhealthy"
            assert after[sid]["routing"] == expected, (sid, after[sid]["routing"])
        fleet.start_worker(fleet.urls.index(victim))
        model.routing.health.success(victim)  # a successful probe would do this; probes are off here
        fresh = [model.invoke([SystemMessage("another agent " * 40), HumanMessage("x")], session_id=f"new-{i}")
                 for i in range(6)]
        assert victim in {m.response_metadata["worker"] for m in fresh}


def test_tenants_never_share_cached_prefixes() -> None:
    with SimFleet(1) as fleet:
        acme = ChatSGLang(model="sim", base_url=fleet.urls[0], tenant="acme", max_tokens=4)
        globex = ChatSGLang(model="sim", base_url=fleet.urls[0], tenant="globex", max_tokens=4)
        prompt = [SystemMessage(SYSTEM), HumanMessage("where is my parcel?")]
        a1 = acme.invoke(prompt, session_id="a1")
        g1 = globex.invoke(prompt, session_id="g1")
        a2 = acme.invoke(prompt, session_id="a2")
        assert a1.usage_metadata["input_token_details"]["cache_read"] == 0
        assert g1.usage_metadata["input_token_details"]["cache_read"] == 0  # same text, other tenant: no hit
        assert a2.usage_metadata["input_token_details"]["cache_read"] >= a1.usage_metadata["input_tokens"] - 1
        assert a1.response_metadata["template_id"] != g1.response_metadata["template_id"]


def test_a_caller_cannot_set_another_tenants_cache_namespace(redis_server, prefix) -> None:
    """extra_key and cache_salt belong to the router: a per-call override is refused, nothing is written."""
    import redis as redis_py

    raw = redis_py.Redis.from_url(redis_server.url)
    with SimFleet(1) as fleet:
        store = RedisStore(redis_server.url, prefix=prefix)
        acme = ChatSGLang(model="sim", base_url=fleet.urls[0], tenant="acme", max_tokens=4)
        globex = ChatSGLang(model="sim", base_url=fleet.urls[0], tenant="globex", max_tokens=4,
                            router=Router(fleet.urls, store=store, probe_interval=None))
        prompt = [SystemMessage(SYSTEM), HumanMessage("where is my parcel?")]
        acme.invoke(prompt, session_id="a1")
        attempts = [
            ({"extra_body": {"extra_key": "acme"}}, "extra_body.extra_key"),
            ({"extra_key": "acme"}, "extra_key"),
            ({"extra_body": {"cache_salt": "ac", "extra_key": "me"}}, "extra_body.extra_key"),
            ({"cache_salt": "acme"}, "cache_salt"),
        ]
        for kwargs, field in attempts:
            with pytest.raises(InvalidRequestError) as err:  # a call's request, not the model's configuration
                globex.invoke(prompt, session_id="g-sneaky", **kwargs)
            assert err.value.field == field
        assert not list(raw.scan_iter(match="{" + prefix + "}:*"))  # refused before routing: no key written
        with pytest.raises(ConfigError) as err:  # the default tenant has no namespace to lend either
            ChatSGLang(model="sim", base_url=fleet.urls[0], extra_body={"extra_key": "acme"})
        assert err.value.field == "extra_body.extra_key"
        own = globex.invoke(prompt, session_id="g1", extra_body={"extra_key": "globex"})  # its own: allowed
        assert own.usage_metadata["input_token_details"]["cache_read"] == 0  # no cross-tenant cached token
        globex.close()
        acme.close()
    raw.close()


def test_redis_killed_mid_run_no_call_fails(redis_server_factory) -> None:
    server = redis_server_factory()
    with SimFleet(2) as fleet:
        model = ChatSGLang(model="sim", workers=fleet.urls, redis_url=server.url, max_tokens=4)
        history = [SystemMessage(SYSTEM)]
        outcomes = []
        for step in range(9):
            if step == 3:
                server.stop()
            if step == 6:
                server.start()
            history.append(HumanMessage(f"step {step}"))
            msg = model.invoke(history, session_id="through-outage")
            assert msg.content
            outcomes.append(msg.response_metadata["routing"])
        assert outcomes[:3] == ["placed_least_load", "pinned", "pinned"]
        assert "degraded" in outcomes[3:6]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workers": ["ftp://gpu-1:30000"]}, "workers[0]"),
        ({"workers": []}, "base_url"),
        ({"base_url": "http://127.0.0.1:30000", "redis_url": "http://127.0.0.1:6379"}, "redis_url"),
        ({"base_url": "http://127.0.0.1:30000", "templates": "sometimes"}, "templates"),
    ],
)
def test_bad_configuration_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ChatSGLang(model="sim", **kwargs)
    assert info.value.field == field


async def test_aclose_leaves_no_redis_connection_open(redis_server_factory, lc_fleet) -> None:
    import redis as redis_py

    server = redis_server_factory()
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, redis_url=server.url, max_tokens=4)
    reply = await model.ainvoke("hello", session_id="close-me")
    assert reply.response_metadata["routing"] == "placed_least_load"
    probe = redis_py.Redis.from_url(server.url)
    assert len(probe.client_list()) >= 2  # the probe and the model's async store client
    await model.aclose()
    deadline = time.monotonic() + 5
    while len(probe.client_list()) != 1:
        assert time.monotonic() < deadline, f"connections left open: {probe.client_list()}"
        await asyncio.sleep(0.02)
    assert all(w["inflight"] == 0 for w in RedisStore(server.url).stats(time.time())["workers"].values())
    probe.close()
