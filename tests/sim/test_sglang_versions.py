"""``--sglang-version``: each release's routes and fields, and the client and router against them."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agent_cache.backends import SGLangClient
from agent_cache.errors import WorkerAbortedError
from agent_cache.routing.router import RouteRequest, Router
from agent_cache.sim import SimFleet, ThreadedServer

MSGS = [{"role": "system", "content": "Shared system prompt. " * 20}, {"role": "user", "content": "hi"}]


def _status(url: str, path: str) -> int:
    method = "POST" if path == "/tokenize" else "GET"
    return httpx.request(method, url + path, json={"prompt": "x"} if method == "POST" else None).status_code


@pytest.mark.parametrize(
    "version, present, absent",
    [
        ("0.5.2", {"/get_server_info", "/get_model_info", "/get_load"},
         {"/server_info", "/model_info", "/v1/loads", "/tokenize"}),
        ("0.5.4", {"/get_server_info", "/get_model_info", "/tokenize"}, {"/server_info", "/model_info", "/v1/loads"}),
        ("0.5.6", {"/server_info", "/model_info", "/get_server_info"}, {"/v1/loads"}),
        ("0.5.9", {"/server_info", "/v1/loads", "/tokenize", "/get_model_info"}, set()),
    ],
)
def test_each_version_serves_its_routes(version: str, present: set[str], absent: set[str]) -> None:
    with SimFleet(1, sglang_version=version) as fleet:
        url = fleet.urls[0]
        for path in present:
            assert _status(url, path) == 200, (version, path)
        for path in absent:
            assert _status(url, path) == 404, (version, path)
        assert httpx.get(url + "/get_server_info").json()["version"] == version


def test_extra_key_is_ignored_before_0_5_11_and_zero_hits_are_null_before_0_5_22() -> None:
    for version, isolates, zero in (("0.5.4", False, None), ("0.5.11", True, None), ("0.5.23", True, 0)):
        with SimFleet(1, sglang_version=version) as fleet:
            client = SGLangClient(fleet.urls[0])
            first = client.chat(MSGS, extra_key="tenant-a", max_tokens=5)
            assert first.usage is not None and first.usage.cached_tokens == zero, version
            other = client.chat(MSGS, extra_key="tenant-b", max_tokens=5)
            assert other.usage is not None
            shared = bool(other.usage.cached_tokens)
            assert shared is not isolates, version
            client.close()


def test_models_card_and_chat_id_as_sglang() -> None:
    with SimFleet(1, sglang_version="0.5.9") as fleet:
        url = fleet.urls[0]
        card = httpx.get(url + "/v1/models").json()["data"][0]
        assert card["root"] == card["id"] and isinstance(card["created"], int) and card["parent"] is None
        chat = httpx.post(url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, "rid": "r-1"}).json()
        assert chat["id"] == "r-1"
        gen = httpx.post(url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 3}}).json()
        assert len(gen["output_ids"]) == gen["meta_info"]["completion_tokens"]
        assert gen["meta_info"]["weight_version"] == "default"
    with SimFleet(1, sglang_version="0.5.4") as fleet:
        card = httpx.get(fleet.urls[0] + "/v1/models").json()["data"][0]
        assert "parent" not in card


def test_metrics_only_with_enable_metrics() -> None:
    with SimFleet(1, enable_metrics=False) as fleet:
        assert httpx.get(fleet.urls[0] + "/metrics").status_code == 404


def test_client_falls_back_to_get_info_routes_on_0_5_4() -> None:
    with SimFleet(1, sglang_version="0.5.4", max_total_tokens=123_456) as fleet:
        client = SGLangClient(fleet.urls[0])
        assert client.server_info()["max_total_num_tokens"] == 123_456
        assert client.model_info()["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"
        client.close()


def test_router_keeps_a_0_5_4_worker_healthy_and_routes_to_it() -> None:
    with SimFleet(2, sglang_version="0.5.4", max_total_tokens=150_000) as fleet:
        router = Router(fleet.urls, probe_interval=None)
        try:
            router.probe_once()
            assert router.health.down(fleet.urls) == set()
            assert all(router._capacity[u] == 150_000 for u in fleet.urls)  # read from /get_server_info
            result, placement = router.execute(RouteRequest(session_id="s-1"),
                                               lambda url: SGLangClient(url).chat(MSGS, max_tokens=3))
            assert placement.worker in fleet.urls and result.usage is not None
        finally:
            router.close()


def test_a_slow_health_probe_does_not_open_the_breaker() -> None:
    # SGLang's /health sleeps 1 s before its first check: at time scale 1 it takes
    # a second; a 0.2 s probe timeout is a soft failure, not a dead worker
    with SimFleet(1, time_scale=1.0) as fleet:
        router = Router(fleet.urls, probe_interval=None, probe_timeout=0.2, failure_threshold=3)
        try:
            router.probe_once()
            assert router.health.down(fleet.urls) == set()
        finally:
            router.close()
        fleet.stop_worker(0)
        router = Router(fleet.urls, probe_interval=None, probe_timeout=0.2)
        try:
            router.probe_once()  # refused: hard
            assert router.health.down(fleet.urls) == set(fleet.urls)
        finally:
            router.close()


def _aborting_app() -> Starlette:
    async def chat(request):
        return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                          "finish_reason": "abort", "matched_stop": None}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}})

    async def generate(request):
        return JSONResponse({"text": "", "output_ids": [], "meta_info": {
            "id": "x", "prompt_tokens": 3, "completion_tokens": 0, "cached_tokens": 0,
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/generate", generate, methods=["POST"])])


def test_finish_reason_abort_is_a_retryable_error() -> None:
    server = ThreadedServer(_aborting_app)
    server.start()
    try:
        client = SGLangClient(server.url)
        with pytest.raises(WorkerAbortedError) as chat_err:
            client.chat([{"role": "user", "content": "hi"}])
        assert chat_err.value.retryable
        with pytest.raises(WorkerAbortedError, match="Abort in waiting queue"):
            client.generate(text="hi")
        client.close()
    finally:
        server.stop()
