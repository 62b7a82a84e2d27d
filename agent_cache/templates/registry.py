"""Template registry: template id -> first seen, sessions, token length, in the store."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from agent_cache.background import Flusher
from agent_cache.errors import StoreError
from agent_cache.templates.templater import NormalizedPrompt

logger = logging.getLogger("agent_cache.templates")


@dataclass(frozen=True)
class _Record:
    tenant: str
    template_id: str
    token_length: int
    session_id: str | None
    now: float


@runtime_checkable
class TemplateStore(Protocol):
    def record_template(
        self, tenant: str, template_id: str, token_length: int, session_id: str | None, now: float
    ) -> None: ...

    def template_info(self, tenant: str, template_id: str) -> dict[str, Any] | None: ...


class TemplateRegistry:
    """Records templates through the store; never stores prompt text unless ``store_text``.

    :meth:`record` does no I/O on a store behind a network (Redis): it queues
    the record, and a background thread writes the queue ``flush_delay``
    seconds later, so template bookkeeping never slows or stalls a call.
    While the store is unreachable the queue waits (at most ``max_pending``
    records; the oldest are dropped first). One record is written per
    (template, session) among the ``dedupe`` most recent; a pair seen again
    after that is written again, which the store counts once. With ``store_text=True`` the
    stable text is kept in this object only (diagnostics).
    """

    def __init__(self, store: TemplateStore, *, store_text: bool = False,
                 clock: Callable[[], float] = time.time, dedupe: int = 1024, flush_delay: float = 0.05,
                 max_pending: int = 10_000) -> None:
        self.store = store
        self.store_text = store_text
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str, str | None], None] = OrderedDict()
        self._dedupe = dedupe
        self._texts: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._pending: deque[_Record] = deque(maxlen=max_pending)
        remote = getattr(store, "round_trip", True)  # the memory store records for free
        self._flusher = Flusher(flush_delay, self.flush, "agent-cache-templates") if remote else None

    def record(self, tenant: str, prompt: NormalizedPrompt, session_id: str | None = None) -> None:
        key = (tenant, prompt.template_id, session_id)
        with self._lock:
            if self.store_text:
                self._texts.setdefault((tenant, prompt.template_id), prompt.messages)
            if key in self._seen:  # one store write per (template, session), not per call
                self._seen.move_to_end(key)
                return
            self._seen[key] = None
            while len(self._seen) > self._dedupe:
                self._seen.popitem(last=False)
            self._pending.append(_Record(tenant, prompt.template_id, prompt.template_tokens, session_id,
                                         self._clock()))
        if self._flusher is None:
            self.flush()
        else:
            self._flusher.kick()

    def pending(self) -> int:
        """Records queued and not written yet."""
        return len(self._pending)

    def flush(self) -> None:
        """Write the queued records now; on a store error keep the rest queued for the next flush."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                rec = self._pending[0]
            try:
                self.store.record_template(rec.tenant, rec.template_id, rec.token_length, rec.session_id, rec.now)
            except StoreError as exc:  # bookkeeping only: must not fail a call
                logger.warning("%d template record(s) not written yet: %s", len(self._pending), exc)
                return
            with self._lock:
                if self._pending and self._pending[0] is rec:
                    self._pending.popleft()

    def close(self) -> None:
        """Stop the background thread and write what is queued (best effort)."""
        if self._flusher is not None:
            self._flusher.close()
        self.flush()

    def info(self, tenant: str, template_id: str) -> dict[str, Any] | None:
        return self.store.template_info(tenant, template_id)

    def text(self, tenant: str, template_id: str) -> list[dict[str, Any]] | None:
        """Messages of the first prompt seen with this id (``store_text=True`` only)."""
        return self._texts.get((tenant, template_id))
