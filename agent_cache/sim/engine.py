"""The simulated worker's engine: cache, admission, timing and counters.

No HTTP here (that is :mod:`agent_cache.sim.server`). One engine is one
SGLang worker: a radix cache over token ids, at most
``max_running_requests`` requests at once, the latency model of
:mod:`agent_cache.sim.latency` scaled by ``time_scale`` (0 = no sleeping).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Sequence

from agent_cache.sim.chat_template import decode, encode_text
from agent_cache.sim.latency import DEFAULT_LATENCY, LatencyModel
from agent_cache.sim.radix import RadixCache

SIM_VERSION = "0.5.4-sim"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)


@dataclass
class WorkerOptions:
    """Flags of ``agent-cache sim-worker``, named after SGLang's where it has one."""

    served_model_name: str = "sim-llama-3.1-8b"
    model_path: str = "meta-llama/Llama-3.1-8B-Instruct"
    max_total_tokens: int = 200_000  # --max-total-tokens: KV capacity in tokens
    context_length: int = 131_072
    page_size: int = 1  # --page-size
    radix_eviction_policy: str = "lru"  # --radix-eviction-policy
    disable_radix_cache: bool = False  # --disable-radix-cache
    enable_cache_report: bool = True  # --enable-cache-report
    max_running_requests: int = 64  # --max-running-requests
    time_scale: float = 0.0  # 1.0 = the latency model in real time, 0 = instant
    startup_seconds: float = 0.0  # /health answers 503 this long after start
    latency: LatencyModel = DEFAULT_LATENCY


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    last_cache_hit_rate: float = 0.0
    ttft_sum: float = 0.0
    ttft_buckets: list = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_buckets[i] += 1
                return
        self.ttft_buckets[-1] += 1


class PromptTooLong(ValueError):
    pass


def apply_stop(text: str, stop: Sequence[str] | None, max_tokens: int | None) -> tuple[list[int], str, str, str | None]:
    """Cut ``text`` at the first stop string and at ``max_tokens`` tokens."""
    finish, matched = "stop", None
    if stop:
        cut = [(text.find(s), s) for s in stop if s and text.find(s) >= 0]
        if cut:
            pos, matched = min(cut)
            text = text[:pos]
    ids = list(encode_text(text))
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        text = decode(ids)
        finish, matched = "length", None
    return ids, text, finish, matched


class Engine:
    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options or WorkerOptions()
        o = self.options
        self.cache = RadixCache(o.max_total_tokens, page_size=o.page_size, eviction_policy=o.radix_eviction_policy)
        self.counters = Counters()
        self.started_at = time.monotonic()
        self.running = 0
        self.queued = 0
        self.running_context_tokens = 0
        self._slots: asyncio.Semaphore | None = None

    @property
    def ready(self) -> bool:
        return time.monotonic() - self.started_at >= self.options.startup_seconds

    def _semaphore(self) -> asyncio.Semaphore:
        # created lazily inside the server's loop
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.options.max_running_requests)
        return self._slots

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        limit = min(self.options.max_total_tokens, self.options.context_length)
        if len(prompt_ids) >= limit:
            raise PromptTooLong(
                f"The input ({len(prompt_ids)} tokens) is longer than the model's context length "
                f"({limit} tokens; max_total_num_tokens={self.options.max_total_tokens})."
            )

    async def _sleep(self, seconds: float) -> None:
        if self.options.time_scale > 0 and seconds > 0:
            await asyncio.sleep(seconds * self.options.time_scale)

    async def serve(
        self,
        prompt_ids: Sequence[int],
        output_ids: list[int],
        *,
        extra_key: str | None = None,
        on_token: "asyncio.Queue[int] | None" = None,
    ) -> tuple[int, float]:
        """Run one request; returns ``(cached_tokens, ttft_seconds)``.

        With ``on_token``, puts the number of tokens emitted so far after each
        decode step (the streaming path reads it).
        """
        o = self.options
        start = time.monotonic()
        self.queued += 1
        slots = self._semaphore()
        await slots.acquire()
        self.queued -= 1
        self.running += 1
        self.running_context_tokens += len(prompt_ids)
        node = None
        try:
            cached = 0
            if not o.disable_radix_cache:
                # SGLang always computes the last prompt token, for its logits
                match = self.cache.match_prefix(prompt_ids[:-1], extra_key)
                cached, node = match.length, match.node
                self.cache.lock(node)
            await self._sleep(o.latency.prefill_seconds(len(prompt_ids) - cached))
            ttft = time.monotonic() - start
            if not o.disable_radix_cache:
                self.cache.insert(prompt_ids, extra_key)  # prompt KV is shareable once prefilled
            self.counters.prompt_tokens += len(prompt_ids)
            self.counters.cached_tokens += cached
            self.counters.requests += 1
            self.counters.last_cache_hit_rate = cached / max(1, len(prompt_ids))
            step = o.latency.decode_step_seconds(self.running_context_tokens)
            if on_token is not None:
                for i in range(1, len(output_ids) + 1):
                    if i > 1:
                        await self._sleep(step)
                    on_token.put_nowait(i)
            else:
                await self._sleep(o.latency.decode_seconds(len(output_ids), self.running_context_tokens))
            self.counters.generation_tokens += len(output_ids)
            self.counters.observe_ttft(ttft if o.time_scale == 0 else ttft / o.time_scale)
            if not o.disable_radix_cache:
                self.cache.insert(list(prompt_ids) + list(output_ids), extra_key)
            return cached, ttft
        finally:
            if node is not None:
                self.cache.unlock(node)
            self.running -= 1
            self.running_context_tokens -= len(prompt_ids)
            slots.release()

    def flush(self) -> bool:
        """``/flush_cache``: SGLang refuses while requests run."""
        if self.running or self.queued:
            return False
        self.cache.reset()
        return True


def new_rid() -> str:
    return uuid.uuid4().hex
