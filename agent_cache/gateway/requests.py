"""An incoming gateway request made ready to route: checked, its session found, its prompt templated.

Three endpoints are proxied: OpenAI's ``/v1/chat/completions`` and
``/v1/completions`` and SGLang's native ``/generate``. Each request is checked
against the fields SGLang accepts (an unknown field is an error naming it),
its session is found (header, then the OpenAI ``user`` field, then for chat
the conversation's fingerprint), the chat prompt goes through the same
:class:`~agent_cache.templates.Templater` as ``ChatSGLang``, and the tenant's
``extra_key`` is set so tenants never share cached prompts.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import orjson

from agent_cache.backends.protocol import CHAT_FIELDS
from agent_cache.backends.request_check import TENANT_FIELDS, check_chat_request
from agent_cache.backends.request_schema import check_depth
from agent_cache.errors import ConfigError, TemplateError
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.session_header import session_value
from agent_cache.routing.router import RouteRequest
from agent_cache.templates.templater import NormalizedPrompt, Templater

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"

# Fields OpenAI clients send that SGLang has no use for: accepted, not forwarded.
OPENAI_ONLY_FIELDS = frozenset({"store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier",
                                "modalities", "verbosity"})
# SGLang's CompletionRequest (0.5.x) fields
COMPLETION_FIELDS = frozenset({
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    "top_k", "min_p", "min_tokens", "json_schema", "regex", "ebnf", "repetition_penalty", "stop_token_ids",
    "stop_regex", "no_stop_trim", "ignore_eos", "skip_special_tokens", "lora_path", "session_params",
    "response_format", "custom_params", "rid", "extra_key", "cache_salt", "priority",
    "return_cached_tokens_details",
})
# SGLang's GenerateReqInput (0.5.x) fields a client may set
GENERATE_FIELDS = frozenset({
    "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "sampling_params",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs",
    "stream", "log_metrics", "return_hidden_states", "modalities", "session_params", "lora_path", "lora_id",
    "custom_logit_processor", "priority", "extra_key", "rid", "routing_key", "no_logs", "custom_labels",
})
_FIELDS = {CHAT: CHAT_FIELDS, COMPLETIONS: COMPLETION_FIELDS, GENERATE: GENERATE_FIELDS}
# refused when tenants share the workers: SGLang keys a request's state by rid (a colliding rid
# takes over another request), and a custom logit processor is code the worker runs
SHARED_REFUSED = frozenset({"rid", "custom_logit_processor"})

_TENANT_HINT = "the gateway sets it from the API key's tenant"


@dataclass(frozen=True)
class GatewayCall:
    """One request, ready to send to whichever worker the router picks."""

    path: str
    body: bytes  # the JSON body for the worker
    route: RouteRequest
    stream: bool
    include_usage: bool  # the client asked for the usage chunk of a stream
    prompt: NormalizedPrompt | None  # chat only: recorded in the template registry once served
    grant: ApiKey | None = None  # the caller's API key (what it may see and is charged)
    model: str | None = None  # as the client named it (traces and logs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# 19 digits in a row: possibly an integer past 64 bits, which orjson reads as a float. Found by
# mapping digits to 1 and the rest to 0 (C speed: a regular expression took 180 us on 8 KB)
_DIGITS = bytes(49 if 48 <= c <= 57 else 48 for c in range(256))
_NINETEEN = b"1" * 19


def loads(raw: bytes, *, strict: bool = True) -> Any:
    """JSON from bytes: orjson (a tenth of the json module's time on a chat body), and the json
    module for what orjson reads differently or refuses and JSON allows (integers past 64 bits,
    lone surrogate escapes, which the field checks then name). ``strict``: NaN and Infinity are
    refused, as JSON refuses them (a request); else read as the json module reads them (a worker's
    answer)."""
    return _loads(raw, strict)[0]


def _loads(raw: bytes, strict: bool) -> tuple[Any, bool]:
    """:func:`loads`, and whether orjson read it (then every text is valid Unicode and every number
    finite: orjson refuses the rest)."""
    if _NINETEEN not in raw.translate(_DIGITS):
        try:
            return orjson.loads(raw), True
        except orjson.JSONDecodeError:
            pass
    return (json.loads(raw, parse_constant=_no_constant) if strict else json.loads(raw)), False


def parse_json_body(raw: bytes) -> tuple[dict[str, Any], bool]:
    """The request body as a JSON object, or ConfigError naming what is wrong; and whether its values
    need no further check (``prepare``'s ``checked_json``)."""
    try:
        body, checked = _loads(raw, True)
    except UnicodeDecodeError as exc:
        raise ConfigError("body", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise ConfigError("body", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError("body", "JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise ConfigError("body", f"expected a JSON object, got {type(body).__name__}")
    check_depth(body)  # before any walk of it (the session's inference, the templater) can recurse
    return body, checked


def find_session(headers: Mapping[str, str], header: str, body: Mapping[str, Any],
                 infer: Callable[[], str] | None) -> str:
    """The session of a request: the session header, the ``user`` field, the inferred one, or a fresh id."""
    for field, value in ((header, headers.get(header)), ("user", body.get("user"))):
        if value is not None:
            return session_value(value, field, header=field == header)
    return infer() if infer is not None else f"anon-{uuid.uuid4().hex}"


def _encode(body: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)  # compact UTF-8, as below, twenty times faster
    except TypeError:  # an integer past 64 bits
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def prepare(path: str, body: dict[str, Any], *, grant: ApiKey, extra_key: str | None, session: str,
            templater: Templater | None, pool: str | None, extra_fields: frozenset[str],
            shared: bool = False, checked_json: bool = False) -> GatewayCall:
    """Check one request and build what goes to the worker; raises ConfigError naming the bad field.

    ``shared``: the gateway serves several tenants (API keys), so fields that reach across requests
    on a worker (a request id another tenant could collide with, code the worker would run) are refused.
    ``checked_json``: every text in ``body`` is valid Unicode and every number finite (orjson read
    it), so that walk is skipped.
    """
    if "extra_body" in body:
        raise ConfigError("extra_body", "not a request field: OpenAI clients merge extra_body into the body")
    if shared:
        for name in SHARED_REFUSED & body.keys():
            raise ConfigError(name, "not accepted by a gateway serving several tenants (--api-keys)")
    dropped = (OPENAI_ONLY_FIELDS if path != GENERATE else frozenset()) - extra_fields
    params = {k: v for k, v in body.items() if k not in dropped}
    fields = _FIELDS[path] | extra_fields  # accepted as they are (none is a field the gateway sets)
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ConfigError("stream_options", f"expected an object, got {type(options).__name__}")
    include_usage = bool((options or {}).get("include_usage"))
    prompt: NormalizedPrompt | None = None
    template_id, tokens = None, 0
    if path == CHAT:
        messages = params.pop("messages", None)
        if messages is None:
            raise ConfigError("messages", "required: the conversation so far")
        if not isinstance(messages, list) or not messages:
            raise ConfigError("messages", "expected a non-empty list of messages")
        check_chat_request(messages, params, {"extra_key": extra_key}, fields=fields, owner=_TENANT_HINT,
                           values_checked=checked_json)
        if templater is None:
            raise ValueError("a chat request needs the tenant's templater")
        try:
            prompt = templater.normalize(messages, params.get("tools"), session_id=session, parsed_json=True)
        except TemplateError as exc:
            field = exc.field if exc.field.startswith(("messages", "tools")) else f"messages.{exc.field}"
            raise ConfigError(field, str(exc).split(": ", 1)[-1]) from None
        params["messages"] = prompt.messages
        if prompt.tools is not None:
            params["tools"] = prompt.tools
        template_id, tokens = prompt.template_id, prompt.template_tokens
    else:
        if path == COMPLETIONS and "prompt" not in params:
            raise ConfigError("prompt", "required: the text to complete")
        if path == GENERATE and ("text" in params) == ("input_ids" in params):
            raise ConfigError("text", "give exactly one of text or input_ids")
        check_chat_request([], params, {"extra_key": extra_key}, fields=fields, owner=_TENANT_HINT,
                           values_checked=checked_json)
    for name in TENANT_FIELDS:
        params.pop(name, None)
    if extra_key is not None:
        params["extra_key"] = extra_key
    if stream and path != GENERATE:
        params["stream_options"] = {**(options or {}), "include_usage": True}  # the router needs the usage
    route = RouteRequest(session_id=session, template_id=template_id, tenant=grant.tenant,
                         pool=grant.pool or pool, prompt_tokens_estimate=tokens)
    model = params.get("model")
    return GatewayCall(path, _encode(params), route, stream, include_usage or path == GENERATE, prompt, grant,
                       model if isinstance(model, str) else None)
