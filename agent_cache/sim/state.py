"""The simulated worker's state endpoints: health, model and server info, loads, cache flush, metrics.

Shapes as SGLang 0.5.x serves them (``entrypoints/http_server.py``,
``v1_loads.py``, ``metrics/collector.py``); the routes are chosen per
release in :mod:`agent_cache.sim.server`.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from agent_cache.sim.engine import Engine, WorkerOptions


class StateRoutes:
    """The endpoints that report on (or reset) one worker's engine rather than generate."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def options(self) -> WorkerOptions:
        return self.engine.options

    async def health(self, request: Request) -> Response:
        """SGLang's ``/health``: 503 while starting, then as :meth:`Engine.health` finds the scheduler."""
        if not self.engine.ready:
            return Response(status_code=503)
        return Response(status_code=200 if await self.engine.health() else 503)

    async def models(self, request: Request) -> Response:
        o = self.options
        card: dict[str, Any] = {
            "id": o.served_model_name,
            "object": "model",
            "created": int(time.time()),  # SGLang's ModelCard sets it per request
            "owned_by": "sglang",
            "root": o.served_model_name,
            "max_model_len": o.context_length,
        }
        if self.engine.version.minor >= 5:
            card["parent"] = None
        return JSONResponse({"object": "list", "data": [card]})

    async def model_info(self, request: Request) -> Response:
        o = self.options
        info: dict[str, Any] = {
            "model_path": o.model_path,
            "tokenizer_path": o.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
        if self.engine.version.minor >= 6:
            info.update(has_image_understanding=False, has_audio_understanding=False)
        if self.engine.version.minor >= 8:
            info.update(model_type="llama", architectures=["LlamaForCausalLM"])
        return JSONResponse(info)

    def _load(self) -> dict[str, Any]:
        m = self.engine.model
        return {
            "dp_rank": 0,
            "num_running_reqs": m.num_running,
            "num_waiting_reqs": m.num_waiting,
            "num_used_tokens": m.used_tokens,
            "max_total_num_tokens": self.options.max_total_tokens,
            "token_usage": m.token_usage,
            "gen_throughput": 0.0,
            "cache_hit_rate": m.counters.last_cache_hit_rate,
            "utilization": m.num_running / m.config.running_limit,
            "max_running_requests": m.config.running_limit,
            "num_total_reqs": m.num_running + m.num_waiting,
        }

    async def server_info(self, request: Request) -> Response:
        o, e = self.options, self.engine
        return JSONResponse(
            {
                "model_path": o.model_path,
                "served_model_name": o.served_model_name,
                "tokenizer_path": o.model_path,
                "version": str(e.version),
                "tp_size": 1,
                "dp_size": 1,
                "page_size": o.page_size,
                "context_length": o.context_length,
                "max_total_tokens": o.max_total_tokens,
                "max_running_requests": o.max_running_requests,
                "chunked_prefill_size": o.chunked_prefill_size,
                "max_prefill_tokens": o.max_prefill_tokens,
                "schedule_policy": o.schedule_policy,
                "disable_radix_cache": o.disable_radix_cache,
                "radix_eviction_policy": o.radix_eviction_policy,
                "enable_cache_report": o.enable_cache_report,
                "enable_metrics": o.enable_metrics,
                "simulated": True,
                # SGLang reports no count of cached tokens over HTTP (num_used_tokens leaves out the
                # evictable cache); the simulator adds one so benchmarks can read what its tree holds
                "sim_cached_tokens": e.model.cache.total_tokens,
                "status": "ready",
                "max_total_num_tokens": o.max_total_tokens,
                "max_req_input_len": min(o.context_length, o.max_total_tokens) - 1,
                "internal_states": [
                    {
                        "max_total_num_tokens": o.max_total_tokens,
                        "max_running_requests": e.model.config.running_limit,
                        "last_gen_throughput": 0.0,
                        "memory_usage": {"token_capacity": o.max_total_tokens},
                    }
                ],
            }
        )

    async def get_load(self, request: Request) -> Response:
        e, m = self.engine, self.engine.model
        if e.version.minor < 3:
            return JSONResponse({"load": m.num_running + m.num_waiting})
        waiting = sum(len(r.prompt) for r in m.waiting)
        return JSONResponse([{"dp_rank": 0, "num_reqs": m.num_running + m.num_waiting, "num_waiting_reqs": m.num_waiting,
                              "num_tokens": m.used_tokens + waiting}])

    async def loads(self, request: Request) -> Response:
        load = self._load()
        body: dict[str, Any] = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "version": str(self.engine.version), "loads": [load]}
        if self.engine.version.minor < 23:
            body["dp_rank_count"] = 1
            body["aggregate"] = {
                "total_running_reqs": load["num_running_reqs"], "total_waiting_reqs": load["num_waiting_reqs"],
                "total_reqs": load["num_total_reqs"], "avg_token_usage": load["token_usage"],
                "avg_throughput": load["gen_throughput"], "avg_utilization": load["utilization"],
            }
        return JSONResponse(body)

    async def flush_cache(self, request: Request) -> Response:
        if self.engine.flush():
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. "
                                     "(When there are running or waiting requests, the operation will not be performed.)\n")
        return PlainTextResponse("Cache not flushed: requests are running or waiting.\n", status_code=400)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

    def metrics_text(self) -> str:
        o, m = self.options, self.engine.model
        c = m.counters
        labels = f'model_name="{o.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
        lines: list[str] = []

        def metric(name: str, kind: str, value: float, help_text: str) -> None:
            lines.append(f"# HELP sglang:{name} {help_text}")
            lines.append(f"# TYPE sglang:{name} {kind}")
            suffix = "_total" if kind == "counter" else ""
            lines.append(f"sglang:{name}{suffix}{{{labels}}} {float(value)}")

        metric("num_running_reqs", "gauge", m.num_running, "The number of running requests.")
        metric("num_queue_reqs", "gauge", m.num_waiting, "The number of requests in the waiting queue.")
        metric("num_used_tokens", "gauge", m.used_tokens, "The number of used tokens.")
        metric("token_usage", "gauge", m.token_usage, "The token usage.")
        metric("gen_throughput", "gauge", 0.0, "The generation throughput (token/s).")
        metric("cache_hit_rate", "gauge", c.last_cache_hit_rate, "The prefix cache hit rate (latest batch).")
        metric("utilization", "gauge", m.num_running / m.config.running_limit, "Running requests over capacity.")
        metric("prompt_tokens", "counter", c.prompt_tokens, "Number of prefill tokens processed.")
        metric("generation_tokens", "counter", c.generation_tokens, "Number of generation tokens processed.")
        metric("cached_tokens", "counter", c.cached_tokens, "Number of cached prompt tokens.")
        metric("num_requests", "counter", c.requests, "Number of requests processed.")
        metric("num_retracted_reqs", "counter", c.retractions, "Number of retracted requests.")
        name = "sglang:time_to_first_token_seconds"
        h = self.engine.ttft
        lines.append(f"# HELP {name} Histogram of time to first token in seconds.")
        lines.append(f"# TYPE {name} histogram")
        total = 0
        for bound, count in zip(h.buckets, h.counts):
            total += count
            lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(total)}')
        total += h.counts[-1]
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(total)}')
        lines.append(f"{name}_sum{{{labels}}} {h.sum}")
        lines.append(f"{name}_count{{{labels}}} {float(total)}")
        return "\n".join(lines) + "\n"
