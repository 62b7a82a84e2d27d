"""The values every layer passes up and down: what a call asks the router for (:class:`RouteRequest`), where it
was sent (:class:`Placement`) and what it used (:class:`Usage`). Plain data below every package, so the
pipeline, the router, the store's reports and telemetry share them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_POOL = "default"  # the pool of a worker, and of a call, that names none


@dataclass(frozen=True)
class RouteRequest:
    session_id: str
    template_id: str | None = None
    tenant: str = "default"
    pool: str | None = None
    prompt_tokens_estimate: int = 0


@dataclass(frozen=True)
class Placement:
    worker: str
    outcome: str  # pinned | placed_template | placed_least_load | moved:<reason> | degraded | last_resort | second_opinion
    epoch: int
    session_id: str = ""
    tenant: str = "default"
    template_id: str | None = None
    pool: str = DEFAULT_POOL


# outcomes decided without the store: nothing to release or report there
STORELESS = ("degraded", "last_resort", "second_opinion")


@dataclass(frozen=True)
class Usage:
    """Token counts of one call; ``cached_tokens`` is None when not reported."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
