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

import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable

from prometheus_client import REGISTRY, CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_cache.backends.protocol import Usage, parse_usage
from agent_cache.errors import (
    BackendError,
    ConfigError,
    ContextLengthError,
    NoHealthyWorkerError,
    RequestRejectedError,
    RoutingError,
    StreamError,
    WorkerTimeoutError,
)
from agent_cache.gateway.config import ApiKey, GatewayConfig, key_digest
from agent_cache.gateway.upstream import Upstream
from agent_cache.gateway.requests import CHAT, COMPLETIONS, GENERATE, GatewayCall, find_session, parse_json_body, prepare
from agent_cache.routing.conversation import conversation_session
from agent_cache.routing.lifecycle import Attempt, CallLifecycle
from agent_cache.routing.router import Placement, Router
from agent_cache.templates import Templater, TemplateRegistry
from agent_cache.templates.templater import encoder

logger = logging.getLogger("agent_cache.gateway")

WORKER_HEADER = "x-agent-cache-worker"
SESSION_HEADER = "x-agent-cache-session"
POOL_HEADER = "x-agent-cache-pool"
_RETRY_BASE = 0.2  # seconds before the second attempt, doubling after
_NO_KEY = ApiKey("default")


class _Metrics:
    """The gateway's own series, on prometheus_client's default registry (next to the router's)."""

    def __init__(self) -> None:
        self.requests = Counter("agent_cache_gateway_requests", "Gateway requests by endpoint and status",
                                ["endpoint", "status"])
        self.inflight = Gauge("agent_cache_gateway_inflight", "Calls in flight through this gateway process")


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
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _error_for(exc: BaseException) -> JSONResponse:
    """The HTTP answer for an error raised while a request was prepared or served."""
    if isinstance(exc, RequestRejectedError):
        headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after is not None else None
        return error_response(exc.status, str(exc), code=exc.code, headers=headers)
    if isinstance(exc, ConfigError):
        return error_response(400, str(exc), param=exc.field, code="invalid_value")
    if isinstance(exc, NoHealthyWorkerError):
        return error_response(503, str(exc), code="no_healthy_worker", headers={"Retry-After": "1"})
    if isinstance(exc, RoutingError):
        return error_response(400, str(exc), param=POOL_HEADER, code="invalid_pool")
    if isinstance(exc, BackendError):
        if isinstance(exc, ContextLengthError):
            return error_response(400, str(exc), param="messages", code="context_length_exceeded")
        if exc.status is not None and 400 <= exc.status < 500:
            return error_response(exc.status, str(exc), code="worker_rejected")
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
            max_attempts=config.max_attempts)
        self.registry = TemplateRegistry(self.router.store)
        self.metrics = _process_metrics()
        self._templaters: dict[str, Templater] = {}
        self.upstream = Upstream(timeout=config.timeout, max_connections=config.max_concurrency)
        self.inflight = 0
        self.draining = False

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

    async def read_body(self, request: Request) -> dict[str, Any]:
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
        if self.draining:
            raise RequestRejectedError(503, "the gateway is shutting down", code="shutting_down", retry_after=1)
        if self.inflight >= self.config.max_concurrency:
            raise RequestRejectedError(503, f"the gateway has {self.inflight} calls in flight (--max-concurrency)",
                                       code="overloaded", retry_after=1)
        self.inflight += 1
        self.metrics.inflight.inc()

    def _release(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.dec()

    def _lifecycle(self, call: GatewayCall) -> CallLifecycle:
        return CallLifecycle(self.router, call.route, max_attempts=self.config.max_attempts, backoff=_RETRY_BASE,
                             last_resort=True)

    def _served(self, call: GatewayCall, placement: Placement) -> None:
        if call.prompt is not None:
            self.registry.record(placement.tenant, call.prompt, placement.session_id)  # queued: no I/O here

    @staticmethod
    def _headers(placement: Placement, call: GatewayCall) -> dict[str, str]:
        return {WORKER_HEADER: placement.worker, SESSION_HEADER: call.route.session_id}

    # --- the proxied endpoints ----------------------------------------------------

    async def proxy(self, request: Request, path: str) -> Response:
        try:
            self._admit()
        except RequestRejectedError as exc:
            return self._count(path, _error_for(exc))
        streaming = False
        try:
            call = await self._prepare(request, path)
            if call.stream:
                response = await self._stream(call)
                streaming = True  # the stream's end releases the slot
                return response
            return self._count(path, await self._once(call))
        except Exception as exc:  # every failure becomes an OpenAI-style error body
            return self._count(path, _error_for(exc))
        finally:
            if not streaming:
                self._release()

    def _count(self, path: str, response: Response) -> Response:
        self.metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    async def _prepare(self, request: Request, path: str) -> GatewayCall:
        grant = self.authorize(request)
        body = await self.read_body(request)
        infer: Callable[[], str] | None = None
        if path == CHAT and self.config.infer_sessions and isinstance(body.get("messages"), list):
            messages = body["messages"]
            if all(isinstance(m, dict) for m in messages):
                infer = lambda: conversation_session(messages)  # noqa: E731 - computed only when needed
        session = find_session(request.headers, self.config.session_header, body, infer)
        return prepare(path, body, grant=grant, extra_key=self.router.extra_key_for(grant.tenant), session=session,
                       templater=self.templater(grant.tenant) if path == CHAT else None,
                       pool=request.headers.get(POOL_HEADER), extra_fields=self.config.extra_fields)

    async def _once(self, call: GatewayCall) -> Response:
        async def attempt(placement: Placement) -> tuple[bytes, Usage | None]:
            raw = await self.upstream.post(placement.worker, call.path, call.body)
            return raw, _usage_of(raw, call.path)

        raw, placement = await self._lifecycle(call).arun(attempt)
        self._served(call, placement)
        return Response(raw, media_type="application/json", headers=self._headers(placement, call))

    async def _stream(self, call: GatewayCall) -> Response:
        """Start the stream once the first event arrived (an attempt failing before that moves on)."""
        life = self._lifecycle(call)
        current: list[Placement] = []

        async def sender(attempt: Attempt) -> AsyncGenerator[bytes, None]:
            current.append(attempt.placement)
            usage: Usage | None = None
            done = False
            async for line in self.upstream.stream(attempt.placement.worker, call.path, call.body):
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                    elif b'"prompt_tokens"' in payload:
                        found = _usage_of(payload, call.path)
                        usage = found or usage
                        if (not call.include_usage and found is not None
                                and b'"choices":[]' in payload.replace(b" ", b"")):
                            continue  # the usage chunk the gateway asked for on the client's behalf
                attempt.delivered = True  # from here on a retry would repeat output
                yield line
            if not done:
                raise StreamError("stream ended without data: [DONE]", url=attempt.placement.worker)
            attempt.usage = usage

        events = life.astream(sender)
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            first = b""
        except BaseException:
            await events.aclose()
            raise

        async def body() -> AsyncIterator[bytes]:
            status = "200"
            try:
                yield first
                async for item in events:
                    yield item
                if life.result is not None:
                    self._served(call, life.result[1])
            except Exception as exc:  # the status line is sent: the stream just ends
                status = "stream_error"
                logger.warning("stream through %s broke: %s", current[-1].worker if current else "?", exc)
            finally:
                await events.aclose()
                self._release()
                self.metrics.requests.labels(call.path, status).inc()

        return StreamingResponse(body(), media_type="text/event-stream", headers=self._headers(current[-1], call))

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
        """200 while the gateway takes calls and a worker is up; 503 while draining or with none up."""
        urls = [w.url for w in self.router.workers]
        down = self.router.health.down(urls)
        body = {"status": "ok", "workers": {u: u not in down for u in urls}, "inflight": self.inflight,
                "store_degraded": self.router.availability.degraded}
        if self.draining:
            body["status"] = "draining"
        elif len(down) == len(urls):
            body["status"] = "no_healthy_worker"
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def aclose(self) -> None:
        await self.upstream.aclose()
        self.registry.close()
        await self.router.aclose()


def _usage_of(raw: bytes | str, path: str) -> Usage | None:
    """The usage a worker reported in a response body or stream event (``meta_info`` for ``/generate``)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if path == GENERATE:
        meta = data.get("meta_info")
        if not isinstance(meta, dict):
            return None
        return Usage(int(meta.get("prompt_tokens") or 0), int(meta.get("completion_tokens") or 0),
                     int(meta.get("cached_tokens") or 0))
    return parse_usage(data.get("usage"))


def create_app(config: GatewayConfig, router: Router | None = None) -> Starlette:
    """The gateway as an ASGI app (``uvicorn.run(create_app(config))``)."""
    gateway = Gateway(config, router)

    def proxied(path: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await gateway.proxy(request, path)

        return endpoint

    app = Starlette(
        routes=[
            Route(CHAT, proxied(CHAT), methods=["POST"]),
            Route(COMPLETIONS, proxied(COMPLETIONS), methods=["POST"]),
            Route(GENERATE, proxied(GENERATE), methods=["POST"]),
            Route("/v1/models", gateway.models, methods=["GET"]),
            Route("/health", gateway.health, methods=["GET"]),
            Route("/metrics", gateway.prometheus, methods=["GET"]),
        ],
        lifespan=_lifespan(gateway),
    )
    app.state.gateway = gateway
    return app


def _lifespan(gateway: Gateway) -> Callable[[Starlette], Any]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        encoder()  # load the tokenizer the templates count with now, not inside the first call
        yield
        gateway.draining = True
        await gateway.aclose()

    return lifespan


__all__ = ["Gateway", "create_app", "error_response", "WORKER_HEADER", "SESSION_HEADER", "POOL_HEADER"]
