"""HTTP face of the simulated worker: SGLang 0.5.x endpoints and JSON shapes.

Endpoints: ``/v1/chat/completions`` (streamed and not), ``/generate``,
``/health``, ``/health_generate``, ``/v1/models``, ``/get_model_info`` and
``/get_server_info`` (plus ``/model_info`` and ``/server_info`` from 0.5.6),
``/get_load``, ``/v1/loads`` (from 0.5.8), ``/flush_cache``, ``/tokenize``
(from 0.5.4), ``/metrics`` (with ``enable_metrics``), each as the release
``WorkerOptions.sglang_version`` serves it (:mod:`agent_cache.sim.versions`).
There is no ``/version``: SGLang has none, and the smg gateway takes a
worker that answers it for vLLM. The state endpoints (health, info, loads,
flush, metrics) live in :mod:`agent_cache.sim.state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_cache.sim.chat_template import StreamDecoder
from agent_cache.sim.engine import Engine, PromptTooLong, WorkerOptions, apply_stop, new_rid
from agent_cache.sim.outputs import plan_output
from agent_cache.sim.state import StateRoutes

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class _BadRequest(Exception):
    pass


def _generate_error(message: str) -> JSONResponse:
    # /generate's own shape: http_server.py _create_error_response, {"error": {"message": ...}} with 400
    return JSONResponse({"error": {"message": message}}, status_code=400)


def _error(message: str, status: int = 400, kind: str = "BadRequestError") -> JSONResponse:
    # SGLang's ErrorResponse, returned flat by its OpenAI serving layer
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return JSONResponse(body, status_code=status)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _BadRequest(f"Invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadRequest("Request body must be a JSON object")
    return body


def _test_failure(body: Mapping[str, Any]) -> JSONResponse | None:
    """Test hooks for failures a request causes, as SGLang has them for some options: ``sim_fail_status``
    (an HTTP status) answers that status; ``sim_whole_answer`` (chat) answers a streamed request whole."""
    status = body.get("sim_fail_status")
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        kind = "BadRequestError" if status < 500 else "InternalServerError"
        return _error(f"simulated failure: this request's options fail with {status}", status, kind)
    return None


def _cache_key(engine: Engine, body: Mapping[str, Any]) -> str | None:
    # SGLang keys the radix tree by extra_key, cache_salt folded into it
    # (serving_base._compute_extra_key); releases before 0.5.11 ignore both
    if not engine.version.has("extra_key"):
        return None
    parts = [str(body[k]) for k in ("cache_salt", "extra_key") if body.get(k) is not None]
    return "".join(parts) if parts else None


def _offered_tools(body: Mapping[str, Any]) -> list[Any] | None:
    """The tools the chat template sees (serving_chat._process_messages)."""
    tools: list[Any] | None = body.get("tools") or None
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        named = [t for t in tools if isinstance(t, Mapping) and (t.get("function") or {}).get("name") == name]
        if not named:
            raise _BadRequest(f"Tool '{name}' not found in 'tools'.")
        return named
    return tools


def _check_response_format(body: Mapping[str, Any]) -> None:
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            raise _BadRequest("1 validation error for ChatCompletionRequest\nresponse_format.json_schema.name\n  Field required")


def _validate_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("Field 'messages' is required and must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _BadRequest(f"messages[{i}]: invalid message or role")
    return messages


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or value < 0:
        raise _BadRequest("max_tokens must be a non-negative integer")
    return value


def _stops(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else [str(s) for s in value]


def _usage(engine: Engine, prompt: int, completion: int, cached: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    # details only with --enable-cache-report; a zero hit is null before 0.5.22
    if engine.options.enable_cache_report and (cached > 0 or engine.version.has("zero_cached_tokens")):
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


class SimServer:
    """The Starlette app of one simulated worker."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.engine = Engine(options)
        self.app = Starlette(routes=self._routes(), lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            self.engine.close()  # the KV event publisher's socket and thread

    @property
    def options(self) -> WorkerOptions:
        return self.engine.options

    def _routes(self) -> list[Route]:
        v = self.engine.version
        state = StateRoutes(self.engine)
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/health", state.health, methods=["GET"]),
            Route("/health_generate", state.health, methods=["GET"]),
            Route("/v1/models", state.models, methods=["GET"]),
            Route("/get_model_info", state.model_info, methods=["GET"]),
            Route("/get_server_info", state.server_info, methods=["GET"]),
            Route("/get_load", state.get_load, methods=["GET"]),
            Route("/flush_cache", state.flush_cache, methods=["POST", "GET"]),
        ]
        if v.has("plain_info_routes"):
            routes += [Route("/model_info", state.model_info, methods=["GET"]),
                       Route("/server_info", state.server_info, methods=["GET"])]
        if v.has("v1_loads"):
            routes.append(Route("/v1/loads", state.loads, methods=["GET"]))
        if v.has("tokenize"):
            routes += [Route("/tokenize", self.tokenize, methods=["POST"]),
                       Route("/v1/tokenize", self.tokenize, methods=["POST"])]
        if self.options.enable_metrics:
            routes.append(Route("/metrics", state.metrics, methods=["GET"]))
        return routes

    @contextlib.asynccontextmanager
    async def _serving(self, prompt_ids: list[int], output_ids: list[int], max_new_tokens: int | None,
                       key: str | None) -> AsyncIterator[tuple["asyncio.Queue[int]", "asyncio.Task[tuple[int, float]]"]]:
        """The engine serving one streamed request: its progress (output tokens so far after each pass)
        and its result; cancelled if the stream ends first (the client went away)."""
        progress: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.ensure_future(self.engine.serve(prompt_ids, output_ids, max_new_tokens=max_new_tokens,
                                                       extra_key=key, on_token=progress))
        try:
            yield progress, task
        finally:
            if not task.done():
                task.cancel()

    # --- chat -----------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            messages = _validate_messages(body)
            max_tokens = _max_tokens(body)
            tools = _offered_tools(body)
            _check_response_format(body)
        except _BadRequest as exc:
            return _error(str(exc))
        if not self.engine.ready:
            return _error("The server is starting", 503, "ServiceUnavailableError")
        failing = _test_failure(body)
        if failing is not None:
            return failing
        if tools and self.engine.version.minor < 9:
            # before 0.5.9 the template gets each tool's bare function dict
            tools = [t.get("function", t) if isinstance(t, Mapping) else t for t in tools]
        prompt_ids = self.engine.tokenizer.render_ids(messages, tools)
        try:
            self.engine.check_prompt(prompt_ids)
        except PromptTooLong as exc:
            return _error(str(exc))
        plan = plan_output(body, prompt_ids)
        if plan.tool_calls:
            text = "".join(c["function"]["arguments"] for c in plan.tool_calls)
            output_ids, finish, matched = list(self.engine.tokenizer.encode_text(text)), "tool_calls", None
        else:
            output_ids, text, finish, matched = apply_stop(plan.text, _stops(body.get("stop")), max_tokens,
                                                           self.engine.tokenizer)
        rid = str(body.get("rid") or new_rid())  # SGLang's chat id is the request id, no prefix
        model = str(body.get("model") or self.options.served_model_name)
        key = _cache_key(self.engine, body)
        if body.get("stream") and not body.get("sim_whole_answer"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            stream = self._chat_stream(rid, model, prompt_ids, output_ids, text, plan.tool_calls, finish, matched, key,
                                       include_usage, max_tokens)
            return StreamingResponse(stream, media_type="text/event-stream")
        cached, _ = await self.engine.serve(prompt_ids, output_ids, max_new_tokens=max_tokens, extra_key=key)
        message: dict[str, Any] = {"role": "assistant", "content": None if plan.tool_calls else text, "reasoning_content": None}
        message["tool_calls"] = [{**c, "index": i} for i, c in enumerate(plan.tool_calls)] or None
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
                ],
                "usage": _usage(self.engine, len(prompt_ids), len(output_ids), cached),
                "metadata": {"weight_version": "default"},
            }
        )

    async def _chat_stream(
        self,
        rid: str,
        model: str,
        prompt_ids: list[int],
        output_ids: list[int],
        text: str,
        tool_calls: list[dict[str, Any]],
        finish: str,
        matched: str | None,
        key: str | None,
        include_usage: bool,
        max_tokens: int | None,
    ) -> AsyncIterator[bytes]:
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
            data = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice], "usage": None}
            return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"

        # SGLang sends the role chunk with the first generated output, i.e. after the prefill
        # (serving_chat._generate_chat_stream), so a client's first byte comes at the first token
        role = chunk({"role": "assistant", "content": ""})
        stream_text = StreamDecoder(output_ids, self.engine.tokenizer.decode)
        async with self._serving(prompt_ids, output_ids, max_tokens, key) as (progress, task):
            sent = 0
            calls_sent = False
            while sent < len(output_ids):
                getter = asyncio.ensure_future(progress.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    task.result()  # re-raise the engine's error, if any
                    break
                upto = getter.result()
                if sent == 0:
                    yield role
                if tool_calls:
                    if not calls_sent:
                        for i, call in enumerate(tool_calls):
                            head = {"id": call["id"], "index": i, "type": "function",
                                    "function": {"name": call["function"]["name"], "arguments": ""}}
                            yield chunk({"tool_calls": [head]})
                            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
                        calls_sent = True
                else:
                    piece = stream_text.upto(upto)
                    if piece:
                        yield chunk({"content": piece})
                sent = upto
            cached, _ = await task
            if sent == 0:  # no token generated (max_tokens 0): the role chunk still opens the answer
                yield role
            yield chunk({}, finish, matched_stop=matched)
            if include_usage:
                usage = _usage(self.engine, len(prompt_ids), len(output_ids), cached)
                data = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": usage}
                yield b"data: " + json.dumps(data).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

    # --- /v1/completions (serving_completions.py) -----------------------------

    async def completions(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                prompt_ids = list(self.engine.tokenizer.encode_text(prompt))
            elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
                prompt_ids = list(prompt)
            else:
                raise _BadRequest("prompt must be a string or a list of token ids")
            max_tokens = _max_tokens(body)
        except _BadRequest as exc:
            return _error(str(exc))
        if not self.engine.ready:
            return _error("The server is starting", 503, "ServiceUnavailableError")
        try:
            self.engine.check_prompt(prompt_ids)
        except PromptTooLong as exc:
            return _error(str(exc))
        plan = plan_output({"messages": [], "sim_output": body.get("sim_output")}, prompt_ids)
        output_ids, text, finish, matched = apply_stop(plan.text, _stops(body.get("stop")),
                                                       16 if max_tokens is None else max_tokens,  # OpenAI's default
                                                       self.engine.tokenizer)
        rid, created = str(body.get("rid") or new_rid()), int(time.time())
        model = str(body.get("model") or self.options.served_model_name)
        key = _cache_key(self.engine, body)

        def data(choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
            return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
                    "usage": usage}

        def choice(piece: str, reason: str | None) -> dict[str, Any]:
            return {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason,
                    "matched_stop": matched if reason else None}

        if not body.get("stream"):
            cached, _ = await self.engine.serve(prompt_ids, output_ids, max_new_tokens=max_tokens, extra_key=key)
            return JSONResponse(data([choice(text, finish)], _usage(self.engine, len(prompt_ids), len(output_ids),
                                                                      cached)))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            stream_text = StreamDecoder(output_ids, self.engine.tokenizer.decode)
            async with self._serving(prompt_ids, output_ids, max_tokens, key) as (progress, task):
                sent = 0
                while sent < len(output_ids):
                    upto = await progress.get()
                    piece = stream_text.upto(upto)
                    if piece:
                        yield b"data: " + json.dumps(data([choice(piece, None)], None)).encode() + b"\n\n"
                    sent = upto
                cached, _ = await task
                yield b"data: " + json.dumps(data([choice("", finish)], None)).encode() + b"\n\n"
                if include_usage:
                    usage = _usage(self.engine, len(prompt_ids), len(output_ids), cached)
                    yield b"data: " + json.dumps(data([], usage)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- native /generate -----------------------------------------------------

    async def generate(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            if "text" in body and isinstance(body["text"], str):
                prompt_ids = list(self.engine.tokenizer.encode_text(body["text"]))
            elif isinstance(body.get("input_ids"), list) and all(isinstance(i, int) for i in body["input_ids"]):
                prompt_ids = list(body["input_ids"])
            else:
                raise _BadRequest("Either text (a string) or input_ids (a list of ints) is required")
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise _BadRequest("sampling_params must be an object")
        except _BadRequest as exc:
            return _generate_error(str(exc))
        if not prompt_ids:
            return _generate_error("The input is empty")
        try:
            self.engine.check_prompt(prompt_ids)
        except PromptTooLong as exc:
            return _generate_error(str(exc))
        plan = plan_output({"messages": [], "sim_output": body.get("sim_output")}, prompt_ids)
        max_new = params.get("max_new_tokens", 128)
        output_ids, text, finish, matched = apply_stop(plan.text, _stops(params.get("stop")), max_new,
                                                       self.engine.tokenizer)
        rid = str(body.get("rid") or new_rid())
        key = _cache_key(self.engine, body)
        version = self.engine.version
        start = time.monotonic()
        # the text so far, as SGLang's detokenizer builds it
        stream_text = StreamDecoder(output_ids, self.engine.tokenizer.decode)

        def result(cached: int, upto: int, sent: int, done: bool) -> dict[str, Any]:
            reason: Any = None
            if done:
                reason = {"type": "length", "length": max_new} if finish == "length" else {"type": "stop", "matched": matched}
            meta: dict[str, Any] = {
                "id": rid,
                "finish_reason": reason,
                "prompt_tokens": len(prompt_ids),
                "weight_version": "default",
                "completion_tokens": upto,
                "cached_tokens": cached,
            }
            if version.has("retractions"):
                meta["total_retractions"] = 0
            if done:
                meta["e2e_latency"] = time.monotonic() - start
            # streamed output_ids: only the new ones before 0.5.6, all so far after
            first = sent if version.has("output_delta") else 0
            if not done:
                stream_text.upto(upto)
            return {"text": text if done else stream_text.text,
                    "output_ids": output_ids[first:upto], "meta_info": meta}

        if not body.get("stream"):
            cached, _ = await self.engine.serve(prompt_ids, output_ids, max_new_tokens=max_new, extra_key=key)
            return JSONResponse(result(cached, len(output_ids), 0, True))

        async def events() -> AsyncIterator[bytes]:
            async with self._serving(prompt_ids, output_ids, max_new, key) as (progress, task):
                sent = 0
                while sent < len(output_ids) - 1:
                    upto = await progress.get()
                    if upto >= len(output_ids):
                        break
                    yield b"data: " + json.dumps(result(0, upto, sent, False)).encode() + b"\n\n"
                    sent = upto
                cached, _ = await task
                yield b"data: " + json.dumps(result(cached, len(output_ids), sent, True)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- /tokenize ---------------------------------------------------------------

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
        except _BadRequest as exc:
            return _error(str(exc))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = list(self.engine.tokenizer.encode_text(prompt))
            return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.options.context_length})
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            ids_list = [list(self.engine.tokenizer.encode_text(p)) for p in prompt]
            return JSONResponse({"tokens": ids_list, "count": [len(i) for i in ids_list], "max_model_len": self.options.context_length})
        if isinstance(body.get("messages"), list):
            ids = self.engine.tokenizer.render_ids(body["messages"], body.get("tools"))
            return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.options.context_length})
        return _error("Field 'prompt' (a string or list of strings) or 'messages' is required")


def create_app(options: WorkerOptions | None = None) -> Starlette:
    return SimServer(options).app
