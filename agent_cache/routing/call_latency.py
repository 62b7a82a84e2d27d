"""One call's latency series and its tenant's token counts, observed by its lifecycle for both doors.

A call's clock starts when its door has the request in hand (``ChatSGLang``:
as the call is made; the gateway: once the request body is read), and the
lifecycle's runners read it as the call goes (``CallLifecycle(started=...)``):

- route time: until its first attempt's request goes to the worker (checks,
  templating, the gateway's limits, the route and its store round trip), under
  that worker;
- and once the call ends, under the worker of its last attempt: its duration
  (to the last bytes of the answer, or to its failure) with its outcome; for a
  served call its time to first token (to the first bytes of the answer from
  the worker; a whole answer's one piece), its time per output token after
  the first, and its tenant's input, output and cached tokens.

Each series is observed once per call, whatever the attempts, so a worker's
counts are the calls it served. The times are ``time.monotonic()`` readings the
lifecycle and the attempt take anyway.
"""

from __future__ import annotations

import asyncio
import time

from agent_cache.routing.metrics import CACHED, CANCELLED, ERROR, INPUT, NO_WORKER, OK, OUTPUT, RouterMetrics
from agent_cache.values import Placement, Usage


def outcome(error: BaseException | None) -> str:
    """The ``outcome`` label of a call that ended with ``error``: ok, cancelled (the caller left: a
    generator closed, a task cancelled) or error."""
    if error is None:
        return OK
    return CANCELLED if isinstance(error, (GeneratorExit, asyncio.CancelledError)) else ERROR


class CallLatency:
    """The clock of one call that arrived at ``started`` (``time.monotonic()``), observed into ``metrics``."""

    __slots__ = ("_metrics", "_started", "_routed")

    def __init__(self, metrics: RouterMetrics, started: float) -> None:
        self._metrics = metrics
        self._started = started
        self._routed = False

    def sent(self, worker: str, at: float) -> None:
        """An attempt's request goes to ``worker`` at ``at``: the first one ends the call's route time."""
        if not self._routed:
            self._routed = True
            m = self._metrics
            m.child(m.route_duration, worker).observe(at - self._started)

    def ended(self, placement: Placement | None, error: BaseException | None, *, first_byte: float | None = None,
              answered: float | None = None, usage: Usage | None = None) -> None:
        """The call ended: ``placement``, the last attempt's (None: no worker was chosen); for a served
        call, ``first_byte`` (None: the answer came whole), ``answered`` (its last bytes) and ``usage``."""
        m = self._metrics
        worker = placement.worker if placement is not None else NO_WORKER
        at = answered if error is None and answered is not None else time.monotonic()
        m.child(m.request_duration, worker, outcome(error)).observe(at - self._started)
        if error is not None or placement is None:
            return
        first = at if first_byte is None else first_byte
        m.child(m.time_to_first_token, worker).observe(first - self._started)
        if usage is None:
            return
        if first_byte is not None and usage.completion_tokens > 1:  # the decode after the first token, per token
            m.child(m.time_per_output_token, worker).observe((at - first) / (usage.completion_tokens - 1))
        tenant = m.tenant_label(placement.tenant)
        m.child(m.tenant_tokens, tenant, INPUT).inc(usage.prompt_tokens)
        m.child(m.tenant_tokens, tenant, OUTPUT).inc(usage.completion_tokens)
        m.child(m.tenant_tokens, tenant, CACHED).inc(usage.cached_tokens or 0)
