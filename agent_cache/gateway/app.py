"""``agent-cache serve``: an OpenAI-compatible HTTP gateway in front of SGLang workers.

Every proxied call runs the same lifecycle as a ``ChatSGLang`` call
(:class:`~agent_cache.routing.lifecycle.CallLifecycle`): the router picks the
session's worker, a failed attempt moves to another worker while nothing
reached the client, and the attempt's usage is fed back to the store.
Response bodies and stream events pass through unchanged, chunk by chunk;
two headers say where the call went (``x-agent-cache-worker``,
``x-agent-cache-session``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, TypeVar

from prometheus_client import REGISTRY, CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent_cache.backends.protocol import Usage, parse_usage, stream_error_event
from agent_cache.errors import (
    BackendError,
    ConfigError,
    ContextLengthError,
    MalformedResponseError,
    NoHealthyWorkerError,
    RequestRejectedError,
    ResponseMismatchError,
    RoutingError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
    StreamError,
    WorkerTimeoutError,
)
from agent_cache.gateway import access_log, authz
from agent_cache.gateway.admin import Admin, fleet_for
from agent_cache.gateway.config import GatewayConfig
from agent_cache.gateway.keys import ApiKey, key_digest
from agent_cache.gateway.ratelimit import RateLimits
from agent_cache.gateway.readiness import ready_response
from agent_cache.gateway.session_header import echoed
from agent_cache.gateway.upstream import SentEarly, Upstream
from agent_cache.gateway.requests import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    GatewayCall,
    find_session,
    loads,
    parse_json_body,
    prepare,
)
from agent_cache.routing.conversation import conversation_session
from agent_cache.routing.lifecycle import RETRY_BACKOFF, Attempt, CallLifecycle
from agent_cache.routing.router import Placement, Router
from agent_cache.telemetry import tracing
from agent_cache.templates import Templater, TemplateRegistry
from agent_cache.templates.templater import encoder

logger = logging.getLogger("agent_cache.gateway")

WORKER_HEADER = "x-agent-cache-worker"
SESSION_HEADER = "x-agent-cache-session"
POOL_HEADER = authz.POOL_HEADER
_NO_KEY = authz.OPERATOR  # without API keys: one caller, allowed everything
_PROMPT_FIELD = {CHAT: "messages", COMPLETIONS: "prompt", GENERATE: "text"}
_OPERATION = {CHAT: "chat", COMPLETIONS: "text_completion", GENERATE: "text_completion"}  # gen_ai.operation.name
BODY_TIMEOUT = 60.0  # seconds a client may take to send its request body
CLIENT_CLOSED = 499  # the client went away before the answer (nginx's convention; nobody reads it)
T = TypeVar("T")


class _Metrics:
    """The gateway's own series, on prometheus_client's default registry (next to the router's)."""

    def __init__(self) -> None:
        self.requests = Counter("agent_cache_gateway_requests", "Gateway requests by endpoint and status",
                                ["endpoint", "status"])
        self.inflight = Gauge("agent_cache_gateway_inflight", "Calls in flight through this gateway process")
        self.early_sends = Counter("agent_cache_gateway_early_sends",
                                   "Calls sent to the session's last worker before the route answered, by "
                                   "whether the route confirmed that worker", ["result"])


_metrics: _Metrics | None = None


def _process_metrics() -> _Metrics:
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    return _metrics


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    body = {"error": {"message": authz.hide_urls(message), "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _error_for(exc: BaseException, path: str = CHAT) -> JSONResponse:
    """The HTTP answer for an error raised while a request was prepared or served."""
    if isinstance(exc, RequestRejectedError):
        headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after is not None else {}
        return error_response(exc.status, str(exc), param=exc.param, code=exc.code, headers={**headers, **exc.headers})
    if isinstance(exc, StoreRefusedError):  # the store refuses the gateway: not the caller's fault
        logger.error("the metadata store refused the gateway: %s", exc)
        return error_response(500, "the gateway's metadata store refused it (see the gateway's log)",
                              code="store_misconfigured")
    if isinstance(exc, ConfigError):
        return error_response(400, str(exc), param=exc.field, code="invalid_value")
    if isinstance(exc, NoHealthyWorkerError):
        return error_response(503, str(exc), code="no_healthy_worker", headers={"Retry-After": "1"})
    if isinstance(exc, RoutingError):
        return error_response(400, str(exc), param=POOL_HEADER, code="invalid_pool")
    if isinstance(exc, BackendError):
        if isinstance(exc, ContextLengthError):
            return error_response(400, str(exc), param=_PROMPT_FIELD[path], code="context_length_exceeded")
        if exc.status is not None and 400 <= exc.status < 500:
            return error_response(exc.status, str(exc), code="worker_rejected")
        if isinstance(exc, ResponseMismatchError):
            return error_response(400, str(exc), code="worker_response_mismatch")
        if exc.request_fault and exc.status is not None:  # a second worker answered the same: the worker's status
            return error_response(exc.status, str(exc), code="worker_error_reproduced")
        if isinstance(exc, WorkerTimeoutError):
            return error_response(504, str(exc), code="worker_timeout")
        return error_response(502, str(exc), code="worker_error")
    logger.exception("gateway error", exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")


class Gateway:
    """The state of one gateway process: its router, templaters, worker clients and limits."""

    def __init__(self, config: GatewayConfig, router: Router | None = None) -> None:
        self.config = config
        self.router = router if router is not None else Router(
            config.workers, redis_url=config.redis_url, prefix=config.prefix, probe_interval=config.probe_interval,
            max_attempts=config.max_attempts, first_byte_floor=config.first_byte_floor,
            allow_empty=bool(config.fleet.dns))
        self.registry = TemplateRegistry(self.router.store)
        self.fleet = fleet_for(config.redis_url, config.prefix, self.router, config.fleet)
        self.metrics = _process_metrics()
        self._templaters: dict[str, Templater] = {}
        self.upstream = Upstream(timeout=config.timeout, max_connections=config.max_concurrency,
                                 api_key=config.worker_api_key)
        self.inflight = 0
        self.limits = RateLimits(config.redis_url, config.prefix)  # rpm= and tpm= of the keys file

    # --- pieces -----------------------------------------------------------------

    def templater(self, tenant: str) -> Templater:
        t = self._templaters.get(tenant)
        if t is None:  # one per tenant: at most one per line of the keys file, plus the default
            t = self._templaters[tenant] = Templater(self.config.templates, tenant=tenant)
        return t

    def authorize(self, request: Request) -> ApiKey:
        keys = self.config.api_keys
        if keys is None:
            return _NO_KEY
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        grant = keys.get(key_digest(key.strip())) if scheme.lower() == "bearer" and key.strip() else None
        if grant is None:  # the key is never logged nor echoed
            raise RequestRejectedError(401, "a valid API key is needed: Authorization: Bearer <key>",
                                       code="invalid_api_key")
        return grant

    async def read_body(self, request: Request) -> tuple[dict[str, Any], bool]:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestRejectedError(413, f"request body larger than {limit} bytes", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestRejectedError(413, f"request body larger than {limit} bytes", code="body_too_large")
            chunks.append(chunk)
        return parse_json_body(b"".join(chunks))

    def _admit(self) -> None:
        if self.inflight >= self.config.max_concurrency:
            raise RequestRejectedError(503, f"the gateway has {self.inflight} calls in flight (--max-concurrency)",
                                       code="overloaded", retry_after=1)
        self.inflight += 1
        self.metrics.inflight.inc()

    def _release(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.dec()

    def _lifecycle(self, call: GatewayCall) -> CallLifecycle:
        entry = access_log.current()  # the call's access log line, when that log is on
        return CallLifecycle(self.router, call.route, max_attempts=self.config.max_attempts, backoff=RETRY_BACKOFF,
                             last_resort=True, trace=tracing.call_attributes(call.model, _OPERATION[call.path]),
                             observer=entry.call(call.route.tenant, call.route.session_id) if entry else None)

    def _served(self, call: GatewayCall, placement: Placement) -> None:
        if call.prompt is not None:
            self.registry.record(placement.tenant, call.prompt, placement.session_id)  # queued: no I/O here

    def _headers(self, placement: Placement, call: GatewayCall) -> dict[str, str]:
        # a session id may hold any Unicode: percent-encoded, as an HTTP header carries Latin-1 only
        return {WORKER_HEADER: authz.shown_worker(call.grant, placement.worker),
                SESSION_HEADER: echoed(call.route.session_id), **self.limits.headers(call.grant)}

    # --- the proxied endpoints ----------------------------------------------------

    async def proxy(self, request: Request, path: str, send: Send) -> Response | None:
        """Serve one proxied call; the response to send, or None once it was sent."""
        try:  # checked before a slot is taken: a slow or bad client holds none
            call = await self._prepare(request, path)
            self._admit()
        except Exception as exc:  # every failure becomes an OpenAI-style error body
            return self._count(path, _error_for(exc, path))
        release = _Once(self._release)
        try:
            if call.stream:
                response = await self._stream(request, call, release)
            else:
                answered = await self._once(request, call, send)
                if answered is None:
                    self.metrics.requests.labels(path, "200").inc()
                    response = None
                else:
                    response = self._count(path, answered)
        except Exception as exc:
            release()
            return self._count(path, _error_for(exc, path))
        if not call.stream:
            release()
        return response

    def _count(self, path: str, response: Response) -> Response:
        self.metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    async def _prepare(self, request: Request, path: str) -> GatewayCall:
        tracing.continue_incoming(request.headers)  # the caller's traceparent parents the call's span
        grant = self.authorize(request)
        try:
            body, checked = await _within(BODY_TIMEOUT, self.read_body(request))
        except asyncio.TimeoutError:
            raise RequestRejectedError(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s",
                                       code="request_timeout") from None
        infer: Callable[[], str] | None = None
        if path == CHAT and self.config.infer_sessions and isinstance(body.get("messages"), list):
            messages = body["messages"]
            if all(isinstance(m, dict) for m in messages):
                infer = lambda: conversation_session(messages)  # noqa: E731 - computed only when needed
        session = find_session(request.headers, self.config.session_header, body, infer)
        authz.check_fields(grant, body)
        call = prepare(path, body, grant=grant, extra_key=self.router.extra_key_for(grant.tenant), session=session,
                       templater=self.templater(grant.tenant) if path == CHAT else None,
                       pool=authz.choose_pool(grant, request.headers.get(POOL_HEADER)),
                       extra_fields=self.config.extra_fields, shared=self.config.api_keys is not None,
                       checked_json=checked)
        await self.limits.admit(grant)  # last: a request refused for another reason is not counted
        return call

    async def _once(self, request: Request, call: GatewayCall, send: Send) -> Response | None:
        """A non-streamed call; None once the worker's answer was sent to the client, which happens
        as soon as it arrived whole, before the attempt is settled (the store's bookkeeping is then
        off the client's wait)."""
        early = self._send_early(call)
        answered = False

        async def attempt(placement: Placement) -> tuple[None, Usage | None]:
            nonlocal early, answered
            sent, early = self._confirm(early, placement.worker), None
            if sent is not None:
                raw = await self.upstream.answer(sent)
            else:
                raw = await self.upstream.post(placement.worker, call.path, call.body)
            if raw.startswith(b"data:"):  # an event stream: an option of the request asked for it
                raise ResponseMismatchError("the worker answered a whole request with a stream",
                                            url=placement.worker, status=200)
            usage = _usage_of(_json_object(raw, placement.worker), call.path)
            answered = True  # succeeded: nothing is retried, and a client leaving now cancels nothing
            await _send_json(send, raw, self._headers(placement, call))
            self.limits.charge(call.grant, usage)
            self._served(call, placement)
            return None, usage

        try:
            outcome = await _unless_client_leaves(request.receive, self._lifecycle(call).arun(attempt),
                                                  lambda: answered)
        finally:
            if early is not None:  # the route failed, or the client left, before the first attempt
                self.upstream.drop(early)
        return Response(status_code=CLIENT_CLOSED) if outcome is None else None

    def _send_early(self, call: GatewayCall) -> SentEarly | None:
        """Send the call to the worker that served its session's last call here, before the store's
        route answers (a round trip to Redis, overlapped with the worker's own time); None without
        such a worker or an idle connection to it.

        The route still decides: when it names another worker, the early send is dropped (its
        connection closed, which SGLang takes as an abort) and the call goes there.
        """
        worker = self.router.likely_worker(call.route)
        if worker is None:
            return None
        return self.upstream.send_now(worker, call.path, call.body, streaming=call.stream)

    def _confirm(self, early: SentEarly | None, worker: str) -> SentEarly | None:
        """The early send if the route chose its worker; else it is dropped (and None)."""
        if early is None:
            return None
        if early.worker == worker:
            self.metrics.early_sends.labels("confirmed").inc()
            return early
        self.metrics.early_sends.labels("dropped").inc()  # the route moved the session
        self.upstream.drop(early)
        return None

    async def _stream(self, request: Request, call: GatewayCall, release: "_Once") -> Response:
        """Start the stream once the first event arrived (an attempt failing before that moves on)."""
        life = self._lifecycle(call)
        current: list[Placement] = []
        early = self._send_early(call)

        def drop_early() -> None:
            nonlocal early
            if early is not None:  # the route failed, or the client left, before the first attempt
                self.upstream.drop(early)
                early = None

        async def sender(attempt: Attempt) -> AsyncGenerator[bytes, None]:
            nonlocal early
            current.append(attempt.placement)
            worker = attempt.placement.worker
            written, early = self._confirm(early, worker), None
            usage: Usage | None = None
            done = False
            # the first attempt waits the worker's adaptive first-byte deadline (a hung worker is left
            # after a few of its usual times to first byte); a retry waits the full --timeout
            wait = self.router.first_byte.deadline(worker, self.config.timeout) if len(current) == 1 else None
            started, first = time.monotonic(), True
            event: list[bytes] = []  # an event's lines, passed on together when it ends (a blank line)
            upstream = self.upstream.stream(worker, call.path, call.body, first_byte_timeout=wait,
                                            sent=written)
            async with contextlib.aclosing(upstream):  # a failed attempt closes its connection at once
                async for line in upstream:
                    if first:
                        self.router.first_byte.observe(worker, time.monotonic() - started)
                        first = False
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                        elif not attempt.delivered and payload.startswith(b'{"error"'):
                            raise stream_error_event(_json_object(payload, worker), worker)  # before any output
                        elif b'"prompt_tokens"' in payload:
                            found = _usage_of(_json_object(payload, worker), call.path)
                            usage = found or usage
                            if (not call.include_usage and found is not None
                                    and b'"choices":[]' in payload.replace(b" ", b"")):
                                continue  # the usage chunk the gateway asked for on the client's behalf
                    elif not attempt.delivered and not event:
                        if line.lstrip().startswith(b"{"):  # a whole JSON answer: an option asked for it
                            raise ResponseMismatchError("the worker answered a streamed request with a JSON "
                                                        "body", url=worker, status=200)
                        if line.strip() and not line.startswith(b":"):
                            raise MalformedResponseError("the stream is not server-sent events", url=worker)
                        continue  # blank lines before the first event: nothing to pass on yet
                    event.append(line)
                    if line in (b"\n", b"\r\n"):  # one write per event, not per line
                        attempt.delivered = True  # from here on a retry would repeat output
                        yield b"".join(event)
                        event.clear()
            if event:
                attempt.delivered = True
                yield b"".join(event)
            if not done:
                raise StreamError("stream ended without data: [DONE]", url=worker)
            attempt.usage = usage
            self.limits.charge(call.grant, usage)

        events = life.astream(sender)
        status = {"label": "200"}

        async def cleanup() -> None:
            drop_early()
            await events.aclose()
            if release():
                self.metrics.requests.labels(call.path, status["label"]).inc()

        try:
            first = await _unless_client_leaves(request.receive, events.__anext__())
            if first is None:
                await cleanup()
                return Response(status_code=CLIENT_CLOSED)
            headers = self._headers(current[-1], call)
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
                logger.warning("stream through %s broke: %s", current[-1].worker if current else "?", exc)
                error = {"error": {"message": authz.hide_urls(str(exc)), "type": "server_error", "code": 502}}
                yield b"data: " + json.dumps(error).encode() + b"\n\n"
                return
            if life.result is not None:
                self._served(call, life.result[1])

        return _EventStream(body(), cleanup, headers)

    # --- the gateway's own endpoints --------------------------------------------------

    async def models(self, request: Request) -> Response:
        try:
            self.authorize(request)
        except RequestRejectedError as exc:
            return _error_for(exc)
        down = self.router.health.down(w.url for w in self.router.workers)
        last: BaseException | None = None
        for w in self.router.workers:
            if w.url in down:
                continue
            try:
                return JSONResponse(await self.upstream.get_json(w.url, "/v1/models"))
            except BackendError as exc:
                last = exc
        return _error_for(last or NoHealthyWorkerError("no healthy worker"))

    async def health(self, request: Request) -> Response:
        """Liveness: 200 while the process serves (workers and store are /ready's; no worker URL here)."""
        return JSONResponse({"status": "ok", "inflight": self.inflight,
                             "store_degraded": self.router.availability.degraded})

    async def ready(self, request: Request) -> Response:
        """Readiness: the status for anyone (probes send no key); the detail for an admin key."""
        try:
            detail = self.authorize(request).is_admin
        except RequestRejectedError:
            detail = False
        return await ready_response(self.router, probing=self.config.probe_interval is not None, detail=detail)

    async def prometheus(self, request: Request) -> Response:
        """With API keys, /metrics on the main port is for admin keys (scrapers use --metrics-port)."""
        try:
            authz.require_admin(self.authorize(request))
        except RequestRejectedError as exc:
            return _error_for(exc)
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def check_store(self) -> None:
        """At start-up: a store refusing the gateway (password, ACL, database) stops it with the reason;
        an unreachable one only warns, as routing goes on by hashing until it answers."""
        try:
            await asyncio.to_thread(self.router.store.stats, time.time(), templates=False)
        except StoreUnavailableError as exc:
            self.router.availability.failed(exc)  # /health says so, and calls skip the store until it answers
            logger.warning("metadata store unreachable at start-up (%s): routing by hashing until it answers", exc)
        except StoreError as exc:
            logger.warning("metadata store error at start-up: %s", exc)

    async def aclose(self) -> None:
        await self.limits.aclose()
        await asyncio.to_thread(self.fleet.stop)
        await self.upstream.aclose()
        self.registry.close()
        await self.router.aclose()


class _Once:
    """Runs ``fn`` on the first call only; True for that call."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> bool:
        fn, self._fn = self._fn, None
        if fn is None:
            return False
        fn()
        return True


class _EventStream(Response):
    """A server-sent event stream passed on item by item, as ASGI messages written here (a starlette
    StreamingResponse runs a task group per stream under uvicorn). A client that leaves stops it;
    ``cleanup`` runs however it ends, even when its body never starts (the server refusing a
    header, the client gone before the first byte)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]],
                 headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._content = content
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await _unless_client_leaves(receive, self._send_all(send))
        finally:
            await self._cleanup()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for chunk in self._content:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _within(seconds: float, work: Awaitable[T]) -> T:
    """``await work``, raising asyncio.TimeoutError after ``seconds`` (without a task of its own where
    the Python has ``asyncio.timeout``)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await work
    return await asyncio.wait_for(work, seconds)


async def _unless_client_leaves(receive: Receive, work: Awaitable[T],
                                answered: Callable[[], bool] | None = None) -> T | None:
    """``await work``, or cancel it and return None if the client disconnects first (its call is
    settled as cancelled: the slot and the in-flight count are released at once).

    The work runs in the handler's own task; a watcher cancels that task when the client goes,
    unless ``answered()`` says the whole answer went out (the rest of the work then runs to its end).
    """
    handler = asyncio.current_task()
    assert handler is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await _disconnect(receive)
        if answered is not None and answered():
            return
        left = True
        handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:
            raise  # this handler is being cancelled for another reason
        if sys.version_info >= (3, 11) and handler.uncancel() > 0:
            raise  # the watcher's cancel is consumed here; another one is not
        return None
    finally:
        watcher.cancel()


async def _send_json(send: Send, body: bytes, headers: dict[str, str]) -> None:
    """A 200 answer with a JSON body, as two ASGI messages (what a starlette Response sends, without
    building one)."""
    raw = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _disconnect(receive: Receive) -> None:
    """Returns when the client closes the connection, or once the answer is complete (the body has
    been read: receive waits for either)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _json_object(raw: bytes, worker: str) -> dict[str, Any]:
    """A worker's JSON answer or stream event; anything else is a malformed (retryable) answer."""
    try:
        data = loads(raw, strict=False)  # Infinity in logprobs is read as the json module reads it
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise MalformedResponseError("the worker's answer is not a JSON object", url=worker)
    return data


def _count_of(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _usage_of(data: dict[str, Any], path: str) -> Usage | None:
    """The usage a worker reported in a response body or stream event (``meta_info`` for ``/generate``)."""
    if path == GENERATE:
        meta = data.get("meta_info")
        if not isinstance(meta, dict):
            return None
        return Usage(_count_of(meta.get("prompt_tokens")), _count_of(meta.get("completion_tokens")),
                     _count_of(meta.get("cached_tokens")))
    try:
        return parse_usage(data.get("usage"))
    except (TypeError, ValueError):  # counts that are not numbers: no usage to learn from
        return None


class _Proxied:
    """The ASGI app of one proxied endpoint (it answers every error itself)."""

    def __init__(self, gateway: Gateway, path: str) -> None:
        self.gateway = gateway
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if access_log.enabled():  # --log-format json (or text at --log-level info)
            await access_log.logged(self._serve, scope, receive, send)
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.gateway.proxy(Request(scope, receive), self.path, send)
        if response is not None:
            await response(scope, receive, send)


class _GatewayApp(Starlette):
    """Starlette, with the proxied calls dispatched straight to the gateway: they answer every error
    themselves, so the middleware and route matching in front of them only cost time per call."""

    gateway: Gateway
    proxied: dict[str, _Proxied]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not self.user_middleware:
            endpoint = self.proxied.get(scope["path"])  # middleware added to the app sees every call
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(config: GatewayConfig, router: Router | None = None) -> Starlette:
    """The gateway as an ASGI app (``uvicorn.run(create_app(config))``)."""
    gateway = Gateway(config, router)
    proxied = {path: _Proxied(gateway, path) for path in (CHAT, COMPLETIONS, GENERATE)}
    app = _GatewayApp(
        routes=[
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in proxied.items()),
            Route("/v1/models", gateway.models, methods=["GET"]),
            Route("/health", gateway.health, methods=["GET"]),
            Route("/ready", gateway.ready, methods=["GET"]),
            Route("/metrics", gateway.prometheus, methods=["GET"]),
            *Admin(gateway.fleet, config.api_keys, gateway.authorize).routes(),
        ],
        lifespan=_lifespan(gateway),
    )
    app.state.gateway = app.gateway = gateway
    app.proxied = proxied
    return app


def _lifespan(gateway: Gateway) -> Callable[[Starlette], Any]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        encoder()  # load the tokenizer the templates count with now, not inside the first call
        await gateway.check_store()
        await asyncio.to_thread(gateway.fleet.start)  # the shared fleet (and DNS) before the first call
        yield
        await gateway.aclose()

    return lifespan


__all__ = ["Gateway", "create_app", "error_response", "WORKER_HEADER", "SESSION_HEADER", "POOL_HEADER"]
