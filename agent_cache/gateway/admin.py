"""The admin endpoints of the gateway: the fleet, changed without restarts, in smg's shapes.

- ``GET /workers``: ``{"workers": [...], "total": N, "stats": {...}}``
- ``GET /workers/{url}``: one worker
- ``POST /workers`` ``{"url": ..., "pool": ...}``: 202 ``{"status": "accepted", "worker_id", "url",
  "location", "message"}`` with a ``Location`` header
- ``DELETE /workers/{url}``: 202 ``{"status": "accepted", "worker_id", "message"}``; the worker drains
  (see :mod:`agent_cache.routing.fleet`)

A worker's id is its URL (percent-encoded in a path: ``/workers/http%3A%2F%2Fw1%3A30000``).
Errors are smg's ``{"error": message, "code": CODE}``.

Who may call them: with ``--api-keys``, a key with ``role=admin``. Without keys nobody, unless
``--admin-loopback`` opens them to clients on the loopback interface (the gateway's own
machine or pod, ``kubectl port-forward``); they never answer an unauthenticated remote caller.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
from typing import Any, Callable
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_cache.errors import ConfigError, StoreError
from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.responses import JSONResponse, bounded
from agent_cache.routing.config import parse_worker
from agent_cache.routing.discovery import parse_targets
from agent_cache.routing.fleet import (
    DEFAULT_DNS_INTERVAL,
    DEFAULT_REFRESH,
    DEFAULT_WORKER_DRAIN_TIMEOUT,
    Fleet,
    FleetConfig,
    FleetWorker,
)
from agent_cache.routing.router import Router
from agent_cache.store.fleet_board import DRAINING, open_board

MAX_ADMIN_BODY = 64 * 1024
# smg's worker fields the gateway cannot honour per worker: refused rather than silently ignored
_REFUSED_FIELDS = {"api_key": "workers share the gateway's worker key ($AGENT_CACHE_API_KEY)"}


def fleet_for(redis_url: str | None, prefix: str, router: Router, config: FleetConfig) -> Fleet:
    """The fleet of a gateway: its board in the deployment's Redis, or in this process."""
    return Fleet(router, open_board(redis_url, prefix), config)


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": bounded(message), "code": code}, status_code=status)


def _loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Admin:
    """The ``/workers`` endpoints over one fleet."""

    def __init__(self, fleet: Fleet, api_keys: object | None, authorize: Callable[[Request], ApiKey]) -> None:
        self.fleet = fleet
        self._keys = api_keys
        self._authorize = authorize

    def refusal(self, request: Request) -> JSONResponse | None:
        """None when the caller may use the admin endpoints, else the answer to send."""
        if self._keys is None:
            if self.fleet.config.admin_on_loopback and _loopback(request.client.host if request.client else None):
                return None
            return _error(403, "the admin endpoints need --api-keys with a role=admin key "
                               "(or --admin-loopback for callers on this machine)", "ADMIN_DISABLED")
        try:
            grant = self._authorize(request)
        except RequestRejectedError as exc:
            return _error(exc.status, str(exc), "UNAUTHORIZED")
        if not grant.is_admin:
            return _error(403, "this key has no role=admin", "FORBIDDEN")
        return None

    async def _loads(self) -> dict[str, int] | None:
        return await asyncio.to_thread(self.fleet.loads)

    @staticmethod
    def _info(w: FleetWorker, loads: dict[str, int] | None) -> dict[str, Any]:
        return {"id": w.url, "url": w.url, "worker_type": "regular", "connection_mode": "http",
                "is_healthy": w.healthy, "load": -1 if loads is None else loads.get(w.url, 0),
                "pool": w.pool, "state": w.state, "source": w.source}

    async def list_workers(self, request: Request) -> Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        workers, loads = self.fleet.workers(), await self._loads()
        stats = {"total_workers": len(workers), "healthy_workers": sum(w.healthy for w in workers),
                 "draining_workers": sum(w.state == DRAINING for w in workers),
                 "prefill_count": 0, "decode_count": 0, "regular_count": len(workers)}
        return JSONResponse({"workers": [self._info(w, loads) for w in workers], "total": len(workers),
                             "stats": stats})

    async def get_worker(self, request: Request) -> Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        try:
            url = parse_worker(request.path_params["worker_id"], "worker_id").url
        except ConfigError as exc:
            return _error(400, str(exc), "BAD_REQUEST")
        for w in self.fleet.workers():
            if w.url == url:
                return JSONResponse(self._info(w, await self._loads()))
        return _error(404, f"no worker {url}", "WORKER_NOT_FOUND")

    async def add_worker(self, request: Request) -> Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        body = await request.body()
        try:
            data = json.loads(body) if len(body) <= MAX_ADMIN_BODY else None
        except (ValueError, RecursionError):  # RecursionError: JSON nested past the parser's stack
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            return _error(400, 'expected a JSON object {"url": ..., "pool": ...}', "BAD_REQUEST")
        for name, why in _REFUSED_FIELDS.items():
            if data.get(name) is not None:
                return _error(400, f"{name} is not supported: {why}", "BAD_REQUEST")
        pool = data.get("pool")
        if pool is not None and (not isinstance(pool, str) or not pool):
            return _error(400, f"pool: expected a non-empty string, got {pool!r}", "BAD_REQUEST")
        try:
            entry = await asyncio.to_thread(self.fleet.add, data["url"], pool)
        except ConfigError as exc:
            return _error(409 if exc.field == "pool" else 400, str(exc), "BAD_REQUEST")
        except StoreError as exc:
            return _error(503, f"the fleet board is unavailable: {exc}", "STORE_UNAVAILABLE")
        location = "/workers/" + quote(entry.url, safe="")
        return JSONResponse({"status": "accepted", "worker_id": entry.url, "url": entry.url, "location": location,
                             "pool": entry.pool, "message": "Worker added to the fleet of every replica"},
                            status_code=202, headers={"Location": location})

    async def delete_worker(self, request: Request) -> Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        try:
            entry = await asyncio.to_thread(self.fleet.remove, request.path_params["worker_id"])
        except ConfigError as exc:
            return _error(400, str(exc), "BAD_REQUEST")
        except StoreError as exc:
            return _error(503, f"the fleet board is unavailable: {exc}", "STORE_UNAVAILABLE")
        if entry is None:
            return _error(404, f"no worker {request.path_params['worker_id']}", "WORKER_NOT_FOUND")
        return JSONResponse({"status": "accepted", "worker_id": entry.url,
                             "message": "Worker draining: removed once its calls in flight end"}, status_code=202)

    def routes(self) -> list[Route]:
        return [Route("/workers", self.list_workers, methods=["GET"]), Route("/workers", self.add_worker, methods=["POST"]),
                Route("/workers/{worker_id:path}", self.get_worker, methods=["GET"]),
                Route("/workers/{worker_id:path}", self.delete_worker, methods=["DELETE"])]


# --- command line ---------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``agent-cache serve``'s fleet flags."""
    p.add_argument("--workers-dns", action="append", metavar="[POOL=]NAME:PORT,...",
                   help="discover workers from DNS (a Kubernetes headless Service): each address of NAME "
                        "becomes http://ADDRESS:PORT; re-resolved every --workers-dns-interval s")
    p.add_argument("--workers-dns-interval", type=float, default=DEFAULT_DNS_INTERVAL, metavar="S",
                   help="seconds between DNS resolutions (default %(default)s)")
    p.add_argument("--workers-dns-hosts", metavar="FILE",
                   help="resolve the --workers-dns names from this hosts-format file instead of DNS")
    p.add_argument("--worker-drain-timeout", type=float, default=DEFAULT_WORKER_DRAIN_TIMEOUT, metavar="S",
                   help="the longest a worker removed from the fleet drains before it is dropped (default "
                        "%(default)s; --drain-timeout is the gateway's own on SIGTERM)")
    p.add_argument("--fleet-refresh", type=float, default=DEFAULT_REFRESH, metavar="S",
                   help="seconds between reads of the fleet shared through the store (default %(default)s)")
    p.add_argument("--admin-loopback", action="store_true",
                   help="without --api-keys, open the admin endpoints (/workers) to loopback clients")


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    """The :class:`FleetConfig` of parsed ``serve`` flags (ConfigError naming the flag)."""
    try:
        return _fleet_config(args)
    except ConfigError as exc:
        flag = {"dns_interval": "--workers-dns-interval", "drain_timeout": "--worker-drain-timeout",
                "refresh": "--fleet-refresh"}.get(exc.field, exc.field)
        raise ConfigError(flag, str(exc).split(": ", 1)[-1]) from None


def _fleet_config(args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(dns=parse_targets(args.workers_dns or [], "--workers-dns"),
                       dns_interval=args.workers_dns_interval, dns_hosts=args.workers_dns_hosts,
                       drain_timeout=args.worker_drain_timeout, refresh=args.fleet_refresh,
                       admin_on_loopback=args.admin_loopback)


__all__ = ["Admin", "add_arguments", "fleet_config", "fleet_for"]
