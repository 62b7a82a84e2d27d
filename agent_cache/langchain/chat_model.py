"""``ChatSGLang``: a LangChain chat model over a fleet of SGLang workers."""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Callable, Iterator, Literal, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LangSmithParams, LanguageModelInput
from langchain_core.language_models.chat_models import (
    BaseChatModel,
    agenerate_from_stream,
    generate_from_stream,
)
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, model_validator

from agent_cache import environment, exit_flush
from agent_cache.backends.request_check import check_chat_request
from agent_cache.calls import attempt as attempts
from agent_cache.calls.httpx_transport import HttpxTransport, SyncHttpxTransport
from agent_cache.calls.prepare import CHAT, Call, prepare
from agent_cache.calls.served import Served
from agent_cache.errors import ConfigError, InvalidRequestError, TemplateError
from agent_cache.routing.config import DEFAULT_MAX_ATTEMPTS, DEFAULT_PROBE_INTERVAL, check_tenant
from agent_cache.routing.lifecycle import RETRY_BACKOFF, Attempt, CallLifecycle
from agent_cache.routing.router import Placement, Router
from agent_cache.telemetry import tracing
from agent_cache.templates import Templater, TemplateRegistry
from agent_cache.templates.templater import encoder
from agent_cache.traces import TraceWriter
from agent_cache.langchain.messages import to_openai_messages
from agent_cache.langchain.options import checked_kwargs, unknown_option
from agent_cache.langchain.output import AttemptOutput
from agent_cache.langchain.sessions import conversation_session, resolve_session_id, session_from_config
from agent_cache.langchain.structured import structured_output, tool_kwargs

# kwargs of a call that configure this model rather than the request body
_LOCAL_KWARGS = (
    "session_id", "_config_session", "_whole_message", "stream_usage", "ls_structured_output_format",
    "template_variables",
)


@dataclass
class _Call:
    """One model call: the pipeline's :class:`~agent_cache.calls.prepare.Call` and what this door keeps."""

    call: Call
    model: str
    include_usage: bool  # the caller wants the usage (a whole message always carries it)
    original: list[dict[str, Any]]  # the messages as the agent produced them (for a trace)
    tools: list[dict[str, Any]] | None
    attempts: int = 0  # attempts sent so far

    @property
    def session_id(self) -> str:
        return self.call.route.session_id


def _env_secret(name: str) -> SecretStr | None:
    value = environment.value(name)
    return SecretStr(value) if value is not None else None


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
    max_retries: int = DEFAULT_MAX_ATTEMPTS - 1  # the Router's max_attempts, counted as retries (LangChain's name)
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
    _served: Served = PrivateAttr()
    _transport: SyncHttpxTransport | None = PrivateAttr(default=None)
    _atransports: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpxTransport] = PrivateAttr(
        default_factory=weakref.WeakKeyDictionary)

    if not TYPE_CHECKING:  # type checkers see pydantic's typed constructor, one keyword per field

        def __init__(self, **kwargs: Any) -> None:
            # Checked before pydantic so the caller sees ConfigError naming the field,
            # not a ValidationError wrapping it; a misspelt option first (base_ulr= is not a missing base_url)
            kwargs = checked_kwargs(kwargs, ChatSGLang.model_fields)
            try:
                super().__init__(**kwargs)
            except ValidationError as exc:
                # the router and templates validate their own options: surface their ConfigError
                for err in exc.errors():
                    cause = (err.get("ctx") or {}).get("error")
                    if isinstance(cause, ConfigError):
                        raise cause from None
                    if err.get("type") == "extra_forbidden":
                        raise unknown_option(str(err["loc"][0]), ChatSGLang.model_fields) from None
                raise

    @model_validator(mode="after")
    def _make_router(self) -> "ChatSGLang":
        router = self.router
        if router is None:
            urls = [self.base_url] if self.base_url else list(self.workers or [])
            interval = self.health_probe_interval
            if "health_probe_interval" not in self.model_fields_set and len(urls) > 1:
                interval = DEFAULT_PROBE_INTERVAL  # several workers: a hung one is found without a call waiting on it
            redis_url = self.redis_url.get_secret_value() if self.redis_url is not None else None
            router = Router(urls, redis_url=redis_url, probe_interval=interval)
        try:
            self._check_options(router)
            self._trace = TraceWriter(self.trace_path) if self.trace_path is not None else None
            self._registry = TemplateRegistry(router.store)  # templates of served calls, recorded after them
            self._served = Served.for_router(self._registry, router, self._trace)
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
        try:
            check_chat_request([], {k: v for k, v in options.items() if v is not None},
                               {"extra_key": router.extra_key_for(self.tenant)})
        except InvalidRequestError as exc:  # the model's own options: its configuration, not one call's request
            raise ConfigError(exc.field, str(exc).split(": ", 1)[-1]) from None

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

    # --- transports --------------------------------------------------------------

    def _key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def _cap(self) -> float | None:
        """The longest silence of a worker within an answer: ``timeout`` or ``stall_timeout``, the shorter."""
        bounds = [t for t in (self.timeout, self.stall_timeout) if t is not None]
        return min(bounds) if bounds else None

    def _sync_transport(self) -> SyncHttpxTransport:
        if self._transport is None:
            self._transport = SyncHttpxTransport(timeout=self._cap(), api_key=self._key())
        return self._transport

    def _async_transport(self) -> HttpxTransport:
        # httpx.AsyncClient is bound to the loop it first ran on; keep one per loop.
        loop = asyncio.get_running_loop()
        transport = self._atransports.get(loop)
        if transport is None:
            transport = self._atransports[loop] = HttpxTransport(timeout=self._cap(), api_key=self._key())
        return transport

    def close(self) -> None:
        """Close the HTTP clients of this model (and its router, unless one was passed in).

        Also done at interpreter exit for a model not closed (bounded: see :mod:`agent_cache.exit_flush`).
        """
        exit_flush.unregister(self)
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._served.close()
        if self.router is None:
            self._router.close()

    async def aclose(self) -> None:
        """As :meth:`close`, and also the async clients of the running loop (the router's included)."""
        exit_flush.unregister(self)
        transport = self._atransports.pop(asyncio.get_running_loop(), None)
        if transport is not None:
            await transport.aclose()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        await asyncio.to_thread(self._served.close)  # its last writes are sync: off the event loop
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
        started = time.monotonic()  # the call's latencies start here
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
        body = {"model": model, "messages": raw_messages, **{k: v for k, v in params.items() if v is not None}}
        # bad input fails here, naming its field, before anything is routed or written
        call = prepare(CHAT, body, session=session_id, tenant=self.tenant, pool=self.pool,
                       extra_key=self._router.extra_key_for(self.tenant), templater=self._templater,
                       variables=call_variables, include_usage=True, started=started)
        return _Call(call, model, include_usage, raw_messages, params.get("tools"))

    def _lifecycle(self, call: _Call) -> CallLifecycle:
        # after a failure the next try may use a worker whose breaker is open: the
        # evidence may be stale (a restart), and the backoff paces the trial
        return CallLifecycle(self._router, call.call.route, max_attempts=self.max_retries + 1, backoff=RETRY_BACKOFF,
                             last_resort=True, trace=tracing.call_attributes(call.model, "chat"),
                             started=call.call.started)

    # --- non-streaming ------------------------------------------------------------

    # A whole-message call (invoke, ainvoke, generate) is streamed from the
    # worker too and assembled here: a worker that sends nothing for
    # stall_timeout seconds, or whose stream breaks, fails the attempt, and
    # the call is retried on another worker since nothing reached the caller.

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return generate_from_stream(self._chunks(messages, stop, run_manager, kwargs, live=False))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return await agenerate_from_stream(self._achunks(messages, stop, run_manager, kwargs, live=False))

    # --- streaming ------------------------------------------------------------------

    def _final_chunk(self, call: _Call, placement: Placement, output: AttemptOutput) -> ChatGenerationChunk:
        """The last chunk of a call a worker served (its usage and metadata); the served hook runs."""
        self._served(call.call, placement, usage=output.usage, text=output.text, messages=call.original,
                     tools=call.tools)
        metadata = {"model_name": call.model, "session_id": call.session_id,
                    "template_id": call.call.route.template_id}
        return output.last(placement, metadata, call.include_usage)

    def _stream_attempt(self, call: _Call, attempt: Attempt, run_manager: CallbackManagerForLLMRun | None,
                        live: bool) -> Iterator[ChatGenerationChunk]:
        """One streamed attempt: chunks go to the caller (``live``) or are kept for the whole message."""
        output = attempt.value = AttemptOutput(attempt, live, run_manager.run_id if run_manager else None)
        call.attempts += 1
        for event in attempts.stream(self._sync_transport(), call.call, attempt, deadlines=self._router.first_byte,
                                     cap=self._cap(), first_attempt=call.attempts == 1):
            if (out := output.chunk(event)) is not None:
                if run_manager:
                    run_manager.on_llm_new_token(out.text, chunk=out)
                if live:
                    yield out

    async def _astream_attempt(self, call: _Call, attempt: Attempt,
                               run_manager: AsyncCallbackManagerForLLMRun | None,
                               live: bool) -> AsyncGenerator[ChatGenerationChunk, None]:
        """Async :meth:`_stream_attempt`."""
        output = attempt.value = AttemptOutput(attempt, live, run_manager.run_id if run_manager else None)
        call.attempts += 1
        async for event in attempts.astream(self._async_transport(), call.call, attempt,
                                            deadlines=self._router.first_byte, cap=self._cap(),
                                            first_attempt=call.attempts == 1):
            if (out := output.chunk(event)) is not None:
                if run_manager:
                    await run_manager.on_llm_new_token(out.text, chunk=out)
                if live:
                    yield out

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        return self._chunks(messages, stop, run_manager, kwargs, live=True)

    def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                 run_manager: AsyncCallbackManagerForLLMRun | None = None,
                 **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        return self._achunks(messages, stop, run_manager, kwargs, live=True)

    def _chunks(self, messages: list[BaseMessage], stop: list[str] | None,
                run_manager: CallbackManagerForLLMRun | None, kwargs: dict[str, Any],
                live: bool) -> Iterator[ChatGenerationChunk]:
        """A call's chunks: as they come (``live``), or the succeeding attempt's once it ended; then the last."""
        call = self._prepare(messages, stop, run_manager, kwargs, whole=not live)
        life = self._lifecycle(call)
        yield from life.stream(lambda attempt: self._stream_attempt(call, attempt, run_manager, live))
        assert life.result is not None
        output, placement = life.result
        yield from output.chunks  # kept when not live
        final = self._final_chunk(call, placement, output)
        if not live and run_manager is not None:  # as a stream's last chunk: LangGraph's "messages" mode sees the usage
            run_manager.on_llm_new_token("", chunk=final)
        yield final

    async def _achunks(self, messages: list[BaseMessage], stop: list[str] | None,
                       run_manager: AsyncCallbackManagerForLLMRun | None, kwargs: dict[str, Any],
                       live: bool) -> AsyncIterator[ChatGenerationChunk]:
        """Async :meth:`_chunks`."""
        call = self._prepare(messages, stop, run_manager, kwargs, whole=not live)
        life = self._lifecycle(call)
        async for chunk in life.astream(lambda attempt: self._astream_attempt(call, attempt, run_manager, live)):
            yield chunk
        assert life.result is not None
        output, placement = life.result
        final = self._final_chunk(call, placement, output)
        if not live and run_manager is not None:
            await run_manager.on_llm_new_token("", chunk=final)
        for chunk in [*output.chunks, final]:
            yield chunk

    # --- tools and structured output (agent_cache/langchain/structured.py) -------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer tools; ``tool_choice`` is "auto", "none", "any"/"required"/True, a tool name or an OpenAI dict."""
        return super().bind(**tool_kwargs(tools, tool_choice), **kwargs)

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
        return structured_output(self, schema, method=method, include_raw=include_raw, strict=strict)
