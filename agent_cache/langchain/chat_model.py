"""``ChatSGLang``: a LangChain chat model over a fleet of SGLang workers."""

from __future__ import annotations

import asyncio
import difflib
import inspect
import time
import weakref
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Callable, Iterator, Literal, Sequence, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LangSmithParams, LanguageModelInput, LanguageModelOutput
from langchain_core.language_models.chat_models import (
    BaseChatModel,
    agenerate_from_stream,
    generate_from_stream,
)
from langchain_core.messages import LC_ID_PREFIX, AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import TypeBaseModel, is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, model_validator

from agent_cache import environment, exit_flush
from agent_cache.backends.protocol import Usage
from agent_cache.backends.request_check import check_chat_request
from agent_cache.backends.sglang import AsyncSGLangClient, SGLangClient, normalize_worker_url
from agent_cache.errors import ConfigError, TemplateError
from agent_cache.routing.config import check_tenant
from agent_cache.routing.lifecycle import RETRY_BACKOFF, Attempt, CallLifecycle
from agent_cache.routing.router import Placement, RouteRequest, Router
from agent_cache.telemetry import tracing
from agent_cache.templates import NormalizedPrompt, Templater, TemplateRegistry
from agent_cache.templates.templater import encoder
from agent_cache.traces import TraceWriter
from agent_cache.langchain.messages import to_ai_chunk, to_openai_messages, usage_metadata
from agent_cache.langchain.sessions import conversation_session, resolve_session_id, session_from_config

DEFAULT_PROBE_INTERVAL = 5.0  # active /health probes when there is more than one worker to fail over to

# kwargs of a call that configure this model rather than the request body
_LOCAL_KWARGS = (
    "session_id", "_config_session", "_whole_message", "stream_usage", "ls_structured_output_format",
    "template_variables",
)


@dataclass
class _Call:
    """One model call, ready to send: the normalised prompt and its routing request."""

    session_id: str
    model: str
    messages: list[dict[str, Any]]
    request: RouteRequest
    prompt: NormalizedPrompt
    params: dict[str, Any]
    include_usage: bool
    original: list[dict[str, Any]]  # the messages as the agent produced them (for a trace)
    tools: list[dict[str, Any]] | None
    attempts: int = 0  # attempts sent so far


def _env_secret(name: str) -> SecretStr | None:
    value = environment.value(name)
    return SecretStr(value) if value is not None else None


def _known_options() -> set[str]:
    return set(ChatSGLang.model_fields) | {f.alias for f in ChatSGLang.model_fields.values() if f.alias}


def _unknown_option(name: str) -> ConfigError:
    close = difflib.get_close_matches(name, sorted(_known_options()), n=1, cutoff=0.6)
    if close:
        hint = f"; did you mean {close[0]!r}?"
    elif name in inspect.signature(Router).parameters:
        hint = f"; it is a Router option: ChatSGLang(router=Router(workers, {name}=...), ...)"
    else:
        hint = "; request fields go in model_kwargs or extra_body"
    return ConfigError(name, f"ChatSGLang has no option {name!r}{hint}")


class ChatSGLang(BaseChatModel):
    """Chat model for SGLang workers (OpenAI-compatible ``/v1/chat/completions``).

    Give one worker as ``base_url`` or several as ``workers``; every call of
    one session (see ``docs/langchain.md``) goes to the same worker so its
    prompt prefix is served from that worker's radix cache.
    """

    # an unknown or misspelt option is an error naming it, never silently dropped
    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True, extra="forbid")

    model_name: str = Field(default="default", alias="model")
    base_url: str | None = None
    workers: list[str] | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = 120.0
    stall_timeout: float | None = 30.0
    max_retries: int = 2
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    streaming: bool = False
    stream_usage: bool = True
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    extra_body: dict[str, Any] | None = None
    # AGENT_CACHE_* defaults come from field factories (docs/configuration.md has the table);
    # base_url/workers are read in __init__, as their precedence depends on each other and on router=
    api_key: SecretStr | None = Field(default_factory=lambda: _env_secret(environment.API_KEY))
    # routing and templates (docs/langchain.md, docs/routing.md, docs/templates.md)
    router: Router | None = Field(default=None, exclude=True)
    # may carry a password: masked in repr, dumps and callbacks; a router= brings its own store
    redis_url: SecretStr | None = Field(default_factory=lambda data: None if data.get("router") is not None
                                        else _env_secret(environment.REDIS_URL))
    templates: str | Templater = "system"  # a mode (docs/templates.md) or a Templater of one's own
    values_position: str = "system_suffix_message"
    freeze_values: bool = False
    sort_tools: bool = True  # canonical and templatize modes only
    template_variables: dict[str, str] | None = None
    tenant: str = "default"
    pool: str | None = None
    health_probe_interval: float | None = None
    infer_sessions: bool = True  # a call without a session id: the session of its conversation's start
    trace_path: str | None = None  # append every served call to this trace file (docs/traces.md)

    _router: Router = PrivateAttr()
    _templater: Templater = PrivateAttr()
    _registry: TemplateRegistry = PrivateAttr()
    _trace: TraceWriter | None = PrivateAttr(default=None)
    _clients: dict[str, SGLangClient] = PrivateAttr(default_factory=dict)
    _aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncSGLangClient]] = PrivateAttr(
        default_factory=weakref.WeakKeyDictionary)

    if not TYPE_CHECKING:  # type checkers see pydantic's typed constructor, one keyword per field

        def __init__(self, **kwargs: Any) -> None:
            # Checked before pydantic so the caller sees ConfigError naming the field,
            # not a ValidationError wrapping it; a misspelt option first (base_ulr= is not a missing base_url)
            for name in kwargs:
                if name not in _known_options():
                    raise _unknown_option(name)
            base_url, workers = kwargs.get("base_url"), kwargs.get("workers")
            router = kwargs.get("router")
            if isinstance(router, Router):
                urls = [w.url for w in router.workers]
                given = [base_url] if base_url is not None else list(workers or [])
                if given and [normalize_worker_url(u, "workers") for u in given] != urls:
                    raise ConfigError("workers", f"router= brings its own workers {urls}; leave base_url/workers out "
                                                 "or give the same list")
                if not given:  # the router's workers are the model's
                    workers = kwargs["workers"] = urls
            if base_url is None and not workers:  # environment second, after keywords
                base_url = kwargs["base_url"] = environment.value(environment.BASE_URL)
                if base_url is None:
                    workers = environment.workers()
                    if workers:
                        kwargs["workers"] = workers
            if base_url is None and not workers:
                raise ConfigError("base_url", "give base_url (one worker) or workers (a list of worker URLs)")
            if base_url is not None and workers:
                raise ConfigError("workers", "give either base_url or workers, not both")
            if base_url is not None:
                kwargs["base_url"] = normalize_worker_url(base_url, "base_url")
            else:
                kwargs["workers"] = [normalize_worker_url(u, f"workers[{i}]") for i, u in enumerate(workers)]
            if kwargs.get("max_retries", 0) < 0:
                raise ConfigError("max_retries", f"must be >= 0, got {kwargs['max_retries']}")
            for name in ("timeout", "stall_timeout"):
                value = kwargs.get(name)
                if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                    raise ConfigError(name, f"must be a number of seconds > 0 or None, got {value!r}")
            try:
                super().__init__(**kwargs)
            except ValidationError as exc:
                # the router and templates validate their own options: surface their ConfigError
                for err in exc.errors():
                    cause = (err.get("ctx") or {}).get("error")
                    if isinstance(cause, ConfigError):
                        raise cause from None
                    if err.get("type") == "extra_forbidden":
                        raise _unknown_option(str(err["loc"][0])) from None
                raise

    @model_validator(mode="after")
    def _make_router(self) -> "ChatSGLang":
        router = self.router
        if router is None:
            urls = [self.base_url] if self.base_url else list(self.workers or [])
            interval = self.health_probe_interval
            if "health_probe_interval" not in self.model_fields_set and len(urls) > 1:
                interval = DEFAULT_PROBE_INTERVAL  # a hung worker is found without a call waiting on it
            redis_url = self.redis_url.get_secret_value() if self.redis_url is not None else None
            router = Router(urls, redis_url=redis_url, probe_interval=interval)
        try:
            self._check_options(router)
            self._trace = TraceWriter(self.trace_path) if self.trace_path is not None else None
        except ConfigError:
            if self.router is None:
                router.close()
            raise
        try:
            if isinstance(self.templates, Templater):
                self._templater = self.templates
            else:
                self._templater = Templater(
                    self.templates,
                    variables=self.template_variables,
                    values_position=self.values_position,
                    freeze_values=self.freeze_values,
                    sort_tools=self.sort_tools,
                    tenant=self.tenant,
                )
        except TemplateError as exc:
            field = {"mode": "templates", "variables": "template_variables"}.get(exc.field, exc.field)
            raise ConfigError(field, str(exc).split(": ", 1)[-1]) from exc
        # template bookkeeping for calls a worker served (recorded after the call, see _served)
        self._registry = TemplateRegistry(router.store)
        self._router = router
        exit_flush.register(self, ChatSGLang.close)  # a script ending without close() still writes (bounded)
        return self

    def _check_options(self, router: Router) -> None:
        """Tenant, pool and request options, checked when the model is made rather than at its first call."""
        check_tenant(self.tenant)
        if isinstance(self.templates, Templater) and self.templates.tenant != self.tenant:
            raise ConfigError("templates", f"the Templater's tenant {self.templates.tenant!r} is not the model's "
                                           f"{self.tenant!r}")
        if self.pool is not None and not any(w.pool == self.pool for w in router.workers):
            pools = sorted({w.pool for w in router.workers})
            raise ConfigError("pool", f"no worker is in pool {self.pool!r}; the workers' pools: {pools}")
        options = {"temperature": self.temperature, "max_tokens": self.max_tokens, "stop": self.stop,
                   **self.model_kwargs, "extra_body": self.extra_body}
        check_chat_request([], {k: v for k, v in options.items() if v is not None},
                           {"extra_key": router.extra_key_for(self.tenant)})

    @property
    def routing(self) -> Router:
        """The router deciding which worker serves each session."""
        return self._router

    # --- LangChain metadata ---------------------------------------------------

    @property
    def lc_secrets(self) -> dict[str, str]:
        """Fields LangChain's serialisation replaces by a reference to their environment variable."""
        return {"api_key": environment.API_KEY, "redis_url": environment.REDIS_URL}

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids by tiktoken's cl100k (offline): an estimate, as the templates' token lengths are.

        The worker's own tokenizer is exact: ``SGLangClient(url).tokenize(text)`` (SGLang 0.5.4+).
        """
        return list(encoder().encode(text, disallowed_special=()))

    @property
    def _llm_type(self) -> str:
        return "sglang"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "workers": [w.url for w in self._router.workers],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="sglang",
            ls_model_name=kwargs.get("model") or self.model_name,
            ls_model_type="chat",
        )
        if (t := kwargs.get("temperature", self.temperature)) is not None:
            params["ls_temperature"] = t
        if (m := kwargs.get("max_tokens", self.max_tokens)) is not None:
            params["ls_max_tokens"] = m
        if stop := stop or kwargs.get("stop") or self.stop:
            params["ls_stop"] = stop
        return params

    # --- entry points: remember the session the caller's config names ---------------

    # invoke/ainvoke return one whole message: a streamed call is then run by
    # _generate/_agenerate, which can retry a broken stream since no chunk
    # reached the caller (see _should_stream).

    def invoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any) -> AIMessage:
        kwargs.setdefault("_config_session", session_from_config(config))
        kwargs.setdefault("_whole_message", True)
        return super().invoke(input, config, **kwargs)

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        kwargs.setdefault("_config_session", session_from_config(config))
        kwargs.setdefault("_whole_message", True)
        return await super().ainvoke(input, config, **kwargs)

    def _should_stream(self, *, async_api: bool, run_manager: Any = None, **kwargs: Any) -> bool:
        if kwargs.get("_whole_message"):
            return False  # _generate/_agenerate stream themselves when asked to
        return super()._should_stream(async_api=async_api, run_manager=run_manager, **kwargs)

    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[AIMessageChunk]:
        kwargs.setdefault("_config_session", session_from_config(config))
        yield from super().stream(input, config, **kwargs)

    async def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[AIMessageChunk]:
        kwargs.setdefault("_config_session", session_from_config(config))
        async for chunk in super().astream(input, config, **kwargs):
            yield chunk

    # --- clients ----------------------------------------------------------------

    def _key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def _client(self, worker: str) -> SGLangClient:
        if worker not in self._clients:
            self._clients[worker] = SGLangClient(worker, timeout=self.timeout, api_key=self._key())
        return self._clients[worker]

    def _aclient(self, worker: str) -> AsyncSGLangClient:
        # httpx.AsyncClient is bound to the loop it first ran on; keep one per loop.
        per_loop = self._aclients.setdefault(asyncio.get_running_loop(), {})
        if worker not in per_loop:
            per_loop[worker] = AsyncSGLangClient(worker, timeout=self.timeout, api_key=self._key())
        return per_loop[worker]

    def close(self) -> None:
        """Close the HTTP clients of this model (and its router, unless one was passed in).

        Also done at interpreter exit for a model not closed (bounded: see :mod:`agent_cache.exit_flush`).
        """
        exit_flush.unregister(self)
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._registry.close()
        if self._trace is not None:
            self._trace.close()
        if self.router is None:
            self._router.close()

    async def aclose(self) -> None:
        """As :meth:`close`, and also the async clients of the running loop (the router's included)."""
        exit_flush.unregister(self)
        per_loop = self._aclients.pop(asyncio.get_running_loop(), {})
        for client in per_loop.values():
            await client.aclose()
        for sync_client in self._clients.values():
            sync_client.close()
        self._clients.clear()
        await asyncio.to_thread(self._registry.close)  # its last writes are sync: off the event loop
        if self._trace is not None:
            self._trace.close()
        if self.router is None:
            await self._router.aclose()

    def __enter__(self) -> "ChatSGLang":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "ChatSGLang":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- request building -------------------------------------------------------

    def _prepare(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
        whole: bool = False,
    ) -> _Call:
        kwargs = dict(kwargs)
        raw_messages = to_openai_messages(messages)
        # the conversation's fingerprint is computed only for a call that names no session
        infer = (lambda: conversation_session(raw_messages)) if self.infer_sessions else None
        session_id = resolve_session_id(kwargs.get("session_id"), run_manager, kwargs.get("_config_session"), infer)
        # a whole message always carries its usage; a stream only if asked (stream_usage)
        include_usage = whole or bool(kwargs.get("stream_usage", self.stream_usage))
        call_variables = kwargs.get("template_variables")  # read before the local kwargs are stripped
        for name in _LOCAL_KWARGS:
            kwargs.pop(name, None)
        model = kwargs.pop("model", None) or self.model_name
        params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        params.update(self.model_kwargs)
        params.update(kwargs)
        extra = {**(self.extra_body or {}), **(params.pop("extra_body", None) or {})}
        if extra:
            params["extra_body"] = extra
        stops = stop or params.pop("stop", None) or self.stop
        params["stop"] = stops or None
        extra_key = self._router.extra_key_for(self.tenant)
        # bad input fails here, naming its field, before anything is routed or written
        check_chat_request(raw_messages, params, {"extra_key": extra_key})
        raw_tools = params.get("tools")
        prompt = self._templater.normalize(raw_messages, raw_tools, session_id=session_id,
                                           variables=call_variables)
        if prompt.tools is not None:
            params["tools"] = prompt.tools
        if extra_key is not None:
            params["extra_key"] = extra_key  # keeps tenants apart in the worker's radix cache
        request = RouteRequest(session_id=session_id, template_id=prompt.template_id, tenant=self.tenant,
                               pool=self.pool, prompt_tokens_estimate=prompt.template_tokens)
        return _Call(session_id, model, prompt.messages, request, prompt, params, include_usage, raw_messages,
                     raw_tools)

    def _metadata(self, call: _Call, placement: Placement, model: str, finish: str | None,
                  cached: int | None) -> dict[str, Any]:
        return {
            "model_name": model or call.model,
            "model_provider": "sglang",
            "finish_reason": finish,
            "worker": placement.worker,
            "session_id": call.session_id,
            "cached_tokens": cached,
            "template_id": call.request.template_id,
            "routing": placement.outcome,
        }

    def _read_timeout(self, call: _Call, worker: str) -> float | None:
        """Longest wait for the worker's next bytes (the first token included) in a streamed call.

        The first attempt waits the worker's adaptive deadline (routing/first_byte.py), so a hung
        worker is left after a few of its usual times to first token; a retry waits the full
        timeout/stall_timeout, so a prompt that legitimately takes longer still gets its answer.
        """
        bounds = [t for t in (self.timeout, self.stall_timeout) if t is not None]
        cap = min(bounds) if bounds else None
        call.attempts += 1
        return self._router.first_byte.deadline(worker, cap) if call.attempts == 1 else cap

    def _lifecycle(self, call: _Call) -> CallLifecycle:
        # after a failure the next try may use a worker whose breaker is open: the
        # evidence may be stale (a restart), and the backoff paces the trial
        return CallLifecycle(self._router, call.request, max_attempts=self.max_retries + 1, backoff=RETRY_BACKOFF,
                             last_resort=True, trace=tracing.call_attributes(call.model, "chat"))

    # --- non-streaming ------------------------------------------------------------

    # A whole-message call (invoke, ainvoke, generate) is streamed from the
    # worker too and assembled here: a worker that sends nothing for
    # stall_timeout seconds, or whose stream breaks, fails the attempt, and
    # the call is retried on another worker since nothing reached the caller.

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(messages, stop, run_manager, kwargs, whole=True)
        life = self._lifecycle(call)
        for _ in life.stream(lambda attempt: self._stream_attempt(call, attempt, run_manager, live=False)):
            pass
        assert life.result is not None
        (state, chunks), placement = life.result
        final = _last_chunk(self._final_chunk(call, placement, state), chunks, run_manager)
        if run_manager is not None:  # as a stream's last chunk: LangGraph's "messages" mode sees the usage
            run_manager.on_llm_new_token("", chunk=final)
        return generate_from_stream(iter([*chunks, final]))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(messages, stop, run_manager, kwargs, whole=True)
        life = self._lifecycle(call)
        async for _ in life.astream(lambda attempt: self._astream_attempt(call, attempt, run_manager, live=False)):
            pass
        assert life.result is not None
        (state, chunks), placement = life.result
        final = _last_chunk(self._final_chunk(call, placement, state), chunks, run_manager)
        if run_manager is not None:  # as a stream's last chunk: LangGraph's "messages" mode sees the usage
            await run_manager.on_llm_new_token("", chunk=final)
        return await agenerate_from_stream(_aiter([*chunks, final]))

    # --- streaming ------------------------------------------------------------------

    def _final_chunk(self, call: _Call, placement: Placement, state: dict[str, Any]) -> ChatGenerationChunk:
        """The last chunk of a call a worker served (its usage and metadata); records its template."""
        self._registry.record(self.tenant, call.prompt, placement.session_id)  # queued: no I/O here
        if self._trace is not None:
            usage_seen: Usage | None = state.get("usage")
            self._trace.write(call.session_id, call.original, state.get("text", ""),
                              usage_seen.completion_tokens if usage_seen else None, time.time(), call.tools)
        usage: Usage | None = state.get("usage")
        cached = (usage.cached_tokens or 0) if usage else None
        meta = self._metadata(call, placement, state.get("model", ""), state.get("finish"), cached)
        chunk = AIMessageChunk(
            content="",
            id=state.get("id"),
            response_metadata=meta,
            usage_metadata=usage_metadata(usage.prompt_tokens, usage.completion_tokens, cached or 0) if usage else None,
            chunk_position="last",
        )
        return ChatGenerationChunk(message=chunk)

    @staticmethod
    def _track(state: dict[str, Any], chunk: Any) -> ChatGenerationChunk | None:
        state["model"] = chunk.model or state.get("model", "")
        if chunk.finish_reason:
            state["finish"] = chunk.finish_reason
        if chunk.usage is not None:
            state["usage"] = chunk.usage
        if chunk.content:
            state["text"] = state.get("text", "") + chunk.content
        if chunk.content or chunk.tool_calls or chunk.reasoning_content:
            message = to_ai_chunk(chunk)
            state.setdefault("id", message.id)  # the usage chunk carries it too (_final_chunk)
            return ChatGenerationChunk(message=message)
        return None

    @staticmethod
    def _attempt_chunk(out: ChatGenerationChunk, attempt: Attempt, chunks: list[ChatGenerationChunk], run_manager: Any,
                       live: bool) -> bool:
        """Note one chunk of an attempt; True if it goes to the caller now (``live``)."""
        if live:
            attempt.delivered = True  # from here on, a retry would duplicate output
        else:
            chunks.append(out)  # the whole message is built from the attempt that succeeds
            if run_manager is not None and out.message.id is None:
                out.message.id = f"{LC_ID_PREFIX}-{run_manager.run_id}"
        return live

    def _stream_attempt(self, call: _Call, attempt: Attempt, run_manager: CallbackManagerForLLMRun | None,
                        live: bool) -> Iterator[ChatGenerationChunk]:
        """One streamed attempt: chunks go to the caller (``live``) or are kept for the whole message."""
        state: dict[str, Any] = {}
        chunks: list[ChatGenerationChunk] = []
        worker, sent = attempt.placement.worker, time.monotonic()
        raw_chunks = self._client(worker).stream_chat(
            call.messages, model=call.model, include_usage=call.include_usage, timeout=self._read_timeout(call, worker),
            **call.params
        )
        for raw in raw_chunks:
            out = self._track(state, raw)
            if out is None:
                continue
            if not chunks and not attempt.delivered:  # the first token: the worker's time to first byte
                self._router.first_byte.observe(worker, time.monotonic() - sent)
            if run_manager:
                run_manager.on_llm_new_token(out.text, chunk=out)
            if self._attempt_chunk(out, attempt, chunks, run_manager, live):
                yield out
        attempt.value, attempt.usage = (state, chunks), state.get("usage")

    async def _astream_attempt(self, call: _Call, attempt: Attempt,
                               run_manager: AsyncCallbackManagerForLLMRun | None,
                               live: bool) -> AsyncGenerator[ChatGenerationChunk, None]:
        """Async :meth:`_stream_attempt`."""
        state: dict[str, Any] = {}
        chunks: list[ChatGenerationChunk] = []
        worker, sent = attempt.placement.worker, time.monotonic()
        raw_chunks = self._aclient(worker).stream_chat(
            call.messages, model=call.model, include_usage=call.include_usage, timeout=self._read_timeout(call, worker),
            **call.params
        )
        async for raw in raw_chunks:
            out = self._track(state, raw)
            if out is None:
                continue
            if not chunks and not attempt.delivered:  # the first token: the worker's time to first byte
                self._router.first_byte.observe(worker, time.monotonic() - sent)
            if run_manager:
                await run_manager.on_llm_new_token(out.text, chunk=out)
            if self._attempt_chunk(out, attempt, chunks, run_manager, live):
                yield out
        attempt.value, attempt.usage = (state, chunks), state.get("usage")

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, run_manager, kwargs)
        life = self._lifecycle(call)
        yield from life.stream(lambda attempt: self._stream_attempt(call, attempt, run_manager, live=True))
        assert life.result is not None
        (state, _), placement = life.result
        yield self._final_chunk(call, placement, state)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, run_manager, kwargs)
        life = self._lifecycle(call)
        async for chunk in life.astream(lambda attempt: self._astream_attempt(call, attempt, run_manager, live=True)):
            yield chunk
        assert life.result is not None
        (state, _), placement = life.result
        yield self._final_chunk(call, placement, state)

    # --- tools and structured output -----------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer tools; ``tool_choice`` is "auto", "none", "any"/"required"/True, a tool name or an OpenAI dict."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None and tool_choice is not False:
            kwargs["tool_choice"] = _tool_choice(tool_choice, formatted)
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """Structured output; ``json_schema`` (default) constrains decoding with SGLang's grammar backend."""
        if kwargs:
            raise ConfigError("with_structured_output", f"unexpected arguments {sorted(kwargs)}")
        # a pydantic model class (v2 or v1): is_basemodel_subclass checks that but is no TypeGuard
        model = cast(TypeBaseModel, schema) if isinstance(schema, type) and is_basemodel_subclass(schema) else None
        llm: Runnable[LanguageModelInput, AIMessage]
        parser: Runnable[LanguageModelOutput, Any]
        if method == "json_mode":
            llm = self.bind(response_format={"type": "json_object"}, ls_structured_output_format={
                "kwargs": {"method": method}, "schema": schema})
            parser = PydanticOutputParser(pydantic_object=model) if model is not None else JsonOutputParser()
        else:
            if schema is None:
                raise ConfigError("schema", f"method {method!r} needs a schema")
            tool = convert_to_openai_tool(schema, strict=strict)
            fn = tool["function"]
            ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": tool}
            if method == "function_calling":
                llm = self.bind_tools([tool], tool_choice=fn["name"], ls_structured_output_format=ls_format)
                parser = (
                    PydanticToolsParser(tools=[model], first_tool_only=True)
                    if model is not None
                    else JsonOutputKeyToolsParser(key_name=fn["name"], first_tool_only=True)
                )
            elif method == "json_schema":
                spec: dict[str, Any] = {"name": fn["name"], "schema": fn.get("parameters") or {}}
                if strict is not None:
                    spec["strict"] = strict
                llm = self.bind(
                    response_format={"type": "json_schema", "json_schema": spec},
                    ls_structured_output_format=ls_format,
                )
                parser = PydanticOutputParser(pydantic_object=model) if model is not None else JsonOutputParser()
            else:
                raise ConfigError("method", f"expected json_schema, function_calling or json_mode, got {method!r}")
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")


def _tool_choice(choice: str | bool | dict[str, Any], tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        return choice
    if choice is True or choice in ("any", "required"):
        # one offered tool and "True" means that tool, as in other providers
        if choice is True and len(tools) == 1:
            return {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        return "required"
    if choice in ("auto", "none"):
        return choice
    names = [t["function"]["name"] for t in tools]
    if choice not in names:
        raise ConfigError("tool_choice", f"{choice!r} is not one of the bound tools {names}")
    return {"type": "function", "function": {"name": choice}}


def _last_chunk(final: ChatGenerationChunk, chunks: list[ChatGenerationChunk], run_manager: Any) -> ChatGenerationChunk:
    """The usage chunk of a whole message, with the id its other chunks carry (or its run's)."""
    if chunks and chunks[0].message.id is not None:
        final.message.id = chunks[0].message.id
    elif final.message.id is None and run_manager is not None:
        final.message.id = f"{LC_ID_PREFIX}-{run_manager.run_id}"
    return final


async def _aiter(items: list[ChatGenerationChunk]) -> AsyncIterator[ChatGenerationChunk]:
    for item in items:
        yield item
