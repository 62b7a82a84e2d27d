"""What a router owes the store, written late: in-flight releases, usage reports and its lease.

A finished call's release and a served call's usage report ride on this
router's next store write (the next route carries them in the same
script), or are written by a background :class:`~agent_cache.background.Flusher`
within ``release_delay`` (in its thread, or in the event loop it was bound
to: :meth:`Outbox.flush_in`), so a call costs one round trip. While calls are in
flight the router's lease is renewed every ``lease / 3`` seconds, so a
router killed mid-call has its counts reclaimed by the store.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

from agent_cache.background import Flusher
from agent_cache.errors import StoreError
from agent_cache.routing.degraded import StoreAvailability
from agent_cache.routing.releases import PendingReleases
from agent_cache.routing.store_ops import Flow, StoreOp, arun, run
from agent_cache.store.base import Lease, Releases, UsageReport


class Outbox:
    """This router's owed releases, queued usage reports and lease, and the threads that write them.

    ``on_error``: told of a store error in a write (a write never raises:
    releases wait for the next one, reports are dropped).
    """

    def __init__(self, store: Any, availability: StoreAvailability, on_error: Callable[[StoreError], None],
                 clock: Callable[[], float], release_delay: float, lease: float) -> None:
        self.store = store
        self.availability = availability
        self._on_error = on_error
        self._clock = clock
        self.lease = lease
        # in-flight counts placed through the store but not yet released there:
        # deferred to the next store write, or owed while the store is unreachable
        self.pending = PendingReleases()
        self._reports: list[UsageReport] = []
        self._reports_lock = threading.Lock()
        remote = getattr(store, "round_trip", True)  # the memory store releases for free
        self._flusher = Flusher(release_delay, self.flush, "agent-cache-release") if remote and release_delay > 0 else None
        # a router with calls in flight renews its lease in the background (see renew)
        self._renewer = Flusher(lease / 3, self._renew_loop, "agent-cache-lease") if remote else None

    def lease_record(self) -> Lease:
        return Lease(self.pending.current_source(), self.lease)

    def routed(self, worker: str) -> None:
        """A route through the store counted a call in flight on ``worker``: hold it under the lease."""
        self.pending.hold(worker)
        if self._renewer is not None:
            self._renewer.kick()

    def take_reports(self) -> list[UsageReport]:
        # a failed write drops what it carried: reports are not idempotent, and only feed statistics
        # and the next decisions (a lost one costs at most one stale eviction signal)
        with self._reports_lock:
            reports, self._reports = self._reports, []
        return reports

    def queue_report(self, report: UsageReport) -> bool:
        """Queue the report for the next store write; False if it must be written now."""
        if self._flusher is None:
            return False
        with self._reports_lock:
            self._reports.append(report)
        self._flusher.kick()
        return True

    def release(self, worker: str) -> bool:
        """Owe the store one call's release on ``worker``; True if the caller should write it now."""
        self.pending.add(worker)
        if self.availability.degraded:
            return False  # paid with the first write once the store answers
        if self._flusher is not None:
            self._flusher.kick()
            return False
        return True

    def write(self, op: Callable[[Releases], StoreOp | None]) -> Flow[None]:
        """One store write carrying the releases owed (``op`` builds it); acknowledged once it succeeded."""
        if self.availability.degraded:
            return  # owed releases wait for the first write once the store answers
        releases = self.pending.take()
        command = op(releases)
        if command is None:
            return
        try:
            yield command
        except StoreError as exc:  # a Redis refusing this client fails routes, not background writes
            self._on_error(exc)
        else:
            self.pending.acknowledge(releases)

    def flush_flow(self) -> Flow[None]:
        """Write owed releases and queued reports (one round trip, none if nothing is owed)."""
        if self.availability.degraded:
            return
        reports = self.take_reports()

        def command(releases: Releases) -> StoreOp | None:
            if reports:
                return StoreOp("report_many", (reports, self._clock(), releases))
            return None if releases is None else StoreOp("release_many", (releases, self._clock()))

        yield from self.write(command)

    def flush(self) -> None:
        run(self.store, self.flush_flow())

    async def aflush(self) -> None:
        """Async :meth:`flush`."""
        await arun(self.store, self.flush_flow())

    def flush_in(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write what calls in ``loop`` (a long-lived one, running in this thread) owe in that loop, not by
        waking the flusher's thread for each (the gateway's calls)."""
        if self._flusher is not None:
            self._flusher.run_in(loop, self.aflush)

    def renew(self) -> None:
        """Tell the store what this router really has in flight and renew its lease (one round trip)."""
        run(self.store, self.write(
            lambda releases: StoreOp("renew", (self.lease_record(), self.pending.held(), self._clock(), releases))))

    def _renew_loop(self) -> None:
        self.renew()
        if self.pending.held() and self._renewer is not None:
            self._renewer.kick()  # calls still in flight: renew again in lease / 3

    def stop_flushing(self) -> None:
        if self._flusher is not None:
            self._flusher.close()

    def close(self) -> None:
        """Stop the threads; write what is owed and end the lease."""
        self.stop_flushing()
        self.flush()
        if self._renewer is not None:
            self._renewer.close()
            self.renew()
