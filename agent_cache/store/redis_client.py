"""The one Redis client of the store: redis-py, sync and asyncio, made from a URL.

Start-up checks, model calls, stats and deletes all go through what this
module makes, so they accept and refuse the same URLs, credentials and ACL
rules. Short socket timeouts and no client-side retries: when Redis is down a
call fails fast with :class:`StoreUnavailableError` and the router switches to
degraded mode instead of stacking timeouts.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis

from agent_cache.errors import ConfigError, StoreError, StoreRefusedError, StoreUnavailableError
from agent_cache.redact import redact_url
from agent_cache.store import keys

ASYNC_CONNECTIONS = 64  # per event loop (a gateway process runs one)
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")
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
# Redis answers but refuses this client: a wrong password or user, no
# password, a database index it does not have, an ACL rule without a command
# the scripts run. Retrying cannot help: StoreRefusedError, not the degraded
# mode an unreachable Redis gets. (AuthenticationError also covers redis-py's
# "AUTH <password> called without any password configured": a password given
# to a Redis that has none, refused when the client speaks RESP2.)
_REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)
# what each refusal means, by the words of Redis's reply (redis-py drops the reply's first word)
_REFUSALS = (
    ("invalid username-password pair", "WRONGPASS: a wrong user name or password"),
    ("HELLO must be called with the client already authenticated", "NOAUTH: Redis needs a password, none was given"),
    ("Authentication required", "NOAUTH: Redis needs a password, none was given"),
    ("called without any password configured", "a password was given to a Redis that has none"),
    ("Client sent AUTH, but no password is set", "a password was given to a Redis that has none"),
    ("DB index is out of range", "no such database index"),
    ("can't run this command", "NOPERM: the ACL rules do not allow a command the scripts run"),
    ("NOPERM", "NOPERM: the ACL rules do not allow this command"),
    ("NOAUTH", "NOAUTH: Redis needs a password, none was given"),
    ("WRONGPASS", "WRONGPASS: a wrong user name or password"),
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
    if parts.scheme not in SCHEMES:
        raise ConfigError(field, f"unsupported scheme {parts.scheme!r} in {shown!r}; use one of {', '.join(SCHEMES)}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(field, f"no socket path in {shown!r}")
    elif "sentinel" not in parts.scheme and not parts.hostname:
        raise ConfigError(field, f"no host in {shown!r}")
    if "sentinel" in parts.scheme and not parts.path.strip("/"):
        raise ConfigError(field, f"no service name in {shown!r}; use redis+sentinel://host:port/service_name")
    return url


def map_error(exc: Exception) -> StoreError:
    """The agent-cache error for a redis-py error (or an OSError from a socket)."""
    shown = redact_url(exc)
    cause = next((words for reply, words in _REFUSALS if reply in str(exc)), None)
    if cause is not None or isinstance(exc, _REFUSED):
        return StoreRefusedError(f"Redis refused this client ({cause or type(exc).__name__}: {shown}); check the "
                                 "user, password, database index and ACL rules (docs/deploying-redis.md)")
    if isinstance(exc, (*_UNAVAILABLE, OSError)):
        return StoreUnavailableError(f"redis unavailable: {shown}")
    if isinstance(exc, _CANNOT_WRITE):
        return StoreUnavailableError(f"redis cannot take writes: {shown}")
    return StoreError(f"redis error: {shown}")


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


def is_cluster(url: str | None) -> bool:
    return url is not None and urlsplit(url).scheme.endswith("+cluster")


def make_client(url: str, options: dict[str, Any], *, cluster: bool, asyncio: bool) -> Any:
    """A redis-py client (``redis.asyncio``'s with ``asyncio``) for a URL checked by :func:`validate_redis_url`:
    plain, TLS, unix socket, Sentinel or Cluster; ``options`` are redis-py connection options."""
    if asyncio:
        import redis.asyncio as lib
        from redis.asyncio.cluster import RedisCluster
        from redis.asyncio.retry import Retry
        from redis.asyncio.sentinel import Sentinel
    else:
        import redis as lib  # type: ignore[no-redef]
        from redis.cluster import RedisCluster  # type: ignore[assignment]
        from redis.retry import Retry  # type: ignore[assignment]
        from redis.sentinel import Sentinel  # type: ignore[assignment]
    from redis.backoff import NoBackoff

    parts = urlsplit(url)
    if "sentinel" in parts.scheme:
        hosts, service, extra = _sentinel_parts(url)
        # redis-py before 8.2 leaves its Sentinel constructors unannotated
        sentinel = Sentinel(hosts, socket_timeout=options.get("socket_timeout"))  # type: ignore[no-untyped-call, unused-ignore]
        return sentinel.master_for(service, **extra, **options, retry=Retry(NoBackoff(), 0))  # type: ignore[no-untyped-call, unused-ignore]
    if cluster or is_cluster(url):
        plain = parts._replace(scheme=parts.scheme.split("+")[0]).geturl()
        return RedisCluster.from_url(plain, **options)
    if asyncio:
        # an event loop's calls in flight each hold a connection while their script runs: at most
        # ASYNC_CONNECTIONS of them, the rest wait up to the socket timeout for one (then: unavailable)
        opts = {"max_connections": ASYNC_CONNECTIONS, "timeout": options.get("socket_timeout"), **options}
        pool = lib.BlockingConnectionPool.from_url(url, **opts, retry=Retry(NoBackoff(), 0))
        client = lib.Redis(connection_pool=pool)
        client.auto_close_connection_pool = True  # aclose() closes the pool, as from_url's client does
        return client
    return lib.Redis.from_url(url, **options, retry=Retry(NoBackoff(), 0))


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


__all__ = ["SCHEMES", "validate_redis_url", "map_error", "make_client", "delete_deployment", "is_cluster"]
