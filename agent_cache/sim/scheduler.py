"""One SGLang worker's scheduler, iteration by iteration, on a clock it is given.

No I/O and no real time: the HTTP simulator (:mod:`agent_cache.sim.engine`)
drives it in real time scaled by ``time_scale``, the fleet simulator
(:mod:`agent_cache.bench.fleetsim`) on a virtual clock. Both call::

    it = model.next_iteration()       # None when there is nothing to run
    ...wait it.seconds...
    events = model.finish_iteration(it, now)

What it copies from SGLang 0.5.x (``managers/scheduler.py``,
``schedule_policy.py``, ``schedule_batch.py``):

* the GPU runs one forward pass at a time, **prefill first**: when a waiting
  request can be admitted the next pass is a prefill batch, otherwise a
  decode step of the whole running batch; mixed batches are off (SGLang's
  default);
* a prefill batch takes waiting requests in policy order (``fcfs``, or
  ``lpm``: longest cached prefix first, FCFS when more than 128 wait; a
  request that matches <= 32 cached tokens but shares >= 32 with one ahead
  of it in the queue is held back, so a cold shared prefix is prefilled once) up to
  ``max_prefill_tokens`` new tokens; a prompt longer than the chunk budget
  (``chunked_prefill_size``) is prefilled in chunks over several passes;
* admission by token budget (``PrefillAdder``): a request enters when its
  new tokens plus its output budget (``min(max_new_tokens, 4096)``) fit in
  free plus evictable KV, after the running requests' remaining budgets x
  ``new_token_ratio``, and while fewer than ``max_running_requests`` run;
  once one does not fit, nothing is admitted until a running request ends;
* KV: the prompt is inserted into the radix tree when prefilled and stays
  locked while the request runs; decode tokens take pool slots outside the
  tree until the request ends; a pass allocates its whole batch at once and,
  when free slots are short, evicts the whole allocation from the tree
  (``mem_cache/common.py``), not just the shortfall; when a decode step finds no room, requests are retracted to the
  end of the waiting queue (fewest output tokens first), keep their output
  and are prefilled again later, and ``new_token_ratio`` is reset from what
  the batch really used;
* ``new_token_ratio`` decays linearly over 600 decode passes from 0.7 to
  0.098, and returns to 0.7 when the worker is idle.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from agent_cache.sim.latency import DEFAULT_LATENCY, LatencyModel
from agent_cache.kv.events import EventFormat
from agent_cache.sim.versions import LATEST_VERSION, SGLangVersion
from agent_cache.sim.radix import RadixCache, _Node

SCHEDULE_POLICIES = ("fcfs", "lpm")
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
LPM_FCFS_FALLBACK = 128  # schedule_policy.py: LPM degrades to FCFS beyond this queue length
# schedule_policy.py IN_BATCH_PREFIX_CACHING_{CHECK,DEPRIORITIZE}_THRESHOLD
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness 1.0
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS

FIRST_TOKEN, DONE = "first_token", "done"


def default_max_running_requests(max_total_tokens: int, context_length: int) -> int:
    """SGLang's default when ``--max-running-requests`` is not given.

    ``model_runner.init_memory_pool``: the request pool holds
    ``clamp(max_total_tokens / context_length x 512, 2048, 4096)`` slots;
    the scheduler then runs at most ``max_total_tokens // 2`` requests, capped
    by that pool (``scheduler.py``: ``min(max_running_requests, pool size)``).
    """
    pool = min(max(int(max_total_tokens / context_length * 512), 2048), 4096)
    return max(1, min(pool, max_total_tokens // 2))


@dataclass(frozen=True)
class SchedulerConfig:
    """A worker's scheduling flags, named as SGLang's ``server_args``."""

    max_total_tokens: int = 200_000  # --max-total-tokens (KV pool, tokens)
    context_length: int = 131_072
    page_size: int = 1
    radix_eviction_policy: str = "lru"
    disable_radix_cache: bool = False
    schedule_policy: str = "fcfs"  # --schedule-policy
    chunked_prefill_size: int = 8192  # --chunked-prefill-size (SGLang's default on an 80 GB GPU)
    max_prefill_tokens: int = 16384  # --max-prefill-tokens
    max_running_requests: int | None = None  # None: as SGLang derives it
    latency: LatencyModel = DEFAULT_LATENCY
    enable_kv_events: bool = False  # the radix cache queues SGLang's KV events (--kv-events-config)
    finished_drops_last_token: bool = True  # what a finished request leaves in the tree (sim/versions.py)
    # as the release simulated publishes them (default: the newest the simulator knows)
    kv_event_format: EventFormat = field(default_factory=lambda: SGLangVersion.parse(LATEST_VERSION).kv_event_format)

    def __post_init__(self) -> None:
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        for name in ("max_total_tokens", "context_length", "page_size", "chunked_prefill_size", "max_prefill_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_running_requests is not None and self.max_running_requests <= 0:
            raise ValueError(f"max_running_requests must be positive, got {self.max_running_requests}")

    @property
    def running_limit(self) -> int:
        if self.max_running_requests is not None:
            return self.max_running_requests
        return default_max_running_requests(self.max_total_tokens, self.context_length)


@dataclass(eq=False)
class SimRequest:
    """One generation request: its prompt, the output it will produce, and its progress."""

    prompt: Sequence[int]
    output_len: int  # tokens it will generate (the simulator knows its output in advance)
    max_new_tokens: int | None = None  # what the client asked for (the budget reserves it); None: no limit
    extra_key: str | None = None
    arrival: float = 0.0
    output: Sequence[int] = ()  # the output token ids, inserted into the cache when it ends
    tag: object = None  # the driver's handle
    # progress
    cached: int = 0  # prompt tokens found in the cache at (first) admission: what usage reports
    computed: int = 0  # tokens of prompt + generated output whose KV exists
    generated: int = 0
    first_token_at: float | None = None
    done_at: float | None = None
    retractions: int = 0
    _admitted: bool = False
    _aborted: bool = False
    _budget: int = CLIP_MAX_NEW_TOKENS  # max_new_tokens as the worker caps it
    _node: _Node | None = None  # locked radix node
    _outside: int = 0  # KV slots held outside the radix tree

    @property
    def finished(self) -> bool:
        return self.done_at is not None

    def _reserve(self) -> int:
        return max(0, min(self._budget - self.generated, CLIP_MAX_NEW_TOKENS))

    def _sequence(self) -> list[int]:
        """Prompt plus the output generated so far: what a (re)prefill must cover."""
        if not self.generated:
            return list(self.prompt)
        return list(self.prompt) + list(self.output[: self.generated])


@dataclass
class Iteration:
    """One forward pass: a prefill batch (``chunks``: request, new tokens) or a decode step."""

    kind: str  # "prefill" | "decode"
    seconds: float
    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)
    batch: list[SimRequest] = field(default_factory=list)


@dataclass
class Counters:
    """Totals since start, as SGLang's ``/metrics`` counters."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    retractions: int = 0
    prefill_passes: int = 0
    decode_passes: int = 0
    busy_seconds: float = 0.0
    last_cache_hit_rate: float = 0.0


class WorkerModel:
    """The scheduler and KV pool of one worker. Not thread-safe: one driver owns it."""

    def __init__(self, config: SchedulerConfig | None = None, *, cache: RadixCache | None = None) -> None:
        """``cache``: a tree shared with other models (the fleet simulator's infinite oracle cache)."""
        self.config = config or SchedulerConfig()
        c = self.config
        self.cache = cache or RadixCache(c.max_total_tokens, page_size=c.page_size,
                                         eviction_policy=c.radix_eviction_policy,
                                         enable_kv_events=c.enable_kv_events, kv_format=c.kv_event_format)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # prefilled, decoding
        self.chunked: SimRequest | None = None  # a prompt part-way through chunked prefill
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._batch_full = False  # SGLang's running_batch.batch_is_full: no admission until one ends
        self.counters = Counters()
        self._ratio_decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        self._busy = False

    # --- state ---------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Requests holding KV (decoding, or part-way through prefill): SGLang's ``num_running_reqs``."""
        return len(self.running) + (1 if self.chunked is not None else 0)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def used_tokens(self) -> int:
        """KV that running requests hold: ``max_total - (available + evictable)``, as SGLang reports it."""
        return self.config.max_total_tokens - (self.cache.free_tokens + self.cache.evictable_tokens)

    @property
    def token_usage(self) -> float:
        return self.used_tokens / self.config.max_total_tokens

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked)

    def flush(self) -> bool:
        """``/flush_cache``: refused while requests run or wait."""
        if not self.idle:
            return False
        self.cache.reset()
        return True

    # --- requests ------------------------------------------------------------

    def check_prompt(self, prompt_len: int) -> str | None:
        """Why SGLang would reject a prompt of this length, or None."""
        limit = min(self.config.max_total_tokens, self.config.context_length)
        if prompt_len >= limit:
            return (f"The input ({prompt_len} tokens) is longer than the model's context length "
                    f"({limit} tokens; max_total_num_tokens={self.config.max_total_tokens}).")
        return None

    def submit(self, req: SimRequest, now: float) -> None:
        req.arrival = now
        # SGLang caps max_new_tokens so that prompt + output fit max_req_len
        room = min(self.config.context_length, self.config.max_total_tokens) - 1 - len(req.prompt)
        req._budget = max(0, room if req.max_new_tokens is None else min(req.max_new_tokens, room))
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """The client went away: free what it holds, as SGLang's abort does."""
        if req.finished or req._aborted:
            return
        req._aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
            return
        self._batch_full = False
        if req is self.chunked:
            self.chunked = None
        elif req in self.running:
            self.running.remove(req)
        else:
            return
        self._release(req)

    # --- one pass ------------------------------------------------------------

    def next_iteration(self) -> Iteration | None:
        """Choose the next forward pass (prefill first), allocating its KV; None when idle."""
        assert not self._busy, "finish the running iteration first"
        if self.idle:
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # self_check_during_idle
            return None
        it = self._prefill_batch()
        if it is None and self.running:
            it = self._decode_step()
        if it is not None:
            self._busy = True
        return it

    def finish_iteration(self, it: Iteration, now: float) -> list[tuple[SimRequest, str]]:
        """Apply a pass that ended at ``now``; returns ``(request, FIRST_TOKEN | DONE)`` events."""
        self._busy = False
        self.counters.busy_seconds += it.seconds
        events: list[tuple[SimRequest, str]] = []
        if it.kind == "prefill":
            self.counters.prefill_passes += 1
            for req, n in it.chunks:
                if req._aborted:
                    continue
                req.computed += n
                self._cache_progress(req)
                if req is self.chunked:
                    continue  # more chunks to come
                # a prefill pass ends with one sampled token (the first, or the
                # next one of a request that was retracted and recomputed)
                req.generated += 1
                self.counters.generation_tokens += 1
                if req.first_token_at is None:
                    req.first_token_at = now
                    events.append((req, FIRST_TOKEN))
                if req.generated >= req.output_len:
                    events.append((req, DONE))
                    self._finish(req, now)
        else:
            self.counters.decode_passes += 1
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - self._ratio_decay)
            for req in it.batch:
                if req._aborted:
                    continue
                req.generated += 1
                req.computed += 1
                self.counters.generation_tokens += 1
                if req.generated >= req.output_len:
                    events.append((req, DONE))
                    self._finish(req, now)
        return events

    # --- prefill -------------------------------------------------------------

    def _order_waiting(self) -> None:
        if self.config.schedule_policy != "lpm" or len(self.waiting) > LPM_FCFS_FALLBACK or self.config.disable_radix_cache:
            return
        # schedule_policy._compute_prefix_matches: a request with (almost) nothing
        # cached that shares a prefix with one ahead of it waits, so that prefix
        # is computed once and then hit, not prefilled twice in one batch
        lengths: dict[int, float] = {}
        queued = RadixCache(1 << 60)
        for r in self.waiting:
            seq = r._sequence()[:-1]
            cached = self.cache.match_prefix(seq, r.extra_key).length
            lengths[id(r)] = -cached
            if cached <= IN_BATCH_CHECK_THRESHOLD:
                if queued.match_prefix(seq, r.extra_key).length >= IN_BATCH_DEPRIORITIZE_THRESHOLD:
                    lengths[id(r)] = float("inf")
                else:
                    queued.insert(seq, r.extra_key)
        # longest cached prefix first (a stable sort keeps arrival order among equals)
        self.waiting = deque(sorted(self.waiting, key=lambda r: lengths[id(r)]))

    def _prefill_batch(self) -> Iteration | None:
        c = self.config
        chunks: list[tuple[SimRequest, int]] = []
        rem_input = c.max_prefill_tokens
        rem_chunk = c.chunked_prefill_size
        # PrefillAdder.rem_total_tokens: free plus evictable KV, less what the
        # running requests may still need for their outputs
        rem_total = self.cache.free_tokens + self.cache.evictable_tokens - sum(
            int(r._reserve() * self.new_token_ratio) for r in self.running)
        if self.chunked is not None:
            req = self.chunked
            left = len(req._sequence()) - req.computed
            n = min(left, rem_chunk)
            chunks.append((req, n))
            rem_chunk -= n
            rem_input -= n
            rem_total -= n
            if n < left:
                return self._prefill_pass(chunks)
            self.chunked = None  # its last chunk: it decodes after this pass
            self.running.append(req)
        if self.waiting and not self._batch_full:
            self._order_waiting()
            limit = c.running_limit
            while self.waiting and rem_chunk > 0:
                if self.num_running >= limit:
                    self._batch_full = True
                    break
                req = self.waiting[0]
                seq = req._sequence()
                cached, node = self._match(req, seq)
                new = len(seq) - cached
                if new + req._reserve() >= rem_total:
                    self._batch_full = True  # NO_TOKEN: wait until a running request ends
                    break
                if new >= rem_input and chunks:
                    break  # this batch's input budget is spent
                self.waiting.popleft()
                if node is not None:
                    self.cache.lock(node)
                req._node = node
                req.computed = cached
                if not req._admitted:
                    req._admitted = True
                    req.cached = cached
                    self.counters.requests += 1
                    self.counters.prompt_tokens += len(req.prompt)
                    self.counters.cached_tokens += cached
                    self.counters.last_cache_hit_rate = cached / max(1, len(req.prompt))
                n = min(new, rem_chunk // c.page_size * c.page_size) if new > rem_chunk else new
                chunks.append((req, n))
                rem_total -= new + req._reserve()
                rem_input -= n
                rem_chunk -= n
                if n < new:
                    self.chunked = req  # the rest in later passes
                    break
                self.running.append(req)
        return self._prefill_pass(chunks) if chunks else None

    def _prefill_pass(self, chunks: list[tuple[SimRequest, int]]) -> Iteration:
        self._allocate(chunks)
        seconds = self.config.latency.prefill_batch_seconds((n, req.computed) for req, n in chunks)
        return Iteration("prefill", seconds, chunks=chunks)

    def _match(self, req: SimRequest, seq: list[int]) -> tuple[int, _Node | None]:
        if self.config.disable_radix_cache:
            return 0, None
        # SGLang always computes the last prompt token, for its logits
        m = self.cache.match_prefix(seq[:-1], req.extra_key)
        return m.length, m.node

    # --- decode --------------------------------------------------------------

    def _decode_step(self) -> Iteration | None:
        retracted = []
        while len(self.running) > 1 and self.cache.free_tokens + self.cache.evictable_tokens < len(self.running):
            retracted.append(self._retract_one())
        if retracted:
            # scheduler.update_running_batch: the ratio jumps to what the batch has really needed
            decoded = sum(r.generated for r in self.running)
            asked = sum(r._budget for r in self.running)
            self.new_token_ratio = min(1.0, (decoded + 20 * len(self.running)) / (asked + 1))
        self._allocate([(req, 1) for req in self.running], prefill=False)
        kv = sum(r.computed + 1 for r in self.running)
        seconds = self.config.latency.decode_step_seconds(len(self.running), kv)
        return Iteration("decode", seconds, batch=list(self.running))

    def _retract_one(self) -> SimRequest:
        # ScheduleBatch.retract_decode: the fewest output tokens (then the longest
        # prompt) goes back to the end of the queue; its prefix stays in the tree
        req = min(self.running, key=lambda r: (r.generated, -len(r.prompt)))
        self.running.remove(req)
        self._release(req)
        req.computed = 0
        req.retractions += 1
        self.counters.retractions += 1
        self.waiting.append(req)
        self._batch_full = False
        return req

    # --- KV bookkeeping ------------------------------------------------------

    def _allocate(self, chunks: list[tuple[SimRequest, int]], prefill: bool = True) -> None:
        """One pass's KV slots, allocated for the whole batch at once.

        ``mem_cache/common.py`` ``evict_from_tree_cache``: when fewer slots
        are free than the batch needs, the tree evicts the batch's whole
        need, not only the shortfall (paged: one extra page per request).
        """
        page = self.config.page_size
        need = sum(n for _, n in chunks)
        if page > 1:  # alloc_paged_token_slots_extend / _decode over-estimate a new page per request
            need = len(chunks) * page + (need if prefill else 0)
        if self.cache.free_tokens < need:
            self.cache.evict(need)
        for req, n in chunks:
            req._outside += n
            self.cache.outside_tokens += n

    def _cache_progress(self, req: SimRequest) -> None:
        """Move a prefilled chunk into the tree and hold it there (``cache_unfinished_req``)."""
        self.cache.outside_tokens -= req._outside
        req._outside = 0
        if self.config.disable_radix_cache:
            req._outside = req.computed  # without a tree the request keeps its own slots
            self.cache.outside_tokens += req.computed
            return
        seq = req._sequence()[: req.computed]
        self.cache.insert(seq, req.extra_key)
        old = req._node
        req._node = self.cache.match_prefix(seq, req.extra_key).node
        self.cache.lock(req._node)
        if old is not None:
            self.cache.unlock(old)

    def _release(self, req: SimRequest, keep: Sequence[int] = ()) -> None:
        """Free the request's slots; ``keep`` goes into the tree (unlocked) first."""
        self.cache.outside_tokens -= req._outside
        req._outside = 0
        if keep and not self.config.disable_radix_cache:
            self.cache.insert(keep, req.extra_key)
        if req._node is not None:
            self.cache.unlock(req._node)
            req._node = None

    def _finish(self, req: SimRequest, now: float) -> None:
        """``cache_finished_req``: prompt and output go into the tree (but the last token, from 0.5.23), unlocked."""
        req.done_at = now
        self._batch_full = False
        if req in self.running:
            self.running.remove(req)
        # SGLang 0.5.23 inserts the tokens whose KV was computed: all but the last output token, which was
        # sampled and never run through the model; 0.5.9 inserts that one too
        keep = list(req.prompt) + list(req.output)
        self._release(req, keep=keep[:-1] if self.config.finished_drops_last_token else keep)
