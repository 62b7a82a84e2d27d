"""SGLang wire format: request bodies, response parsing, error mapping.

Pure functions shared by the sync and async clients in
:mod:`agent_cache.backends.sglang`. Field names follow SGLang 0.5.x
(``python/sglang/srt/entrypoints/openai/protocol.py`` and
``serving_chat.py``, ``managers/io_struct.py`` for ``/generate``).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agent_cache.errors import (
    BackendError,
    ContextLengthError,
    MalformedResponseError,
    StreamError,
    WorkerAbortedError,
    WorkerBadRequestError,
    WorkerConnectionError,
    WorkerRefusedError,
    WorkerRateLimitError,
    WorkerServerError,
    WorkerTimeoutError,
)
from agent_cache.values import Usage

# Body fields of ChatCompletionRequest the client may set. SGLang ignores
# unknown fields, but we refuse them so a typo is caught here, not silently.
CHAT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "response_format",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "n",
        "stream",
        "stream_options",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "reasoning_effort",
        "user",
        "parallel_tool_calls",
        # SGLang extensions
        "rid",
        "extra_key",
        "cache_salt",
        "priority",
        "session_params",
        "chat_template_kwargs",
        "separate_reasoning",
        "stream_reasoning",
        "return_cached_tokens_details",
        "continue_final_message",
        "regex",
        "ebnf",
        "json_schema",
        "lora_path",
        "no_stop_trim",
        "ignore_eos",
        "skip_special_tokens",
        "min_tokens",
        "stop_token_ids",
        "stop_regex",
        "custom_params",
    }
)

_CONTEXT_RE = re.compile(
    r"context length|maximum (allowed )?length|max_total_num_tokens|too long|exceeds",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model produced it


@dataclass(frozen=True)
class ChatResult:
    """A non-streamed chat completion."""

    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: Usage | None
    model: str
    id: str
    reasoning_content: str | None = None
    matched_stop: Any = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str | None


@dataclass(frozen=True)
class ChatChunk:
    """One streamed chunk; the usage chunk has no choices and ``usage`` set."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCallDelta]
    finish_reason: str | None
    usage: Usage | None
    model: str
    id: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class GenerateResult:
    """A ``/generate`` answer (the final one when streamed)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: Any
    e2e_latency: float | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def build_chat_body(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str | None = None,
    stream: bool = False,
    include_usage: bool = True,
    url: str = "",
    extra_body: Mapping[str, Any] | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Body for ``POST /v1/chat/completions``.

    Unknown keyword fields raise (a typo is caught here, not silently ignored
    by SGLang); ``extra_body`` is merged unchecked, as in the OpenAI SDK.
    """
    unknown = sorted(k for k in params if k not in CHAT_FIELDS)
    if unknown:
        raise WorkerBadRequestError(
            f"unknown chat completion field(s) {unknown}; SGLang accepts {sorted(CHAT_FIELDS)}",
            url=url,
        )
    body: dict[str, Any] = {"model": model or "default", "messages": list(messages)}
    body.update({k: v for k, v in params.items() if v is not None})
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    if extra_body:
        body.update(extra_body)
    return body


def parse_usage(obj: Any) -> Usage | None:
    """The ``usage`` object of a response (``prompt_tokens_details.cached_tokens`` included), or None."""
    if not isinstance(obj, dict):
        return None
    details = obj.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=int(obj.get("prompt_tokens") or 0),
        completion_tokens=int(obj.get("completion_tokens") or 0),
        cached_tokens=None if cached is None else int(cached),
    )


def _check_abort(finish: Any, url: str) -> None:
    """SGLang reports a request it aborted (memory, shutdown, /abort_request) as a finish reason."""
    if finish == "abort" or (isinstance(finish, dict) and finish.get("type") == "abort"):
        detail = finish.get("message") if isinstance(finish, dict) else None
        raise WorkerAbortedError(f"the worker aborted the request{': ' + str(detail) if detail else ''}", url=url)


def parse_chat(data: Any, url: str) -> ChatResult:
    """Parse a ChatCompletionResponse (raises WorkerAbortedError for ``finish_reason: abort``)."""
    try:
        _check_abort(data["choices"][0].get("finish_reason"), url)
    except (KeyError, IndexError, TypeError, AttributeError):
        pass  # reported as malformed below
    try:
        choice = data["choices"][0]
        message = choice["message"]
        calls = [
            ToolCall(
                id=str(tc.get("id") or f"call_{i}"),
                name=tc["function"]["name"],
                arguments=tc["function"].get("arguments") or "",
            )
            for i, tc in enumerate(message.get("tool_calls") or [])
        ]
        return ChatResult(
            content=message.get("content"),
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            usage=parse_usage(data.get("usage")),
            model=str(data.get("model", "")),
            id=str(data.get("id", "")),
            reasoning_content=message.get("reasoning_content"),
            matched_stop=choice.get("matched_stop"),
            raw=data,
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise MalformedResponseError(f"chat completion lacks {exc!s}", url=url) from exc


def parse_chat_chunk(data: Any, url: str) -> ChatChunk:
    """Parse a ChatCompletionStreamResponse chunk (raises on an error event)."""
    if not isinstance(data, dict):
        raise MalformedResponseError("stream chunk is not a JSON object", url=url)
    if data.get("object") == "error" or "error" in data:
        raise stream_error_event(data, url)
    try:
        choices = data.get("choices") or []
        content = reasoning = finish = None
        deltas: list[ToolCallDelta] = []
        if choices:
            choice = choices[0]
            delta = choice.get("delta") or {}
            content = delta.get("content")
            reasoning = delta.get("reasoning_content")
            finish = choice.get("finish_reason")
            _check_abort(finish, url)
            for tc in delta.get("tool_calls") or []:
                fn = tc.get("function") or {}
                deltas.append(
                    ToolCallDelta(
                        index=int(tc.get("index") or 0),
                        id=tc.get("id"),
                        name=fn.get("name"),
                        arguments=fn.get("arguments"),
                    )
                )
        return ChatChunk(
            content=content,
            reasoning_content=reasoning,
            tool_calls=deltas,
            finish_reason=finish,
            usage=parse_usage(data.get("usage")),
            model=str(data.get("model", "")),
            id=str(data.get("id", "")),
            raw=data,
        )
    except (AttributeError, TypeError, ValueError) as exc:
        raise MalformedResponseError(f"bad stream chunk: {exc!s}", url=url) from exc


def parse_generate(data: Any, url: str) -> GenerateResult:
    """Parse a ``/generate`` response object (one element, not a batch)."""
    try:
        _check_abort(data["meta_info"].get("finish_reason"), url)
    except (KeyError, TypeError, AttributeError):
        pass  # reported as malformed below
    try:
        meta = data["meta_info"]
        return GenerateResult(
            text=data["text"],
            prompt_tokens=int(meta["prompt_tokens"]),
            completion_tokens=int(meta["completion_tokens"]),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            finish_reason=meta.get("finish_reason"),
            e2e_latency=meta.get("e2e_latency"),
            raw=data,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedResponseError(f"/generate response lacks {exc!s}", url=url) from exc


def error_message(body: bytes | str) -> str:
    """The message of an SGLang error body, whichever shape it takes."""
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        return text.strip()[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return str(data)[:500]


# a worker's refusal, not a verdict on the request's content: an API key, a path or a method the worker
# does not take (errors.WorkerRefusedError)
REFUSAL_STATUSES = (401, 403, 404, 405)


def transport_error(exc: BaseException, worker: str) -> BackendError:
    """The typed error for a failure to exchange with ``worker`` (any transport's exception; an error status is
    :func:`http_error`'s)."""
    if isinstance(exc, BackendError):
        return exc
    name = type(exc).__name__
    if name == "HttpParserError" or (name in ("RemoteProtocolError", "LocalProtocolError") and _not_http(exc)):
        return MalformedResponseError(f"not an HTTP answer: {exc}", url=worker)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, socket.timeout)) or name.endswith("Timeout"):
        return WorkerTimeoutError(f"timed out: {name}", url=worker)
    return WorkerConnectionError(f"cannot reach worker: {name}: {exc!s}", url=worker)


def _not_http(exc: BaseException) -> bool:
    """httpx reports both garbage and a connection closed before the answer as a protocol error."""
    text = str(exc).lower()
    return "disconnected" not in text and "closed" not in text


def http_error(status: int, body: bytes | str, url: str) -> BackendError:
    """Map an HTTP error status and SGLang error body to our error class."""
    message = f"HTTP {status}: {error_message(body)}"
    if status == 429:
        return WorkerRateLimitError(message, url=url, status=status)
    if status >= 500:
        return WorkerServerError(message, url=url, status=status)
    if status == 400 and _CONTEXT_RE.search(message):
        return ContextLengthError(message, url=url, status=status)
    if status in REFUSAL_STATUSES:
        return WorkerRefusedError(message, url=url, status=status)
    return WorkerBadRequestError(message, url=url, status=status)


def stream_error_event(data: Mapping[str, Any], url: str) -> BackendError:
    """An error event carried inside an SSE stream."""
    error = data.get("error")
    err: Mapping[str, Any] = error if isinstance(error, dict) else data
    message = str(err.get("message", err))
    code = err.get("code")
    status = int(code) if isinstance(code, int) or (isinstance(code, str) and code.isdigit()) else None
    if status is not None and 400 <= status < 500:
        if _CONTEXT_RE.search(message):
            return ContextLengthError(f"error event in stream: {message}", url=url, status=status)
        return WorkerBadRequestError(f"error event in stream: {message}", url=url, status=status)
    return StreamError(f"error event in stream: {message}", url=url, status=status)


def sse_payload(line: str) -> str | None:
    """The data of one SSE line, or None for comments, blanks and other fields."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def decode_json(text: str | bytes, url: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise MalformedResponseError(f"{what} is not valid JSON: {exc}", url=url) from exc


def parse_metrics(text: str) -> dict[str, float]:
    """Flatten SGLang's Prometheus text into ``{"sglang:name": value}``.

    Samples of one name are summed across label sets (one per tp rank or
    model); histograms keep ``_sum`` and ``_count``.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # SGLang <= 0.5.3 names metrics "sglang:x", later releases "sglang_x"
            if sample.name.startswith("sglang_"):
                name = "sglang:" + sample.name[len("sglang_") :]
            elif sample.name.startswith("sglang:"):
                name = sample.name
            else:
                continue
            if name.endswith("_bucket") or name.endswith("_created"):
                continue
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out
