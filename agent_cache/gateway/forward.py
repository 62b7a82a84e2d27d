"""The gateway's door to the call pipeline: a prepared :class:`~agent_cache.calls.prepare.Call` run
through the lifecycle, its attempts over the gateway's transport, its answer written to the client.

A streamed call passes the worker's events on as they come; a whole call is
sent whole and the worker's answer passed on as it is
(:func:`~agent_cache.calls.attempt.awhole`). Both wait for a hung worker only
until its deadline: a stream's first byte, a whole answer's arrival (then as
long as the worker answers its ``/health``). The answer goes out before the
attempt is settled (the store's bookkeeping is off the client's wait).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from agent_cache.calls import attempt as attempts
from agent_cache.calls.prepare import CHAT, COMPLETIONS, GENERATE
from agent_cache.calls.prepare import Call
from agent_cache.calls.served import Served
from agent_cache.calls.transport import SentEarly, WorkerTransport
from agent_cache.gateway import access_log, authz
from agent_cache.gateway.asgi import EventStream, Once, send_json, unless_client_leaves
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.ratelimit import RateLimits, Reservation
from agent_cache.gateway.session_header import echoed
from agent_cache.routing.lifecycle import RETRY_BACKOFF, Attempt, CallLifecycle
from agent_cache.routing.router import Placement, Router
from agent_cache.telemetry import tracing

logger = logging.getLogger("agent_cache.gateway")

WORKER_HEADER = "x-agent-cache-worker"
SESSION_HEADER = "x-agent-cache-session"
CLIENT_CLOSED = 499  # the client went away before the answer (nginx's convention; nobody reads it)
_OPERATION = {CHAT: "chat", COMPLETIONS: "text_completion", GENERATE: "text_completion"}  # gen_ai.operation.name


@dataclass
class Forward:
    """Runs the gateway's calls: ``timeout`` is the longest silence of a worker within an answer
    (and the first-byte wait of a retry); ``limits`` charges each served call to its key;
    ``early_sends`` counts early sends by outcome; ``count`` counts a finished stream by endpoint
    and status."""

    router: Router
    transport: WorkerTransport
    served: Served
    limits: RateLimits
    timeout: float
    max_attempts: int
    early_sends: Counter
    count: Callable[[str, str], None]

    def _lifecycle(self, call: Call) -> CallLifecycle:
        entry = access_log.current()  # the call's access log line, when that log is on
        return CallLifecycle(self.router, call.route, max_attempts=self.max_attempts, backoff=RETRY_BACKOFF,
                             last_resort=True, trace=tracing.call_attributes(call.model, _OPERATION[call.path]),
                             observer=entry.call(call.route.tenant, call.route.session_id) if entry else None,
                             started=call.started)

    def headers(self, placement: Placement, call: Call, grant: ApiKey) -> dict[str, str]:
        # a session id may hold any Unicode: percent-encoded, as an HTTP header carries Latin-1 only
        return {WORKER_HEADER: authz.shown_worker(grant, placement.worker),
                SESSION_HEADER: echoed(call.route.session_id), **self.limits.headers(grant)}

    def _send_early(self, call: Call) -> SentEarly | None:
        """Send the call to the worker that served its session's last call here, before the store's
        route answers (a round trip to Redis, overlapped with the worker's own time); None without
        such a worker, or where the transport cannot send without waiting.

        The route still decides: when it names another worker, the early send is dropped (which
        SGLang takes as an abort) and the call goes there.
        """
        worker = self.router.likely_worker(call.route)
        return None if worker is None else self.transport.send_early(worker, call.path, call.body)

    def _confirm(self, early: SentEarly | None, worker: str) -> SentEarly | None:
        """The early send if the route chose its worker; else it is dropped (and None)."""
        if early is None:
            return None
        if early.worker == worker:
            self.early_sends.labels("confirmed").inc()
            return early
        self.early_sends.labels("dropped").inc()  # the route moved the session
        self.transport.drop(early)
        return None


    async def whole(self, request: Request, call: Call, grant: ApiKey, send: Send,
                    reserved: Reservation | None = None) -> Response | None:
        """A call whose client wants the whole answer; None once it was sent."""
        early = self._send_early(call)
        answered = False
        tries: list[Placement] = []

        async def sender(attempt: Attempt) -> AsyncGenerator[None, None]:
            nonlocal early, answered
            placement = attempt.placement
            sent, early = self._confirm(early, placement.worker), None
            tries.append(placement)
            raw = await attempts.awhole(self.transport, call, attempt, deadlines=self.router.first_byte,
                                        cap=self.timeout, first_attempt=len(tries) == 1, early=sent)
            answered = True  # succeeded: nothing is retried, and a client leaving now cancels nothing
            await send_json(send, raw, self.headers(placement, call, grant))
            if reserved is not None:
                reserved.delivered = True
                reserved.spent(attempt.usage)
            self.served(call, placement)
            return
            yield  # an async generator that yields nothing

        async def run() -> bool:
            async for _ in self._lifecycle(call).astream(sender):
                pass
            return True

        try:
            outcome = await unless_client_leaves(request.receive, run(), lambda: answered)
        finally:
            if early is not None:  # the route failed, or the client left, before the first attempt
                self.transport.drop(early)
        return Response(status_code=CLIENT_CLOSED) if outcome is None else None

    async def stream(self, request: Request, call: Call, grant: ApiKey, release: Once,
                     reserved: Reservation | None = None) -> Response:
        """Start the stream once the first event arrived (an attempt failing before that moves on)."""
        life = self._lifecycle(call)
        tries: list[Placement] = []
        early = self._send_early(call)

        def drop_early() -> None:
            nonlocal early
            if early is not None:  # the route failed, or the client left, before the first attempt
                self.transport.drop(early)
                early = None

        async def sender(attempt: Attempt) -> AsyncGenerator[bytes, None]:
            nonlocal early
            sent, early = self._confirm(early, attempt.placement.worker), None
            tries.append(attempt.placement)
            events = attempts.astream(self.transport, call, attempt, deadlines=self.router.first_byte,
                                      cap=self.timeout, first_attempt=len(tries) == 1, early=sent)
            async for event in events:
                attempt.delivered = True  # from here on a retry would repeat output
                if reserved is not None:
                    reserved.delivered = True
                    reserved.spent(attempt.usage)  # the usage event may come before the end
                yield event.raw
            if reserved is not None:
                reserved.spent(attempt.usage)

        events = life.astream(sender)
        status = {"label": "200"}

        async def cleanup() -> None:
            drop_early()
            await events.aclose()
            if release():
                self.count(call.path, status["label"])

        try:
            first = await unless_client_leaves(request.receive, events.__anext__())
            if first is None:
                await cleanup()
                return Response(status_code=CLIENT_CLOSED)
            headers = self.headers(tries[-1], call, grant)
        except BaseException:
            drop_early()
            await events.aclose()
            raise

        async def body() -> AsyncIterator[bytes]:
            yield first
            try:
                async for item in events:
                    yield item
            except Exception as exc:  # the status line is sent: end the stream with an error event
                status["label"] = "stream_error"
                access_log.stream_broke()
                logger.warning("stream through %s broke: %s", tries[-1].worker if tries else "?", exc)
                error = {"error": {"message": authz.hide_urls(str(exc)), "type": "server_error", "code": 502}}
                yield b"data: " + json.dumps(error).encode() + b"\n\n"
                return
            if life.result is not None:
                self.served(call, life.result[1])

        return EventStream(body(), cleanup, headers)
