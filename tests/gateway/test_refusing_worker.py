"""A worker that refuses every call it should serve (its SGLang ``--api-key`` differs from the fleet's:
401 on ``/v1``, ``/health`` open; or a wrong path: 404) is taken out of rotation within a few calls, costs
the callers nothing meanwhile, and comes back once it serves again. A request every worker refuses is the
request's fault: answered as it is, no worker blamed."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Callable, Iterator

import httpx
import pytest

from agent_cache.bench.realfleet import AgentCacheGateways, Processes
from agent_cache.sim import WorkerOptions, create_app
from agent_cache.sim.fleet import SimWorkerThread, ThreadedServer


class Refusing:
    """A simulated worker behind a switch: while ``status`` is set, every generation route answers it."""

    def __init__(self, status: int | None) -> None:
        self.status = status
        self.refused = 0
        self.server = ThreadedServer(self._app)

    def _app(self) -> Callable[..., Any]:
        inner = create_app(WorkerOptions(time_scale=0.0))

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and self.status is not None and (path.startswith("/v1/chat")
                                                                         or path == "/generate"):
                self.refused += 1
                await send({"type": "http.response.start", "status": self.status,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"error": "refused"}'})
                return
            await inner(scope, receive, send)

        return app


@pytest.fixture
def fleet() -> Iterator[tuple[list[SimWorkerThread], Refusing]]:
    good = [SimWorkerThread(WorkerOptions(time_scale=0.0)) for _ in range(2)]
    bad = Refusing(401)
    for w in good:
        w.start()
    bad.server.start()
    try:
        yield good, bad
    finally:
        for w in good:
            w.stop()
        bad.server.stop()


def _call(client: httpx.Client, session: str) -> httpx.Response:
    return client.post("/v1/chat/completions", headers={"x-session-id": session}, json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {session}"}]})


def _healthy(gateway: str, worker: str) -> float | None:
    text = httpx.get(gateway + "/metrics").text
    found = re.search(rf'^agent_cache_worker_healthy{{worker="{re.escape(worker)}"}} (\S+)$', text, re.M)
    return None if found is None else float(found.group(1))


@pytest.mark.parametrize("status", [401, 403, 404, 405])
def test_a_refusing_worker_is_taken_out_and_no_call_fails(fleet, status: int) -> None:
    good, bad = fleet
    bad.status = status
    urls = [bad.server.url, *(w.url for w in good)]
    with Processes() as procs:
        gw = AgentCacheGateways(procs, urls, args=["--prefix", f"t-{uuid.uuid4().hex[:8]}"]).urls[0]
        with httpx.Client(base_url=gw, timeout=30) as client:
            answers = [_call(client, f"s{i}") for i in range(40)]
            assert [r.status_code for r in answers] == [200] * 40  # a second opinion served each refused one
            assert bad.refused <= 3  # out of rotation within a few calls
            assert _healthy(gw, bad.server.url) == 0.0
            assert all(r.headers["x-agent-cache-worker"] != bad.server.url for r in answers)


def test_the_refusing_worker_comes_back_once_it_serves(fleet) -> None:
    good, bad = fleet
    urls = [bad.server.url, *(w.url for w in good)]
    with Processes() as procs:
        gw = AgentCacheGateways(procs, urls, args=["--prefix", f"t-{uuid.uuid4().hex[:8]}"]).urls[0]
        with httpx.Client(base_url=gw, timeout=30) as client:
            for i in range(10):
                assert _call(client, f"a{i}").status_code == 200
            assert _healthy(gw, bad.server.url) == 0.0
            bad.status = None  # its key fixed
            deadline = time.monotonic() + 20  # the first cool-down is 2 s: its half-open trial decides
            served_by_it = 0
            while time.monotonic() < deadline and not served_by_it:
                r = _call(client, f"b{uuid.uuid4().hex[:6]}")
                assert r.status_code == 200
                served_by_it += r.headers["x-agent-cache-worker"] == bad.server.url
                time.sleep(0.2)
            assert served_by_it and _healthy(gw, bad.server.url) == 1.0


def test_a_request_every_worker_refuses_is_answered_as_it_is_and_blames_none(fleet) -> None:
    good, bad = fleet
    bad.status = 404
    other = Refusing(404)
    other.server.start()
    try:
        with Processes() as procs:
            gw = AgentCacheGateways(procs, [bad.server.url, other.server.url],
                                    args=["--prefix", f"t-{uuid.uuid4().hex[:8]}"]).urls[0]
            with httpx.Client(base_url=gw, timeout=30) as client:
                r = _call(client, "all-refuse")
                assert r.status_code == 404
                assert _healthy(gw, bad.server.url) == _healthy(gw, other.server.url) == 1.0
    finally:
        other.server.stop()
