"""What follows a served call, for both doors: its template recorded, its trace written, and the hooks
given run (with KV events on, the router's view of the workers' caches learns from the call).

:meth:`Served.__call__` is the one hook each door runs once the caller has
its answer (the gateway, just before its lifecycle settles the attempt;
``ChatSGLang``, once the message is assembled). Nothing in it does I/O on
the caller's path: each part queues its work for a background thread.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from agent_cache.calls.prepare import Call
from agent_cache.routing.cache_view import CacheView
from agent_cache.routing.router import Router
from agent_cache.templates.registry import TemplateRegistry
from agent_cache.traces import TraceWriter
from agent_cache.values import Placement, Usage

Hook = Callable[[Call, Placement], None]  # run after each served call; queues its work, no I/O


class Served:
    """The bookkeeping after a served call: ``registry`` records templates, ``trace`` (optional)
    appends the call to a trace file, each of ``hooks`` is handed the call and its placement;
    :meth:`for_router` makes it from a router's options."""

    def __init__(self, registry: TemplateRegistry, trace: TraceWriter | None = None,
                 hooks: Sequence[Hook] = ()) -> None:
        self.registry = registry
        self.trace = trace
        self.hooks = tuple(hooks)

    @classmethod
    def for_router(cls, registry: TemplateRegistry, router: Router, trace: TraceWriter | None = None) -> "Served":
        """The hook for calls ``router`` places: with its KV events on (``router.kv_events``), each served
        chat call is handed to them to learn its template's and its session's tokens."""
        return cls(registry, trace, () if router.kv_events is None else (_learner(router.kv_events),))

    def __call__(self, call: Call, placement: Placement, *, usage: Usage | None = None, text: str = "",
                 messages: Sequence[dict[str, Any]] = (), tools: list[dict[str, Any]] | None = None) -> None:
        if call.prompt is not None:
            self.registry.record(placement.tenant, call.prompt, placement.session_id)  # queued: no I/O here
        for hook in self.hooks:  # queued too
            hook(call, placement)
        if self.trace is not None:
            self.trace.write(call.route.session_id, list(messages), text,
                             usage.completion_tokens if usage else None, time.time(), tools)

    def close(self) -> None:
        """The registry's and the trace's last writes; the hooks belong to whoever gave them."""
        self.registry.close()
        if self.trace is not None:
            self.trace.close()


def _learner(view: CacheView) -> Hook:
    def learn(call: Call, placement: Placement) -> None:
        if call.prompt is not None:  # chat calls: a completion's prompt is not templated
            view.learn(call.prompt.template_id, call.prompt.messages, placement)

    return learn
