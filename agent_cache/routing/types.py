"""What a call asks the router for and what it is given: shared by the router and the call lifecycle."""

from __future__ import annotations

from dataclasses import dataclass

from agent_cache.routing.config import DEFAULT_POOL


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
