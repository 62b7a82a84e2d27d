"""What follows a served call, for both doors: its template recorded, its trace written, and with
KV events on, its template's and its last message's tokens learnt (``routing/kv_tokens.py``).

:meth:`Served.__call__` is the one hook each door runs once the caller has
its answer (the gateway, just before its lifecycle settles the attempt;
``ChatSGLang``, once the message is assembled). Nothing in it does I/O on
the caller's path: each part queues its work for a background thread.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from agent_cache.backends.protocol import Usage
from agent_cache.calls.prepare import Call
from agent_cache.routing.kv_tokens import KvTokens
from agent_cache.routing.router import Router
from agent_cache.routing.types import Placement
from agent_cache.templates.registry import TemplateRegistry
from agent_cache.traces import TraceWriter


class Served:
    """The bookkeeping after a served call: ``registry`` records templates, ``trace`` (optional)
    appends the call to a trace file, ``template_tokens`` (optional) learns templates' token ids;
    :meth:`for_router` makes it from a router's options."""

    def __init__(self, registry: TemplateRegistry, trace: TraceWriter | None = None,
                 template_tokens: KvTokens | None = None) -> None:
        self.registry = registry
        self.trace = trace
        self.template_tokens = template_tokens

    @classmethod
    def for_router(cls, registry: TemplateRegistry, router: Router, trace: TraceWriter | None = None, *,
                   api_key: str | None = None) -> "Served":
        """The hook for calls ``router`` places: with its KV events on, templates' and sessions' tokens are
        learnt from the workers (``api_key``: theirs)."""
        kv = router.kv_events
        learner = None if kv is None else KvTokens(kv, api_key=api_key)
        return cls(registry, trace, learner)

    def __call__(self, call: Call, placement: Placement, *, usage: Usage | None = None, text: str = "",
                 messages: Sequence[dict[str, Any]] = (), tools: list[dict[str, Any]] | None = None) -> None:
        if call.prompt is not None:
            self.registry.record(placement.tenant, call.prompt, placement.session_id)  # queued: no I/O here
            if self.template_tokens is not None:  # queued too
                self.template_tokens.want(call.prompt.template_id, call.prompt.messages, placement.worker,
                                          tenant=placement.tenant, session_id=placement.session_id)
        if self.trace is not None:
            self.trace.write(call.route.session_id, list(messages), text,
                             usage.completion_tokens if usage else None, time.time(), tools)

    def close(self) -> None:
        self.registry.close()
        if self.template_tokens is not None:
            self.template_tokens.close()
        if self.trace is not None:
            self.trace.close()
