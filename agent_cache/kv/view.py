"""The workers' caches as their KV events show them: :class:`KvView`, what the rest of agent-cache is given.

A router takes it as its :class:`~agent_cache.routing.cache_view.CacheView`
(``Router(kv_events=view)``): each route's workers are marked from it
(:meth:`KvView.mark`), and the served hook of both doors (``calls/served.py``)
hands it each served call (:meth:`KvView.learn`). Inside, the state
(``state.py``) is fed by the subscriber (``indexer.py``, a thread started by
:meth:`KvView.start`) and taught templates' and sessions' tokens by the
learner (``tokens.py``, two threads asking the workers' ``/tokenize``);
their series (``metrics.py``) are served while it runs.

Whoever makes a view closes it: routers and chat models given one do not.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Sequence

from agent_cache.errors import ConfigError
from agent_cache.kv.events import KVEventBatch
from agent_cache.kv.indexer import EventSource, KvIndexer
from agent_cache.kv.metrics import KV_METRICS
from agent_cache.kv.state import KvState
from agent_cache.kv.tokens import HEAD_MIN_CHARS, TAIL_CHARS, KvTokens, trim_edges
from agent_cache.store.base import WorkerSpec
from agent_cache.values import Placement


class KvView:
    """The workers' KV events followed from ``sources`` (worker URL -> its publisher; none: fed by
    :meth:`apply`), and the tokens of templates and sessions learnt from the workers (``api_key``: theirs;
    ``tokenize(url, text)``: another way to ask)."""

    TAIL_CHARS = TAIL_CHARS  # the end of a call's last message asked for (about 1,000 tokens)
    HEAD_MIN_CHARS = HEAD_MIN_CHARS  # the shortest first message after the template asked for

    def __init__(self, sources: Mapping[str, EventSource] | None = None, *, api_key: str | None = None,
                 tokenize: Callable[[str, str], Sequence[int]] | None = None) -> None:
        if sources is not None and not all(isinstance(s, EventSource) for s in sources.values()):
            raise ConfigError("kv_events", "expected worker URL -> EventSource (agent_cache.kv.parse_sources)")
        self.sources = dict(sources or {})
        self.state = KvState()
        self.tokens = KvTokens(self.state, api_key=api_key, tokenize=tokenize)
        self.indexer: KvIndexer | None = None

    def start(self) -> "KvView":
        """Subscribe to the workers' publishers (a background thread) and serve the series; returns the view."""
        if self.sources and self.indexer is None:
            try:
                for extra in ("zmq", "msgpack"):  # the kv extra
                    importlib.import_module(extra)
            except ImportError:
                raise ConfigError("kv_events", "KV events need pyzmq and msgpack: pip install 'agent-cache[kv]'") \
                    from None
            self.indexer = KvIndexer(self.state, self.sources).start()
            KV_METRICS.add(self.indexer, self.tokens)
        return self

    # --- the router's seam (routing/cache_view.py) ---------------------------------

    def mark(self, specs: tuple[WorkerSpec, ...], template_id: str | None, *, namespace: str | None,
             session: tuple[str, str]) -> tuple[WorkerSpec, ...]:
        return self.state.annotate(template_id, specs, namespace=namespace, session=session)

    def learn(self, template_id: str | None, messages: Sequence[Mapping[str, Any]], placement: Placement) -> None:
        self.tokens.want(template_id, messages, placement.worker, tenant=placement.tenant,
                         session_id=placement.session_id)

    # --- fed directly (a simulation that knows the events and the token ids) ---------

    def apply(self, url: str, seq: int, batch: KVEventBatch) -> None:
        """One batch of ``url``'s events, numbered ``seq``, as the subscriber applies each it receives."""
        self.state.apply(url, seq, batch)

    def learn_template_ids(self, template_id: str, token_ids: Sequence[int]) -> None:
        """The template's token ids as its workers cache them (:meth:`learn` asks a worker for them)."""
        self.state.learn_template(template_id, token_ids)

    def learn_session_ids(self, tenant: str, session_id: str, worker: str, tail_ids: Sequence[int],
                          head_ids: Sequence[int] | None = None) -> None:
        """A session's latest step on ``worker``: the token ids of the end of its last message and of the start
        of its first message after the template, cut as :meth:`learn` asks for them, less their edges as
        from a worker's answer."""
        self.state.learn_session(tenant, session_id, trim_edges(tail_ids), worker,
                                 head_ids=None if head_ids is None else trim_edges(head_ids))

    def close(self) -> None:
        """Stop subscribing and asking (what is still queued is dropped)."""
        if self.indexer is not None:
            KV_METRICS.remove(self.indexer)
            self.indexer.close()
        self.tokens.close()
