"""The workers' KV cache events, followed (optional: ``pip install 'agent-cache[kv]'``; docs/routing.md,
"KV events").

The one construction point: :class:`KvView` (``view.py``) is what the rest
of agent-cache is given, as the router's
:class:`~agent_cache.routing.cache_view.CacheView`
(``Router(kv_events=KvView(parse_sources(...)).start())``); ``EventSource``
and ``parse_sources`` name the workers' publishers. ``events.py`` is
SGLang's wire format, which the simulated worker publishes. The rest is
the view's own: the state (``state.py``), the subscriber (``indexer.py``),
the token learner (``tokens.py``) and their series (``metrics.py``).

Imported on first use, so ``import agent_cache.kv.events`` stays light and
nothing here needs pyzmq until a view subscribes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_cache.lazy import lazy_exports

if TYPE_CHECKING:
    from agent_cache.kv.indexer import EventSource, parse_sources
    from agent_cache.kv.view import KvView

__getattr__ = lazy_exports(__name__, globals(), {"KvView": "agent_cache.kv.view",
                                                 "EventSource": "agent_cache.kv.indexer",
                                                 "parse_sources": "agent_cache.kv.indexer"})
__all__ = ["EventSource", "KvView", "parse_sources"]
