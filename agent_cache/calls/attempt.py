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

:func:`awhole` is the attempt of a call sent whole (the worker answers once,
at its end): the first attempt waits the worker's adaptive deadline for
whole answers, and shortly before it asks the worker's ``/health``
(:func:`alive_within`): a worker that answers is busy with a long answer and
is waited for another deadline; one that does not has hung, and the attempt
fails as a timeout at the deadline (retried elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncGenerator, AsyncIterator, Iterator

from agent_cache.calls.jsonio import json_object
from agent_cache.calls.prepare import Call
from agent_cache.calls.reader import Event, EventReader, usage_of
from agent_cache.calls.transport import SyncWorkerTransport, WorkerTransport
from agent_cache.errors import ResponseMismatchError, WorkerTimeoutError
from agent_cache.routing.first_byte import FirstByteDeadlines
from agent_cache.routing.lifecycle import Attempt

# seconds before a whole answer's deadline its worker's /health is asked (at most half the deadline):
# SGLang's answers within about 1 s while its scheduler runs (it checks each second whether a forward
# pass ended)
HEALTH_WAIT = 2.0


class _Steps:
    """What the runners share: the deadline, the first byte's time, each line's event."""

    def __init__(self, call: Call, attempt: Attempt, deadlines: FirstByteDeadlines, cap: float | None,
                 first_attempt: bool) -> None:
        self.worker = attempt.placement.worker
        self.attempt = attempt
        self.deadlines = deadlines
        # the first attempt waits the worker's adaptive deadline (a hung worker is left after a few
        # of its usual times to first byte); a retry waits ``cap``, so a slow prompt still gets its answer
        self.size = len(call.body)
        # a call larger than the worker's recent ones, or behind others still in their prefill, waits longer
        ahead = deadlines.waiting(self.worker, self.size)
        self.wait = deadlines.deadline(self.worker, cap, ahead) if first_attempt else cap
        self.reader = EventReader(self.worker, call.path, call.include_usage)
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
                  cap: float | None, first_attempt: bool, early: Any = None) -> AsyncGenerator[Event, None]:
    """The events of one attempt (async); ``early``: the call, already sent to this worker."""
    steps = _Steps(call, attempt, deadlines, cap, first_attempt)
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


@contextlib.asynccontextmanager
async def alive_within(transport: WorkerTransport, worker: str, wait: float | None) -> AsyncIterator[None]:
    """Bound the wait for ``worker`` in the block by ``wait`` seconds (None: no bound), as long as the
    worker shows it is alive: shortly before the bound (:data:`HEALTH_WAIT` seconds, at most half of
    ``wait``) its ``/health`` is asked; an answer by the bound moves it ``wait`` on, else the block is
    cancelled at the bound and :class:`WorkerTimeoutError` raised. A hung worker is left after ``wait``,
    as a stream's first-byte deadline leaves it; an ``asyncio.timeout`` with no task of its own until a
    check is due."""
    if wait is None:
        yield
        return
    loop = asyncio.get_running_loop()
    lead = min(HEALTH_WAIT, wait / 2)
    bound = asyncio.timeout(loop.time() + wait)
    pending: list[asyncio.TimerHandle | asyncio.Task[None]] = []  # the next check's timer, checks under way

    async def check(until: float) -> None:
        try:
            alive = await transport.alive(worker, lead)
        except Exception:  # whatever it was, the worker did not show it is alive
            alive = False
        if alive:
            bound.reschedule(until + wait)
            pending.append(loop.call_at(until + wait - lead, due, until + wait))
        else:  # an error status, a refused connection: no need to wait for the bound
            bound.reschedule(loop.time())

    def due(until: float) -> None:
        pending.append(loop.create_task(check(until)))

    pending.append(loop.call_at(loop.time() + wait - lead, due, loop.time() + wait))
    try:
        async with bound:
            yield
    except TimeoutError:
        if not bound.expired():
            raise
        raise WorkerTimeoutError(f"no answer within {wait:g} s, nor from /health within {lead:g} s",
                                 url=worker) from None
    finally:
        for left in pending:
            left.cancel()


async def awhole(transport: WorkerTransport, call: Call, attempt: Attempt, *, deadlines: FirstByteDeadlines,
                 cap: float | None, first_attempt: bool, early: Any = None) -> bytes:
    """One attempt of a call sent whole: the worker's answer, its usage left on ``attempt``. The first
    attempt waits the deadline of the workers' recent times to a whole answer (``deadlines``, ``whole=True``),
    then as long as the worker answers its ``/health``; a retry waits the transport's timeout; ``early``:
    the call, already sent to this worker."""
    worker, size = attempt.placement.worker, len(call.body)
    ahead = deadlines.waiting(worker, size)
    wait = deadlines.deadline(worker, cap, ahead, whole=True) if first_attempt else None
    started = time.monotonic()
    try:
        async with alive_within(transport, worker, wait):
            raw = await transport.post(worker, call.path, call.body, early=early)
    finally:
        deadlines.answered(worker, size)
    deadlines.observe(worker, time.monotonic() - started, size, whole=True)
    if raw.startswith(b"data:"):  # an event stream: an option of the request asked for it
        raise ResponseMismatchError("the worker answered a whole request with a stream", url=worker, status=200)
    attempt.usage = usage_of(json_object(raw, worker), call.path)
    return raw
