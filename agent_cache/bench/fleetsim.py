"""Discrete-event simulation of an SGLang fleet on a virtual clock.

N workers, each with a :class:`~agent_cache.sim.radix.RadixCache` and the
shared :class:`~agent_cache.sim.latency.LatencyModel`. Sessions are
closed-loop: call k+1 is issued after call k returns plus the session's tool
time. Per call:

1. the policy picks a worker (at the call's arrival time);
2. the worker admits it when fewer than ``max_running_requests`` run,
   otherwise it queues (FIFO);
3. on admission the prompt's longest cached prefix is matched and locked;
   the uncached tokens are prefilled. Prefills on one worker are serialised
   (the GPU computes one prefill batch at a time), so
   TTFT = queue wait + wait for earlier prefills + own prefill;
4. the prompt is inserted into the cache when its prefill ends (later calls
   can hit it while this one decodes), prompt + output when the call ends.

Decode is approximated cheaply: a call's decode time is fixed when its
prefill ends, ``(n_out - 1) x decode_step(batch KV)``, with the batch KV
being the context of every call running on that worker at that moment. It
ignores batch changes during the decode and the stall prefills cause to
running decodes. Eviction is amortised: when an insert would overflow, at
least 1/32 of the capacity is freed at once (SGLang also evicts in bulk).
"""

from __future__ import annotations

import heapq
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from agent_cache.bench.policies import RoutingPolicy
from agent_cache.bench.workloads import CallSpec, SessionSpec
from agent_cache.sim.latency import DEFAULT_LATENCY, LatencyModel
from agent_cache.sim.radix import RadixCache

_ARRIVE, _PREFILLED, _DONE = 0, 1, 2


@dataclass(frozen=True)
class FleetConfig:
    workers: int = 8
    capacity_tokens: int = 400_000  # KV pool per worker (about 52 GB at Llama-3.1-8B's 128 KiB/token)
    page_size: int = 1
    eviction_policy: str = "lru"
    replicas: int = 1
    latency: LatencyModel = DEFAULT_LATENCY


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
    moves: int = 0
    wall_s: float = 0.0


class _Worker:
    __slots__ = ("cache", "running", "inflight", "ctx", "queue", "prefill_free")

    def __init__(self, cache: RadixCache | None) -> None:
        self.cache = cache
        self.running = 0
        self.inflight = 0  # queued + running
        self.ctx = 0  # KV tokens of the running calls
        self.queue: deque = deque()
        self.prefill_free = 0.0


class _Req:
    __slots__ = ("sess", "call", "prompt", "worker", "replica", "t_arrive", "cached", "node", "ctx")

    def __init__(self, sess: "_Sess", call: CallSpec, prompt: list[int], worker: int, replica: int, t: float) -> None:
        self.sess, self.call, self.prompt, self.worker, self.replica, self.t_arrive = sess, call, prompt, worker, replica, t
        self.cached = 0
        self.node = None
        self.ctx = 0


class _Sess:
    __slots__ = ("spec", "calls", "next", "t_start")

    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec
        self.calls: Iterator[CallSpec] = spec.start()
        self.next: CallSpec | None = next(self.calls, None)
        self.t_start = spec.arrival_s


class _Fleet:
    """The policies' view of the fleet: true in-flight counts and cached tokens (what the store reports)."""

    def __init__(self, workers: list[_Worker], capacity: int) -> None:
        self.workers = workers
        self.n = len(workers)
        self.capacity = capacity

    def inflight(self, i: int) -> int:
        return self.workers[i].inflight

    def kv_tokens(self, i: int) -> int:
        c = self.workers[i].cache
        return c.total_tokens if c is not None else 0


def simulate(sessions: Sequence[SessionSpec], policy: RoutingPolicy, cfg: FleetConfig,
             progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Run every session through the fleet under ``policy``; returns measurements."""
    wall0 = time.perf_counter()
    lat = cfg.latency
    mode = policy.cache
    workers = [_Worker(RadixCache(cfg.capacity_tokens, page_size=cfg.page_size, eviction_policy=cfg.eviction_policy)
                       if mode == "radix" else None) for _ in range(cfg.workers)]
    oracle = RadixCache(1 << 50, page_size=cfg.page_size) if mode == "oracle" else None
    fleet = _Fleet(workers, cfg.capacity_tokens)
    res = RunResult(policy.name, sessions=len(sessions))
    heap: list = []
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
    kv_total = 0  # tokens held across the fleet's caches (or running KV without caches)
    n_calls = 0
    replicas = policy.replicas
    tmpl_form = policy.form == "tmpl"
    max_run = lat.max_running_requests
    evict_chunk = max(1, cfg.capacity_tokens // 32)
    report_every = max(1, len(sessions) // 20)

    def insert(w: _Worker, ids: list[int], known: int) -> None:
        nonlocal kv_total
        c = w.cache
        if c is None:
            return
        before = c.total_tokens
        over = before + len(ids) - known - c.capacity
        if over > 0:
            c.evict(over + evict_chunk)
        c.insert(ids)
        kv_total += c.total_tokens - before

    def admit(w: _Worker, r: _Req, now: float) -> None:
        nonlocal seq, kv_total
        prompt = r.prompt
        if w.cache is not None:
            m = w.cache.match_prefix(prompt)
            r.cached, r.node = m.length, m.node
            w.cache.lock(m.node)
        elif oracle is not None:
            r.cached = oracle.match_prefix(prompt).length
        r.ctx = len(prompt) + len(r.call.output)
        w.running += 1
        w.ctx += r.ctx
        if w.cache is None:
            kv_total += r.ctx  # without a cache only running calls hold KV
        start = now if now > w.prefill_free else w.prefill_free
        end = start + lat.prefill_seconds(len(prompt) - r.cached)
        w.prefill_free = end
        heapq.heappush(heap, (end, seq, _PREFILLED, r))
        seq += 1

    while heap:
        now, _, kind, obj = heapq.heappop(heap)
        if kind == _ARRIVE:
            st: _Sess = obj
            call = st.next
            assert call is not None
            replica = n_calls % replicas
            n_calls += 1
            tid = call.tmpl_template if tmpl_form else call.raw_template
            wi = policy.route(st.spec.session_id, tid, fleet, replica)
            w = workers[wi]
            r = _Req(st, call, call.tmpl if tmpl_form else call.raw, wi, replica, now)
            w.inflight += 1
            total = sum(x.inflight for x in workers)
            res.imbalance_sum += max(x.inflight for x in workers) * len(workers) / total
            res.imbalance_samples += 1
            if w.running < max_run:
                admit(w, r, now)
            else:
                w.queue.append(r)
        elif kind == _PREFILLED:
            r = obj
            w = workers[r.worker]
            res.ttfts.append(now - r.t_arrive)
            if w.cache is not None:
                insert(w, r.prompt, r.cached)
                w.cache.unlock(r.node)
                m = w.cache.match_prefix(r.prompt)  # hold the full prompt path while decoding
                r.node = m.node
                w.cache.lock(m.node)
            elif oracle is not None:
                oracle.insert(r.prompt)
            n_out = len(r.call.output)
            dur = max(0, n_out - 1) * lat.decode_step_seconds(w.ctx) if n_out else 0.0
            heapq.heappush(heap, (now + dur, seq, _DONE, r))
            seq += 1
        else:
            r = obj
            w = workers[r.worker]
            full = r.prompt + r.call.output
            if w.cache is not None:
                insert(w, full, len(r.prompt))
                w.cache.unlock(r.node)
            elif oracle is not None:
                oracle.insert(full)
            else:
                kv_total -= r.ctx
            w.running -= 1
            w.inflight -= 1
            w.ctx -= r.ctx
            res.calls += 1
            res.prompt_tokens += len(r.prompt)
            res.cached_tokens += r.cached
            res.output_tokens += len(r.call.output)
            policy.completed(r.replica, r.worker, r.sess.spec.session_id, r.cached)
            while w.queue and w.running < max_run:
                admit(w, w.queue.popleft(), now)
            st = r.sess
            st.next = next(st.calls, None)
            if st.next is not None:
                heapq.heappush(heap, (now + st.next.think_s, seq, _ARRIVE, st))
                seq += 1
            else:
                res.sessions_done += 1
                res.session_latencies.append(now - st.t_start)
                res.last_done = max(res.last_done, now)
                policy.session_done(st.spec.session_id)
                if progress is not None and res.sessions_done % report_every == 0:
                    progress(res.sessions_done, len(sessions))
        if kv_total > res.peak_kv_tokens:
            res.peak_kv_tokens = kv_total
    if oracle is not None:
        res.peak_kv_tokens = oracle.total_tokens  # everything ever produced: the "infinite" cache
    res.moves = policy.moves
    res.wall_s = time.perf_counter() - wall0
    return res


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """Progress lines on stderr: ``[bench] label: done/total sessions``."""

    def report(done: int, total: int) -> None:
        print(f"[bench] {label}: {done}/{total} sessions", file=sys.stderr, flush=True)

    return report
