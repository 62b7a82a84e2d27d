"""Per-tenant limits: ``rpm=`` (requests per minute) and ``tpm=`` (tokens per minute) of the keys file.

Every gateway replica of a deployment counts in the same Redis script
(``store/lua/ratelimit.lua``): a sliding window of the last 60 one-second
buckets per tenant, on Redis's clock. A request is counted when it is
admitted, and so are the tokens it may use (its *reservation*,
:func:`reservation_tokens`: the request body's bytes / 4 for the prompt, plus
its ``max_tokens``, or ``DEFAULT_OUTPUT_RESERVED`` without one). A call is
admitted while the tenant's window is under ``tpm``, so calls admitted at
once, or streams closed before their end, take a tenant past ``tpm`` by at
most one call's reservation. When the call ends, whatever way, it is settled
(:meth:`RateLimits.settle`): its reservation is replaced by the tokens it
used as the worker reported them; a call that ended without a report keeps
its whole reservation if it sent any output (a stream the client closed),
and gives it all back if it sent none (it failed first). A tenant past its
limit is in debt: its calls are refused until the window is under the limit
again.

When Redis is away (or before it ever answered) each replica enforces its
share alone: the limit divided by the number of live replicas it last
knew. Replicas register themselves in the same script, each call renewing a
short-lived entry. Each replica always keeps its own window of what it
admitted and charged, so the share is measured against its own last minute.

Refusals are 429 in OpenAI's shape with ``Retry-After`` and OpenAI's
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from agent_cache.errors import StoreError
from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.gateway.keys import ApiKey
from agent_cache.store import keys, lua
from agent_cache.values import Usage

logger = logging.getLogger("agent_cache.gateway.limits")

WINDOW = 60  # seconds; the window is WINDOW one-second buckets
REPLICA_TTL = 30.0  # seconds a replica counts as live after its last call through Redis
AWAY_BACKOFF = 1.0  # seconds between tries of a Redis that did not answer
SOCKET_TIMEOUT = 0.25
SCRIPT = lua.script("ratelimit")
DEFAULT_OUTPUT_RESERVED = 1_024  # tokens reserved for the output of a call that sets no max_tokens
PROMPT_BYTES_PER_TOKEN = 4  # the prompt's reservation: the body's bytes / 4 (more than the prompt's tokens)


def reservation_tokens(body: Any, body_bytes: int) -> int:
    """What a call may use of its tenant's ``tpm``: the request body's bytes / 4 for the prompt (the JSON
    around it makes this more than the prompt's tokens), plus the output it asks for at most."""
    out = None
    if isinstance(body, dict):
        params = body.get("sampling_params")
        for value in (body.get("max_completion_tokens"), body.get("max_tokens"),
                      params.get("max_new_tokens") if isinstance(params, dict) else None):
            if type(value) is int and value >= 0:
                out = value
                break
    return body_bytes // PROMPT_BYTES_PER_TOKEN + (DEFAULT_OUTPUT_RESERVED if out is None else out)


@dataclass
class Reservation:
    """Tokens one call holds against its tenant's ``tpm`` from its admission until it is settled."""

    tokens: int
    local_second: int  # the bucket of this replica's window it went to
    redis_second: int | None  # the bucket of Redis's window (None: Redis was away, this replica's only)
    used: int | None = None  # what the worker reported the call used
    delivered: bool = False  # output reached the client
    settled: bool = False

    def spent(self, usage: Usage | None) -> None:
        if usage is not None:
            self.used = usage.total_tokens

    def actual(self) -> int:
        """What to charge: the worker's report; without one, all of it once output went out, else none."""
        if self.used is not None:
            return self.used
        return self.tokens if self.delivered else 0


class _Window:
    """One replica's own sliding window: second -> count (WINDOW buckets at most)."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}

    def state(self, now: float, limit: int) -> "LimitState":
        sec = int(now)
        for s in [s for s in self.buckets if s <= sec - WINDOW]:
            del self.buckets[s]
        used = sum(self.buckets.values())
        under = empty = 0.0
        if self.buckets:
            empty = max(self.buckets) + WINDOW - now
        if used >= limit:
            left = used
            for s in sorted(self.buckets):
                left -= self.buckets[s]
                if left < limit:
                    under = s + WINDOW - now
                    break
        return LimitState(limit, used, under, empty)

    def add(self, now: float, n: int) -> None:
        self.buckets[int(now)] = self.buckets.get(int(now), 0) + n

    def settle(self, second: int, delta: int, used: int, now: float) -> None:
        """A reservation put in bucket ``second`` corrected by ``delta``; gone from the window, ``used`` is
        counted now instead."""
        if second > int(now) - WINDOW:
            self.buckets[second] = self.buckets.get(second, 0) + delta
        elif used > 0:
            self.add(now, used)


@dataclass(frozen=True)
class LimitState:
    """One limit after a check: ``used`` of ``limit`` in the window; seconds until it is under the
    limit again (0 when it is) and until the window is empty."""

    limit: int
    used: int
    until_under: float
    until_empty: float

    @property
    def reached(self) -> bool:
        return self.used >= self.limit

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


@dataclass(frozen=True)
class Verdict:
    """Whether a call is admitted, with the state of the tenant's limits; ``local``: decided by this
    replica's share, Redis being away."""

    admitted: bool
    requests: LimitState | None
    tokens: LimitState | None
    local: bool = False
    reservation: "Reservation | None" = None  # the tokens an admitted call holds of the tenant's tpm

    def retry_after(self) -> int:
        """Whole seconds until the limits that refused the call are under their limits (at least 1)."""
        waits = [s.until_under for s in (self.requests, self.tokens) if s is not None and s.until_under > 0]
        return max(1, math.ceil(max(waits, default=1.0)))

    def headers(self) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the limits the tenant has."""
        out: dict[str, str] = {}
        for kind, state in (("requests", self.requests), ("tokens", self.tokens)):
            if state is not None:
                out[f"x-ratelimit-limit-{kind}"] = str(state.limit)
                out[f"x-ratelimit-remaining-{kind}"] = str(state.remaining)
                out[f"x-ratelimit-reset-{kind}"] = duration(state.until_empty)
        return out


def duration(seconds: float) -> str:
    """A duration as OpenAI's headers write one: ``20ms``, ``1.5s``, ``6m0s``."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


class RateLimits:
    """The limits of one gateway process: Redis's shared window, or this replica's share of it."""

    def __init__(self, redis_url: str | None, prefix: str) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.replica = uuid.uuid4().hex[:16]
        self.replicas = 1  # live replicas, as Redis last said
        self._client: Any = None
        self._script: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._away_until = 0.0  # monotonic time before which Redis is not tried
        self._away = False
        self._local: dict[str, tuple[_Window, _Window]] = {}
        self._pending: set[asyncio.Task[Any]] = set()
        self._last: dict[str, Verdict] = {}  # tenant -> its latest admission here, for the answer's headers

    # --- the gateway's two hooks ----------------------------------------------------------

    async def admit(self, grant: ApiKey, reserve: int = 0) -> Verdict | None:
        """Count one call of the key's tenant and reserve ``reserve`` tokens of its ``tpm``
        (:func:`reservation_tokens`; the verdict's ``reservation``, to settle when the call ends), or raise a
        429 :class:`RequestRejectedError`; None for a key without limits."""
        if grant.rpm is None and grant.tpm is None:
            return None
        tokens = max(0, reserve) if grant.tpm is not None else 0
        shared = await self._shared("admit", grant, tokens)
        mine = self._windows(grant.tenant)
        now = time.time()
        verdict = shared[0] if shared is not None else self._share(grant, now, tokens)
        if not verdict.admitted:
            raise _refusal(grant, verdict)
        if grant.rpm is not None:
            mine[0].add(now, 1)
        if tokens:
            mine[1].add(now, tokens)
        if grant.tpm is not None:
            verdict = replace(verdict, reservation=Reservation(tokens, int(now), shared[1] if shared else None))
        self._last[grant.tenant] = verdict
        return verdict

    def headers(self, grant: ApiKey | None) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers of an admitted call: its tenant's limits as of the tenant's
        latest admission on this replica (that call's own, unless another overtook it)."""
        if grant is None or (grant.rpm is None and grant.tpm is None):
            return {}
        verdict = self._last.get(grant.tenant)
        return verdict.headers() if verdict is not None else {}

    def settle(self, grant: ApiKey | None, held: Reservation | None) -> None:
        """The call ended, whatever way: its reservation replaced by what it used (once; Redis's window is
        updated in the background)."""
        if grant is None or grant.tpm is None or held is None or held.settled:
            return
        held.settled = True
        used = held.actual()
        delta = used - held.tokens
        self._windows(grant.tenant)[1].settle(held.local_second, delta, used, time.time())
        if held.redis_second is None or self.redis_url is None or time.monotonic() < self._away_until:
            return
        task = asyncio.get_running_loop().create_task(
            self._shared("settle", grant, delta, settle=(held.redis_second, used)))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=1.0)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # --- this replica's share ---------------------------------------------------------------

    def _windows(self, tenant: str) -> tuple[_Window, _Window]:
        found = self._local.get(tenant)
        if found is None:  # one per tenant of the keys file that has limits
            found = self._local[tenant] = (_Window(), _Window())
        return found

    def _share(self, grant: ApiKey, now: float, reserve: int) -> Verdict:
        requests, tokens = self._windows(grant.tenant)
        share = max(1, self.replicas)
        r = requests.state(now, max(1, grant.rpm // share)) if grant.rpm is not None else None
        t = tokens.state(now, max(1, grant.tpm // share)) if grant.tpm is not None else None
        admitted = not (r is not None and r.reached) and not (t is not None and t.reached)
        if admitted and r is not None:  # this call counts: the headers say what is left after it
            r = LimitState(r.limit, r.used + 1, r.until_under, WINDOW - (now - int(now)))
        if admitted and t is not None and reserve:  # and so does its reservation
            t = LimitState(t.limit, t.used + reserve, t.until_under, WINDOW - (now - int(now)))
        return Verdict(admitted, r, t, local=True)

    # --- Redis's window -----------------------------------------------------------------

    async def _shared(self, op: str, grant: ApiKey, tokens: int,
                      settle: tuple[int, int] = (0, 0)) -> tuple[Verdict, int] | None:
        """Run the script: the verdict and Redis's second; None while Redis is away (this replica then
        decides alone). ``settle``: the second a settled call was admitted in, and what it used."""
        if self.redis_url is None or time.monotonic() < self._away_until:
            return None
        try:
            script = self._get_script()
            raw = await script(keys=[keys.rate_requests(self.prefix, grant.tenant),
                                     keys.rate_tokens(self.prefix, grant.tenant), keys.rate_replicas(self.prefix)],
                               args=[op, grant.rpm or 0, grant.tpm or 0, tokens, self.replica,
                                     int(REPLICA_TTL * 1000), *settle])
        except Exception as exc:  # redis-py's errors, sockets' OSError: Redis is away for now
            self._went_away(exc)
            return None
        if self._away:
            self._away = False
            logger.warning("rate limits: Redis answers again; limits are shared by all replicas")
        values = [int(v) for v in raw]
        self.replicas = max(1, values[7])
        r = LimitState(grant.rpm, values[1], values[2] / 1000, values[3] / 1000) if grant.rpm else None
        t = LimitState(grant.tpm, values[4], values[5] / 1000, values[6] / 1000) if grant.tpm else None
        return Verdict(bool(values[0]), r, t), values[8]

    def _get_script(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._script is None or self._loop is not loop:  # an asyncio client is bound to its loop
            from agent_cache.store.redis_client import is_cluster, make_client

            assert self.redis_url is not None
            self._client = make_client(self.redis_url, {"socket_timeout": SOCKET_TIMEOUT,
                                                        "socket_connect_timeout": SOCKET_TIMEOUT},
                                       cluster=is_cluster(self.redis_url), asyncio=True)
            self._script = self._client.register_script(SCRIPT)
            self._loop = loop
        return self._script

    def _went_away(self, exc: Exception) -> None:
        from agent_cache.store.redis_client import map_error

        self._away_until = time.monotonic() + AWAY_BACKOFF
        if not self._away:
            self._away = True
            error = exc if isinstance(exc, StoreError) else map_error(exc)
            logger.warning("rate limits: Redis did not answer (%s); this replica enforces its share of each "
                           "limit (the limit / %d replicas) until it does", error, self.replicas)


def _refusal(grant: ApiKey, verdict: Verdict) -> RequestRejectedError:
    reached = [(kind, s) for kind, s in (("requests", verdict.requests), ("tokens", verdict.tokens))
               if s is not None and s.reached]
    what = "; ".join(f"{kind} per minute: limit {s.limit}, used {s.used}" for kind, s in reached)
    share = " (this replica's share: Redis is away)" if verdict.local else ""
    wait = verdict.retry_after()
    return RequestRejectedError(
        429, f"rate limit reached for tenant {grant.tenant!r} on {what}{share}; try again in {wait} s",
        code="rate_limit_exceeded", retry_after=wait, headers=verdict.headers())


__all__ = ["LimitState", "RateLimits", "Reservation", "Verdict", "duration", "reservation_tokens"]
