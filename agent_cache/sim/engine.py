"""The simulated worker's engine: the scheduler model driven in (scaled) real time.

No HTTP here (that is :mod:`agent_cache.sim.server`). One engine is one
SGLang worker: a :class:`~agent_cache.sim.scheduler.WorkerModel` (radix
cache, token-budget admission, one forward pass at a time) run by one
asyncio task that sleeps each pass's cost x ``time_scale`` (0 = no
sleeping: passes follow each other at once, and the model's own clock
advances by their cost, so TTFT figures in ``/metrics`` stay meaningful).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Sequence

from agent_cache.sim.tokenizing import ChatTokenizer, chat_tokenizer
from agent_cache.sim.kv_publisher import create_sink
from agent_cache.sim.latency import DEFAULT_LATENCY, LatencyModel
from agent_cache.sim.radix import RadixCache
from agent_cache.sim.scheduler import DONE, FIRST_TOKEN, Counters, SchedulerConfig, SimRequest, WorkerModel
from agent_cache.sim.versions import LATEST_VERSION, SGLangVersion

# sglang/srt/metrics/collector.py: the default TTFT histogram buckets
HEALTH_CHECK_TIMEOUT = 20  # http_server.py: SGLANG_HEALTH_CHECK_TIMEOUT, seconds
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)


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
    enable_metrics: bool = True  # --enable-metrics (the CLI defaults to off, as SGLang)
    max_running_requests: int | None = None  # --max-running-requests (None: as SGLang derives it)
    schedule_policy: str = "fcfs"  # --schedule-policy
    chunked_prefill_size: int = 8192  # --chunked-prefill-size
    max_prefill_tokens: int = 16384  # --max-prefill-tokens
    sglang_version: str = LATEST_VERSION  # routes and fields of this SGLang release
    time_scale: float = 0.0  # 1.0 = the latency model in real time, 0 = instant
    startup_seconds: float = 0.0  # /health answers 503 this long after start
    latency: LatencyModel = DEFAULT_LATENCY
    kv_events_config: str | None = None  # --kv-events-config: SGLang's JSON (publisher "zmq" publishes)
    tokenizer_path: str | None = None  # --tokenizer-path: a real model's tokenizer (None: the simulator's own)

    def scheduler_config(self) -> SchedulerConfig:
        version = SGLangVersion.parse(self.sglang_version)
        return SchedulerConfig(
            max_total_tokens=self.max_total_tokens, context_length=self.context_length, page_size=self.page_size,
            radix_eviction_policy=self.radix_eviction_policy if version.has("lfu_hits") else "lru",
            disable_radix_cache=self.disable_radix_cache, schedule_policy=self.schedule_policy,
            chunked_prefill_size=self.chunked_prefill_size, max_prefill_tokens=self.max_prefill_tokens,
            max_running_requests=self.max_running_requests, latency=self.latency,
            enable_kv_events=bool(self.kv_events_config), kv_event_format=version.kv_event_format,
            finished_drops_last_token=version.has("finished_drops_last_token"),
        )


@dataclass
class Histogram:
    """A Prometheus histogram of seconds over fixed buckets."""

    buckets: tuple[float, ...]
    sum: float = 0.0
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, seconds: float) -> None:
        self.sum += seconds
        for i, bound in enumerate(self.buckets):
            if seconds <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1


class PromptTooLong(ValueError):
    pass


class Aborted(RuntimeError):
    """The request was aborted inside the worker (SGLang's ``finish_reason: abort``)."""


def apply_stop(text: str, stop: Sequence[str] | None, max_tokens: int | None,
               tokenizer: ChatTokenizer) -> tuple[list[int], str, str, str | None]:
    """Cut ``text`` at the first stop string and at ``max_tokens`` tokens."""
    finish, matched = "stop", None
    if stop:
        cut = [(text.find(s), s) for s in stop if s and text.find(s) >= 0]
        if cut:
            pos, matched = min(cut)
            text = text[:pos]
    ids = list(tokenizer.encode_text(text))
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        text = tokenizer.decode(ids)
        finish, matched = "length", None
    return ids, text, finish, matched


class _Waiter:
    __slots__ = ("done", "tokens", "sent")

    def __init__(self, done: "asyncio.Future[None]", tokens: "asyncio.Queue[int] | None") -> None:
        self.done, self.tokens, self.sent = done, tokens, 0


class Engine:
    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options or WorkerOptions()
        self.version = SGLangVersion.parse(self.options.sglang_version)
        self.tokenizer = chat_tokenizer(self.options.tokenizer_path)
        self.model = WorkerModel(self.options.scheduler_config())
        self.kv_events = create_sink(self.options.kv_events_config, self.version.kv_event_format)
        if self.kv_events is not None:  # the idle loop publishes the start-up AllBlocksCleared
            self.kv_events.idle(self.model.cache)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.started_at = time.monotonic()
        self.created = int(time.time())
        self._vtime = 0.0  # the model's clock when time_scale is 0
        self._last_output = 0.0  # time.monotonic() of the last forward pass's end (SGLang's last_receive_tstamp)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # --- state the HTTP layer reports ------------------------------------------

    @property
    def ready(self) -> bool:
        return time.monotonic() - self.started_at >= self.options.startup_seconds

    def now(self) -> float:
        """The model's clock, in modelled seconds."""
        scale = self.options.time_scale
        return (time.monotonic() - self.started_at) / scale if scale > 0 else self._vtime

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        reason = self.model.check_prompt(len(prompt_ids))
        if reason:
            raise PromptTooLong(reason)

    # --- requests --------------------------------------------------------------

    async def serve(
        self,
        prompt_ids: Sequence[int],
        output_ids: list[int],
        *,
        max_new_tokens: int | None = None,
        extra_key: str | None = None,
        on_token: "asyncio.Queue[int] | None" = None,
    ) -> tuple[int, float]:
        """Run one request to its end; returns ``(cached_tokens, ttft_model_seconds)``.

        With ``on_token``, puts the number of output tokens emitted so far
        after each forward pass that produced one (the streaming path reads it).
        """
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), on_token)
        req = SimRequest(prompt=list(prompt_ids), output_len=max(1, len(output_ids)), output=output_ids,
                         max_new_tokens=max_new_tokens, extra_key=extra_key, tag=waiter)
        self.model.submit(req, self.now())
        self._kick()
        try:
            await waiter.done
        finally:
            if not req.finished:
                self.model.abort(req)  # the client went away: free its KV as SGLang's abort does
        assert req.first_token_at is not None
        return req.cached, req.first_token_at - req.arrival

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        """The scheduler loop: one forward pass at a time, as long as there is work."""
        assert self._wake is not None
        scale = self.options.time_scale
        while True:
            it = self.model.next_iteration()
            if it is None:
                if self.kv_events is not None:
                    self.kv_events.idle(self.model.cache)
                self._wake.clear()
                await self._wake.wait()
                continue
            if scale > 0:
                await asyncio.sleep(it.seconds * scale)
            else:
                self._vtime += it.seconds
                await asyncio.sleep(0)  # let new requests arrive between passes
            events = self.model.finish_iteration(it, self.now())
            if self.kv_events is not None:
                self.kv_events.after_pass(it.kind, self.model.cache)
            self._last_output = time.monotonic()
            self._notify(it.batch or [req for req, _ in it.chunks])
            for req, kind in events:
                waiter: _Waiter = req.tag  # type: ignore[assignment]
                if kind == FIRST_TOKEN:
                    self.ttft.observe(req.first_token_at - req.arrival)  # type: ignore[operator]
                elif kind == DONE and not waiter.done.done():
                    waiter.done.set_result(None)

    @staticmethod
    def _notify(reqs: list[SimRequest]) -> None:
        for req in reqs:
            waiter: _Waiter = req.tag  # type: ignore[assignment]
            if waiter.tokens is not None and req.generated > waiter.sent:
                waiter.sent = min(req.generated, len(req.output)) if req.output else req.generated
                waiter.tokens.put_nowait(waiter.sent)

    async def health(self) -> bool:
        """SGLang's ``/health`` once started: True when the scheduler answers within 20 s (scaled).

        ``entrypoints/http_server.py`` ``health_generate`` sends a one-token
        request, then every 1 s checks whether anything came back from the
        scheduler since it asked. ``managers/scheduler.py``
        ``process_input_requests`` drops that request while a batch runs and
        answers after the next forward pass instead, so a busy worker
        answers in about 1 s without queueing a generation; an idle one runs
        the one-token generation. Instant at ``time_scale`` 0.
        """
        scale = self.options.time_scale
        if scale <= 0:
            return True
        tic = time.monotonic()
        probe = None if self.model.num_running else asyncio.ensure_future(
            self.serve([0], [0], max_new_tokens=1))
        try:
            for _ in range(HEALTH_CHECK_TIMEOUT):
                await asyncio.sleep(1.0 * scale)
                if self._last_output > tic:
                    return True
            return False
        finally:
            if probe is not None:
                probe.cancel()

    def flush(self) -> bool:
        """``/flush_cache``: SGLang refuses while requests run."""
        flushed = self.model.flush()
        if flushed and self.kv_events is not None:  # SGLang flushes only when idle; its idle loop publishes
            self.kv_events.idle(self.model.cache)
        return flushed

    def close(self) -> None:
        """Stop the KV event publisher, if any."""
        if self.kv_events is not None:
            self.kv_events.close()


def new_rid() -> str:
    return uuid.uuid4().hex
