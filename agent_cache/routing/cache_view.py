"""What a router asks of the workers' caches as their KV events show them: the one seam to ``agent_cache.kv``.

The router and the call pipeline import nothing of the KV event path. They
are given an object of this shape (``Router(kv_events=...)``), which
``agent_cache.kv.KvView`` is: the router asks it to mark each route's
workers, and the served hook (``calls/served.py``) hands it each served
call to learn from. Events off (``kv_events=None``), neither happens.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from agent_cache.store.base import WorkerSpec
from agent_cache.values import Placement


@runtime_checkable
class CacheView(Protocol):
    """Which workers hold a template, whether a session's prefix was evicted, and what a served call teaches."""

    def mark(self, specs: tuple[WorkerSpec, ...], template_id: str | None, *, namespace: str | None,
             session: tuple[str, str]) -> tuple[WorkerSpec, ...]:
        """The route's workers, each marked where the events tell: ``template`` "held" / "lacks" for
        ``template_id``, and the session's worker ``prefix`` "held" / "gone" for its latest prefix
        (``session``: tenant, session key; ``namespace``: the call's ``extra_key``). Unmarked otherwise:
        the store's own marks decide. No I/O."""
        ...

    def learn(self, template_id: str | None, messages: Sequence[Mapping[str, Any]], placement: Placement) -> None:
        """A served call's template and messages, learnt from the worker that served it (queued: no I/O here)."""
        ...
