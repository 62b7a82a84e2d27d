"""ChatSGLang's one seam to templates and routing.

Per call: normalise the prompt (:class:`agent_cache.templates.Templater`),
ask the :class:`agent_cache.routing.Router` for the session's worker, and
after the call feed back usage (hit statistics, pin health) or the failure
(passive health, next attempt elsewhere). The chat model itself only speaks
HTTP through the backend clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agent_cache.backends.protocol import Usage
from agent_cache.errors import BackendError, NoHealthyWorkerError
from agent_cache.routing.router import Placement, RouteRequest, Router
from agent_cache.templates import Templater


@dataclass(frozen=True)
class RoutedPrompt:
    """What goes to the worker, and the routing request for it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    request: RouteRequest
    extra_key: str | None


class _WorkerSelector:
    def __init__(self, router: Router, templater: Templater, *, tenant: str, pool: str | None) -> None:
        self.router = router
        self.templater = templater
        self.tenant = tenant
        self.pool = pool

    @property
    def workers(self) -> list[str]:
        return [w.url for w in self.router.workers]

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        session_id: str,
        variables: Mapping[str, str] | None = None,
    ) -> RoutedPrompt:
        prompt = self.templater.normalize(messages, tools, session_id=session_id, variables=variables)
        request = RouteRequest(
            session_id=session_id,
            template_id=prompt.template_id,
            tenant=self.tenant,
            pool=self.pool,
            prompt_tokens_estimate=prompt.template_tokens,
        )
        return RoutedPrompt(prompt.messages, prompt.tools, request, self.router.extra_key_for(self.tenant))

    @staticmethod
    def next_exclude(exclude: frozenset[str], failed: str, workers: Sequence[str]) -> frozenset[str]:
        """Workers to avoid on the next attempt: the failed ones, until none is left to try."""
        exclude = exclude | {failed}
        return frozenset() if exclude >= set(workers) else exclude

    def begin(self, prompt: RoutedPrompt, exclude: frozenset[str], *, retry: bool = False) -> Placement:
        try:
            return self.router.route(prompt.request, exclude=exclude)
        except NoHealthyWorkerError:
            if not retry:
                raise
            return self.router.last_resort(prompt.request, exclude=exclude)

    async def abegin(self, prompt: RoutedPrompt, exclude: frozenset[str], *, retry: bool = False) -> Placement:
        try:
            return await self.router.aroute(prompt.request, exclude=exclude)
        except NoHealthyWorkerError:
            if not retry:
                raise
            return self.router.last_resort(prompt.request, exclude=exclude)

    def succeed(self, placement: Placement, usage: Usage | None) -> None:
        self.router.done(placement)
        self.router.succeeded(placement)
        if usage is not None:
            self.router.report(placement, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens or 0)

    async def asucceed(self, placement: Placement, usage: Usage | None) -> None:
        await self.router.adone(placement)
        self.router.succeeded(placement)
        if usage is not None:
            await self.router.areport(placement, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens or 0)

    def fail(self, placement: Placement, exc: BaseException) -> None:
        self.router.done(placement)
        if isinstance(exc, BackendError) and exc.retryable:
            self.router.failed(placement, exc)

    async def afail(self, placement: Placement, exc: BaseException) -> None:
        await self.router.adone(placement)
        if isinstance(exc, BackendError) and exc.retryable:
            self.router.failed(placement, exc)
