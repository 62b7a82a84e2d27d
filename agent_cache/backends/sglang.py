"""HTTP clients for one SGLang worker: :class:`SGLangClient` and :class:`AsyncSGLangClient`.

Each client owns a pooled httpx connection to one worker URL. Every
operation is written once, as a flow of requests (:class:`_Request`, with
the parser of its answer), run by the sync or the async face, which differ
only in how they do I/O (as :func:`~agent_cache.routing.lifecycle.call_flow`).
Errors are typed (:mod:`agent_cache.errors`) and carry the worker URL and
``retryable``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence, cast
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
    transport_error,
)
from agent_cache.errors import BackendError, ConfigError, InvalidRequestError, ResponseMismatchError, StreamError
from agent_cache.telemetry import trace_context

DEFAULT_TIMEOUT = 120.0
MAX_WORKER_URL = 2048  # characters; a URL longer than any browser or proxy takes is a mistake


def normalize_worker_url(url: str, field: str = "base_url") -> str:
    """Validate a worker URL (``http``/``https`` with a host) and strip trailing ``/`` and ``/v1``."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(field, f"expected a worker URL such as http://127.0.0.1:30000, got {url!r}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url.strip()):
        raise ConfigError(field, f"whitespace or a control character inside the URL {url!r}")
    if len(url) > MAX_WORKER_URL:
        raise ConfigError(field, f"a worker URL of {len(url)} characters; at most {MAX_WORKER_URL}")
    if not url.isascii():  # a lone surrogate, or an international name HTTP cannot send as it is
        raise ConfigError(field, f"non-ASCII characters in {url!r}; give the host in its ASCII (punycode) form")
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise ConfigError(field, f"not a URL: {url!r} ({exc})") from None
    if parts.username is not None or parts.password is not None:  # they would show wherever the URL is shown
        raise ConfigError(field, f"no credentials in a worker URL (got one for host {parts.hostname!r}); give "
                                 "the workers' API key in $AGENT_CACHE_API_KEY (ChatSGLang: api_key=) instead")
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
        raise InvalidRequestError("text", "pass exactly one of text or input_ids to /generate")
    body: dict[str, Any] = {"sampling_params": dict(sampling_params or {}), "stream": stream}
    if text is not None:
        body["text"] = text
    else:
        body["input_ids"] = list(input_ids or [])
    body.update(extra)
    return body


@dataclass(frozen=True)
class _Request:
    """One request of an operation, and what its answer becomes."""

    method: str
    path: str
    read: Callable[[httpx.Response], Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


# an operation: the requests it sends (each answered with its response), then its result
_Flow = Generator[_Request, httpx.Response, Any]
_DONE = object()  # a stream's [DONE]


def _next(flow: _Flow, response: httpx.Response | None) -> tuple[_Request | None, Any]:
    """The flow's next request, or (None, its result)."""
    try:
        return flow.send(response), None  # type: ignore[arg-type]  # None primes the flow
    except StopIteration as stop:
        return None, stop.value


def _with_timeout(kwargs: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    if timeout is not None:
        kwargs["timeout"] = _timeout(timeout)
    return kwargs


class _Base:
    """The operations of a client, as flows of requests; the faces run them."""

    def __init__(self, base_url: str, *, timeout: float | None, api_key: str | None) -> None:
        self.base_url = normalize_worker_url(base_url)
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._info_paths: dict[str, str] = {}  # the metadata route this worker answered

    def _limits(self, max_connections: int) -> dict[str, Any]:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        return {"base_url": self.base_url, "timeout": _timeout(self.timeout), "headers": self._headers,
                "limits": limits}

    def _map_transport(self, exc: Exception) -> BackendError:
        return transport_error(exc, self.base_url)

    def _check(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            raise http_error(response.status_code, response.content, self.base_url)

    def _json(self, response: httpx.Response, what: str) -> Any:
        self._check(response)
        return decode_json(response.content, self.base_url, what)

    def _object(self, what: str) -> Callable[[httpx.Response], dict[str, Any]]:
        # the info, models and tokenize endpoints answer a JSON object; passed on unchecked, as before
        return lambda response: cast(dict[str, Any], self._json(response, what))

    def _one(self, request: _Request) -> _Flow:
        return request.read((yield request))

    # --- the operations ------------------------------------------------------------

    def _chat(self, messages: Sequence[Mapping[str, Any]], model: str | None, timeout: float | None,
              params: dict[str, Any]) -> _Flow:
        body = build_chat_body(messages, model=model, url=self.base_url, **params)
        return self._one(_Request("POST", "/v1/chat/completions", lambda r: parse_chat(
            self._json(r, "chat completion"), self.base_url), _with_timeout({"json": body}, timeout)))

    def _generate(self, text: str | None, input_ids: Sequence[int] | None, sampling_params: Mapping[str, Any] | None,
                  timeout: float | None, extra: dict[str, Any]) -> _Flow:
        body = _generate_body(text, input_ids, sampling_params, False, extra, self.base_url)
        return self._one(_Request("POST", "/generate", lambda r: parse_generate(
            self._json(r, "/generate response"), self.base_url), _with_timeout({"json": body}, timeout)))

    def _health(self, timeout: float | None) -> _Flow:
        return self._one(_Request("GET", "/health", self._check, {"timeout": _timeout(timeout)}))

    def _info(self, name: str) -> _Flow:
        # /server_info and /model_info from SGLang 0.5.6; /get_* before (and as aliases after)
        path = self._info_paths.get(name, f"/{name}")
        response = yield _Request("GET", path, self._check)
        if response.status_code == 404 and path == f"/{name}":
            path = f"/get_{name}"
            response = yield _Request("GET", path, self._check)
            if response.status_code != 404:
                self._info_paths[name] = path
        return self._object(path)(response)

    def _metrics(self) -> _Flow:
        def read(response: httpx.Response) -> dict[str, float]:
            self._check(response)
            return parse_metrics(response.text)

        return self._one(_Request("GET", "/metrics", read))

    def _tokenize(self, prompt: str, add_special_tokens: bool) -> _Flow:
        body = {"prompt": prompt, "add_special_tokens": add_special_tokens}
        return self._one(_Request("POST", "/tokenize", self._object("/tokenize"), {"json": body}))

    # --- streams: the request, and what each ``data:`` payload becomes -------------------

    def _chat_stream(self, messages: Sequence[Mapping[str, Any]], model: str | None, include_usage: bool,
                     params: dict[str, Any]) -> tuple[str, dict[str, Any], Callable[[str], Any]]:
        body = build_chat_body(messages, model=model, stream=True, include_usage=include_usage, url=self.base_url,
                               **params)
        return "/v1/chat/completions", body, self._chunk

    def _generate_stream(self, text: str | None, input_ids: Sequence[int] | None,
                         sampling_params: Mapping[str, Any] | None,
                         extra: dict[str, Any]) -> tuple[str, dict[str, Any], Callable[[str], Any]]:
        return "/generate", _generate_body(text, input_ids, sampling_params, True, extra, self.base_url), \
            self._generate_item

    def _item(self, line: str, parse: Callable[[str], Any]) -> Any:
        """What one line of a stream is: an item, :data:`_DONE`, or None (nothing)."""
        payload = sse_payload(line)
        if not payload:
            return None
        return _DONE if payload == "[DONE]" else parse(payload)

    def _chunk(self, payload: str) -> ChatChunk:
        return parse_chat_chunk(decode_json(payload, self.base_url, "stream chunk"), self.base_url)

    def _generate_item(self, payload: str) -> GenerateResult:
        data = decode_json(payload, self.base_url, "/generate stream event")
        if isinstance(data, dict) and ("error" in data or data.get("object") == "error"):
            raise stream_error_event(data, self.base_url)
        return parse_generate(data, self.base_url)

    def _truncated(self) -> StreamError:
        return StreamError("stream ended without data: [DONE]", url=self.base_url)

    @contextlib.contextmanager
    def _mapped(self, *, broken: bool) -> Iterator[None]:
        """httpx's errors as typed ones: once a stream has begun (``broken``), a :class:`StreamError`."""
        try:
            yield
        except httpx.HTTPError as exc:
            if broken:
                raise StreamError(f"stream broke: {exc!s}", url=self.base_url) from exc
            raise self._map_transport(exc) from exc


class SGLangClient(_Base):
    """Synchronous client for one SGLang worker."""

    def __init__(self, base_url: str, *, timeout: float | None = DEFAULT_TIMEOUT, api_key: str | None = None,
                 max_connections: int = 64, http: httpx.Client | None = None) -> None:
        """``http``: a connection pool shared with other clients (absolute URLs; the caller closes it),
        for a caller that talks to many workers (an httpx client costs about 1 MB and milliseconds)."""
        super().__init__(base_url, timeout=timeout, api_key=api_key)
        self._own = http is None
        self._prefix = "" if http is None else self.base_url  # a shared pool has no base URL
        self._http = http if http is not None else httpx.Client(
            **self._limits(max_connections), event_hooks={"request": [trace_context.add_headers]})  # traceparent

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> "SGLangClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _shared(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A request's arguments; over a shared pool, with this client's headers and timeout."""
        if self._own:
            return kwargs
        return {"headers": self._headers, "timeout": _timeout(self.timeout), **kwargs}

    def _run(self, flow: _Flow) -> Any:
        """Send each request of ``flow``; its result."""
        request, result = _next(flow, None)
        while request is not None:
            try:
                request, result = _next(flow, self._http.request(request.method, self._prefix + request.path,
                                                                 **self._shared(request.kwargs)))
            except httpx.HTTPError as exc:
                raise self._map_transport(exc) from exc
        return result

    def _stream(self, spec: tuple[str, dict[str, Any], Callable[[str], Any]], timeout: float | None) -> Iterator[Any]:
        path, body, parse = spec
        with self._mapped(broken=False), self._http.stream(
                "POST", self._prefix + path, **self._shared(_with_timeout({"json": body}, timeout))) as response:
            if response.status_code >= 400:
                response.read()
                self._check(response)
            _check_stream(response, self.base_url)
            with self._mapped(broken=True):
                for line in response.iter_lines():
                    if (item := self._item(line, parse)) is _DONE:
                        return
                    if item is not None:
                        yield item
        raise self._truncated()

    # --- OpenAI-compatible chat ------------------------------------------------

    def chat(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None, timeout: float | None = None,
             **params: Any) -> ChatResult:
        """``POST /v1/chat/completions`` (non-streaming)."""
        return cast(ChatResult, self._run(self._chat(messages, model, timeout, params)))

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
                    include_usage: bool = True, timeout: float | None = None, **params: Any) -> Iterator[ChatChunk]:
        """Streamed ``/v1/chat/completions``; raises :class:`StreamError` if ``[DONE]`` never comes."""
        return self._stream(self._chat_stream(messages, model, include_usage, params), timeout)

    # --- native API ------------------------------------------------------------

    def generate(self, text: str | None = None, *, input_ids: Sequence[int] | None = None,
                 sampling_params: Mapping[str, Any] | None = None, timeout: float | None = None,
                 **extra: Any) -> GenerateResult:
        """``POST /generate``; ``extra`` carries ``rid``, ``extra_key``, ``priority``..."""
        return cast(GenerateResult, self._run(self._generate(text, input_ids, sampling_params, timeout, extra)))

    def stream_generate(self, text: str | None = None, *, input_ids: Sequence[int] | None = None,
                        sampling_params: Mapping[str, Any] | None = None, timeout: float | None = None,
                        **extra: Any) -> Iterator[GenerateResult]:
        """Streamed ``/generate``: each item carries the cumulative text so far."""
        return self._stream(self._generate_stream(text, input_ids, sampling_params, extra), timeout)

    # --- server state ------------------------------------------------------------

    def health(self, *, timeout: float | None = 10.0) -> None:
        """``GET /health``; returns when healthy, raises a BackendError otherwise."""
        self._run(self._health(timeout))

    def server_info(self) -> dict[str, Any]:
        """``/server_info`` (``/get_server_info`` on SGLang before 0.5.6)."""
        return cast(dict[str, Any], self._run(self._info("server_info")))

    def model_info(self) -> dict[str, Any]:
        """``/model_info`` (``/get_model_info`` on SGLang before 0.5.6)."""
        return cast(dict[str, Any], self._run(self._info("model_info")))

    def models(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._run(self._one(_Request("GET", "/v1/models", self._object("/v1/models")))))

    def metrics(self) -> dict[str, float]:
        return cast(dict[str, float], self._run(self._metrics()))

    def flush_cache(self) -> None:
        self._run(self._one(_Request("POST", "/flush_cache", self._check)))

    def tokenize(self, prompt: str, *, add_special_tokens: bool = True) -> dict[str, Any]:
        return cast(dict[str, Any], self._run(self._tokenize(prompt, add_special_tokens)))


class AsyncSGLangClient(_Base):
    """Asynchronous client for one SGLang worker (same methods, awaitable)."""

    def __init__(self, base_url: str, *, timeout: float | None = DEFAULT_TIMEOUT, api_key: str | None = None,
                 max_connections: int = 64) -> None:
        super().__init__(base_url, timeout=timeout, api_key=api_key)
        self._http = httpx.AsyncClient(**self._limits(max_connections),
                                       event_hooks={"request": [trace_context.aadd_headers]})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSGLangClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, flow: _Flow) -> Any:
        """Async :meth:`SGLangClient._run`."""
        request, result = _next(flow, None)
        while request is not None:
            try:
                response = await self._http.request(request.method, request.path, **request.kwargs)
            except httpx.HTTPError as exc:
                raise self._map_transport(exc) from exc
            request, result = _next(flow, response)
        return result

    async def _stream(self, spec: tuple[str, dict[str, Any], Callable[[str], Any]],
                      timeout: float | None) -> AsyncIterator[Any]:
        path, body, parse = spec
        with self._mapped(broken=False):
            async with self._http.stream("POST", path, **_with_timeout({"json": body}, timeout)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._check(response)
                _check_stream(response, self.base_url)
                with self._mapped(broken=True):
                    async for line in response.aiter_lines():
                        if (item := self._item(line, parse)) is _DONE:
                            return
                        if item is not None:
                            yield item
        raise self._truncated()

    async def chat(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
                   timeout: float | None = None, **params: Any) -> ChatResult:
        return cast(ChatResult, await self._run(self._chat(messages, model, timeout, params)))

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None,
                    include_usage: bool = True, timeout: float | None = None,
                    **params: Any) -> AsyncIterator[ChatChunk]:
        return self._stream(self._chat_stream(messages, model, include_usage, params), timeout)

    async def generate(self, text: str | None = None, *, input_ids: Sequence[int] | None = None,
                       sampling_params: Mapping[str, Any] | None = None, timeout: float | None = None,
                       **extra: Any) -> GenerateResult:
        return cast(GenerateResult, await self._run(self._generate(text, input_ids, sampling_params, timeout, extra)))

    def stream_generate(self, text: str | None = None, *, input_ids: Sequence[int] | None = None,
                        sampling_params: Mapping[str, Any] | None = None, timeout: float | None = None,
                        **extra: Any) -> AsyncIterator[GenerateResult]:
        return self._stream(self._generate_stream(text, input_ids, sampling_params, extra), timeout)

    async def health(self, *, timeout: float | None = 10.0) -> None:
        await self._run(self._health(timeout))

    async def server_info(self) -> dict[str, Any]:
        """``/server_info`` (``/get_server_info`` on SGLang before 0.5.6)."""
        return cast(dict[str, Any], await self._run(self._info("server_info")))

    async def model_info(self) -> dict[str, Any]:
        """``/model_info`` (``/get_model_info`` on SGLang before 0.5.6)."""
        return cast(dict[str, Any], await self._run(self._info("model_info")))

    async def models(self) -> dict[str, Any]:
        request = _Request("GET", "/v1/models", self._object("/v1/models"))
        return cast(dict[str, Any], await self._run(self._one(request)))

    async def metrics(self) -> dict[str, float]:
        return cast(dict[str, float], await self._run(self._metrics()))

    async def flush_cache(self) -> None:
        await self._run(self._one(_Request("POST", "/flush_cache", self._check)))

    async def tokenize(self, prompt: str, *, add_special_tokens: bool = True) -> dict[str, Any]:
        return cast(dict[str, Any], await self._run(self._tokenize(prompt, add_special_tokens)))


__all__ = ["SGLangClient", "AsyncSGLangClient", "normalize_worker_url", "DEFAULT_TIMEOUT"]


def _check_stream(response: httpx.Response, url: str) -> None:
    """A JSON body where a stream was asked: an option of the request made the worker answer whole."""
    if response.headers.get("content-type", "").startswith("application/json"):
        raise ResponseMismatchError("the worker answered a streamed request with a JSON body", url=url,
                                    status=response.status_code)
