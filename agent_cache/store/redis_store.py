"""Redis metadata store: one Lua script (EVALSHA) per routing decision.

Every operation is built once as a pure :class:`_Script` call (script, keys,
arguments) and run by a thin sync or async runner on redis-py
(:mod:`agent_cache.store.redis_client`), whose ``Script`` loads a script again
when Redis answers NOSCRIPT (a restarted or flushed server).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence, TypeVar

import redis

from agent_cache.errors import ConfigError, StoreRefusedError
from agent_cache.placement.rule import Policy
from agent_cache.store import keys, lua
from agent_cache.store.base import (DEFAULT_PREFIX, DEFAULT_SESSION_TTL, DEFAULT_TEMPLATE_WINDOW, Lease, ReleaseBatch,
                                    Releases, RouteQuery, RouteResult, UsageReport, WorkerSpec, template_retention, to_ms)
from agent_cache.store.redis_client import delete_deployment, is_cluster, make_client, map_error, validate_redis_url
from agent_cache.store.redis_stats import collect_stats, decode_record

T = TypeVar("T")
_SCRIPTS = {"route": lua.ROUTE, "reports": lua.REPORTS, "abandon": lua.ABANDON, "renew": lua.RENEW,
            "release": lua.RELEASE, "check": lua.script("check")}
# what the check script asks Redis about: every command the scripts run, and those of template records
_CHECKED = sorted(set(lua.commands("".join(_SCRIPTS.values()))) | {"HSETNX", "PFADD", "PFCOUNT"})


@dataclass(frozen=True)
class _Script:
    """One script call, built without I/O: which script, its keys and its arguments."""

    name: str
    keys: list[str]
    args: list[Any]


class RedisStore:
    """Metadata store on Redis (plain, TLS, unix socket, Sentinel or Cluster).

    ``url`` schemes: ``redis://``, ``rediss://`` (TLS), ``unix://``,
    ``redis+sentinel://host:port[,host:port]/service_name[/db]``,
    ``redis+cluster://host:port`` (or ``cluster=True``). Pass ``client`` /
    ``async_client`` to bring your own redis-py clients.
    """

    round_trip = True  # every call costs a network round trip: the router batches releases

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        session_ttl: float = DEFAULT_SESSION_TTL,
        template_window: float = DEFAULT_TEMPLATE_WINDOW,
        socket_timeout: float = 0.25,
        cluster: bool = False,
        client: Any = None,
        async_client: Any = None,
        **redis_options: Any,
    ) -> None:
        if url is None and client is None:
            raise ConfigError("redis_url", "pass a Redis URL or a client")
        if url is not None:
            validate_redis_url(url)
        keys.check_prefix(prefix)
        self.url = url
        self.prefix = prefix
        self.session_ttl = session_ttl
        self.template_window = template_window
        self._retention = template_retention(session_ttl, template_window)
        self._tag = keys.tag(prefix)
        self._keys = keys.script_keys(prefix)  # declared first by every script call (keys.SCRIPT_KEYS)
        self._cluster = cluster or is_cluster(url)
        self._options = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout, **redis_options}
        self._client = client if client is not None else self._make(asyncio=False)
        self._scripts = {name: self._client.register_script(text) for name, text in _SCRIPTS.items()}
        self._aclient = async_client
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._ascripts: dict[str, Any] | None = None

    # --- clients and runners ------------------------------------------------------

    def _make(self, *, asyncio: bool) -> Any:
        assert self.url is not None
        return make_client(self.url, dict(self._options), cluster=self._cluster, asyncio=asyncio)

    def _async(self) -> Any:
        # An asyncio client is bound to the loop that created it.
        loop = asyncio.get_running_loop()
        if self._aclient is None or (self.url is not None and self._aloop is not loop):
            if self.url is None:
                raise ConfigError("async_client", "pass async_client to use the async face without a URL")
            self._aclient = self._make(asyncio=True)
            self._ascripts = None
            self._aloop = loop
        return self._aclient

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise map_error(exc) from exc

    async def _acall(self, coro: Any) -> Any:
        try:
            return await coro
        except (redis.exceptions.RedisError, OSError) as exc:
            raise map_error(exc) from exc

    def _run(self, call: _Script | None) -> Any:
        if call is None:
            return None
        return self._call(lambda: self._scripts[call.name](keys=call.keys, args=call.args))

    async def _arun(self, call: _Script | None) -> Any:
        if call is None:
            return None
        client = self._async()
        if self._ascripts is None:
            self._ascripts = {name: client.register_script(text) for name, text in _SCRIPTS.items()}
        return await self._acall(self._ascripts[call.name](keys=call.keys, args=call.args))

    # --- script calls (shared by both faces) --------------------------------------

    def _route_call(
        self, q: RouteQuery, policy: Policy, now: float, releases: Releases, lease: Lease | None,
        reports: Sequence[UsageReport] = (),
    ) -> _Script:
        tid = q.template_id or ""
        k = [*self._keys, keys.session(self.prefix, q.tenant, q.session_id), keys.template(self.prefix, q.tenant, tid)]
        args: list[Any] = [
            self._tag, keys.member(q.tenant, q.session_id), tid, q.pool, q.tenant, q.session_id,
            to_ms(now), to_ms(self.session_ttl), to_ms(self.template_window),
            *_policy_args(policy), int(q.prompt_tokens_estimate), keys.member(q.tenant, tid),
            _workers_arg(q.workers), to_ms(lease.seconds) if lease else 0,
        ]  # fmt: skip
        args += self._reports_args(reports) + _release_args(releases, lease.source if lease else None)
        return _Script("route", k, args)

    def _reports_args(self, reports: Sequence[UsageReport]) -> list[Any]:
        """Queued usage reports as script arguments: their count, two TTLs, then 8 fields each (reports_apply.lua)."""
        if not reports:
            return [0]
        out: list[Any] = [len(reports), 2 * to_ms(self.session_ttl), to_ms(self._retention)]
        for r in reports:
            t = r.template_id or ""
            out += [keys.member(r.tenant, r.session_id), r.worker, int(r.epoch), t, keys.member(r.tenant, t),
                    int(r.prompt_tokens), int(r.cached_tokens), to_ms(r.now)]
        return out

    def _reports_call(self, reports: Sequence[UsageReport], releases: Releases) -> _Script:
        args = [self._tag, *self._reports_args(reports), *_release_args(releases)]
        return _Script("reports", list(self._keys), args)

    def _release_call(self, releases: ReleaseBatch | Mapping[str, int]) -> _Script | None:
        args = _release_args(releases)
        return _Script("release", list(self._keys), [self._tag, *args]) if args else None

    def _abandon_call(self, tenant: str, sid: str, worker: str, epoch: int, tid: str | None,
                      releases: Releases) -> _Script:
        k = [*self._keys, keys.session(self.prefix, tenant, sid), keys.template(self.prefix, tenant, tid or "")]
        return _Script("abandon", k, [self._tag, keys.member(tenant, sid), worker, int(epoch),
                                      *_release_args(releases)])

    def _check_call(self) -> _Script:
        return _Script("check", [keys.inflight(self.prefix)], list(_CHECKED))

    @staticmethod
    def _refused(command: Any) -> None:
        if command:
            name = command.decode() if isinstance(command, bytes) else str(command)
            raise StoreRefusedError(f"Redis refused this client: its ACL rules do not allow {name} on the "
                                    "deployment's keys (docs/deploying-redis.md)")

    # --- sync face ----------------------------------------------------------------

    def route(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        return _route_result(self._run(self._route_call(query, policy, now, releases, lease, reports)))

    def renew(self, lease: Lease, held: Mapping[str, int], now: float, releases: Releases = None) -> None:
        truth = "".join(f"{url} {int(n)}\n" for url, n in held.items() if n > 0)
        args = [self._tag, to_ms(now), to_ms(lease.seconds), truth, *_release_args(releases, lease.source)]
        self._run(_Script("renew", list(self._keys), args))

    def release(self, worker: str, now: float) -> None:
        self.release_many({worker: 1}, now)

    def release_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None:
        self._run(self._release_call(releases))

    def report(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
               prompt_tokens: int, cached_tokens: int, now: float, releases: Releases = None) -> None:
        report = UsageReport(tenant, session_id, worker, epoch, template_id, prompt_tokens, cached_tokens, now)
        self._run(self._reports_call([report], releases))

    def report_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None:
        self._run(self._reports_call(reports, releases))

    def abandon(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                now: float, releases: Releases = None) -> None:
        self._run(self._abandon_call(tenant, session_id, worker, epoch, template_id, releases))

    def check(self) -> None:
        """Raise what a model call would meet: StoreUnavailableError if Redis cannot be reached,
        StoreRefusedError if it refuses this client's credentials, database or ACL rules (the
        commands the scripts run on this deployment's keys, asked of Redis 7+). Writes nothing."""
        self._refused(self._run(self._check_call()))

    def get_session(self, tenant: str, session_id: str, now: float) -> dict[str, Any] | None:
        raw = self._call(lambda: self._client.hgetall(keys.session(self.prefix, tenant, session_id)))
        rec = decode_record(raw)
        if not rec or rec["last_seen"] < to_ms(now) - to_ms(self.session_ttl):
            return None
        return rec

    def set_worker(self, url: str, state: str, capacity: int, now: float) -> None:
        mapping = {"state": state, "capacity": int(capacity), "updated": to_ms(now)}
        self._call(lambda: self._client.hset(keys.worker(self.prefix, url), mapping=mapping))

    def record_template(
        self, tenant: str, template_id: str, token_length: int, session_id: str | None, now: float
    ) -> None:
        info = keys.template_info(self.prefix, tenant, template_id)
        sessions = keys.template_sessions(self.prefix, tenant, template_id)
        retention = to_ms(self._retention)

        def run() -> None:  # expires with the template's other records (templates.lua)
            pipe = self._client.pipeline(transaction=not self._cluster)
            pipe.hsetnx(info, "first_seen", repr(float(now)))
            pipe.hset(info, "token_length", int(token_length))
            pipe.pexpire(info, retention)
            if session_id is not None:
                pipe.pfadd(sessions, session_id)
                pipe.pexpire(sessions, retention)
            pipe.execute()

        self._call(run)

    def template_info(self, tenant: str, template_id: str) -> dict[str, Any] | None:
        info = keys.template_info(self.prefix, tenant, template_id)

        def run() -> list[Any]:
            sessions = keys.template_sessions(self.prefix, tenant, template_id)
            if self._cluster:  # redis-py refuses PFCOUNT in a cluster pipeline
                return [self._client.hgetall(info), self._client.pfcount(sessions)]
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(info)
            pipe.pfcount(sessions)
            replies: list[Any] = pipe.execute()  # one reply per queued command
            return replies

        raw, count = self._call(run)
        if not raw:
            return None
        d = {k.decode(): v.decode() for k, v in raw.items()}
        return {"first_seen": float(d["first_seen"]), "sessions": int(count), "token_length": int(d["token_length"])}

    def stats(self, now: float, *, templates: bool = True) -> dict[str, Any]:
        return self._call(lambda: collect_stats(self.prefix, self.template_window, self._client, now, templates))

    def ping(self) -> None:
        self._call(self._client.ping)

    def close(self) -> None:
        self._client.close()

    # --- async face ---------------------------------------------------------------

    async def aroute(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        return _route_result(await self._arun(self._route_call(query, policy, now, releases, lease, reports)))

    async def arelease(self, worker: str, now: float) -> None:
        await self.arelease_many({worker: 1}, now)

    async def arelease_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None:
        await self._arun(self._release_call(releases))

    async def areport(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                      prompt_tokens: int, cached_tokens: int, now: float, releases: Releases = None) -> None:
        report = UsageReport(tenant, session_id, worker, epoch, template_id, prompt_tokens, cached_tokens, now)
        await self._arun(self._reports_call([report], releases))

    async def areport_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None:
        await self._arun(self._reports_call(reports, releases))

    async def aabandon(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                       now: float, releases: Releases = None) -> None:
        await self._arun(self._abandon_call(tenant, session_id, worker, epoch, template_id, releases))

    async def acheck(self) -> None:
        """:meth:`check` on the asyncio client (the one model calls in this event loop use)."""
        self._refused(await self._arun(self._check_call()))

    async def aping(self) -> None:
        await self._acall(self._async().ping())

    async def aclose(self) -> None:
        """Close the asyncio client (one made for another event loop went with that loop)."""
        client, self._aclient, self._ascripts = self._aclient, None, None
        if client is None:
            return
        try:
            same_loop = self._aloop is asyncio.get_running_loop()
        except RuntimeError:
            same_loop = False
        if self.url is None or same_loop:
            await client.aclose()


def _route_result(raw: list[Any]) -> RouteResult:
    worker, outcome, epoch, previous = (x.decode() if isinstance(x, bytes) else x for x in raw)
    return RouteResult(worker or None, outcome, int(epoch), previous or None)


@lru_cache(maxsize=64)
def _policy_args(policy: Policy) -> tuple[str, ...]:
    # repr of a float round-trips exactly, so Lua computes with the same values as Python
    return (str(to_ms(policy.live_window)), repr(float(policy.quiet_factor)), str(to_ms(policy.min_quiet)),
            repr(float(policy.balance_factor)), repr(float(policy.move_factor)), repr(float(policy.slack)))


def _workers_arg(workers: tuple[WorkerSpec, ...]) -> str:
    """The pool's workers as one script argument (fewer arguments to pack per call)."""
    return "".join(f"{w.url} {w.state} {int(w.capacity)}{' ' + w.template if w.template else ''}"
                   f"{' prefix=' + w.prefix if w.prefix else ''}\n" for w in workers)


def _release_args(releases: ReleaseBatch | Mapping[str, int] | None, source: str | None = None) -> list[Any]:
    """A release batch as the scripts' trailing arguments: source, then ``url, total, delta`` triples.

    ``source``: the router to name even with nothing to release (its lease).
    """
    releases = ReleaseBatch.of(releases) if releases is not None else None
    if releases is None or not releases.totals:
        return [source] if source else []
    out: list[Any] = [releases.source]
    for url, total in releases.totals.items():
        out += [url, int(total), int(releases.deltas[url])]
    return out


__all__ = ["RedisStore", "validate_redis_url", "delete_deployment"]
