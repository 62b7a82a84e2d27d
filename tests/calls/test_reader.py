"""The one SSE reader, on byte-exact streams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_cache.backends.protocol import Usage
from agent_cache.calls.reader import EventReader
from agent_cache.errors import MalformedResponseError, ResponseMismatchError, StreamError, WorkerBadRequestError

W = "http://w"


def _sse(*events: Any) -> list[bytes]:
    lines: list[bytes] = []
    for event in events:
        data = event if isinstance(event, bytes) else json.dumps(event).encode()
        lines += [b"data: " + data + b"\n", b"\n"]
    return lines


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, index: int = 0, **extra: Any) -> dict:
    choice = {"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish, **extra}
    return {"id": "r1", "object": "chat.completion.chunk", "created": 7, "model": "m", "choices": [choice],
            "usage": None}


USAGE = {"id": "r1", "object": "chat.completion.chunk", "created": 7, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                   "prompt_tokens_details": {"cached_tokens": 4}}}


def _read(lines: list[bytes], include_usage: bool = True) -> tuple[EventReader, list[bytes]]:
    reader = EventReader(W, "/v1/chat/completions", include_usage)
    out = [e.raw for line in lines if (e := reader.feed(line)) is not None]
    last = reader.end()
    return reader, out + ([last.raw] if last is not None else [])


def test_events_pass_through_byte_for_byte_and_the_usage_is_noted() -> None:
    lines = [b"\n", b": keep-alive\n", *_sse(_chunk({"content": "hi"}), USAGE, b"[DONE]")]
    reader, events = _read(lines)
    assert b"".join(events) == b"".join(lines[2:])  # blank lines and comments before the first event: dropped
    assert reader.usage == Usage(10, 3, 4) and reader.done


def test_the_usage_event_asked_for_on_the_callers_behalf_is_read_but_not_given_out() -> None:
    reader, events = _read(_sse(_chunk({"content": "hi"}), USAGE, b"[DONE]"), include_usage=False)
    assert len(events) == 2 and b"prompt_tokens" not in b"".join(events) and reader.usage == Usage(10, 3, 4)


def test_what_is_not_a_whole_event_stream_is_an_error() -> None:
    with pytest.raises(MalformedResponseError):
        _read([b"<html>\n"])
    with pytest.raises(StreamError):
        _read(_sse(_chunk({"content": "hi"})))  # no [DONE]
    reader = EventReader(W, "/v1/chat/completions")
    event = reader.feed(b'data: {"error": {"message": "bad", "code": 400}}\n') or reader.feed(b"\n")
    assert event is not None and isinstance(event.error(), WorkerBadRequestError)


def test_a_whole_json_answer_to_a_stream_is_a_mismatch() -> None:
    body = json.dumps({"id": "r1", "choices": [{"index": 0, "message": {"content": "hi"}}],
                       "usage": USAGE["usage"]}).encode()
    with pytest.raises(ResponseMismatchError):
        _read([body + b"\n"])
