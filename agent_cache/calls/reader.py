"""The one reader of a worker's server-sent events: lines in, whole events out, usage noted.

Pure (no I/O), so the gateway and ``ChatSGLang`` feed it from any transport:
the gateway passes each event's bytes on unchanged, ``ChatSGLang`` parses
their JSON into LangChain chunks. It also finds what every door needs from a
stream: the usage the worker reported (``usage`` for the OpenAI routes,
``meta_info`` for ``/generate``), an error event, that ``data: [DONE]`` came.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_cache.backends.protocol import parse_usage, stream_error_event
from agent_cache.calls.jsonio import json_object
from agent_cache.errors import BackendError, MalformedResponseError, ResponseMismatchError, StreamError
from agent_cache.values import Usage

GENERATE = "/generate"


@dataclass
class Event:
    """One event: its lines as they came (``raw``) and its ``data:`` payload (None: no data line)."""

    raw: bytes
    payload: bytes | None
    worker: str
    _data: dict[str, Any] | None = field(default=None, repr=False)

    def data(self) -> dict[str, Any]:
        """The payload as a JSON object (parsed once); a payload that is not one is malformed."""
        if self._data is None:
            self._data = json_object(self.payload or b"", self.worker)
        return self._data

    def error(self) -> BackendError | None:
        """The error an error event carries (``{"error": ...}`` or ``"object": "error"``)."""
        payload = self.payload
        if payload is None or b'"error"' not in payload or not (
                payload.startswith(b'{"error"') or b'"object":"error"' in payload.replace(b" ", b"")):
            return None
        return stream_error_event(self.data(), self.worker)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_of(data: dict[str, Any], path: str) -> Usage | None:
    """The usage a worker reported in a response body or stream event (``meta_info`` for ``/generate``)."""
    if path == GENERATE:
        meta = data.get("meta_info")
        if not isinstance(meta, dict):
            return None
        return Usage(_count(meta.get("prompt_tokens")), _count(meta.get("completion_tokens")),
                     _count(meta.get("cached_tokens")))
    try:
        return parse_usage(data.get("usage"))
    except (TypeError, ValueError):  # counts that are not numbers: no usage to learn from
        return None


class EventReader:
    """Reads one stream. ``include_usage``: the caller asked for the usage-only event (the worker is
    always asked for it, as the router learns from it); without, that event is read and not given out.
    A whole JSON body where a stream was asked (an option of the request can make SGLang answer so) is
    a :class:`ResponseMismatchError`."""

    def __init__(self, worker: str, path: str, include_usage: bool = True) -> None:
        self.worker = worker
        self.path = path
        self.include_usage = include_usage
        self.usage: Usage | None = None
        self.done = False
        self.events = 0  # events given out so far
        self._lines: list[bytes] = []
        self._payload: bytes | None = None

    def feed(self, line: bytes) -> Event | None:
        """One line (with its line ending); the event it completes, if any."""
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
            else:
                self._payload = payload
        elif not self.events and not self._lines:
            if line.lstrip().startswith(b"{"):  # a whole JSON answer: an option of the request asked for it
                raise ResponseMismatchError("the worker answered a streamed request with a JSON body",
                                            url=self.worker, status=200)
            if line.strip() and not line.startswith(b":"):
                raise MalformedResponseError("the stream is not server-sent events", url=self.worker)
            return None  # blank lines before the first event: nothing to pass on yet
        self._lines.append(line)
        if line in (b"\n", b"\r\n"):
            return self._event()
        return None

    def end(self) -> Event | None:
        """The stream ended: its last event if it had no closing blank line; raises if ``[DONE]`` never came."""
        event = self._event() if self._lines else None
        if not self.done:
            raise StreamError("stream ended without data: [DONE]", url=self.worker)
        return event

    def _event(self) -> Event | None:
        event = Event(b"".join(self._lines), self._payload, self.worker)
        self._lines, self._payload = [], None
        if event.payload is not None and b'"prompt_tokens"' in event.payload:
            found = usage_of(event.data(), self.path)
            self.usage = found or self.usage
            if not self.include_usage and found is not None and event.data().get("choices") == []:
                return None  # the usage chunk asked for on the caller's behalf
        self.events += 1
        return event
