"""HTTP clients for one SGLang worker: :class:`SGLangClient` and :class:`AsyncSGLangClient`.

Each client owns a pooled httpx connection to one worker URL. The two faces
share every request builder and parser (:mod:`agent_cache.backends.protocol`)
and differ only in how they do I/O. Errors are typed
(:mod:`agent_cache.errors`) and carry the worker URL and ``retryable``.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence, cast
from urllib.parse import urlsplit

import httpx

from agent_cache.backends.protocol import (
    ChatChunk,
    ChatResult,
    GenerateResult,
    build_chat_body,
    decode_json,
    http_error,
    parse_chat,
    parse_chat_chunk,
    parse_generate,
    parse_metrics,
    sse_payload,
    stream_error_event,
)
from agent_cache.errors import (
    BackendError,
    ConfigError,
    ResponseMismatchError,
    StreamError,
    WorkerConnectionError,
    WorkerTimeoutError,
)
from agent_cache.telemetry import trace_context

DEFAULT_TIMEOUT = 120.0


def normalize_worker_url(url: str, field: str = "base_url") -> str:
    """Validate a worker URL (``http``/``https`` with a host) and strip trailing ``/`` and ``/v1``."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(field, f"expected a worker URL such as http://127.0.0.1:30000, got {url!r}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url.strip()):
        raise ConfigError(field, f"whitespace or a control character inside the URL {url!r}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ConfigError(field, f"unsupported URL scheme {parts.scheme!r} in {url!r}; use http or https")
    if not parts.hostname:
        raise ConfigError(field, f"no host in {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in 0-65535
    except ValueError:
        raise ConfigError(field, f"bad port in {url!r}") from None
    if parts.query or parts.fragment:
        raise ConfigError(field, f"a worker URL takes no query or fragment, got {url!r}")
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def _timeout(seconds: float | None) -> httpx.Timeout:
    if seconds is None:
        return httpx.Timeout(None, connect=10.0)
    return httpx.Timeout(seconds, connect=min(10.0, seconds))


def _generate_body(
    text: str | None,
    input_ids: Sequence[int] | None,
    sampling_params: Mapping[str, Any] | None,
    stream: bool,
    extra: Mapping[str, Any],
    url: str,
) -> dict[str, Any]:
    if (text is None) == (input_ids is None):
        raise ConfigError("text", "pass exactly one of text or input_ids to /generate")
    body: dict[str, Any] = {"sampling_params": dict(sampling_params or {}), "stream": stream}
    if text is not None:
        body["text"] = text
    else:
        body["input_ids"] = list(input_ids or [])
    body.update(extra)
    return body


class _Base:
    def __init__(self, base_url: str, *, timeout: float | None, api_key: str | None) -> None:
        self.base_url = normalize_worker_url(base_url)
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._info_paths: dict[str, str] = {}  # the metadata route this worker answered

    def _map_transport(self, exc: Exception) -> BackendError:
        if isinstance(exc, httpx.TimeoutException):
            return WorkerTimeoutError(f"timed out: {type(exc).__name__}", url=self.base_url)
        return WorkerConnectionError(f"cannot reach worker: {exc!s}", url=self.base_url)

    def _check(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            raise http_error(response.status_code, response.content, self.base_url)

    def _json(self, response: httpx.Response, what: str) -> Any:
        self._check(response)
        return decode_json(response.content, self.base_url, what)

    def _json_object(self, response: httpx.Response, what: str) -> dict[str, Any]:
        # the info, models and tokenize endpoints answer a JSON object; passed on unchecked, as before
        return cast(dict[str, Any], self._json(response, what))

    def _chunk(self, payload: str) -> ChatChunk:
        return parse_chat_chunk(decode_json(payload, self.base_url, "stream chunk"), self.base_url)

    def _generate_item(self, payload: str) -> GenerateResult:
        data = decode_json(payload, self.base_url, "/generate stream event")
        if isinstance(data, dict) and ("error" in data or data.get("object") == "error"):
            raise stream_error_event(data, self.base_url)
        return parse_generate(data, self.base_url)

    def _truncated(self) -> StreamError:
        return StreamError("stream ended without data: [DONE]", url=self.base_url)


class SGLangClient(_Base):
    """Synchronous client for one SGLang worker."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        api_key: str | None = None,
        max_connections: int = 64,
    ) -> None:
        super().__init__(base_url, timeout=timeout, api_key=api_key)
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=_timeout(timeout),
            headers=self._headers,
            event_hooks={"request": [trace_context.add_headers]},  # a traced call's traceparent
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "SGLangClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._map_transport(exc) from exc

    @contextlib.contextmanager
    def _stream(self, path: str, body: dict[str, Any], timeout: float | None) -> Iterator[Iterator[str]]:
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        try:
            with self._http.stream("POST", path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response)
                _check_stream(response, self.base_url)
                yield self._lines(response)
        except httpx.HTTPError as exc:
            raise self._map_transport(exc) from exc

    def _lines(self, response: httpx.Response) -> Iterator[str]:
        try:
            yield from response.iter_lines()
        except httpx.HTTPError as exc:
            raise StreamError(f"stream broke: {exc!s}", url=self.base_url) from exc

    # --- OpenAI-compatible chat ------------------------------------------------

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> ChatResult:
        """``POST /v1/chat/completions`` (non-streaming)."""
        body = build_chat_body(messages, model=model, url=self.base_url, **params)
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        response = self._request("POST", "/v1/chat/completions", **kwargs)
        return parse_chat(self._json(response, "chat completion"), self.base_url)

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        include_usage: bool = True,
        timeout: float | None = None,
        **params: Any,
    ) -> Iterator[ChatChunk]:
        """Streamed ``/v1/chat/completions``; raises :class:`StreamError` if ``[DONE]`` never comes."""
        body = build_chat_body(
            messages, model=model, stream=True, include_usage=include_usage, url=self.base_url, **params
        )
        with self._stream("/v1/chat/completions", body, timeout) as lines:
            for line in lines:
                payload = sse_payload(line)
                if payload is None or payload == "":
                    continue
                if payload == "[DONE]":
                    return
                yield self._chunk(payload)
        raise self._truncated()

    # --- native API ------------------------------------------------------------

    def generate(
        self,
        text: str | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> GenerateResult:
        """``POST /generate``; ``extra`` carries ``rid``, ``extra_key``, ``priority``..."""
        body = _generate_body(text, input_ids, sampling_params, False, extra, self.base_url)
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        data = self._json(self._request("POST", "/generate", **kwargs), "/generate response")
        return parse_generate(data, self.base_url)

    def stream_generate(
        self,
        text: str | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> Iterator[GenerateResult]:
        """Streamed ``/generate``: each item carries the cumulative text so far."""
        body = _generate_body(text, input_ids, sampling_params, True, extra, self.base_url)
        with self._stream("/generate", body, timeout) as lines:
            for line in lines:
                payload = sse_payload(line)
                if not payload:
                    continue
                if payload == "[DONE]":
                    return
                yield self._generate_item(payload)
        raise self._truncated()

    # --- server state ------------------------------------------------------------

    def health(self, *, timeout: float | None = 10.0) -> None:
        """``GET /health``; returns when healthy, raises a BackendError otherwise."""
        self._check(self._request("GET", "/health", timeout=_timeout(timeout)))

    def _info(self, name: str) -> dict[str, Any]:
        # /server_info and /model_info from SGLang 0.5.6; /get_* before (and as aliases after)
        path = self._info_paths.get(name, f"/{name}")
        response = self._request("GET", path)
        if response.status_code == 404 and path == f"/{name}":
            path = f"/get_{name}"
            response = self._request("GET", path)
            if response.status_code != 404:
                self._info_paths[name] = path
        return self._json_object(response, path)

    def server_info(self) -> dict[str, Any]:
        """``/server_info`` (``/get_server_info`` on SGLang before 0.5.6)."""
        return self._info("server_info")

    def model_info(self) -> dict[str, Any]:
        """``/model_info`` (``/get_model_info`` on SGLang before 0.5.6)."""
        return self._info("model_info")

    def models(self) -> dict[str, Any]:
        return self._json_object(self._request("GET", "/v1/models"), "/v1/models")

    def metrics(self) -> dict[str, float]:
        response = self._request("GET", "/metrics")
        self._check(response)
        return parse_metrics(response.text)

    def flush_cache(self) -> None:
        self._check(self._request("POST", "/flush_cache"))

    def tokenize(self, prompt: str, *, add_special_tokens: bool = True) -> dict[str, Any]:
        body = {"prompt": prompt, "add_special_tokens": add_special_tokens}
        return self._json_object(self._request("POST", "/tokenize", json=body), "/tokenize")


class AsyncSGLangClient(_Base):
    """Asynchronous client for one SGLang worker (same methods, awaitable)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        api_key: str | None = None,
        max_connections: int = 64,
    ) -> None:
        super().__init__(base_url, timeout=timeout, api_key=api_key)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=_timeout(timeout),
            headers=self._headers,
            event_hooks={"request": [trace_context.aadd_headers]},
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSGLangClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._map_transport(exc) from exc

    async def _stream_lines(self, path: str, body: dict[str, Any], timeout: float | None) -> AsyncIterator[str]:
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        try:
            async with self._http.stream("POST", path, **kwargs) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._check(response)
                _check_stream(response, self.base_url)
                try:
                    async for line in response.aiter_lines():
                        yield line
                except httpx.HTTPError as exc:
                    raise StreamError(f"stream broke: {exc!s}", url=self.base_url) from exc
        except StreamError:
            raise
        except httpx.HTTPError as exc:
            raise self._map_transport(exc) from exc

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> ChatResult:
        body = build_chat_body(messages, model=model, url=self.base_url, **params)
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        response = await self._request("POST", "/v1/chat/completions", **kwargs)
        return parse_chat(self._json(response, "chat completion"), self.base_url)

    async def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        include_usage: bool = True,
        timeout: float | None = None,
        **params: Any,
    ) -> AsyncIterator[ChatChunk]:
        body = build_chat_body(
            messages, model=model, stream=True, include_usage=include_usage, url=self.base_url, **params
        )
        async for line in self._stream_lines("/v1/chat/completions", body, timeout):
            payload = sse_payload(line)
            if not payload:
                continue
            if payload == "[DONE]":
                return
            yield self._chunk(payload)
        raise self._truncated()

    async def generate(
        self,
        text: str | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> GenerateResult:
        body = _generate_body(text, input_ids, sampling_params, False, extra, self.base_url)
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = _timeout(timeout)
        data = self._json(await self._request("POST", "/generate", **kwargs), "/generate response")
        return parse_generate(data, self.base_url)

    async def stream_generate(
        self,
        text: str | None = None,
        *,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> AsyncIterator[GenerateResult]:
        body = _generate_body(text, input_ids, sampling_params, True, extra, self.base_url)
        async for line in self._stream_lines("/generate", body, timeout):
            payload = sse_payload(line)
            if not payload:
                continue
            if payload == "[DONE]":
                return
            yield self._generate_item(payload)
        raise self._truncated()

    async def health(self, *, timeout: float | None = 10.0) -> None:
        self._check(await self._request("GET", "/health", timeout=_timeout(timeout)))

    async def _info(self, name: str) -> dict[str, Any]:
        path = self._info_paths.get(name, f"/{name}")
        response = await self._request("GET", path)
        if response.status_code == 404 and path == f"/{name}":
            path = f"/get_{name}"
            response = await self._request("GET", path)
            if response.status_code != 404:
                self._info_paths[name] = path
        return self._json_object(response, path)

    async def server_info(self) -> dict[str, Any]:
        """``/server_info`` (``/get_server_info`` on SGLang before 0.5.6)."""
        return await self._info("server_info")

    async def model_info(self) -> dict[str, Any]:
        """``/model_info`` (``/get_model_info`` on SGLang before 0.5.6)."""
        return await self._info("model_info")

    async def models(self) -> dict[str, Any]:
        return self._json_object(await self._request("GET", "/v1/models"), "/v1/models")

    async def metrics(self) -> dict[str, float]:
        response = await self._request("GET", "/metrics")
        self._check(response)
        return parse_metrics(response.text)

    async def flush_cache(self) -> None:
        self._check(await self._request("POST", "/flush_cache"))

    async def tokenize(self, prompt: str, *, add_special_tokens: bool = True) -> dict[str, Any]:
        body = {"prompt": prompt, "add_special_tokens": add_special_tokens}
        return self._json_object(await self._request("POST", "/tokenize", json=body), "/tokenize")


__all__ = ["SGLangClient", "AsyncSGLangClient", "normalize_worker_url", "DEFAULT_TIMEOUT"]


def _check_stream(response: httpx.Response, url: str) -> None:
    """A JSON body where a stream was asked: an option of the request made the worker answer whole."""
    if response.headers.get("content-type", "").startswith("application/json"):
        raise ResponseMismatchError("the worker answered a streamed request with a JSON body", url=url,
                                    status=response.status_code)
