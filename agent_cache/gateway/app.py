"""``agent-cache serve``: an OpenAI-compatible HTTP gateway in front of SGLang workers.

Every proxied call goes through the same pipeline as a ``ChatSGLang`` call
(:mod:`agent_cache.calls`): prepared into a ``Call``, run by the lifecycle
(the router picks the session's worker, a failed attempt moves to another
worker while nothing reached the client, the attempt's usage is fed back to
the store), each attempt over the gateway's transport (httpx, or the fast
path with ``--transport fast``). Stream events pass through unchanged, event
by event; a whole call is sent whole and the worker's answer passed on
(:mod:`agent_cache.gateway.forward`). Two headers say where the call went
(``x-agent-cache-worker``, ``x-agent-cache-session``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from prometheus_client import REGISTRY, CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent_cache.calls.httpx_transport import HttpxTransport
from agent_cache.calls.prepare import Call
from agent_cache.calls.served import Served
from agent_cache.calls.transport import WorkerTransport
from agent_cache.errors import (
    BackendError,
    ConfigError,
    ContextLengthError,
    InvalidRequestError,
    NoHealthyWorkerError,
    ResponseMismatchError,
    RoutingError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
    WorkerTimeoutError,
)
from agent_cache.gateway import access_log, authz
from agent_cache.gateway.admin import Admin, fleet_for
from agent_cache.gateway.config import GatewayConfig
from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.gateway.keys import ApiKey, key_digest
from agent_cache.gateway.ratelimit import RateLimits, Reservation, reservation_tokens
from agent_cache.gateway.readiness import ready_response
from agent_cache.gateway.asgi import Once, within
from agent_cache.gateway.forward import SESSION_HEADER, WORKER_HEADER, Forward
from agent_cache.gateway.requests import CHAT, COMPLETIONS, GENERATE, find_session, parse_json_body, prepare
from agent_cache.gateway.responses import JSONResponse, bounded
from agent_cache.routing.conversation import conversation_session
from agent_cache.routing.router import Router
from agent_cache.telemetry import tracing
from agent_cache.templates import Templater, TemplateRegistry
from agent_cache.templates.templater import encoder

if TYPE_CHECKING:
    from agent_cache.kv import KvView

logger = logging.getLogger("agent_cache.gateway")

POOL_HEADER = authz.POOL_HEADER
_NO_KEY = authz.OPERATOR  # without API keys: one caller, allowed everything
_PROMPT_FIELD = {CHAT: "messages", COMPLETIONS: "prompt", GENERATE: "text"}
BODY_TIMEOUT = 60.0  # seconds a client may take to send its request body
INLINE_BODY_BYTES = 64 * 1024  # a larger body is prepared on a thread (a few ms of CPU and more)


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
    # bounded: an error may quote the request (a field's value or name), which need not come back whole
    message, param = bounded(authz.hide_urls(message)), None if param is None else bounded(param)
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
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
    if isinstance(exc, InvalidRequestError):
        return error_response(400, str(exc), param=exc.field, code="invalid_value")
    if isinstance(exc, ConfigError):  # the gateway's own configuration, met serving a call: not the caller's fault
        logger.error("gateway configuration error while serving a call: %s", exc)
        return error_response(500, "the gateway is misconfigured (see the gateway's log)", code="gateway_misconfigured")
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
        kv: KvView | None = None
        if config.kv_events is not None:  # the workers' caches from their events (agent_cache.kv), started last
            from agent_cache.kv import KvView

            kv = KvView(config.kv_events, api_key=config.worker_api_key)
        self.router = router if router is not None else Router(
            config.workers, redis_url=config.redis_url, prefix=config.prefix, probe_interval=config.probe_interval,
            max_attempts=config.max_attempts, first_byte_floor=config.first_byte_floor,
            allow_empty=bool(config.fleet.dns), kv_events=kv)
        if kv is not None and self.router.kv_events is not kv:
            raise ConfigError("kv_events", "the router given cannot take the gateway's KV events: give it "
                                           "kv_events=KvView(...) and leave kv_events out of the config")
        self.registry = TemplateRegistry(self.router.store)
        self.fleet = fleet_for(config.redis_url, config.prefix, self.router, config.fleet)
        self.metrics = _process_metrics()
        self._templaters: dict[str, Templater] = {}
        self.transport = _transport(config)
        self.inflight = 0
        self._tenant_inflight: dict[str, int] = {}  # calls in flight per tenant (concurrency= of the keys file)
        self.limits = RateLimits(config.redis_url, config.prefix)  # rpm= and tpm= of the keys file
        served = Served.for_router(self.registry, self.router)
        self.forward = Forward(self.router, self.transport, served, self.limits,
                               timeout=config.timeout, max_attempts=config.max_attempts,
                               early_sends=self.metrics.early_sends,
                               count=lambda path, status: self.metrics.requests.labels(path, status).inc())
        self.kv = None if kv is None else kv.start()  # the subscriber's thread, and the KV series on /metrics

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

    async def read_body(self, request: Request) -> bytes:
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
        return b"".join(chunks)

    def _admit(self, grant: ApiKey) -> None:
        if self.inflight >= self.config.max_concurrency:
            raise RequestRejectedError(503, f"the gateway has {self.inflight} calls in flight (--max-concurrency)",
                                       code="overloaded", retry_after=1)
        self._check_concurrency(grant)
        self._tenant_inflight[grant.tenant] = self._tenant_inflight.get(grant.tenant, 0) + 1
        self.inflight += 1
        self.metrics.inflight.inc()

    def _check_concurrency(self, grant: ApiKey) -> None:
        held = self._tenant_inflight.get(grant.tenant, 0)
        if grant.concurrency is not None and held >= grant.concurrency:  # so no tenant takes every slot
            raise RequestRejectedError(429, f"{held} calls of this key's tenant are in flight on this gateway "
                                            f"(concurrency={grant.concurrency} in the keys file)",
                                       code="concurrency_limit_exceeded", retry_after=1)

    def _release(self, grant: ApiKey, reserved: Reservation | None) -> None:
        self.limits.settle(grant, reserved)  # the call's tokens, whatever way it ended
        held = self._tenant_inflight.pop(grant.tenant, 1) - 1
        if held > 0:
            self._tenant_inflight[grant.tenant] = held
        self.inflight -= 1
        self.metrics.inflight.dec()

    # --- the proxied endpoints ----------------------------------------------------

    async def proxy(self, request: Request, path: str, send: Send) -> Response | None:
        """Serve one proxied call; the response to send, or None once it was sent."""
        try:  # checked before a slot is taken: a slow or bad client holds none
            call, grant, reserved = await self._prepare(request, path)
        except Exception as exc:  # every failure becomes an OpenAI-style error body
            return self._count(path, _error_for(exc, path))
        try:
            self._admit(grant)
        except Exception as exc:
            self.limits.settle(grant, reserved)  # nothing was sent: the reservation goes back
            return self._count(path, _error_for(exc, path))
        release = Once(functools.partial(self._release, grant, reserved))
        try:
            if call.stream:
                response = await self.forward.stream(request, call, grant, release, reserved)
            else:
                answered = await self.forward.whole(request, call, grant, send, reserved)
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

    async def _prepare(self, request: Request, path: str) -> tuple[Call, ApiKey, Reservation | None]:
        tracing.continue_incoming(request.headers)  # the caller's traceparent parents the call's span
        grant = self.authorize(request)
        try:
            raw = await within(BODY_TIMEOUT, self.read_body(request))
        except asyncio.TimeoutError:
            raise RequestRejectedError(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s",
                                       code="request_timeout") from None
        # the call's clock starts with its request in hand (a slow client's upload is not the gateway's time)
        work = functools.partial(self._prepared, request, path, grant, raw, time.monotonic())
        # a large body's parsing, checks and templating take seconds of CPU (20 MB: up to 15 s): off
        # the event loop, so every other call, deadline and health probe goes on meanwhile
        call, reserve = work() if len(raw) <= INLINE_BODY_BYTES else await asyncio.to_thread(work)
        self._check_concurrency(grant)  # checked again as the slot is taken (after the await below)
        verdict = await self.limits.admit(grant, reserve)  # last: a request refused for another reason is not counted
        return call, grant, verdict.reservation if verdict is not None else None

    def _prepared(self, request: Request, path: str, grant: ApiKey, raw: bytes,
                  started: float) -> tuple[Call, int]:
        """A read body made a :class:`Call`, with the tokens it may use: CPU alone, on the event loop or a
        thread; ``started``: when the body was read."""
        body, checked = parse_json_body(raw)
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
                       checked_json=checked, depth_checked=True, started=started)
        return call, reservation_tokens(body, len(raw))

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
                return JSONResponse(await self.transport.get_json(w.url, "/v1/models"))
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
        except StoreRefusedError:
            raise  # stops the gateway: every call would fail
        except StoreUnavailableError as exc:
            self.router.availability.failed(exc)  # /health says so, and calls skip the store until it answers
            logger.warning("metadata store unreachable at start-up (%s): routing by hashing until it answers", exc)
        except StoreError as exc:
            logger.warning("metadata store error at start-up: %s", exc)

    async def aclose(self) -> None:
        await self.limits.aclose()
        await asyncio.to_thread(self.fleet.stop)
        await self.transport.aclose()
        await asyncio.to_thread(self.forward.served.close)  # the registry's last writes
        if self.kv is not None:
            await asyncio.to_thread(self.kv.close)  # the subscriber and the token learner
        await self.router.aclose()


def _transport(config: GatewayConfig) -> WorkerTransport:
    """The gateway's transport to its workers: httpx (the reference), or the fast path."""
    if config.transport == "fast":
        from agent_cache.gateway.upstream import Upstream

        return Upstream(timeout=config.timeout, max_connections=config.max_concurrency,
                        api_key=config.worker_api_key, stall=min(config.stall_timeout, config.timeout))
    return HttpxTransport(timeout=config.timeout, max_connections=config.max_concurrency,
                          api_key=config.worker_api_key, stall=min(config.stall_timeout, config.timeout))


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
    themselves, so the middleware and route matching in front of them only cost time per call. Every
    response carries ``x-request-id`` (the access log's ``request_id``)."""

    gateway: Gateway
    proxied: dict[str, _Proxied]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            send = access_log.with_request_id(scope, send)  # on every response, whatever is logged
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
        # calls' releases and usage reports written in this loop, not by waking a thread per call
        gateway.router.outbox.flush_in(asyncio.get_running_loop())
        await gateway.check_store()
        await asyncio.to_thread(gateway.fleet.start)  # the shared fleet (and DNS) before the first call
        yield
        await gateway.aclose()

    return lifespan


__all__ = ["Gateway", "create_app", "error_response", "WORKER_HEADER", "SESSION_HEADER", "POOL_HEADER"]
