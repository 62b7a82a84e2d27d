"""Where each session's last call in this process was served: a hint, never a decision.

The store decides every call (one round trip to Redis). A session's pin
moves only on failure, overload or another replica's decision, so the worker
that served its last call here is almost always where the store sends the
next one. A caller may start sending there while the store's answer is on
its way, and must drop that send when the answer names another worker
(``agent-cache serve`` does; see :mod:`agent_cache.gateway.app`).
"""

from __future__ import annotations

DEFAULT_CAPACITY = 65_536  # sessions remembered, most recent first; a forgotten one just waits for the store


class RecentWorkers:
    """A bounded map (tenant, session) -> the worker that last served it here.

    A plain dict in recency order: each write moves its key to the end and the
    oldest key goes once the map is full. Every operation is a few dict steps,
    atomic under the GIL, so threads share it without a lock (a lost race
    costs one hint).
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._last: dict[tuple[str, str], str] = {}

    def served(self, tenant: str, session_id: str, worker: str) -> None:
        key = (tenant, session_id)
        self._last.pop(key, None)
        self._last[key] = worker
        if len(self._last) > self._capacity:
            try:
                del self._last[next(iter(self._last))]
            except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                pass

    def forget(self, tenant: str, session_id: str) -> None:
        self._last.pop((tenant, session_id), None)

    def get(self, tenant: str, session_id: str) -> str | None:
        return self._last.get((tenant, session_id))

    def __len__(self) -> int:
        return len(self._last)


__all__ = ["DEFAULT_CAPACITY", "RecentWorkers"]
