"""One call, prepared from either front door: :func:`prepare` turns a request into a :class:`Call`.

``ChatSGLang`` and the gateway both hand it the request's fields (the
messages and tools among them), the session, the tenant's ``extra_key`` and
templater, and the pool; it checks the fields (an unknown or bad one is a
:class:`~agent_cache.errors.InvalidRequestError` naming it, before anything is routed
or written), runs the prompt through the templater, sets the tenant's
``extra_key``, and encodes the worker's body. A streamed call asks the
worker for its usage event whatever the caller asked for (the router learns
from the usage); the caller's own wishes travel in ``stream`` and
``include_usage``. A whole call is sent whole (its answer carries the usage)
unless the door asks for a stream (``stream_whole``: ``ChatSGLang`` reads
every answer as events); a whole ``/generate`` is always sent whole, as its
streamed events differ between SGLang releases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Collection, Mapping

from agent_cache.backends.protocol import CHAT_FIELDS
from agent_cache.backends.request_check import TENANT_FIELDS, check_chat_request
from agent_cache.calls.jsonio import dumps
from agent_cache.errors import ConfigError, InvalidRequestError
from agent_cache.templates.templater import NormalizedPrompt, Templater
from agent_cache.values import RouteRequest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"

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
FIELDS = {CHAT: CHAT_FIELDS, COMPLETIONS: COMPLETION_FIELDS, GENERATE: GENERATE_FIELDS}


@dataclass(frozen=True)
class Call:
    """One call, ready to send to whichever worker the router picks."""

    path: str
    body: bytes  # the JSON body for the worker
    route: RouteRequest
    stream: bool  # the caller reads a stream; else it gets the whole answer
    include_usage: bool  # the caller asked for the usage event of a stream
    prompt: NormalizedPrompt | None  # chat only: recorded in the template registry once served
    model: str | None = None  # as the caller named it (traces and logs)
    worker_streams: bool = True  # the worker is asked for a stream (else for its whole answer)
    started: float = 0.0  # time.monotonic() as the door had the request: the call's latencies start here


def _check_input(path: str, params: Mapping[str, Any]) -> None:
    """The text a completion or ``/generate`` call is given: present (null counts as absent) and not
    empty, which SGLang refuses (a 400 from the worker, after the call was routed)."""
    if path == COMPLETIONS:
        named = {"prompt": params.get("prompt")}
        if named["prompt"] is None:
            raise InvalidRequestError("prompt", "required: the text to complete")
    else:
        named = {k: params.get(k) for k in ("text", "input_ids") if params.get(k) is not None}
        if len(named) != 1:
            raise InvalidRequestError("text", "give exactly one of text or input_ids")
    for name, value in named.items():
        if isinstance(value, list) and not value:
            raise InvalidRequestError(name, "empty: give the text (or token ids) to complete")
        if path == GENERATE and value == "":
            raise InvalidRequestError(name, "empty: give the text to complete")


def prepare(path: str, params: dict[str, Any], *, session: str, tenant: str, pool: str | None,
            extra_key: str | None, templater: Templater | None, fields: Collection[str] | None = None,
            owner: str = "give ChatSGLang(tenant=...) instead", variables: Mapping[str, str] | None = None,
            include_usage: bool = False, checked_json: bool = False, from_json: bool = False,
            stream_whole: bool = True, depth_checked: bool = False, started: float | None = None) -> Call:
    """Check one request (``params``: its body, ``messages`` and ``extra_body`` included) and build its
    :class:`Call`. ``fields``: the fields accepted (by default those SGLang accepts on ``path``);
    ``owner``: how the caller picks a tenant, for the error naming a tenant-owned field;
    ``variables``: the call's template variables; ``checked_json``: every text is valid Unicode and
    every number finite (a strict parser read it), so that walk is skipped; ``from_json``: the
    messages and tools were just read from JSON text (only JSON's own types); ``stream_whole``: a
    call whose caller wants the whole answer is streamed from the worker too (else it is sent whole);
    ``depth_checked``: the request's nesting was checked as it was read.
    ``started``: when the door had the request (``time.monotonic()``; by default now).
    A :class:`~agent_cache.errors.TemplateError` from the templater is raised as it is."""
    started = time.monotonic() if started is None else started
    fields = FIELDS[path] if fields is None else fields
    params = dict(params)
    stream = bool(params.get("stream"))
    options = params.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequestError("stream_options", f"expected an object, got {type(options).__name__}")
    # a whole answer carries its usage; a stream, if asked (or from /generate, whose events all do)
    include_usage = include_usage or not stream or bool((options or {}).get("include_usage")) or path == GENERATE
    owned = {"extra_key": extra_key}
    prompt: NormalizedPrompt | None = None
    template_id, tokens = None, 0
    if path == CHAT:
        messages = params.pop("messages", None)
        if messages is None:
            raise InvalidRequestError("messages", "required: the conversation so far")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages", "expected a non-empty list of messages")
        check_chat_request(messages, params, owned, fields=fields, owner=owner, values_checked=checked_json,
                           depth_checked=depth_checked)
        if templater is None:
            raise ConfigError("templater", "a chat request needs the tenant's templater")  # the door's bug, not the caller's
        prompt = templater.normalize(messages, params.get("tools"), session_id=session, variables=variables,
                                     parsed_json=from_json)
        params["messages"] = prompt.messages
        if prompt.tools is not None:
            params["tools"] = prompt.tools
        template_id, tokens = prompt.template_id, prompt.template_tokens
    else:
        _check_input(path, params)
        check_chat_request([], params, owned, fields=fields, owner=owner, values_checked=checked_json,
                           depth_checked=depth_checked)
    params.update(params.pop("extra_body", None) or {})  # merged unchecked, as the OpenAI SDK merges it
    for name in TENANT_FIELDS:
        params.pop(name, None)
    if extra_key is not None:
        params["extra_key"] = extra_key  # keeps tenants apart in the worker's radix cache
    worker_streams = stream or (stream_whole and path != GENERATE)
    if worker_streams:
        params["stream"] = True
        if path != GENERATE:  # the router needs the usage (every /generate event carries it)
            params["stream_options"] = {**(options or {}), "include_usage": True}
    route = RouteRequest(session_id=session, template_id=template_id, tenant=tenant, pool=pool,
                         prompt_tokens_estimate=tokens)
    model = params.get("model")
    return Call(path, dumps(params), route, stream, include_usage, prompt, model if isinstance(model, str) else None,
                worker_streams, started)
