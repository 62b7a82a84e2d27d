"""Redis metadata store: one Lua script (EVALSHA) per routing decision.

Short socket timeouts and no client-side retries: when Redis is down a call
fails fast with :class:`StoreUnavailableError` and the router switches to
degraded mode instead of stacking timeouts.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff

from agent_cache.errors import ConfigError, StoreError, StoreUnavailableError
from agent_cache.placement.rule import Policy
from agent_cache.redact import redact_url
from agent_cache.store import keys, lua
from agent_cache.store.script_runner import AsyncScriptRunner, RedisAddress, Script, ScriptRunner
from agent_cache.store.base import (
    DEFAULT_PREFIX,
    DEFAULT_SESSION_TTL,
    DEFAULT_TEMPLATE_WINDOW,
    STATS_TEMPLATES,
    Lease,
    ReleaseBatch,
    Releases,
    RouteQuery,
    RouteResult,
    UsageReport,
    WorkerSpec,
    template_retention,
    to_ms,
)

T = TypeVar("T")
ROUTE, REPORTS, ABANDON, RENEW, RELEASE = (Script.of(text) for text in (lua.ROUTE, lua.REPORTS, lua.ABANDON,
                                                                         lua.RENEW, lua.RELEASE))
_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")
_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# Redis answers but cannot take writes (maxmemory reached under noeviction, a
# replica after failover, a cluster slot moving or down): as good as away for
# routing, so the router goes degraded instead of failing the model call.
# A script stopped by one of these has written nothing: Redis refuses a
# script's first write, and a script that has written runs to its end.
_CANNOT_WRITE = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)


def validate_redis_url(url: str, field: str = "redis_url") -> str:
    """Check a Redis URL's shape; raises ConfigError naming ``field``."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(field, f"expected a Redis URL such as redis://127.0.0.1:6379/0, got {redact_url(url)!r}")
    shown = redact_url(url)  # error messages never carry the password
    try:
        parts = urlsplit(url)
        if "sentinel" in parts.scheme:  # several host:port pairs, comma-separated
            for hp in parts.netloc.rsplit("@", 1)[-1].split(","):
                host, _, port = hp.partition(":")
                if not host or (port and not 0 < int(port) < 65536):
                    raise ValueError(f"bad sentinel address {hp!r}")
        else:
            parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(field, f"invalid Redis URL {shown!r}: {redact_url(exc)}") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigError(field, f"unsupported scheme {parts.scheme!r} in {shown!r}; use one of {', '.join(_SCHEMES)}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(field, f"no socket path in {shown!r}")
    elif "sentinel" not in parts.scheme and not parts.hostname:
        raise ConfigError(field, f"no host in {shown!r}")
    if "sentinel" in parts.scheme and not parts.path.strip("/"):
        raise ConfigError(field, f"no service name in {shown!r}; use redis+sentinel://host:port/service_name")
    return url


def delete_deployment(redis_url: str, prefix: str) -> int:
    """Delete every key of the deployment ``prefix`` (its ``{prefix}`` hash tag); returns how many."""
    client = redis.Redis.from_url(redis_url)
    try:
        found = list(client.scan_iter(match=keys.tag(prefix) + "*", count=1000))
        for i in range(0, len(found), 500):
            client.delete(*found[i:i + 500])
        return len(found)
    finally:
        client.close()


# Redis answers but refuses this client: a wrong password or user, no
# password, a database index it does not have, an ACL rule without a command
# the scripts run. Retrying cannot help, so it is a configuration error
# naming redis_url, not the degraded mode an unreachable Redis gets.
_MISCONFIGURED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)
_MISCONFIGURED_REPLIES = ("NOAUTH", "NOPERM", "WRONGPASS", "DB index is out of range",
                          "can't run this command")  # the last: a command refused inside a script


def _map_errors(exc: Exception) -> StoreError | ConfigError:
    if isinstance(exc, _MISCONFIGURED) or any(reply in str(exc) for reply in _MISCONFIGURED_REPLIES):
        return ConfigError("redis_url", f"Redis refused this client ({exc}); check the user, password, database "
                                        "index and ACL rules (docs/deploying-redis.md)")
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailableError(f"redis unavailable: {exc}")
    if isinstance(exc, _CANNOT_WRITE):
        return StoreUnavailableError(f"redis cannot take writes: {exc}")
    return StoreError(f"redis error: {exc}")


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    parts = urlsplit(url)
    hosts = []
    for hp in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = hp.partition(":")
        hosts.append((host, int(port or 26379)))
    path = parts.path.strip("/").split("/")
    opts: dict[str, Any] = {}
    if parts.username:
        opts["username"] = unquote(parts.username)
    if parts.password:
        opts["password"] = unquote(parts.password)
    if len(path) > 1 and path[1]:
        opts["db"] = int(path[1])
    if parts.scheme.startswith("rediss"):
        opts["ssl"] = True
    return hosts, path[0], opts


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
        if not prefix or "{" in prefix or "}" in prefix:
            raise ConfigError("prefix", f"prefix must be non-empty without braces, got {prefix!r}")
        self.url = url
        self.prefix = prefix
        self.session_ttl = session_ttl
        self.template_window = template_window
        self._retention = template_retention(session_ttl, template_window)
        self._tag = keys.tag(prefix)
        self._cluster = cluster or (url is not None and urlsplit(url).scheme.endswith("+cluster"))
        self._options = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout, **redis_options}
        self._client = client if client is not None else self._make_sync()
        self._registered = {script: self._client.register_script(script.text)
                            for script in (ROUTE, REPORTS, ABANDON, RENEW, RELEASE)}
        self._aclient = async_client
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._aregistered: dict[Script, Any] | None = None
        # the scripts run on a pipelined connection of their own where the URL says all there is to
        # know (script_runner); redis-py connection options, TLS, Sentinel and Cluster keep redis-py's
        plain = client is None and not self._cluster and not redis_options
        address = RedisAddress.from_url(url) if url is not None and plain else None
        self._runner = ScriptRunner(address, socket_timeout) if address is not None else None
        self._arunner: AsyncScriptRunner | None = None

    # --- clients -----------------------------------------------------------------

    def _url_for_client(self) -> str:
        assert self.url is not None
        parts = urlsplit(self.url)
        if parts.scheme.endswith("+cluster"):
            return parts._replace(scheme=parts.scheme.split("+")[0]).geturl()
        return self.url

    def _make_sync(self) -> Any:
        from redis.retry import Retry

        opts = dict(self._options, retry=Retry(NoBackoff(), 0))
        scheme = urlsplit(self.url or "").scheme
        if "sentinel" in scheme:
            from redis.sentinel import Sentinel

            hosts, service, extra = _sentinel_parts(self.url or "")
            # redis-py before 8.2 leaves its synchronous Sentinel unannotated
            sentinel = Sentinel(hosts, socket_timeout=opts["socket_timeout"])  # type: ignore[no-untyped-call, unused-ignore]
            return sentinel.master_for(service, **extra, **opts)  # type: ignore[no-untyped-call, unused-ignore]
        if self._cluster:
            from redis.cluster import RedisCluster

            opts.pop("retry")
            return RedisCluster.from_url(self._url_for_client(), **opts)
        return redis.Redis.from_url(self._url_for_client(), **opts)

    def _make_async(self) -> Any:
        from redis.asyncio.retry import Retry

        opts = dict(self._options, retry=Retry(NoBackoff(), 0))
        scheme = urlsplit(self.url or "").scheme
        if "sentinel" in scheme:
            from redis.asyncio.sentinel import Sentinel

            hosts, service, extra = _sentinel_parts(self.url or "")
            # redis-py before 8.2 leaves its asyncio Sentinel constructor unannotated
            sentinel = Sentinel(hosts, socket_timeout=opts["socket_timeout"])  # type: ignore[no-untyped-call, unused-ignore]
            return sentinel.master_for(service, **extra, **opts)
        if self._cluster:
            from redis.asyncio.cluster import RedisCluster

            opts.pop("retry")
            return RedisCluster.from_url(self._url_for_client(), **opts)
        return aredis.Redis.from_url(self._url_for_client(), **opts)

    def _async(self) -> Any:
        # An asyncio client is bound to the loop that created it.
        loop = asyncio.get_running_loop()
        if self._aclient is None or (self.url is not None and self._aloop is not loop):
            if self.url is None:
                raise ConfigError("async_client", "pass async_client to use the async face without a URL")
            self._aclient = self._make_async()
            self._aregistered = None
            if self._runner is not None:  # one made for another loop goes with that loop
                self._arunner = AsyncScriptRunner(self._runner.address, self._runner.timeout)
            self._aloop = loop
        return self._aclient

    def _eval(self, script: Script, k: list[str], args: list[Any]) -> Any:
        runner = self._runner
        if runner is not None:
            return self._call(lambda: runner.evalsha(script, k, args))
        return self._call(lambda: self._registered[script](keys=k, args=args))

    async def _aeval(self, script: Script, k: list[str], args: list[Any]) -> Any:
        client = self._async()
        if self._arunner is not None:
            return await self._acall(self._arunner.evalsha(script, k, args))
        if self._aregistered is None:
            self._aregistered = {s: client.register_script(s.text) for s in (ROUTE, REPORTS, ABANDON, RELEASE)}
        return await self._acall(self._aregistered[script](keys=k, args=args))

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.exceptions.RedisError as exc:
            raise _map_errors(exc) from exc

    async def _acall(self, coro: Any) -> Any:
        try:
            return await coro
        except redis.exceptions.RedisError as exc:
            raise _map_errors(exc) from exc
        except OSError as exc:
            raise StoreUnavailableError(f"redis unavailable: {exc}") from exc

    # --- argument builders (shared by both faces) --------------------------------

    def _route_args(
        self, q: RouteQuery, policy: Policy, now: float, releases: Releases, lease: Lease | None,
        reports: Sequence[UsageReport] = (),
    ) -> tuple[list[str], list[Any]]:
        tid = q.template_id or ""
        k = [keys.session(self.prefix, q.tenant, q.session_id), keys.template(self.prefix, q.tenant, tid)]
        args: list[Any] = [
            self._tag, keys.member(q.tenant, q.session_id), tid, q.pool, q.tenant, q.session_id,
            to_ms(now), to_ms(self.session_ttl), to_ms(self.template_window),
            *_policy_args(policy), int(q.prompt_tokens_estimate), keys.member(q.tenant, tid),
            _workers_arg(q.workers), to_ms(lease.seconds) if lease else 0,
        ]  # fmt: skip
        return k, args + self._reports_args(reports) + _release_args(releases, lease.source if lease else None)

    @staticmethod
    def _route_result(raw: list[Any]) -> RouteResult:
        worker, outcome, epoch, previous = (x.decode() if isinstance(x, bytes) else x for x in raw)
        return RouteResult(worker or None, outcome, int(epoch), previous or None)

    def _reports_args(self, reports: Sequence[UsageReport]) -> list[Any]:
        """Queued usage reports as script arguments: their count, two TTLs, then 8 fields each (lua._APPLY_REPORTS)."""
        if not reports:
            return [0]
        out: list[Any] = [len(reports), 2 * to_ms(self.session_ttl), to_ms(self._retention)]
        for r in reports:
            t = r.template_id or ""
            out += [keys.member(r.tenant, r.session_id), r.worker, int(r.epoch), t, keys.member(r.tenant, t),
                    int(r.prompt_tokens), int(r.cached_tokens), to_ms(r.now)]
        return out

    def _abandon_args(self, tenant: str, sid: str, worker: str, epoch: int, tid: str | None,
                      releases: Releases) -> tuple[list[str], list[Any]]:
        k = [keys.session(self.prefix, tenant, sid), keys.template(self.prefix, tenant, tid or "")]
        return k, [self._tag, keys.member(tenant, sid), worker, int(epoch)] + _release_args(releases)

    # --- sync face ----------------------------------------------------------------

    def route(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        k, a = self._route_args(query, policy, now, releases, lease, reports)
        return self._route_result(self._eval(ROUTE, k, a))

    def renew(self, lease: Lease, held: Mapping[str, int], now: float, releases: Releases = None) -> None:
        truth = "".join(f"{url} {int(n)}\n" for url, n in held.items() if n > 0)
        args = [self._tag, to_ms(now), to_ms(lease.seconds), truth, *_release_args(releases, lease.source)]
        k = [keys.inflight(self.prefix)]
        self._eval(RENEW, k, args)

    def release(self, worker: str, now: float) -> None:
        self.release_many({worker: 1}, now)

    def release_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None:
        args = _release_args(releases)
        if args:
            k = [keys.inflight(self.prefix)]
            self._eval(RELEASE, k, [self._tag, *args])

    def report(
        self,
        tenant: str,
        session_id: str,
        worker: str,
        epoch: int,
        template_id: str | None,
        prompt_tokens: int,
        cached_tokens: int,
        now: float,
        releases: Releases = None,
    ) -> None:
        self.report_many([UsageReport(tenant, session_id, worker, epoch, template_id, prompt_tokens, cached_tokens,
                                      now)], now, releases)

    def report_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None:
        args = [self._tag, *self._reports_args(reports), *_release_args(releases)]
        k = [keys.inflight(self.prefix)]
        self._eval(REPORTS, k, args)

    def abandon(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                now: float, releases: Releases = None) -> None:
        k, a = self._abandon_args(tenant, session_id, worker, epoch, template_id, releases)
        self._eval(ABANDON, k, a)

    def get_session(self, tenant: str, session_id: str, now: float) -> dict[str, Any] | None:
        raw = self._call(lambda: self._client.hgetall(keys.session(self.prefix, tenant, session_id)))
        rec = _decode_record(raw)
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

        def run() -> None:  # expires with the template's other records (lua._TEMPLATES)
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
        return self._call(lambda: _collect_stats(self, self._client, now, templates))

    def ping(self) -> None:
        self._call(self._client.ping)

    def close(self) -> None:
        self._client.close()
        if self._runner is not None:
            self._runner.close()

    # --- async face ---------------------------------------------------------------

    async def aroute(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        k, a = self._route_args(query, policy, now, releases, lease, reports)
        return self._route_result(await self._aeval(ROUTE, k, a))

    async def arelease(self, worker: str, now: float) -> None:
        await self.arelease_many({worker: 1}, now)

    async def arelease_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None:
        args = _release_args(releases)
        if args:
            await self._aeval(RELEASE, [keys.inflight(self.prefix)], [self._tag, *args])

    async def areport(
        self,
        tenant: str,
        session_id: str,
        worker: str,
        epoch: int,
        template_id: str | None,
        prompt_tokens: int,
        cached_tokens: int,
        now: float,
        releases: Releases = None,
    ) -> None:
        await self.areport_many([UsageReport(tenant, session_id, worker, epoch, template_id, prompt_tokens,
                                             cached_tokens, now)], now, releases)

    async def areport_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None:
        args = [self._tag, *self._reports_args(reports), *_release_args(releases)]
        await self._aeval(REPORTS, [keys.inflight(self.prefix)], args)

    async def aabandon(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                       now: float, releases: Releases = None) -> None:
        k, a = self._abandon_args(tenant, session_id, worker, epoch, template_id, releases)
        await self._aeval(ABANDON, k, a)

    async def aping(self) -> None:
        await self._acall(self._async().ping())

    async def aclose(self) -> None:
        """Close the asyncio client (one made for another event loop went with that loop)."""
        client, self._aclient, self._aregistered = self._aclient, None, None
        runner, self._arunner = self._arunner, None
        if client is None:
            return
        try:
            same_loop = self._aloop is asyncio.get_running_loop()
        except RuntimeError:
            same_loop = False
        if same_loop and runner is not None:
            runner.close()
        if self.url is None or same_loop:
            await client.aclose()


_INT_FIELDS = (
    "created", "last_seen", "steps", "prompt_tokens", "cached_tokens", "last_cached", "prev_cached", "epoch",
    "held", "active", "pause", "quiet", "open",
)  # fmt: skip


@lru_cache(maxsize=64)
def _policy_args(policy: Policy) -> tuple[str, ...]:
    # repr of a float round-trips exactly, so Lua computes with the same values as Python
    return (str(to_ms(policy.live_window)), repr(float(policy.quiet_factor)), str(to_ms(policy.min_quiet)),
            repr(float(policy.balance_factor)), repr(float(policy.move_factor)), repr(float(policy.slack)))


def _workers_arg(workers: tuple[WorkerSpec, ...]) -> str:
    """The pool's workers as one script argument (fewer arguments to pack per call)."""
    return "".join(f"{w.url} {w.state} {int(w.capacity)}\n" for w in workers)


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


def _decode_record(raw: dict[Any, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else k
        val = v.decode() if isinstance(v, bytes) else v
        if key == "tprev":  # the template mark a placement replaced ('': none)
            rec[key] = int(float(val)) if val else None
        else:
            rec[key] = int(float(val)) if key in _INT_FIELDS else val
    return rec


def _collect_stats(store: RedisStore, client: Any, now: float, with_templates: bool) -> dict[str, Any]:
    p = store.prefix
    now_ms = to_ms(now)
    window = now_ms - to_ms(store.template_window)
    workers = sorted(m.decode() for m in client.smembers(keys.workers_set(p)))
    # the templates used within the window: O(live), not every template ever seen
    templates, in_window = [], 0
    if with_templates:
        used = keys.templates_in_use(p)
        in_window = int(client.zcount(used, window, "+inf"))
        templates = sorted(m.decode() for m in client.zrevrangebyscore(used, "+inf", window, start=0,
                                                                       num=STATS_TEMPLATES))
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.inflight(p))
    pipe.hgetall(keys.kv_tokens(p))
    pipe.hgetall(keys.live_sessions(p))
    for url in workers:
        pipe.hgetall(keys.worker(p, url))
    for tm in templates:
        tenant_enc, _, tid = tm.partition(":")
        tenant = unquote(tenant_enc)
        pipe.zrangebyscore(keys.template(p, tenant, tid), window, "+inf")
        pipe.hgetall(keys.template_stats(p, tenant, tid))
    pipe.hgetall(keys.outcomes(p))
    pipe.hmget(keys.usage(p), "uncached", "calls")
    inflight, kv, live_sessions, *res, usage = pipe.execute()
    # counts of routers whose lease ended (killed clients): the next route reclaims them; not counted here
    for source in client.zrangebyscore(keys.leases(p), "-inf", f"({now_ms}"):
        for url, count in client.hgetall(keys.lease(p, source.decode())).items():
            inflight[url] = max(0, int(inflight.get(url, 0)) - int(count))
    out_workers: dict[str, Any] = {}
    for i, url in enumerate(workers):
        h = {k.decode(): v.decode() for k, v in res[i].items()}
        key = url.encode()
        out_workers[url] = {
            "state": h.get("state", "up"), "capacity": int(h.get("capacity", 0)),
            "sessions": int(h.get("sessions", 0)), "inflight": int(inflight.get(key, 0)),
            "kv_tokens": int(kv.get(key, 0)), "live_sessions": int(live_sessions.get(key, 0)),
            "prompt_tokens": int(h.get("prompt_tokens", 0)),
            "cached_tokens": int(h.get("cached_tokens", 0)),
        }  # fmt: skip
    base = len(workers)
    out_templates: dict[str, Any] = {}
    for j, tm in enumerate(templates):
        tenant_enc, _, tid = tm.partition(":")
        if not tid:
            continue
        st = {k.decode(): int(v) for k, v in res[base + 2 * j + 1].items()}
        out_templates[f"{unquote(tenant_enc)}/{tid}"] = {
            "workers": sorted(w.decode() for w in res[base + 2 * j]),
            "prompt_tokens": st.get("prompt_tokens", 0),
            "cached_tokens": st.get("cached_tokens", 0),
        }
    outcomes = {k.decode(): int(v) for k, v in res[-1].items()}
    uncached, calls = (int(x or 0) for x in usage)
    return {
        "workers": out_workers,
        "templates": out_templates,
        "templates_in_window": in_window,
        "sessions": sum(w["sessions"] for w in out_workers.values()),
        "outcomes": outcomes,
        "uncached_per_call": uncached / calls if calls > 0 else None,
    }
