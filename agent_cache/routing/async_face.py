"""The router's async face: the flows its sync methods run, run with the store's async methods.

Each router operation that talks to the store is written once as a flow of store commands
(:mod:`agent_cache.routing.store_ops`); :class:`~agent_cache.routing.router.Router` runs them with
:func:`~agent_cache.routing.store_ops.run`, and this face with :func:`~agent_cache.routing.store_ops.arun`.
"""

from __future__ import annotations

from agent_cache.routing.health import HealthTracker
from agent_cache.routing.outbox import Outbox
from agent_cache.routing.store_ops import Flow, arun
from agent_cache.store.base import MetadataStore
from agent_cache.values import Placement, RouteRequest, Usage


class AsyncFace:
    """Async ``aroute``, ``adone``, ``aflush``, ``areport``, ``asettle``, ``aabandon`` over the router's flows."""

    store: MetadataStore
    outbox: Outbox
    health: HealthTracker

    def _route(self, request: RouteRequest, exclude: set[str] | frozenset[str]) -> Flow[Placement]:
        raise NotImplementedError

    def _done(self, placement: Placement) -> Flow[None]:
        raise NotImplementedError

    def _report(self, placement: Placement, prompt_tokens: int, cached_tokens: int) -> Flow[None]:
        raise NotImplementedError

    def _settle(self, placement: Placement, error: BaseException | None, usage: Usage | None,
                judged: bool) -> Flow[None]:
        raise NotImplementedError

    def _abandon(self, placement: Placement) -> Flow[None]:
        raise NotImplementedError

    async def aroute(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        """Async :meth:`route`."""
        return await arun(self.store, self._route(request, exclude))

    async def adone(self, placement: Placement) -> None:
        """Async :meth:`done`."""
        self.health.release((placement.worker,))
        await arun(self.store, self._done(placement))

    async def aflush(self) -> None:
        """Async :meth:`flush`."""
        await arun(self.store, self.outbox.flush_flow())

    async def areport(self, placement: Placement, *, prompt_tokens: int, cached_tokens: int) -> None:
        """Async :meth:`report`."""
        await arun(self.store, self._report(placement, prompt_tokens, cached_tokens))

    async def asettle(self, placement: Placement, error: BaseException | None = None,
                      usage: Usage | None = None, *, judged: bool = True) -> None:
        """Async :meth:`settle`."""
        await arun(self.store, self._settle(placement, error, usage, judged))

    async def aabandon(self, placement: Placement) -> None:
        """Async :meth:`abandon`."""
        await arun(self.store, self._abandon(placement))
