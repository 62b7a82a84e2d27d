"""Template registry: template id -> first seen, sessions, token length, in the store."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Protocol, runtime_checkable

from agent_cache.errors import StoreError
from agent_cache.templates.templater import NormalizedPrompt

logger = logging.getLogger("agent_cache.templates")


@runtime_checkable
class TemplateStore(Protocol):
    def record_template(
        self, tenant: str, template_id: str, token_length: int, session_id: str | None, now: float
    ) -> None: ...

    def template_info(self, tenant: str, template_id: str) -> dict[str, Any] | None: ...


class TemplateRegistry:
    """Records templates through the store; never stores prompt text unless ``store_text``.

    With ``store_text=True`` the stable text is kept in this object only (diagnostics).
    """

    def __init__(self, store: TemplateStore, *, store_text: bool = False,
                 clock: Callable[[], float] = time.time, dedupe: int = 50_000) -> None:
        self.store = store
        self.store_text = store_text
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str, str | None], None] = OrderedDict()
        self._dedupe = dedupe
        self._texts: dict[tuple[str, str], list[dict]] = {}

    def record(self, tenant: str, prompt: NormalizedPrompt, session_id: str | None = None) -> None:
        key = (tenant, prompt.template_id, session_id)
        if self.store_text:
            self._texts.setdefault((tenant, prompt.template_id), prompt.messages)
        if key in self._seen:  # one store write per (template, session), not per call
            self._seen.move_to_end(key)
            return
        try:
            self.store.record_template(tenant, prompt.template_id, prompt.template_tokens, session_id, self._clock())
        except StoreError as exc:  # bookkeeping only: a store outage must not fail the call
            logger.warning("template %s not recorded: %s", prompt.template_id, exc)
            return
        self._seen[key] = None
        while len(self._seen) > self._dedupe:
            self._seen.popitem(last=False)

    def info(self, tenant: str, template_id: str) -> dict[str, Any] | None:
        return self.store.template_info(tenant, template_id)

    def text(self, tenant: str, template_id: str) -> list[dict] | None:
        """Messages of the first prompt seen with this id (``store_text=True`` only)."""
        return self._texts.get((tenant, template_id))
