"""``/ready``: whether this gateway process can serve calls now (a Kubernetes readiness probe).

``/health`` is liveness: 200 while the process serves, whatever its workers
do (restarting the gateway does not bring a worker back). ``/ready`` is 200
while at least one configured pool has a healthy worker and the metadata
store is usable. A pool with none answers its own calls 503
(``no_healthy_worker``) and is named in ``pools_down``; it does not take the
replica out of its Service, which would refuse every other pool's calls too
(one canary pool down would take every replica out at once). A store that
is unreachable still counts as usable: the gateway then routes by rendezvous
hashing (degraded mode), and taking every replica out of its Service because
Redis is away would turn a cache-hit loss into an outage. A store that refuses the gateway (password, ACL, database) does not:
every call would fail.

Neither answer names a worker URL; they are open to unauthenticated callers (probes send no
key). With API keys, ``/ready`` gives the store's state and the reason only to an admin key.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agent_cache.errors import StoreError, StoreRefusedError
from agent_cache.gateway.responses import JSONResponse
from agent_cache.routing.health import CLOSED, HALF_OPEN
from agent_cache.routing.router import Router
from agent_cache.store.base import AsyncMetadataStore

STORE_PING_TIMEOUT = 1.0  # seconds; a probe must answer well within the kubelet's timeout


@dataclass(frozen=True)
class Readiness:
    """The verdict: ``ready``, and the short reason when not (no worker URL, no secret)."""

    ready: bool
    store: str  # "ok", "degraded" (unreachable: routing by hashing) or "refused"
    reason: str | None = None
    pools_down: tuple[str, ...] = ()  # pools without a healthy worker while others have one

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ready" if self.ready else "not_ready", "store": self.store}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.pools_down:
            out["pools_down"] = list(self.pools_down)
        return out


def pools_without_healthy_worker(router: Router, *, probing: bool) -> list[str]:
    """The configured pools none of whose workers is healthy, in order of configuration.

    A worker is healthy while its breaker is closed. A half-open breaker (cooldown over, trial
    pending) counts only when nothing probes the workers: then a call is its only trial, and
    a replica kept out of its Service would never get one.
    """
    healthy_states = {CLOSED, HALF_OPEN} if not probing else {CLOSED}
    pools: dict[str, bool] = {}
    for w in router.workers:
        ok = router.health.state(w.url) in healthy_states
        pools[w.pool] = pools.get(w.pool, False) or ok
    return [pool for pool, ok in pools.items() if not ok]


async def store_state(router: Router) -> str:
    """``ok``, ``degraded`` (unreachable or too slow: calls route by hashing) or ``refused``."""
    store = router.store
    try:
        if isinstance(store, AsyncMetadataStore):
            await asyncio.wait_for(store.aping(), STORE_PING_TIMEOUT)
        else:  # a sync-only store: its ping off the event loop
            await asyncio.wait_for(asyncio.to_thread(store.ping), STORE_PING_TIMEOUT)
    except StoreRefusedError:  # the store refuses this client: every call would fail
        return "refused"
    except (StoreError, asyncio.TimeoutError):
        return "degraded"
    return "ok"


async def check_readiness(router: Router, *, probing: bool) -> Readiness:
    store = await store_state(router)
    if store == "refused":
        return Readiness(False, store, "the metadata store refuses the gateway (see its log)")
    if not router.workers:  # discovery has found none yet
        return Readiness(False, store, "no worker yet")
    missing = pools_without_healthy_worker(router, probing=probing)
    if len(missing) == len({w.pool for w in router.workers}):
        return Readiness(False, store, f"no healthy worker in any pool ({', '.join(repr(p) for p in missing)})")
    return Readiness(True, store, pools_down=tuple(missing))


async def ready_response(router: Router, *, probing: bool, detail: bool = True) -> JSONResponse:
    """The ``/ready`` answer: 200 when ready, else 503; with the store's state and the reason when
    ``detail`` (an admin's key, or a gateway without keys), else the status alone."""
    verdict = await check_readiness(router, probing=probing)
    body = verdict.body() if detail else {"status": verdict.body()["status"]}
    return JSONResponse(body, status_code=200 if verdict.ready else 503)


__all__ = ["Readiness", "check_readiness", "pools_without_healthy_worker", "ready_response", "store_state"]
