"""Closing ``ChatSGLang``: ``with`` / ``async with``, and a script that never closes still writes what it owes
at exit, within a bounded time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from agent_cache import exit_flush
from agent_cache.langchain import ChatSGLang
from agent_cache.routing.router import Router
from agent_cache.store.redis_store import RedisStore

SCRIPT = textwrap.dedent("""
    import json, sys
    from agent_cache.langchain import ChatSGLang
    from agent_cache.routing.router import Router

    workers, redis_url, prefix = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    model = ChatSGLang(model="sim", router=Router(workers, redis_url=redis_url, prefix=prefix, probe_interval=None))
    prompt, cached = 0, 0
    for i in range(3):
        out = model.invoke([("system", "You answer briefly. " * 40), ("user", f"question {i}")], session_id="s")
        prompt += out.usage_metadata["input_tokens"]
        cached += out.usage_metadata["input_token_details"]["cache_read"]
    print(json.dumps({"prompt": prompt, "cached": cached}), flush=True)
    if len(sys.argv) > 4:
        sys.stdin.readline()  # the test freezes the store, then lets the script end
    # no close(): the last release, usage report and template record are still queued
""")


def _run(fleet, redis_url: str, prefix: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, ",".join(fleet.urls), redis_url, prefix, *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_script_ending_without_close_writes_its_last_report(lc_fleet, redis_url):
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    proc = _run(lc_fleet, redis_url, prefix)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    sent = json.loads(out)
    store = RedisStore(redis_url, prefix=prefix)
    try:
        stats = store.stats(time.time())
    finally:
        store.close()
    workers = stats["workers"].values()
    assert sum(w["inflight"] for w in workers) == 0, stats  # every call released
    # every usage report written, the last included
    assert sum(w["prompt_tokens"] for w in workers) == sent["prompt"], (stats, sent)
    assert sum(w["cached_tokens"] for w in workers) == sent["cached"], (stats, sent)
    assert stats["templates_in_window"] == 1 and stats["sessions"] == 1, stats


@pytest.mark.slow
def test_exit_is_bounded_when_the_store_does_not_answer(lc_fleet, redis_server_factory):
    server = redis_server_factory()
    proc = _run(lc_fleet, server.url, "frozen", "wait")
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline())["prompt"] > 0
        server.pause()
        t0 = time.monotonic()
        proc.communicate("go\n", timeout=30)
        assert time.monotonic() - t0 < exit_flush.EXIT_BUDGET + 2.0
    finally:
        server.resume()
        proc.kill()


def test_with_closes_and_writes_at_once(lc_fleet, redis_url):
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    router = Router(lc_fleet.urls, redis_url=redis_url, prefix=prefix, probe_interval=None)
    with ChatSGLang(model="sim", workers=lc_fleet.urls) as model:
        model.invoke("hello")
    assert model.routing.outbox.pending.held() == {} and model._transport is None
    with router, ChatSGLang(model="sim", router=router) as model:
        model.invoke("hello", session_id="w")
    stats = RedisStore(redis_url, prefix=prefix).stats(time.time())
    assert sum(w["inflight"] for w in stats["workers"].values()) == 0 and stats["sessions"] == 1, stats


async def test_async_with_closes(lc_fleet):
    async with ChatSGLang(model="sim", workers=lc_fleet.urls) as model:
        out = await model.ainvoke("hello")
    assert out.usage_metadata is not None
    assert not model._atransports  # this loop's transport closed
