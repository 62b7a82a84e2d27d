"""A worker that hangs mid-stream (its first events sent, then silence): past ``--stall-timeout`` the
gateway ends the stream with an error event and frees the call's slot, its tenant's concurrency and its
in-flight count, instead of holding them for the whole ``--timeout``."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from tests.gateway.intercepted_worker import InterceptedWorker


async def _hang_after_two_events(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for word in ("one", "two"):
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                    "more_body": True})
    await asyncio.sleep(30)  # hung: no more events, the connection kept open
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.mark.slow
def test_a_stream_stalled_past_the_bound_ends_with_an_error_event_and_frees_its_slot(tmp_path) -> None:
    worker = InterceptedWorker(_hang_after_two_events)
    worker.server.start()
    keys = tmp_path / "keys"
    keys.write_text("sk-one team-one concurrency=1\n")
    body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with Processes() as procs:
            gw = AgentCacheGateways(procs, [worker.url], args=["--api-keys", str(keys), "--stall-timeout", "1"]).urls[0]
            headers = {"authorization": "Bearer sk-one"}
            started = time.monotonic()
            with httpx.stream("POST", gw + "/v1/chat/completions", json=body, headers=headers, timeout=20) as r:
                assert r.status_code == 200
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            took = time.monotonic() - started
            assert took < 5, took  # the stall bound (1 s), not the 600 s timeout
            assert '"one"' in lines[0] and '"two"' in lines[1]
            error = json.loads(lines[-1].removeprefix("data: "))["error"]
            assert error["code"] == 502 and "stream broke" in error["message"]
            worker.intercept = None  # the worker serves again: the tenant's one slot is free
            after = httpx.post(gw + "/v1/chat/completions", json={**body, "stream": False}, headers=headers,
                               timeout=20)
            assert after.status_code == 200, after.text
    finally:
        worker.server.stop()
