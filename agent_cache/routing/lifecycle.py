"""One model call's lifecycle: a pure flow of steps, driven by a sync or an async runner.

:func:`call_flow` decides, and does no I/O (as httpx's ``Auth.auth_flow``):
which worker to ask for (exclusions after failures, the last resort once
no worker is healthy), when to give up (the attempt budget, an error that is
not retryable, output that already reached the caller), how long to back
off, and that every attempt is settled (its in-flight count released, usage
or failure fed back) before the next one starts. :class:`CallLifecycle`
runs the flow against :class:`Routes` (what it needs of a router, which
:class:`~agent_cache.routing.router.Router` is: this module does not import
the router), with the caller's sender doing the one thing that talks to the
worker.

Every path that calls workers drives it: ``ChatSGLang``'s sync, async and
streaming calls, and ``Router.execute`` / ``Router.aexecute``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import (Any, AsyncGenerator, Awaitable, Callable, Generator, Iterator, Mapping, Protocol, Sequence, TypeVar,
                    Union)

from agent_cache.errors import BackendError, NoHealthyWorkerError
from agent_cache.routing.call_latency import CallLatency
from agent_cache.routing.config import WorkerConfig
from agent_cache.routing.metrics import RouterMetrics
from agent_cache.telemetry import tracing
from agent_cache.values import Placement, RouteRequest, Usage

T = TypeVar("T")
Y = TypeVar("Y")

RETRY_BACKOFF = 0.2  # seconds before a call's second attempt, doubling after (ChatSGLang and the gateway)
_JITTER = random.Random()  # backoff jitter only: no secret, so not the secrets module


# --- the steps the flow asks for --------------------------------------------------------


@dataclass(frozen=True)
class Choose:
    """Route the call, avoiding ``exclude``; with ``last_resort``, a worker even if none is healthy; with
    ``second_opinion``, another healthy worker outside the store (the session's pin stays)."""

    exclude: frozenset[str]
    last_resort: bool
    second_opinion: bool = False


@dataclass(frozen=True)
class Send:
    """Run the attempt on ``placement.worker``; the runner answers with the filled-in :class:`Attempt`."""

    placement: Placement


@dataclass(frozen=True)
class Settle:
    """The attempt ended: release its in-flight count, then feed back its usage or its failure (with
    ``judged`` false the failure is held back from passive health until a second opinion)."""

    placement: Placement
    error: BaseException | None
    usage: Usage | None
    judged: bool = True


@dataclass(frozen=True)
class Judge:
    """The verdict on a failure held back for a second opinion: the worker's own (fed to passive health),
    or, with ``error.request_fault`` or without ``blame`` (the second attempt told nothing: the caller
    left), no verdict on the worker."""

    placement: Placement
    error: BackendError
    blame: bool = True


@dataclass(frozen=True)
class Backoff:
    seconds: float


Step = Union[Choose, Send, Settle, Judge, Backoff]


@dataclass
class Attempt:
    """One try on one worker, as the sender fills it in."""

    placement: Placement
    value: Any = None
    usage: Usage | None = None
    error: BaseException | None = None
    delivered: bool = False  # output already reached the caller: a retry would duplicate it
    # time.monotonic() readings: the runner's as the request goes and as the sender ends, the sender's
    # as the worker's first bytes came (None: the answer came whole, or nothing came)
    sent: float = 0.0
    first_byte: float | None = None
    ended: float = 0.0


def retryable(error: BaseException) -> bool:
    return isinstance(error, BackendError) and error.retryable


def next_exclude(exclude: frozenset[str], failed: str, workers: Sequence[str]) -> frozenset[str]:
    """Workers to avoid on the next attempt: the failed ones, until none is left to try."""
    exclude = exclude | {failed}
    return frozenset() if exclude >= set(workers) else exclude


def backoff_seconds(base: float, attempt: int, rng: random.Random = _JITTER) -> float:
    """The wait after failed attempt ``attempt`` (0-based): ``base`` x 2^attempt with equal jitter, i.e. a
    uniform draw from its upper half, so callers that failed together do not all retry at the same moment."""
    ceiling: float = base * 2.0**attempt
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def reproduced(first: BackendError, second: BaseException | None) -> bool:
    """Whether ``second`` (another worker's answer to the same request) is the same failure as ``first``."""
    return (isinstance(second, BackendError) and type(second) is type(first) and second.status == first.status
            and not second.request_fault)


def call_flow(workers: Sequence[str], *, max_attempts: int, backoff: float = 0.0,
              last_resort: bool = False) -> Generator[Step, Any, tuple[Any, Placement]]:
    """The decisions of one call; returns ``(value, placement)`` of the attempt that succeeded.

    ``max_attempts``: tries in all; ``backoff``: seconds before the second
    try, doubling after each, jittered by :func:`backoff_seconds`; ``last_resort``: after a failure, try a worker
    even when none is healthy (breakers open on evidence that may be stale).

    A failure the request may have caused (a 5xx other than 502/503/504) gets a second opinion: the next
    attempt goes at once to one other healthy worker, outside the store (no pin moves), and the first
    worker is judged only once that answer is in. The same failure again is the request's fault
    (:meth:`~agent_cache.errors.BackendError.blame_request`): raised at once, neither worker blamed.
    A request's fault (``request_fault``) is never retried.
    """
    exclude: frozenset[str] = frozenset()
    last: BaseException | None = None
    held: tuple[Placement, BackendError] | None = None  # a failure awaiting its second opinion
    asked = False  # one second opinion per call
    for n in range(max_attempts):
        try:
            placement = yield Choose(exclude, last_resort=last_resort and n > 0 and held is None,
                                     second_opinion=held is not None)
        except NoHealthyWorkerError:
            if held is not None:  # nobody to ask: the held failure counts as it would have
                yield Judge(*held)
            if last is not None:
                raise last from None
            raise
        attempt: Attempt = yield Send(placement)
        error = attempt.error
        if held is not None:
            first, held = held, None
            if isinstance(error, BackendError) and not attempt.delivered and reproduced(first[1], error):
                first[1].blame_request()
                error.blame_request()
            yield Judge(*first, blame=error is None or isinstance(error, BackendError))
        if (isinstance(error, BackendError) and error.second_opinion and not asked and not attempt.delivered
                and n + 1 < max_attempts):
            asked = True
            yield Settle(placement, error, attempt.usage, judged=False)
            held, last = (placement, error), error
            exclude = next_exclude(exclude, placement.worker, workers)
            continue
        yield Settle(placement, error, attempt.usage)
        if error is None:
            return attempt.value, placement
        if attempt.delivered or not retryable(error) or n + 1 == max_attempts:
            raise error
        last = error
        exclude = next_exclude(exclude, placement.worker, workers)
        if backoff > 0:
            yield Backoff(backoff_seconds(backoff, n))
    raise AssertionError("unreachable: the last attempt returns or raises")


def observed(flow: Generator[Step, Any, tuple[Any, Placement]],
             observers: Sequence[tracing.CallTrace]) -> Generator[Step, Any, tuple[Any, Placement]]:
    """``flow``, with ``observers`` (the call's spans, the gateway's access log line) told of each attempt
    and of how the call ended (:mod:`agent_cache.telemetry`)."""
    try:
        step = next(flow)
        while True:
            for o in observers:
                if isinstance(step, Send):
                    o.attempt(step.placement)
                elif isinstance(step, Settle):
                    o.settled(step.placement, step.error, step.usage)
            try:
                reply = yield step
            except BaseException as exc:  # NoHealthyWorkerError thrown in by a runner, or the flow closed
                step = flow.throw(exc)
                continue
            step = flow.send(reply)
    except StopIteration as stop:
        for o in observers:
            o.end(stop.value[1], None)
        return stop.value  # type: ignore[no-any-return]
    except BaseException as exc:
        for o in observers:
            o.end(None, exc)
        raise


class Routes(Protocol):
    """What a call's lifecycle needs of a router (:class:`~agent_cache.routing.router.Router` is one)."""

    @property
    def workers(self) -> Sequence[WorkerConfig]: ...

    @property
    def metrics(self) -> RouterMetrics: ...

    def route(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = ...) -> Placement: ...

    async def aroute(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = ...) -> Placement: ...

    def last_resort(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = ...) -> Placement: ...

    def second_opinion(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = ...) -> Placement: ...

    def settle(self, placement: Placement, error: BaseException | None = ..., usage: Usage | None = ..., *,
               judged: bool = ...) -> None: ...

    async def asettle(self, placement: Placement, error: BaseException | None = ...,
                      usage: Usage | None = ..., *, judged: bool = ...) -> None: ...

    def judge(self, placement: Placement, error: BackendError, *, blame: bool = ...) -> None: ...


# --- the runners ------------------------------------------------------------------------


class CallLifecycle:
    """Runs :func:`call_flow` for one call against ``router``.

    A sender takes the :class:`Attempt`, talks to ``attempt.placement.worker``
    and fills in ``value`` and ``usage``; a streaming sender yields what the
    caller receives and sets ``delivered`` once output reached the caller.
    After a run, ``result`` holds ``(value, placement)``.

    ``started``: when the call arrived (``time.monotonic()``); with it, the
    call's latencies go to the router's metrics (:mod:`.call_latency`).
    """

    def __init__(self, router: Routes, request: RouteRequest, *, max_attempts: int, backoff: float = 0.0,
                 last_resort: bool = False, trace: Mapping[str, Any] | None = None,
                 observer: tracing.CallTrace | None = None, started: float | None = None) -> None:
        self.router = router
        self.request = request
        self.flow = call_flow([w.url for w in router.workers], max_attempts=max_attempts, backoff=backoff,
                              last_resort=last_resort)
        # spans (OpenTelemetry, configured by OTEL_*; ``trace``: the call span's attributes) and ``observer``
        observers = [o for o in (tracing.start_call(request, trace), observer) if o is not None]
        if observers:
            self.flow = observed(self.flow, observers)
        self.result: tuple[Any, Placement] | None = None
        self.latency = CallLatency(router.metrics, started) if started is not None else None
        self._last: Attempt | None = None  # the latest attempt sent

    # Choose answers the flow with (placement, None), or (None, the NoHealthyWorkerError to throw into it)

    def _choose(self, step: Choose) -> tuple[Placement | None, BaseException | None]:
        try:
            if step.second_opinion:
                return self.router.second_opinion(self.request, exclude=step.exclude), None
            return self.router.route(self.request, exclude=step.exclude), None
        except NoHealthyWorkerError as exc:
            return self._last_resort(step, exc)

    async def _achoose(self, step: Choose) -> tuple[Placement | None, BaseException | None]:
        try:
            if step.second_opinion:
                return self.router.second_opinion(self.request, exclude=step.exclude), None
            return await self.router.aroute(self.request, exclude=step.exclude), None
        except NoHealthyWorkerError as exc:
            return self._last_resort(step, exc)

    def _last_resort(self, step: Choose, exc: NoHealthyWorkerError) -> tuple[Placement | None, BaseException | None]:
        if not step.last_resort:
            return None, exc
        try:
            return self.router.last_resort(self.request, exclude=step.exclude), None
        except NoHealthyWorkerError as last:
            return None, last

    def _attempt(self, placement: Placement) -> Attempt:
        attempt = self._last = Attempt(placement, sent=time.monotonic())
        if self.latency is not None:
            self.latency.sent(placement.worker, attempt.sent)
        return attempt

    def _ended(self, error: BaseException | None) -> None:
        """The call ended (``error``: how it failed): its latencies observed."""
        if self.latency is not None:
            last = self._last
            if last is None:
                self.latency.ended(None, error)
            else:
                self.latency.ended(last.placement, error, first_byte=last.first_byte, answered=last.ended,
                                   usage=last.usage)

    def _next(self, reply: Any, error: BaseException | None) -> Step | None:
        try:
            return self.flow.throw(error) if error is not None else self.flow.send(reply)
        except StopIteration as stop:
            self.result = stop.value
            return None

    def stream(self, sender: Callable[[Attempt], Iterator[Y]]) -> Iterator[Y]:
        """Drive the flow, yielding what the sender yields."""
        reply: Any = None
        error: BaseException | None = None
        try:
            while (step := self._next(reply, error)) is not None:
                reply, error = None, None
                if isinstance(step, Choose):
                    reply, error = self._choose(step)
                elif isinstance(step, Send):
                    reply = attempt = self._attempt(step.placement)
                    try:
                        yield from sender(attempt)
                    except BaseException as exc:  # settled first; the flow re-raises what it does not retry
                        attempt.error = exc
                    attempt.ended = time.monotonic()
                elif isinstance(step, Settle):
                    self.router.settle(step.placement, step.error, step.usage, judged=step.judged)
                elif isinstance(step, Judge):
                    self.router.judge(step.placement, step.error, blame=step.blame)
                else:
                    time.sleep(step.seconds)
        except BaseException as exc:  # the call failed, or its caller left (GeneratorExit)
            self._ended(exc)
            raise
        self._ended(None)

    async def astream(self, sender: Callable[[Attempt], AsyncGenerator[Y, None]]) -> AsyncGenerator[Y, None]:
        """Async :meth:`stream`."""
        reply: Any = None
        error: BaseException | None = None
        try:
            while (step := self._next(reply, error)) is not None:
                reply, error = None, None
                if isinstance(step, Choose):
                    reply, error = await self._achoose(step)
                elif isinstance(step, Send):
                    reply = attempt = self._attempt(step.placement)
                    items = sender(attempt)
                    try:
                        async for item in items:
                            yield item
                    except BaseException as exc:
                        attempt.error = exc
                    finally:
                        await items.aclose()  # as ``yield from`` closes a sync sender
                    attempt.ended = time.monotonic()
                elif isinstance(step, Settle):
                    await self.router.asettle(step.placement, step.error, step.usage, judged=step.judged)
                elif isinstance(step, Judge):
                    self.router.judge(step.placement, step.error, blame=step.blame)
                else:
                    await asyncio.sleep(step.seconds)
        except BaseException as exc:  # the call failed, or its caller left (GeneratorExit, cancelled)
            self._ended(exc)
            raise
        self._ended(None)

    def run(self, call: Callable[[Placement], tuple[T, Usage | None]]) -> tuple[T, Placement]:
        """A call without streamed output: ``call(placement)`` returns ``(value, usage)``."""

        def sender(attempt: Attempt) -> Iterator[None]:
            attempt.value, attempt.usage = call(attempt.placement)
            return iter(())

        for _ in self.stream(sender):
            pass
        assert self.result is not None
        return self.result

    async def arun(self, call: Callable[[Placement], Awaitable[tuple[T, Usage | None]]]) -> tuple[T, Placement]:
        """Async :meth:`run`."""

        async def sender(attempt: Attempt) -> AsyncGenerator[None, None]:
            attempt.value, attempt.usage = await call(attempt.placement)
            return
            yield  # an async generator that yields nothing

        async for _ in self.astream(sender):
            pass
        assert self.result is not None
        return self.result
