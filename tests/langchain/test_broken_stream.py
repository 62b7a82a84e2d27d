"""A worker dying mid-stream: the call lifecycle's runners through ChatSGLang, against real servers.

The dying worker is a tiny server that sends one content chunk and closes
the stream; the other is a simulated worker.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest
from langchain_core.messages import HumanMessage
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agent_cache import ChatSGLang
from agent_cache.errors import StreamError
from agent_cache.placement import rendezvous_pick
from agent_cache.sim import ThreadedServer



class _CutWorker:
    """Answers every chat completion with one content chunk, then closes the stream (a worker dying)."""

    def __init__(self) -> None:
        self.calls = 0

    def app(self) -> Starlette:
        async def chat(request: Any) -> StreamingResponse:
            self.calls += 1

            async def body() -> Any:
                yield (b'data: {"id":"x","object":"chat.completion.chunk","model":"sim",'
                       b'"choices":[{"index":0,"delta":{"content":"half an ans"}}]}\n\n')

            return StreamingResponse(body(), media_type="text/event-stream")

        async def health(request: Any) -> Response:  # healthy until the stream breaks
            return Response(status_code=200)

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


@pytest.fixture
def cut_and_good(lc_fleet) -> Iterator[tuple[_CutWorker, str, str]]:
    cut = _CutWorker()
    server = ThreadedServer(cut.app)
    server.start()
    yield cut, server.url, lc_fleet.urls[0]
    server.stop()


def _session_placed_first_on(worker: str, workers: list[str]) -> str:
    """A session id whose first placement on an empty fleet is ``worker`` (equal costs: rendezvous)."""
    return next(f"s{i}" for i in range(1000) if rendezvous_pick(f"s{i}", workers) == worker)


def test_invoke_on_a_streaming_model_survives_a_worker_dying_mid_stream(cut_and_good) -> None:
    cut, cut_url, good = cut_and_good
    model = ChatSGLang(model="sim", workers=[cut_url, good], streaming=True, max_tokens=8)
    session = _session_placed_first_on(cut_url, [cut_url, good])
    msg = model.invoke([HumanMessage("hello")], session_id=session)
    assert cut.calls == 1  # the first attempt went to the dying worker
    assert msg.response_metadata["worker"] == good
    assert "half an ans" not in msg.content and msg.content  # only the attempt that succeeded
    assert msg.usage_metadata["input_tokens"] > 0
    model.close()


def test_ainvoke_on_a_streaming_model_survives_it_too(cut_and_good) -> None:
    cut, cut_url, good = cut_and_good
    model = ChatSGLang(model="sim", workers=[cut_url, good], streaming=True, max_tokens=8)
    session = _session_placed_first_on(cut_url, [cut_url, good])

    async def go() -> Any:
        try:
            return await model.ainvoke([HumanMessage("hello")], session_id=session)
        finally:
            await model.aclose()

    msg = asyncio.run(go())
    assert cut.calls == 1 and msg.response_metadata["worker"] == good
    assert "half an ans" not in msg.content


def test_stream_keeps_the_error_once_a_chunk_reached_the_caller(cut_and_good) -> None:
    cut, cut_url, good = cut_and_good
    model = ChatSGLang(model="sim", workers=[cut_url, good], max_tokens=8)
    session = _session_placed_first_on(cut_url, [cut_url, good])
    received = []
    with pytest.raises(StreamError):
        for chunk in model.stream([HumanMessage("hello")], session_id=session):
            received.append(chunk.content)
    assert received == ["half an ans"] and cut.calls == 1
    # the failed attempt was settled: nothing is left in flight on either worker
    workers = model.routing.store.stats(0)["workers"]
    assert workers[cut_url]["inflight"] == 0 and workers[good]["inflight"] == 0
    model.close()
