"""Fuzzed calls (hypothesis): messages, tools, session ids, tenants and options.

Each call either succeeds against the simulated workers, or fails with an
``agent_cache.errors`` type naming the field; a rejected call writes no key
to the store (Redis, compared key by key before and after).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from agent_cache import ChatSGLang
from agent_cache.errors import AgentCacheError
from agent_cache.routing import Router
from agent_cache.store import RedisStore

pytestmark = pytest.mark.redis

# text with what breaks naive code: control characters, lone surrogates, NUL, long runs
_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from(["", "\x00", "a\nb", "x" * 5000, "Today is 2026-12-03."]),
)
_image_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.just({"url": "data:image/png;base64,AA"})}),
    st.fixed_dictionaries({"type": st.just("image_url")}),  # no image_url
)
_content = st.one_of(_text, st.lists(st.one_of(_text, st.fixed_dictionaries(
    {"type": st.just("text"), "text": _text}), _image_part), max_size=3))
_message = st.one_of(
    st.builds(SystemMessage, content=_content),
    st.builds(HumanMessage, content=_content),
    st.builds(AIMessage, content=_text),
    st.builds(ToolMessage, content=_text, tool_call_id=st.text(max_size=8)),
)
_tool = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.text(min_size=1, max_size=10), "parameters": st.just({"type": "object", "properties": {}})})}),
    st.dictionaries(st.text(max_size=5), _text, max_size=2),  # malformed
)
_number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(),
                    st.text(max_size=3))
_options = st.fixed_dictionaries({}, optional={
    "temperature": _number,
    "top_p": _number,
    "max_tokens": st.one_of(st.integers(-3, 8), st.floats(allow_nan=True)),
    "stop": st.one_of(st.lists(_text, max_size=2), st.just([float("nan")])),
    "extra_body": st.one_of(st.just({"extra_key": "other-tenant"}), st.just({"cache_salt": "x"}),
                            st.dictionaries(st.sampled_from(["priority", "rid"]), _text, max_size=1)),
    "seed": _number,
})
_session = st.one_of(st.text(min_size=1, max_size=20), st.just("s" * 100_000), _text)
_tenant = st.one_of(st.sampled_from(["default", "acme", "globex", "default", "acme", "t" * 500, "a\x07b", ""]),
                    st.text(max_size=10))


@pytest.fixture(scope="module")
def deployment(lc_fleet, redis_server):
    prefix = f"fuzz-{uuid.uuid4().hex[:8]}"
    # a long lease: its background renewal (a write of its own) never lands between two snapshots
    router = Router(lc_fleet.urls, store=RedisStore(redis_server.url, prefix=prefix), probe_interval=None,
                    lease=3600.0)
    raw = redis.Redis.from_url(redis_server.url)
    yield lc_fleet, router, raw, prefix
    router.close()
    raw.close()


def _keys(raw: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of the deployment with its content (a rejected call must change none)."""
    out: dict[bytes, Any] = {}
    for name in raw.scan_iter(match="{" + prefix + "}:*"):
        kind = raw.type(name)
        out[name] = {b"hash": raw.hgetall, b"zset": lambda n: raw.zrange(n, 0, -1, withscores=True),
                     b"set": raw.smembers}.get(kind, raw.dump)(name)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(messages=st.lists(_message, min_size=1, max_size=3), tools=st.none() | st.lists(_tool, max_size=2),
       session=_session, tenant=_tenant, options=_options)
def test_every_rejection_is_typed_names_its_field_and_writes_nothing(deployment, messages, tools, session, tenant,
                                                                     options) -> None:
    fleet, router, raw, prefix = deployment
    try:
        model = ChatSGLang(model="sim", workers=fleet.urls, router=router, tenant=tenant, max_tokens=2)
    except AgentCacheError as exc:
        assert getattr(exc, "field", ""), exc
        event(f"model refused: {exc.field}")
        return
    router.flush()
    model._registry.flush()
    before = _keys(raw, prefix)
    call: dict[str, Any] = dict(options)
    if tools is not None:
        call["tools"] = tools
    try:
        reply = model.invoke(messages, session_id=session, **call)
    except AgentCacheError as exc:
        assert getattr(exc, "field", ""), f"{type(exc).__name__} names no field: {exc}"
        event(f"call refused: {exc.field.split('[')[0].split('.')[0]}")
        router.flush()
        model._registry.flush()
        after = _keys(raw, prefix)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        assert not changed, f"a rejected call ({exc}) wrote to the store: {changed}"
    else:
        assert isinstance(reply, AIMessage)
        event("served")
    finally:
        model._registry.close()
