"""HTTP face of the simulated worker: SGLang 0.5.x endpoints and JSON shapes.

Endpoints: ``/v1/chat/completions`` (streamed and not), ``/generate``,
``/health``, ``/health_generate``, ``/v1/models``, ``/model_info`` and
``/get_model_info``, ``/server_info`` and ``/get_server_info``,
``/v1/loads``, ``/flush_cache``, ``/tokenize``, ``/metrics``. There is no
``/version``: SGLang has none, and the smg gateway takes a worker that
answers it for vLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_cache.sim.chat_template import decode, encode_text, render_ids
from agent_cache.sim.engine import SIM_VERSION, TTFT_BUCKETS, Engine, PromptTooLong, WorkerOptions, apply_stop, new_rid
from agent_cache.sim.outputs import plan_output

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class _BadRequest(Exception):
    pass


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


def _cache_key(body: Mapping[str, Any]) -> str | None:
    # SGLang keys the radix tree by extra_key; cache_salt is folded into it
    parts = [str(body[k]) for k in ("cache_salt", "extra_key") if body.get(k) is not None]
    return "\x00".join(parts) if parts else None


def _validate_messages(body: Mapping[str, Any]) -> list[dict]:
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
    # SGLang reports details only with --enable-cache-report and a non-zero hit
    if engine.options.enable_cache_report and cached > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


class SimServer:
    """The Starlette app of one simulated worker."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.engine = Engine(options)
        self.app = Starlette(routes=self._routes())

    @property
    def options(self) -> WorkerOptions:
        return self.engine.options

    def _routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/v1/loads", self.loads, methods=["GET"]),
            Route("/flush_cache", self.flush_cache, methods=["POST", "GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]

    # --- chat -----------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            messages = _validate_messages(body)
            max_tokens = _max_tokens(body)
        except _BadRequest as exc:
            return _error(str(exc))
        if not self.engine.ready:
            return _error("The server is starting", 503, "ServiceUnavailableError")
        tools = body.get("tools") or None
        prompt_ids = render_ids(messages, tools)
        try:
            self.engine.check_prompt(prompt_ids)
        except PromptTooLong as exc:
            return _error(str(exc))
        plan = plan_output(body, prompt_ids)
        if plan.tool_calls:
            text = "".join(c["function"]["arguments"] for c in plan.tool_calls)
            output_ids, finish, matched = list(encode_text(text)), "tool_calls", None
        else:
            output_ids, text, finish, matched = apply_stop(plan.text, _stops(body.get("stop")), max_tokens)
        rid = str(body.get("rid") or f"chatcmpl-{new_rid()}")
        model = str(body.get("model") or self.options.served_model_name)
        key = _cache_key(body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            stream = self._chat_stream(rid, model, prompt_ids, output_ids, text, plan.tool_calls, finish, matched, key, include_usage)
            return StreamingResponse(stream, media_type="text/event-stream")
        cached, _ = await self.engine.serve(prompt_ids, output_ids, extra_key=key)
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
        tool_calls: list[dict],
        finish: str,
        matched: str | None,
        key: str | None,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        created = int(time.time())

        def chunk(delta: dict, finish_reason: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
            data = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice], "usage": None}
            return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"

        progress: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.ensure_future(self.engine.serve(prompt_ids, output_ids, extra_key=key, on_token=progress))
        try:
            yield chunk({"role": "assistant", "content": ""})
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
                if tool_calls:
                    if not calls_sent:
                        for i, call in enumerate(tool_calls):
                            head = {"id": call["id"], "index": i, "type": "function",
                                    "function": {"name": call["function"]["name"], "arguments": ""}}
                            yield chunk({"tool_calls": [head]})
                            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
                        calls_sent = True
                else:
                    piece = decode(output_ids[:upto])[len(decode(output_ids[:sent])):]
                    if piece:
                        yield chunk({"content": piece})
                sent = upto
            cached, _ = await task
            yield chunk({}, finish, matched_stop=matched)
            if include_usage:
                usage = _usage(self.engine, len(prompt_ids), len(output_ids), cached)
                data = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": usage}
                yield b"data: " + json.dumps(data).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if not task.done():
                task.cancel()

    # --- native /generate -----------------------------------------------------

    async def generate(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            if "text" in body and isinstance(body["text"], str):
                prompt_ids = list(encode_text(body["text"]))
            elif isinstance(body.get("input_ids"), list) and all(isinstance(i, int) for i in body["input_ids"]):
                prompt_ids = list(body["input_ids"])
            else:
                raise _BadRequest("Either text (a string) or input_ids (a list of ints) is required")
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise _BadRequest("sampling_params must be an object")
        except _BadRequest as exc:
            return _error(str(exc))
        if not prompt_ids:
            return _error("The input is empty")
        try:
            self.engine.check_prompt(prompt_ids)
        except PromptTooLong as exc:
            return _error(str(exc))
        plan = plan_output({"messages": [], "sim_output": body.get("sim_output")}, prompt_ids)
        max_new = params.get("max_new_tokens", 128)
        output_ids, text, finish, matched = apply_stop(plan.text, _stops(params.get("stop")), max_new)
        rid = str(body.get("rid") or new_rid())
        key = _cache_key(body)
        start = time.monotonic()

        def result(cached: int, upto: int, done: bool) -> dict[str, Any]:
            reason: Any = None
            if done:
                reason = {"type": "length", "length": max_new} if finish == "length" else {"type": "stop", "matched": matched}
            return {
                "text": decode(output_ids[:upto]) if not done else text,
                "meta_info": {
                    "id": rid,
                    "finish_reason": reason,
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": upto,
                    "cached_tokens": cached,
                    "e2e_latency": time.monotonic() - start,
                },
            }

        if not body.get("stream"):
            cached, _ = await self.engine.serve(prompt_ids, output_ids, extra_key=key)
            return JSONResponse(result(cached, len(output_ids), True))

        async def events() -> AsyncIterator[bytes]:
            progress: asyncio.Queue[int] = asyncio.Queue()
            task = asyncio.ensure_future(self.engine.serve(prompt_ids, output_ids, extra_key=key, on_token=progress))
            try:
                for _ in range(len(output_ids) - 1):
                    upto = await progress.get()
                    yield b"data: " + json.dumps(result(0, upto, False)).encode() + b"\n\n"
                cached, _ = await task
                yield b"data: " + json.dumps(result(cached, len(output_ids), True)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                if not task.done():
                    task.cancel()

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- server state ---------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if not self.engine.ready:
            return Response(status_code=503)
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        o = self.options
        card = {
            "id": o.served_model_name,
            "object": "model",
            "created": int(self.engine.started_at),
            "owned_by": "sglang",
            "root": o.model_path,
            "parent": None,
            "max_model_len": o.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def model_info(self, request: Request) -> Response:
        o = self.options
        return JSONResponse(
            {
                "model_path": o.model_path,
                "tokenizer_path": o.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
            }
        )

    def _load(self) -> dict[str, Any]:
        e, o = self.engine, self.options
        return {
            "dp_rank": 0,
            "num_running_reqs": e.running,
            "num_waiting_reqs": e.queued,
            "num_total_reqs": e.running + e.queued,
            "num_used_tokens": e.cache.total_tokens,
            "max_total_num_tokens": o.max_total_tokens,
            "max_running_requests": o.max_running_requests,
            "token_usage": e.cache.total_tokens / o.max_total_tokens,
            "gen_throughput": 0.0,
            "cache_hit_rate": e.counters.last_cache_hit_rate,
            "utilization": e.running / o.max_running_requests,
        }

    async def server_info(self, request: Request) -> Response:
        o = self.options
        return JSONResponse(
            {
                "model_path": o.model_path,
                "served_model_name": o.served_model_name,
                "tokenizer_path": o.model_path,
                "version": SIM_VERSION,
                "tp_size": 1,
                "dp_size": 1,
                "page_size": o.page_size,
                "context_length": o.context_length,
                "max_total_tokens": o.max_total_tokens,
                "max_total_num_tokens": o.max_total_tokens,
                "max_running_requests": o.max_running_requests,
                "disable_radix_cache": o.disable_radix_cache,
                "radix_eviction_policy": o.radix_eviction_policy,
                "enable_cache_report": o.enable_cache_report,
                "enable_metrics": True,
                "simulated": True,
                "internal_states": [
                    {
                        "max_total_num_tokens": o.max_total_tokens,
                        "last_gen_throughput": 0.0,
                        "memory_usage": {"token_capacity": o.max_total_tokens},
                    }
                ],
            }
        )

    async def loads(self, request: Request) -> Response:
        return JSONResponse(
            {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": SIM_VERSION,
             "dp_rank_count": 1, "loads": [self._load()]}
        )

    async def flush_cache(self, request: Request) -> Response:
        if self.engine.flush():
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. "
                                     "(When there are running or waiting requests, the operation will not be performed.)\n")
        return PlainTextResponse("Cache not flushed: requests are running or waiting.\n", status_code=400)

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
        except _BadRequest as exc:
            return _error(str(exc))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = list(encode_text(prompt))
            return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.options.context_length})
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            ids_list = [list(encode_text(p)) for p in prompt]
            return JSONResponse({"tokens": ids_list, "count": [len(i) for i in ids_list], "max_model_len": self.options.context_length})
        if isinstance(body.get("messages"), list):
            ids = render_ids(body["messages"], body.get("tools"))
            return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.options.context_length})
        return _error("Field 'prompt' (a string or list of strings) or 'messages' is required")

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

    def metrics_text(self) -> str:
        e, c, o = self.engine, self.engine.counters, self.options
        labels = f'model_name="{o.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
        lines: list[str] = []

        def metric(name: str, kind: str, value: float, help_text: str) -> None:
            lines.append(f"# HELP sglang:{name} {help_text}")
            lines.append(f"# TYPE sglang:{name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            lines.append(f"sglang:{name}{suffix}{{{labels}}} {float(value)}")

        metric("num_running_reqs", "gauge", e.running, "The number of running requests.")
        metric("num_queue_reqs", "gauge", e.queued, "The number of requests in the waiting queue.")
        metric("num_used_tokens", "gauge", e.cache.total_tokens, "The number of used tokens.")
        metric("token_usage", "gauge", e.cache.total_tokens / o.max_total_tokens, "The token usage.")
        metric("gen_throughput", "gauge", 0.0, "The generation throughput (token/s).")
        metric("cache_hit_rate", "gauge", c.last_cache_hit_rate, "The prefix cache hit rate (latest batch).")
        metric("utilization", "gauge", e.running / o.max_running_requests, "Running requests over capacity.")
        metric("prompt_tokens", "counter", c.prompt_tokens, "Number of prefill tokens processed.")
        metric("generation_tokens", "counter", c.generation_tokens, "Number of generation tokens processed.")
        metric("cached_tokens", "counter", c.cached_tokens, "Number of cached prompt tokens.")
        metric("num_requests", "counter", c.requests, "Number of requests processed.")
        name = "sglang:time_to_first_token_seconds"
        lines.append(f"# HELP {name} Histogram of time to first token in seconds.")
        lines.append(f"# TYPE {name} histogram")
        total = 0
        for bound, count in zip(TTFT_BUCKETS, c.ttft_buckets):
            total += count
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(total)}')
        total += c.ttft_buckets[-1]
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(total)}')
        lines.append(f"{name}_sum{{{labels}}} {c.ttft_sum}")
        lines.append(f"{name}_count{{{labels}}} {float(total)}")
        return "\n".join(lines) + "\n"


def create_app(options: WorkerOptions | None = None) -> Starlette:
    return SimServer(options).app
