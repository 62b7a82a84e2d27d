"""One attempt of a call on one worker, the same for both doors: send, read events, time the first byte.

:func:`astream` and :func:`stream` are the async and sync runners of the same
steps: ask the transport for the worker's stream (the first attempt within
the worker's adaptive first-byte deadline, a retry within the stall timeout),
note the worker's time to first byte (on the attempt too, for the call's
latency series), feed the lines to the
:class:`~agent_cache.calls.reader.EventReader`, raise an error event that
comes before any output reached the caller, and leave the worker's usage on
the :class:`~agent_cache.routing.lifecycle.Attempt` once ``[DONE]`` came.
The door decides what an event becomes, and sets ``attempt.delivered`` once
output reached its caller.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, AsyncGenerator, AsyncIterator, Iterator

from agent_cache.calls.prepare import Call
from agent_cache.calls.reader import Event, EventReader
from agent_cache.calls.transport import SyncWorkerTransport, WorkerTransport
from agent_cache.routing.first_byte import FirstByteDeadlines
from agent_cache.routing.lifecycle import Attempt


class _Steps:
    """What the runners share: the deadline, the first byte's time, each line's event."""

    def __init__(self, call: Call, attempt: Attempt, deadlines: FirstByteDeadlines, cap: float | None,
                 first_attempt: bool, whole_ok: bool = False) -> None:
        self.worker = attempt.placement.worker
        self.attempt = attempt
        self.deadlines = deadlines
        # the first attempt waits the worker's adaptive deadline (a hung worker is left after a few
        # of its usual times to first byte); a retry waits ``cap``, so a slow prompt still gets its answer
        self.size = len(call.body)
        # a call larger than the worker's recent ones, or behind others still in their prefill, waits longer
        ahead = deadlines.waiting(self.worker, self.size)
        self.wait = deadlines.deadline(self.worker, cap, ahead) if first_attempt else cap
        # a whole answer where a stream was asked is an answer when the caller wants the whole answer
        self.reader = EventReader(self.worker, call.path, call.include_usage, whole_ok=whole_ok)
        self.started = time.monotonic()
        self.first = True

    def line(self, line: bytes) -> Event | None:
        if self.first:
            now = self.attempt.first_byte = time.monotonic()  # the call's time to first token ends here
            self.deadlines.observe(self.worker, now - self.started, self.size)
            self.done()
        return self.checked(self.reader.feed(line))

    def done(self) -> None:
        """No longer waiting for the first byte (it came, or the attempt ended)."""
        if self.first:
            self.first = False
            self.deadlines.answered(self.worker, self.size)

    @contextlib.asynccontextmanager
    async def aclosing(self, lines: AsyncIterator[bytes]) -> AsyncIterator[None]:
        """Reading ``lines``: closed at the end, however it ends, and no longer waiting."""
        try:
            yield
        finally:
            self.done()
            await lines.aclose()  # type: ignore[attr-defined]  # the transports' lines are generators

    @contextlib.contextmanager
    def closing(self, lines: Iterator[bytes]) -> Iterator[None]:
        """Sync :meth:`aclosing`."""
        try:
            yield
        finally:
            self.done()
            lines.close()  # type: ignore[attr-defined]

    def checked(self, event: Event | None) -> Event | None:
        if event is not None and not self.attempt.delivered and (error := event.error()) is not None:
            raise error  # before any output: the flow may retry it elsewhere
        return event

    def end(self) -> Event | None:
        event = self.checked(self.reader.end())
        self.attempt.usage = self.reader.usage
        return event


async def astream(transport: WorkerTransport, call: Call, attempt: Attempt, *, deadlines: FirstByteDeadlines,
                  cap: float | None, first_attempt: bool, early: Any = None,
                  whole_ok: bool = False) -> AsyncGenerator[Event, None]:
    """The events of one attempt (async); ``early``: the call, already sent to this worker;
    ``whole_ok``: see :class:`~agent_cache.calls.reader.EventReader`."""
    steps = _Steps(call, attempt, deadlines, cap, first_attempt, whole_ok)
    lines = transport.stream(steps.worker, call.path, call.body, first_byte_timeout=steps.wait, early=early)
    async with steps.aclosing(lines):  # a failed attempt closes its connection
        async for line in lines:
            if (event := steps.line(line)) is not None:
                yield event
    if (event := steps.end()) is not None:
        yield event


def stream(transport: SyncWorkerTransport, call: Call, attempt: Attempt, *, deadlines: FirstByteDeadlines,
           cap: float | None, first_attempt: bool) -> Iterator[Event]:
    """Sync :func:`astream`."""
    steps = _Steps(call, attempt, deadlines, cap, first_attempt)
    lines = transport.stream(steps.worker, call.path, call.body, first_byte_timeout=steps.wait)
    with steps.closing(lines):
        for line in lines:
            if (event := steps.line(line)) is not None:
                yield event
    if (event := steps.end()) is not None:
        yield event
