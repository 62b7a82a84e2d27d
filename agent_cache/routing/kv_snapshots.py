"""Workers' resident KV pages shared by the router processes through the store (docs/routing.md, "KV events").

Every process subscribes to the workers' events itself, but one that
subscribes late (a replica added or restarted) hears a worker from the
middle of its stream: without a replay buffer that still holds the
worker's start-up reset, the worker is unknown to it until its next
``AllBlocksCleared``, which may be days away. So the processes that know a
worker write, in turn, a snapshot of its resident pages to the store (one
writer per worker and interval, ``{prefix}:kvwl:<url>``; the snapshot at
``{prefix}:kvw:<url>``, msgpack, gone ``ttl`` s after its last write), and
a process to which a worker is unknown keeps that worker's latest batches
(those of the last 10 s, bounded in events and tokens; only where this
runs, ``KvState.keep_pending_s``) and takes up the snapshot once it received the very batch the snapshot
was taken at and every one since (:meth:`KvState.install`). A snapshot of
a previous run of the worker never matches (its batch differs in
timestamp), one older than the batches kept waits for the next.

Off the call path: one thread, every ``interval`` s. The store away or
refusing (ACL rules without the commands) only leaves late processes
waiting for a reset, as before; counted.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Iterable, Protocol, runtime_checkable

from agent_cache.errors import StoreError, StoreRefusedError
from agent_cache.routing.kv_state import KvState, WorkerSnapshot

log = logging.getLogger(__name__)
DEFAULT_INTERVAL = 2.0  # s between two snapshots of a worker, and between two reads for an unknown one
DEFAULT_TTL = 30.0  # s a snapshot stays without a new write: nobody knows the worker any more
PENDING_SECONDS = 10.0  # at least, of an unknown worker's latest batches kept to bring a snapshot up to date
FORMAT = 2  # 2: resident pages (1: runs, before the events of SGLang 0.5.9+ were followed exactly)


@runtime_checkable
class WorkerSnapshotStore(Protocol):
    """A store that keeps workers' snapshots (``RedisStore``); checked by shape, so routing loads no redis
    client where none is configured."""

    def claim_worker_snapshot(self, url: str, source: str, seconds: float) -> bool: ...

    def put_worker_snapshot(self, url: str, blob: bytes, ttl: float) -> None: ...

    def worker_snapshot(self, url: str) -> bytes | None: ...


def encode(snap: WorkerSnapshot) -> bytes:
    import msgpack

    return bytes(msgpack.packb([FORMAT, snap.seq, snap.ts, snap.page_size, snap.pages, snap.anchored]))


def decode(blob: bytes) -> WorkerSnapshot:
    """Raises StoreError for a blob this version cannot read (another version's, or damaged)."""
    import msgpack

    try:
        fmt, *rest = msgpack.unpackb(blob)
    except (TypeError, ValueError, msgpack.UnpackException) as exc:
        raise StoreError(f"undecodable KV snapshot: {exc}") from exc
    if fmt != FORMAT:
        raise StoreError(f"undecodable KV snapshot: format {fmt!r}, this version reads {FORMAT}")
    try:
        seq, ts, page_size, pages, anchored = rest
        return WorkerSnapshot(int(seq), float(ts), int(page_size), [(int(h), int(n)) for h, n in pages],
                              [(int(h), [int(a) for a in found]) for h, found in anchored])
    except (TypeError, ValueError) as exc:
        raise StoreError(f"undecodable KV snapshot: {exc}") from exc


class KvSnapshots:
    """Writes snapshots of the workers ``state`` knows (in turn with the other processes) and takes up
    others' snapshots of the workers it does not."""

    def __init__(self, state: KvState, store: WorkerSnapshotStore, workers: Iterable[str], *,
                 interval: float = DEFAULT_INTERVAL, ttl: float = DEFAULT_TTL) -> None:
        self.state = state
        self.store = store
        self.workers = tuple(workers)
        self.interval = interval
        self.ttl = max(ttl, 2 * interval)
        self.source = uuid.uuid4().hex[:12]
        # worker -> (seq, ts) of the batch its last snapshot from here was taken at (ts: a restarted worker
        # numbers its batches from 0 again)
        self._written: dict[str, tuple[int, float]] = {}
        # an unknown worker's batches are kept (they cost memory) only where a snapshot may come, and only
        # the last seconds of them: a busy worker's snapshot is written again every interval
        state.keep_pending_s = max(5 * interval, PENDING_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kv-snapshots", daemon=True)
        self.written = 0
        self.installed = 0
        self.failed = 0  # store calls that failed (away, or refusing)
        self.bad = 0  # snapshots this version cannot read

    def start(self) -> "KvSnapshots":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:  # a bug here must not stop the next tries; the events path goes on regardless
                log.exception("kv snapshots: a pass failed")

    def step(self) -> None:
        """One pass: write what this process knows that changed, take up what it does not know."""
        pending = set(self.state.pending())
        for url in self.workers:
            try:
                if url in pending:
                    self._take_up(url)
                else:
                    self._write(url)
            except StoreError as exc:  # away or refusing; this worker's turn only: the others are still tried
                self.failed += 1
                if self.failed == 1 and isinstance(exc, StoreRefusedError):  # a rule, not a blip: say it once
                    log.warning("kv snapshots: the store refused (%s): a router process that subscribes late "
                                "waits for each worker's next cache reset", exc)
                else:
                    log.debug("kv snapshots: %s", exc)

    def _write(self, url: str) -> None:
        last = self.state.last_batch(url)
        if last is None or self._written.get(url) == last:
            return  # not known here, or unchanged since this process wrote it
        if not self.store.claim_worker_snapshot(url, self.source, self.interval * 0.9):
            return  # another process writes it this interval
        snap = self.state.snapshot(url)
        if snap is None:
            return
        self.store.put_worker_snapshot(url, encode(snap), self.ttl)
        self._written[url] = (snap.seq, snap.ts)
        self.written += 1

    def _take_up(self, url: str) -> None:
        blob = self.store.worker_snapshot(url)
        if blob is None:
            return
        try:
            snap = decode(blob)
        except StoreError:  # written by another version: counted, not a failure of the store
            self.bad += 1
            return
        t0 = time.perf_counter()
        outcome = self.state.install(url, snap)
        if outcome == "installed":
            self.installed += 1
            log.info("kv snapshots: %s known from another process's snapshot (batch %d, %d pages, %.1f ms)",
                     url, snap.seq, len(snap.pages), (time.perf_counter() - t0) * 1000)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)
