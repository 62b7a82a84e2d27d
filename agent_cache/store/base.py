"""The metadata store protocol and the records it exchanges with the router.

A store holds hashes and counts only (ids, worker URLs, token counts, times),
never prompt text. Times are passed in as ``now`` (seconds, float) so expiry
is testable with an injected clock; stores keep them as integer milliseconds,
which the Redis Lua script handles exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

from agent_cache.placement.rule import Policy

DEFAULT_PREFIX = "agent-cache"
# An idle agent session's history survives in SGLang's LRU radix cache for
# minutes under load; after 30 idle minutes the prefix is almost surely gone,
# so the pin no longer buys anything and the session may be placed afresh.
DEFAULT_SESSION_TTL = 30 * 60.0
# A template counts as held by a worker if it served it within this window.
DEFAULT_TEMPLATE_WINDOW = 10 * 60.0
# stats() lists at most this many templates, the most recently used: a
# deployment whose prompts differ per session has as many templates as
# sessions, and a summary of all of them would cost O(sessions) to read.
STATS_TEMPLATES = 200


def template_retention(session_ttl: float, template_window: float) -> float:
    """Seconds a template's records outlive its last use: past its last session's TTL and two template windows."""
    return max(session_ttl, 2 * template_window)


@dataclass(frozen=True)
class ReleaseBatch:
    """In-flight releases a router owes the store, safe to deliver twice.

    The router hands them to its next write (route or report), so ending a
    call costs no round trip of its own. ``totals``: worker URL -> calls that
    ``source`` (one router) has released there so far, a running total;
    ``deltas``: how many of those the store has not acknowledged. A store
    keeps the last total it applied per source and worker and applies only
    the difference, so a batch sent again after a timeout (which may have
    reached Redis after all) is not counted twice. Without a source the
    deltas apply as they are.
    """

    source: str
    totals: Mapping[str, int]
    deltas: Mapping[str, int]

    @classmethod
    def of(cls, releases: "ReleaseBatch | Mapping[str, int]") -> "ReleaseBatch":
        """A batch as it is, or plain counts (worker URL -> calls ended) applied as they are."""
        if isinstance(releases, ReleaseBatch):
            return releases
        return cls("", dict(releases), dict(releases))


Releases = Optional[ReleaseBatch]


@dataclass(frozen=True)
class UsageReport:
    """A successful call's reported usage, as the router queues it for its next store write."""

    tenant: str
    session_id: str
    worker: str
    epoch: int
    template_id: str | None
    prompt_tokens: int
    cached_tokens: int
    now: float


@dataclass(frozen=True)
class Lease:
    """Whose in-flight count a route adds, and how long that count stands unless renewed.

    ``source`` is the router (as in :class:`ReleaseBatch`). A router that
    stops renewing (its process died) loses its counts after ``seconds``
    (stores behind a network; the in-process store dies with its router).
    """

    source: str
    seconds: float


def to_ms(now: float) -> int:
    return int(now * 1000)


@dataclass(frozen=True)
class WorkerSpec:
    """A worker as the router sees it now: URL, health state, KV capacity in tokens; ``template``:
    what the worker's KV events say of the route's template ("held", "lacks"; "": no events, the
    store's own marks decide); ``prefix``: what they say of the session's latest prefix there ("held";
    "gone": evicted, the move rule treats it as lost; "": not known, the reported cached tokens decide)."""

    url: str
    state: str = "up"
    capacity: int = 1
    template: str = ""
    prefix: str = ""


@dataclass(frozen=True)
class RouteQuery:
    tenant: str
    session_id: str
    template_id: str | None
    pool: str
    workers: tuple[WorkerSpec, ...]  # the pool's workers, config order
    prompt_tokens_estimate: int = 0


@dataclass(frozen=True)
class RouteResult:
    worker: str | None  # None: the pool has no healthy worker
    outcome: str
    epoch: int
    previous: str | None = None  # the worker a moved pin came from


@runtime_checkable
class MetadataStore(Protocol):
    """Sync face. Every ``route`` is one atomic round trip, releases included.

    A store may set ``round_trip = False`` when its calls are local (the
    router then releases at once instead of batching releases).
    """

    session_ttl: float
    template_window: float

    def route(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        """Place or look up the session's worker; ``reports`` (queued usage) are applied first."""
        ...

    def report_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None: ...

    def renew(self, lease: Lease, held: Mapping[str, int], now: float, releases: Releases = None) -> None:
        """Set ``lease.source``'s in-flight counts to ``held`` (worker URL -> calls) and renew its lease."""
        ...

    def release(self, worker: str, now: float) -> None: ...

    def release_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None: ...

    def report(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
               prompt_tokens: int, cached_tokens: int, now: float, releases: Releases = None) -> None: ...

    def abandon(
        self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None, now: float,
        releases: Releases = None,
    ) -> None:
        """Undo a placement whose first call failed: its pin, KV estimate and template mark."""
        ...

    def get_session(self, tenant: str, session_id: str, now: float) -> dict[str, Any] | None: ...

    def set_worker(self, url: str, state: str, capacity: int, now: float) -> None: ...

    def record_template(
        self, tenant: str, template_id: str, token_length: int, session_id: str | None, now: float
    ) -> None: ...

    def template_info(self, tenant: str, template_id: str) -> dict[str, Any] | None: ...

    def stats(self, now: float, *, templates: bool = True) -> dict[str, Any]:
        """Workers, sessions, decisions and (unless ``templates=False``) the templates used within the window.

        At most :data:`STATS_TEMPLATES` templates are listed, the most recently
        used; ``templates_in_window`` counts them all.
        """
        ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncMetadataStore(Protocol):
    """Async face: same operations, awaitable."""

    async def aroute(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult: ...

    async def areport_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None: ...

    async def arelease(self, worker: str, now: float) -> None: ...

    async def arelease_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None: ...

    async def areport(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                      prompt_tokens: int, cached_tokens: int, now: float, releases: Releases = None) -> None: ...

    async def aabandon(
        self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None, now: float,
        releases: Releases = None,
    ) -> None: ...

    async def aping(self) -> None: ...

    async def aclose(self) -> None: ...
