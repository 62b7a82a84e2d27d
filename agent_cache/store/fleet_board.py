"""The fleet board: which workers the gateway replicas route to, shared through the store.

One entry per worker URL: its pool, its state (``up``, ``draining``, or
``gone`` once a drain finished), when that state began, and who set it
(``admin`` for the ``/workers`` endpoints, ``dns`` for discovery). Workers
given on the command line need no entry; an entry overrides them (``gone``
removes one). Every replica reads the whole board on each refresh, so all of
them agree within one refresh interval.

:class:`MemoryFleetBoard` is per process; :class:`RedisFleetBoard` keeps the
board in one Redis hash of the deployment (``{prefix}:fleet``) and changes an
entry only if it is still what the writer read (a Lua compare-and-set), so
replicas that race on a drain or a discovery write agree on one outcome.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from agent_cache.store import keys, lua

UP, DRAINING, GONE = "up", "draining", "gone"
STATES = (UP, DRAINING, GONE)
_SET = lua.script("fleet_set")


@dataclass(frozen=True)
class FleetEntry:
    """One worker on the board."""

    url: str
    pool: str
    state: str  # up | draining | gone
    since: float  # when this state began (epoch seconds)
    source: str  # admin | dns

    def encode(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "url"}, sort_keys=True)

    @classmethod
    def decode(cls, url: str, raw: str | bytes) -> FleetEntry | None:
        """The entry, or None for a value this version cannot read (left alone)."""
        try:
            data = json.loads(raw)
            entry = cls(url, str(data["pool"]), str(data["state"]), float(data["since"]), str(data["source"]))
        except (ValueError, TypeError, KeyError, RecursionError):
            return None
        return entry if entry.state in STATES else None


class FleetBoard(Protocol):
    def entries(self) -> dict[str, FleetEntry]:
        """Every entry, by worker URL."""

    def replace(self, entry: FleetEntry, expected: FleetEntry | None) -> bool:
        """Write ``entry`` if the board still holds ``expected`` for its URL (None: no entry); True if written."""

    def delete(self, expected: FleetEntry) -> bool:
        """Delete the URL's entry if the board still holds ``expected``; True if deleted."""

    def close(self) -> None: ...


class MemoryFleetBoard:
    """The board of one process (the in-process store's deployments are one process)."""

    def __init__(self) -> None:
        self._entries: dict[str, str] = {}
        self._lock = threading.Lock()

    def entries(self) -> dict[str, FleetEntry]:
        with self._lock:
            raw = dict(self._entries)
        return {url: e for url, value in raw.items() if (e := FleetEntry.decode(url, value)) is not None}

    def replace(self, entry: FleetEntry, expected: FleetEntry | None) -> bool:
        with self._lock:
            if self._entries.get(entry.url, "") != (expected.encode() if expected else ""):
                return False
            self._entries[entry.url] = entry.encode()
            return True

    def delete(self, expected: FleetEntry) -> bool:
        with self._lock:
            if self._entries.get(expected.url) != expected.encode():
                return False
            del self._entries[expected.url]
            return True

    def close(self) -> None:
        return None


class RedisFleetBoard:
    """The board in Redis, shared by every replica of the deployment ``prefix``."""

    def __init__(self, url: str, prefix: str, *, socket_timeout: float = 0.5) -> None:
        import redis  # only where a deployment has Redis

        from agent_cache.store.redis_client import is_cluster, make_client, map_error, validate_redis_url

        self._failures = (redis.exceptions.RedisError, OSError)
        self._map_error = map_error
        validate_redis_url(url)
        self.key = keys.fleet(keys.check_prefix(prefix))
        options = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
        self._client: Any = make_client(url, options, cluster=is_cluster(url), asyncio=False)
        self._set = self._client.register_script(_SET)

    def entries(self) -> dict[str, FleetEntry]:
        try:
            raw = self._client.hgetall(self.key)
        except self._failures as exc:
            raise self._map_error(exc) from exc
        out = {}
        for field, value in raw.items():
            url = field.decode(errors="replace") if isinstance(field, bytes) else str(field)
            entry = FleetEntry.decode(url, value)
            if entry is not None:
                out[url] = entry
        return out

    def replace(self, entry: FleetEntry, expected: FleetEntry | None) -> bool:
        return self._compare_and_set(entry.url, expected.encode() if expected else "", entry.encode())

    def delete(self, expected: FleetEntry) -> bool:
        return self._compare_and_set(expected.url, expected.encode(), "")

    def _compare_and_set(self, url: str, expected: str, new: str) -> bool:
        try:
            return bool(self._set(keys=[self.key], args=[url, expected, new]))
        except self._failures as exc:
            raise self._map_error(exc) from exc

    def close(self) -> None:
        self._client.close()


def open_board(redis_url: str | None, prefix: str) -> FleetBoard:
    """The board for a deployment: in Redis when it has one, else in this process."""
    return MemoryFleetBoard() if redis_url is None else RedisFleetBoard(redis_url, prefix)


__all__ = ["DRAINING", "GONE", "STATES", "UP", "FleetBoard", "FleetEntry", "MemoryFleetBoard", "RedisFleetBoard",
           "open_board"]
