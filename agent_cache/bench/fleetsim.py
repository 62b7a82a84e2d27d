"""Discrete-event simulation of an SGLang fleet on a virtual clock.

N workers, each one :class:`~agent_cache.sim.scheduler.WorkerModel`: the
same scheduler model the simulated HTTP worker runs (prefill-first forward
passes one at a time, chunked prefill, token-budget admission, radix cache
with eviction, retraction), so a bad placement costs here what it costs
there. Sessions are closed-loop: call k+1 is issued after call k returns
plus the session's tool time. Per call:

1. the policy picks a worker (at the call's arrival time); agent-cache's
   policy is the product's Router (see :mod:`agent_cache.bench.policies`),
   told each finished call's reported prompt and cached tokens;
2. the call joins that worker's waiting queue; a worker whose GPU is idle
   starts its next forward pass at once;
3. each pass ends at ``start + its cost``; a call's TTFT is the end of the
   pass that prefilled its last prompt token, less its arrival;
4. the call ends with its last decode step; its prompt and output stay in
   the worker's cache (evictable) for the session's next call.

A policy with ``kv_events`` (``agent-cache-kv``) gets each worker's KV
events when SGLang would publish them (after each prefill pass, every
40th decode pass, and when the worker falls idle).

Cache modes of a policy: ``radix`` (each worker's own cache), ``none``
(radix cache disabled) and ``oracle`` (one infinite cache the whole fleet
shares: an upper bound on hits, with the same GPU timing).
"""

from __future__ import annotations

import dataclasses
import heapq
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from agent_cache.bench.policies import Dispatch, RoutingPolicy
from agent_cache.bench.workloads import CallSpec, SessionSpec
from agent_cache.kv import KvView
from agent_cache.sim.latency import DEFAULT_LATENCY, LatencyModel
from agent_cache.sim.kv_publisher import DECODE_LOG_INTERVAL
from agent_cache.sim.radix import RadixCache
from agent_cache.sim.scheduler import (
    DONE,
    FIRST_TOKEN,
    SchedulerConfig,
    SimRequest,
    WorkerModel,
    default_max_running_requests,
)

_ARRIVE, _PASS_DONE = 0, 1
# (time, seq, kind, payload): the payload is a _Sess (_ARRIVE) or (worker index, Iteration) (_PASS_DONE)
_Event = tuple[float, int, int, Any]
_ORACLE_TOKENS = 1 << 50
# what the KV view asks a worker to tokenize of a call, in tokens at about 4 characters a token
TAIL_TOKENS, HEAD_MIN_TOKENS = KvView.TAIL_CHARS // 4, KvView.HEAD_MIN_CHARS // 4


@dataclass(frozen=True)
class FleetConfig:
    workers: int = 8
    capacity_tokens: int = 400_000  # KV pool per worker (about 52 GB at Llama-3.1-8B's 128 KiB/token)
    page_size: int = 1
    eviction_policy: str = "lru"
    replicas: int = 1
    schedule_policy: str = "fcfs"
    max_running_requests: int | None = None  # None: as SGLang derives it
    latency: LatencyModel = DEFAULT_LATENCY

    def scheduler_config(self, cache: str) -> SchedulerConfig:
        return SchedulerConfig(
            max_total_tokens=_ORACLE_TOKENS if cache == "oracle" else self.capacity_tokens,
            page_size=self.page_size, radix_eviction_policy=self.eviction_policy,
            disable_radix_cache=cache == "none", schedule_policy=self.schedule_policy,
            # the oracle's pool is unbounded; it runs as many requests as a real worker would
            max_running_requests=self.max_running_requests
            or default_max_running_requests(self.capacity_tokens, SchedulerConfig.context_length),
            latency=self.latency,
        )


@dataclass
class RunResult:
    """Raw measurements of one policy over one workload (see :mod:`agent_cache.bench.report`)."""

    policy: str
    sessions: int = 0
    sessions_done: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    session_latencies: list[float] = field(default_factory=list)
    first_arrival: float = 0.0
    last_done: float = 0.0
    peak_kv_tokens: int = 0
    imbalance_sum: float = 0.0
    imbalance_samples: int = 0
    moves: dict[str, int] = field(default_factory=dict)  # pin moves by reason
    placements: dict[str, int] = field(default_factory=dict)  # agent-cache's new sessions by outcome
    kv_events: dict[str, int] = field(default_factory=dict)  # agent-cache-kv: event gaps, prefixes found gone
    evicted_tokens: int = 0
    recomputed_tokens: int = 0  # prompt tokens of a session's own earlier calls prefilled again
    working_set_tokens: int = 0  # peak over time of the live sessions' context tokens, summed
    retractions: int = 0
    decode_batches: dict[int, int] = field(default_factory=dict)  # decode passes by batch size
    queue_waits: list[float] = field(default_factory=list)  # per call: arrival to its first prefill pass
    wall_s: float = 0.0


class _Sess:
    __slots__ = ("spec", "calls", "next", "t_start", "context", "history", "head_end")

    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec
        self.calls: Iterator[CallSpec] = spec.start()
        self.next: CallSpec | None = next(self.calls, None)
        self.t_start = spec.arrival_s
        self.context = 0  # tokens of the latest prompt (+ its output once returned)
        self.history: dict[str, tuple[list[int], list[int]]] = {}  # template -> latest (prompt, output)
        self.head_end: dict[str, int] = {}  # template -> where its first call's own first message ends

    def reusable(self, template: str, prompt: list[int]) -> int:
        """Tokens of ``prompt`` that this session's previous call of ``template`` computed (its prompt and its
        output but the last token, which is sampled and never run through the model)."""
        prev = self.history.get(template)
        if prev is None:
            return 0
        n = common_prefix(prompt, prev[0])
        if n == len(prev[0]):
            n += common_prefix(prompt[n:], prev[1][:-1])
        return n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists (slice comparisons run at C speed)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi+1] != b[:hi+1]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Fleet:
    """The true in-flight calls per worker (the oracle and no-cache floor route by them)."""

    def __init__(self, models: list[WorkerModel]) -> None:
        self.models = models
        self.n = len(models)

    def inflight(self, i: int) -> int:
        m = self.models[i]
        return m.num_running + m.num_waiting


def simulate(sessions: Sequence[SessionSpec], policy: RoutingPolicy, cfg: FleetConfig,
             progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Run every session through the fleet under ``policy``; returns measurements."""
    wall0 = time.perf_counter()
    mode = policy.cache
    sched = cfg.scheduler_config(mode)
    kv = policy.kv_events and mode == "radix"
    if kv:
        sched = dataclasses.replace(sched, enable_kv_events=True)
    decodes = [0] * cfg.workers  # decode passes per worker: SGLang publishes every DECODE_LOG_INTERVAL-th
    shared = RadixCache(_ORACLE_TOKENS, page_size=cfg.page_size) if mode == "oracle" else None
    models = [WorkerModel(sched, cache=shared) for _ in range(cfg.workers)]
    busy = [False] * cfg.workers
    fleet = _Fleet(models)
    res = RunResult(policy.name, sessions=len(sessions))
    heap: list[_Event] = []
    seq = 0
    for s in sessions:
        st = _Sess(s)
        if st.next is None:
            res.sessions_done += 1
            continue
        heap.append((s.arrival_s, seq, _ARRIVE, st))
        seq += 1
    heapq.heapify(heap)
    res.first_arrival = min((s.arrival_s for s in sessions), default=0.0)
    n_calls = 0
    replicas = policy.replicas
    tmpl_form = policy.form == "tmpl"
    live_context = 0  # sum of the live sessions' context tokens
    report_every = max(1, len(sessions) // 20)
    started: set[int] = set()  # requests whose first prefill pass has begun

    def publish(wi: int, kind: str) -> None:
        if kind == "decode":
            decodes[wi] += 1
            if decodes[wi] % DECODE_LOG_INTERVAL:
                return
        events = models[wi].cache.take_events()
        if events:
            policy.kv_batch(wi, events)

    def start_pass(wi: int, now: float) -> None:
        nonlocal seq
        it = models[wi].next_iteration()
        if it is None:
            busy[wi] = False
            if kv:  # SGLang's idle self-check publishes what is queued at once
                publish(wi, "idle")
            return
        busy[wi] = True
        if it.kind == "decode":
            res.decode_batches[len(it.batch)] = res.decode_batches.get(len(it.batch), 0) + 1
        else:
            for req, _ in it.chunks:
                if id(req) not in started:
                    started.add(id(req))
                    res.queue_waits.append(now - req.arrival)
        heapq.heappush(heap, (now + it.seconds, seq, _PASS_DONE, (wi, it)))
        seq += 1

    def kv_held() -> int:
        if shared is not None:
            return shared.total_tokens + shared.outside_tokens
        return sum(m.cache.total_tokens + m.cache.outside_tokens for m in models)

    try:
        while heap:
            now, _, kind, obj = heapq.heappop(heap)
            if kind == _ARRIVE:
                st = obj
                call = st.next
                assert call is not None
                dispatch = Dispatch(st.spec.session_id, st.spec.tenant,
                                    call.tmpl_template if tmpl_form else call.raw_template,
                                    call.tmpl_template_tokens if tmpl_form else call.raw_template_tokens,
                                    n_calls % replicas)
                n_calls += 1
                prompt = call.tmpl if tmpl_form else call.raw
                reusable = st.reusable(dispatch.template_id, prompt)
                if kv:
                    dispatch.template_token_ids = prompt[: dispatch.template_tokens]
                    # what the session added since its previous call: the prompt's last message, its end
                    # only, as the gateway asks a worker for it (KvView.TAIL_CHARS)
                    start = max(reusable, dispatch.template_tokens, len(prompt) - TAIL_TOKENS)
                    dispatch.last_message_ids = prompt[start:]
                    # and the start of its own part once that is long enough for an anchor (the gateway's
                    # first message after the template with HEAD_MIN_CHARS), fixed from then on
                    tt = dispatch.template_tokens
                    end = st.head_end.get(dispatch.template_id)
                    if end is None and len(prompt) - tt >= HEAD_MIN_TOKENS:
                        end = st.head_end[dispatch.template_id] = min(len(prompt), tt + TAIL_TOKENS)
                    dispatch.first_message_ids = prompt[tt:end] if end is not None else ()
                policy.now = now
                wi = policy.route(dispatch, fleet)
                req = SimRequest(prompt=prompt, output_len=max(1, len(call.output)), output=call.output,
                                 max_new_tokens=None, tag=(st, dispatch, reusable))
                live_context += len(prompt) - st.context
                st.context = len(prompt)
                res.working_set_tokens = max(res.working_set_tokens, live_context)
                models[wi].submit(req, now)
                total = sum(fleet.inflight(i) for i in range(fleet.n))
                res.imbalance_sum += max(fleet.inflight(i) for i in range(fleet.n)) * fleet.n / total
                res.imbalance_samples += 1
                if not busy[wi]:
                    start_pass(wi, now)
                continue
            wi, it = obj
            finished = models[wi].finish_iteration(it, now)
            if kv:
                policy.now = now
                publish(wi, it.kind)
            for req, event in finished:
                if event == FIRST_TOKEN:
                    res.ttfts.append(now - req.arrival)
                    continue
                assert event == DONE
                st, dispatch, reusable = req.tag
                started.discard(id(req))
                res.calls += 1
                res.prompt_tokens += len(req.prompt)
                res.cached_tokens += req.cached
                res.output_tokens += len(req.output)
                res.recomputed_tokens += max(0, reusable - req.cached)
                policy.now = now
                policy.completed(dispatch, wi, len(req.prompt), req.cached)
                st.history[dispatch.template_id] = (req.prompt, req.output)
                st.next = next(st.calls, None)
                if st.next is not None:
                    live_context += len(req.output)
                    st.context += len(req.output)
                    res.working_set_tokens = max(res.working_set_tokens, live_context)
                    heapq.heappush(heap, (now + st.next.think_s, seq, _ARRIVE, st))
                    seq += 1
                else:
                    live_context -= st.context
                    st.history.clear()
                    res.sessions_done += 1
                    res.session_latencies.append(now - st.t_start)
                    res.last_done = max(res.last_done, now)
                    policy.now = now
                    policy.session_done(st.spec.session_id)
                    if progress is not None and res.sessions_done % report_every == 0:
                        progress(res.sessions_done, len(sessions))
            start_pass(wi, now)
            held = kv_held()
            if held > res.peak_kv_tokens:
                res.peak_kv_tokens = held
    finally:
        policy.close()
    if shared is not None:
        res.peak_kv_tokens = shared.total_tokens  # everything ever produced: the "infinite" cache
    res.moves = dict(policy.moves)
    res.placements = dict(policy.placements)
    res.kv_events = policy.kv_counts()
    res.evicted_tokens = sum(m.cache.evicted_tokens for m in models) if shared is None else 0
    res.retractions = sum(m.counters.retractions for m in models)
    res.wall_s = time.perf_counter() - wall0
    return res


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """Progress lines on stderr: ``[bench] label: done/total sessions``."""

    def report(done: int, total: int) -> None:
        print(f"[bench] {label}: {done}/{total} sessions", file=sys.stderr, flush=True)

    return report
