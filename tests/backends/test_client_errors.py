"""Every error class of the SGLang client, against real servers on loopback.

Most come from the simulated worker; the failures a healthy SGLang never
produces (broken JSON, a stream cut short, a 429) come from a tiny
misbehaving worker defined here.
"""

from __future__ import annotations

import asyncio
from typing import Iterator

import langchain_core.exceptions as lc
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_cache.backends import AsyncSGLangClient, SGLangClient
from agent_cache.errors import (
    ConfigError,
    ContextLengthError,
    MalformedResponseError,
    StreamError,
    WorkerBadRequestError,
    WorkerConnectionError,
    WorkerRateLimitError,
    WorkerServerError,
    WorkerTimeoutError,
)
from agent_cache.sim import SimFleet, ThreadedServer

MSGS = [{"role": "user", "content": "hello"}]


def _misbehaving_app() -> Starlette:
    async def bad_json(request):
        return Response(b'{"id": "x", "choices": [', media_type="application/json")

    async def missing_fields(request):
        return JSONResponse({"id": "x", "object": "chat.completion"})

    async def rate_limited(request):
        return JSONResponse({"error": {"message": "slow down", "code": 429}}, status_code=429)

    async def cut_stream(request):
        async def body():
            yield b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"par"}}]}\n\n'

        return StreamingResponse(body(), media_type="text/event-stream")

    async def error_event(request):
        async def body():
            yield b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
            yield (b'data: {"error": {"object": "error", "message": "scheduler aborted", '
                   b'"type": "InternalServerError", "param": null, "code": 500}}\n\n')
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    async def route(request):
        mode = request.path_params["mode"]
        body = await request.json()
        if body.get("stream"):
            return await {"cut": cut_stream, "event": error_event}.get(mode, cut_stream)(request)
        return await {"badjson": bad_json, "missing": missing_fields, "429": rate_limited}[mode](request)

    return Starlette(routes=[Route("/{mode}/v1/chat/completions", route, methods=["POST"])])


@pytest.fixture(scope="module")
def broken() -> Iterator[str]:
    server = ThreadedServer(_misbehaving_app)
    server.start()
    yield server.url
    server.stop()


def test_connection_refused_is_retryable(free_port_factory) -> None:
    url = f"http://127.0.0.1:{free_port_factory()}"
    with pytest.raises(WorkerConnectionError) as info:
        SGLangClient(url).chat(MSGS)
    assert info.value.url == url and info.value.retryable is True
    assert isinstance(info.value, lc.ModelConnectionError)


def test_timeout() -> None:
    # 8k uncached tokens at ~27.7k tokens/s, slowed 100x: ~29 s of simulated prefill
    with SimFleet(1, time_scale=100.0) as fleet:
        with pytest.raises(WorkerTimeoutError) as info:
            SGLangClient(fleet.urls[0], timeout=0.3).chat([{"role": "user", "content": "word " * 8000}])
        assert info.value.retryable and isinstance(info.value, lc.ModelTimeoutError)


def test_bad_request_is_not_retryable(worker: str) -> None:
    with pytest.raises(WorkerBadRequestError) as info:
        SGLangClient(worker).chat([])
    assert info.value.status == 400 and info.value.retryable is False
    assert "messages" in str(info.value)
    assert isinstance(info.value, lc.ModelInvalidRequestError)


def test_context_length_error() -> None:
    with SimFleet(1, max_total_tokens=64) as fleet:
        with pytest.raises(ContextLengthError) as info:
            SGLangClient(fleet.urls[0]).chat([{"role": "user", "content": "word " * 100}])
        assert isinstance(info.value, lc.ContextOverflowError) and info.value.retryable is False


def test_503_while_starting() -> None:
    with SimFleet(1, startup_seconds=60) as fleet:
        client = SGLangClient(fleet.urls[0])
        with pytest.raises(WorkerServerError) as info:
            client.health()
        assert info.value.status == 503 and info.value.retryable
        with pytest.raises(WorkerServerError):
            client.chat(MSGS)


def test_rate_limit(broken: str) -> None:
    with pytest.raises(WorkerRateLimitError) as info:
        SGLangClient(f"{broken}/429").chat(MSGS)
    assert "slow down" in str(info.value) and info.value.retryable
    assert isinstance(info.value, lc.ModelRateLimitError)


def test_malformed_json_and_missing_fields(broken: str) -> None:
    with pytest.raises(MalformedResponseError, match="not valid JSON"):
        SGLangClient(f"{broken}/badjson").chat(MSGS)
    with pytest.raises(MalformedResponseError, match="choices"):
        SGLangClient(f"{broken}/missing").chat(MSGS)


def test_stream_without_done_is_an_error_not_a_truncation(broken: str) -> None:
    seen = []
    with pytest.raises(StreamError, match=r"\[DONE\]"):
        for chunk in SGLangClient(f"{broken}/cut").stream_chat(MSGS):
            seen.append(chunk.content)
    assert seen == ["par"]


def test_error_event_mid_stream(broken: str) -> None:
    with pytest.raises(StreamError, match="scheduler aborted") as info:
        list(SGLangClient(f"{broken}/event").stream_chat(MSGS))
    assert info.value.status == 500


def test_async_client_same_errors(broken: str, worker: str, free_port_factory) -> None:
    async def run() -> None:
        async with AsyncSGLangClient(f"{broken}/event") as client:
            with pytest.raises(StreamError):
                async for _ in client.stream_chat(MSGS):
                    pass
        async with AsyncSGLangClient(f"{broken}/cut") as client:
            with pytest.raises(StreamError, match=r"\[DONE\]"):
                async for _ in client.stream_chat(MSGS):
                    pass
        async with AsyncSGLangClient(f"http://127.0.0.1:{free_port_factory()}") as client:
            with pytest.raises(WorkerConnectionError):
                await client.chat(MSGS)
        async with AsyncSGLangClient(worker) as client:
            with pytest.raises(WorkerBadRequestError):
                await client.chat([])

    asyncio.run(run())


def test_unknown_field_is_refused_before_sending(worker: str) -> None:
    with pytest.raises(WorkerBadRequestError, match="max_tokenz"):
        SGLangClient(worker).chat(MSGS, max_tokenz=5)


@pytest.mark.parametrize("url", ["ftp://host:1", "localhost:30000", "", "http://", "http://a b:1",
                                 "http://ho\nst:1", "http://host:99999", "http://host:port", "http://host:1/?x=1",
                                 "http://host:1/#frag", "http://ho\tst:1", "http://admin:PW@host:1", "http://u@host:1"])
def test_bad_worker_url(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        SGLangClient(url)
    assert info.value.field == "base_url"
    assert "PW" not in str(info.value)  # a password given by mistake is not repeated in the error


def test_a_worker_list_with_a_bad_url_names_its_index_and_routes_nothing() -> None:
    from agent_cache import ChatSGLang

    with pytest.raises(ConfigError) as info:
        ChatSGLang(model="sim", workers=["http://127.0.0.1:1", "http://a b:2"])
    assert info.value.field == "workers[1]" and "whitespace" in str(info.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:30000", " http://h:1/ ", "https://h/v1", "http://h:1/prefix"])
def test_good_worker_urls_still_pass(url: str) -> None:
    assert SGLangClient(url).base_url == url.strip().rstrip("/").removesuffix("/v1")
