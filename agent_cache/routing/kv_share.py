"""Sessions' prefix fingerprints shared by every router process through the store (docs/routing.md, "KV events").

A session's fingerprints are learnt by the process that served its call
(``kv_tokens.py``), but with several gateway replicas behind a load balancer
its next step may be routed by another one. So each session learnt (or
forgotten) here is appended to one capped Redis stream of the deployment
(``{prefix}:kvs``, about ``max_records`` kept), and every process reads the
stream and adopts what the others learnt into its own ``KvState``. The
workers' events themselves are not shared: every process subscribes to
them, so all of them see the same resident tokens.

Off the call path both ways: a learnt session only queues its record
(:meth:`KvShare.publish`), a thread appends it; another thread reads the
stream every ``poll`` s. A record carries when its step was served: one
older than what a process knows of the session is not adopted, so a slow
ask never undoes a later step learnt elsewhere.

At start a process reads everything the stream still holds, so a restarted
replica knows the sessions learnt while it was away. Records may be missed
when the store was unreachable, or when the stream was trimmed (or lost,
a Redis restart) past the last one read: then every session's fingerprints
are forgotten, as if none had been learnt, and the stream is read again
from its oldest record. A record not appended (a full queue, the store
away) leaves the other processes with the session's previous step.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any, Protocol, runtime_checkable

from agent_cache.background import Jobs
from agent_cache.errors import StoreError
from agent_cache.routing.kv_state import KvState, SessionPrint

log = logging.getLogger(__name__)
DEFAULT_MAX_RECORDS = 20_000  # 11.5 MB in Redis with two 8-anchor fingerprints each (MEMORY USAGE)
DEFAULT_POLL = 0.05  # s between reads: a step's record is seen elsewhere long before the session's next step
READ_COUNT = 1_000
MAX_QUEUED = 1_024
RETRY_AFTER = 1.0  # s between reads while the store does not answer
OLDEST = "-"


@runtime_checkable
class SessionPrintLog(Protocol):
    """A store that carries the stream (``RedisStore``); checked by shape, so that routing loads no redis client
    where none is configured."""

    def append_session_print(self, record: str, max_records: int) -> None: ...

    def session_prints(self, since: str, count: int) -> list[tuple[str, str]]: ...


class KvShare:
    """Appends the sessions ``state`` learns here to the store's stream, and adopts the others' into it."""

    def __init__(self, state: KvState, store: SessionPrintLog, *, max_records: int = DEFAULT_MAX_RECORDS,
                 poll: float = DEFAULT_POLL) -> None:
        self.state = state
        self.store = store
        self.max_records = max_records
        self.poll = poll
        self.source = uuid.uuid4().hex[:12]  # this process's records, not adopted again while reading on
        self._writes = Jobs(self._append, "kv-share-append", max_queued=MAX_QUEUED, join_timeout=2.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read_loop, name="kv-share-read", daemon=True)
        self.shared = 0  # records appended
        self.adopted = 0  # other processes' records applied here
        self.dropped = 0  # records not appended: the queue full, or the store away
        self.resets = 0  # times every session was forgotten: records may have been missed
        self.bad = 0  # records this version cannot read (skipped)
        self._bad_logged = False

    def start(self) -> "KvShare":
        self._thread.start()
        return self

    # --- writing --------------------------------------------------------------------

    def publish(self, tenant: str, session_id: str, at: float) -> None:
        """Queue the session's record as ``state`` knows it when appended (a forget when it knows nothing);
        ``at``: when the step it learnt or forgot was served. No I/O here."""
        if not self._writes.submit(tenant, session_id, at):
            self.dropped += 1

    def _append(self, tenant: str, session_id: str, at: float) -> None:
        known = self.state.session_print(tenant, session_id)
        if known is None:
            record: list[Any] = [self.source, tenant, session_id, at]
        else:
            record = [self.source, tenant, session_id, known.at, known.worker, list(known.tail), list(known.head),
                      known.head_text]
        try:
            self.store.append_session_print(json.dumps(record, separators=(",", ":")), self.max_records)
            self.shared += 1
        except StoreError as exc:  # away, or refusing (ACL rules without XADD / XRANGE)
            self.dropped += 1
            log.debug("a session's fingerprints were not shared: %s", exc)

    # --- reading --------------------------------------------------------------------

    def _read_loop(self) -> None:
        since, failing = OLDEST, False
        while not self._stop.is_set():
            try:
                found = self.store.session_prints(since, READ_COUNT + 1)
            except StoreError as exc:
                if not failing:
                    log.warning("sessions' fingerprints from other router processes unread: %s", exc)
                failing = True
                self._stop.wait(RETRY_AFTER)
                continue
            except Exception as exc:  # a stream entry the client cannot even read: never the reader's end
                self.bad += 1
                log.warning("the sessions' stream could not be read (%s: %s)", type(exc).__name__, str(exc)[:120])
                self._stop.wait(RETRY_AFTER)
                continue
            if failing or (since != OLDEST and (not found or found[0][0] != since)):
                # records may have been missed (the store away, or the stream trimmed past the last one read):
                # known sessions may be stale, so none is known; then everything the stream holds is read again
                self.state.forget_sessions()
                self.resets += 1
                since, failing = OLDEST, False
                continue
            replay = since == OLDEST  # own records too: forgotten or never known here
            new = found if replay else found[1:]
            for _, record in new:
                self._adopt(record, replay)
            if new:
                since = new[-1][0]
            if len(new) < READ_COUNT:
                self._stop.wait(self.poll)

    def _adopt(self, raw: str, own_too: bool) -> None:
        """Adopt one record; one that is not what ``_append`` writes (any other process may write the stream)
        is counted, logged once and skipped."""
        try:
            record = json.loads(raw)
            if not isinstance(record, list) or len(record) not in (4, 8):
                raise ValueError("not a session record")
            source, tenant, session_id, at = str(record[0]), str(record[1]), str(record[2]), float(record[3])
            if source == self.source and not own_too:
                return
            if len(record) == 4:
                self.state.forget_session(tenant, session_id, at=at)
            else:
                worker, tail, head, head_text = str(record[4]), record[5], record[6], int(record[7])
                self.state.adopt_session(tenant, session_id, SessionPrint(
                    worker, tuple(int(a) for a in tail), tuple(int(a) for a in head), head_text, at))
        except (ValueError, TypeError, IndexError, KeyError, RecursionError) as exc:
            self.bad += 1
            if not self._bad_logged:
                self._bad_logged = True
                log.warning("a record of the sessions' stream was skipped (%s: %s); counted in "
                            "agent_cache_kv_session_records_skipped_total, not logged again", type(exc).__name__,
                            str(exc)[:120])
            return
        self.adopted += source != self.source

    def close(self) -> None:
        """Stop reading; what is still queued to append is dropped, an append under way ends first."""
        self._stop.set()
        self._writes.close()
        if self._thread.is_alive():
            self._thread.join(timeout=RETRY_AFTER + 2)
