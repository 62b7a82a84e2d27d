"""Subscribes to workers' KV event publishers and feeds a :class:`~agent_cache.kv.state.KvState`.

One background thread, one ZeroMQ SUB socket per worker (connected to the
endpoint the worker's ``--kv-events-config`` binds, e.g. ``tcp://*:5557``
on the worker is ``tcp://worker-host:5557`` here). Never on a call's path:
routes read the state the thread keeps. With a worker's replay endpoint,
the thread asks for what it missed: at start, everything the worker still
buffers from its start-up reset on (so an idle worker is known at once);
from sequence 0 when it first hears the worker (so it sees the start-up ``AllBlocksCleared`` while the
publisher still buffers it), and from the first lost sequence number on a
gap or after the publisher's connection dropped (the worker may have
restarted, its first batches sent before this socket reconnected).
Without one, a gap or a dropped connection leaves the worker unknown (the
router's own marks decide for it) until its next ``AllBlocksCleared``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from agent_cache.errors import ConfigError
from agent_cache.kv.events import AllBlocksCleared, decode_batch, sequence_of
from agent_cache.kv.state import KvState

log = logging.getLogger(__name__)
REPLAY_TIMEOUT_MS = 2000
REPLAY_SILENT_S = 30.0  # a replay endpoint that did not answer is left alone this long
ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True)
class EventSource:
    """Where one worker publishes: its PUB endpoint, optional replay endpoint and topic."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


class KvIndexer:
    """A thread that applies every worker's published batches to ``state``."""

    def __init__(self, state: KvState, sources: Mapping[str, EventSource]) -> None:
        import zmq

        self.state = state
        self.sources = dict(sources)
        self._ctx: Any = zmq.Context.instance()
        self._subs: dict[Any, str] = {}
        self._monitors: dict[Any, str] = {}  # a publisher that went away may come back as a new process
        for url, src in self.sources.items():
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
            self._monitors[sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)] = url
            sub.connect(src.endpoint)
            self._subs[sub] = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kv-indexer", daemon=True)
        self._resync: set[str] = set()  # workers whose publisher connection dropped
        self._replayed_upto: dict[str, int] = {}  # worker -> the last batch applied from its replay at start
        self._warned: set[str] = set()  # workers whose undecodable batch was logged
        self._silent: dict[str, float] = {}  # replay endpoint -> until when it is not asked (it did not answer)
        self.batches = 0
        self.replayed = 0
        self.bad = 0

    def start(self) -> "KvIndexer":
        self._thread.start()
        return self

    def _loop(self) -> None:
        import zmq

        from zmq.utils.monitor import recv_monitor_message

        poller = zmq.Poller()
        for sock in (*self._subs, *self._monitors):
            poller.register(sock, zmq.POLLIN)
        try:
            self._catch_up()
            while not self._stop.is_set():
                for sub, _ in poller.poll(100):
                    if sub in self._monitors:
                        recv_monitor_message(sub)
                        self._resync.add(self._monitors[sub])  # its next batch checks whether it restarted
                        continue
                    frames = sub.recv_multipart()
                    if len(frames) != 3:
                        self.bad += 1
                        continue
                    self._receive(self._subs[sub], sequence_of(frames[1]), frames[2])
        except Exception:  # never a frozen tree taken for the truth: every worker unknown, the marks decide
            log.exception("the KV event subscriber stopped")
            for url in self.sources:
                self.state.disconnected(url)
        finally:
            self._close_sockets()  # here: a ZeroMQ socket belongs to the thread that uses it

    def _receive(self, url: str, seq: int, payload: bytes) -> None:
        src = self.sources[url]
        upto = self._replayed_upto.get(url)
        if upto is not None:
            if seq <= upto and url not in self._resync and not (seq == 0 and self._starts_clear(payload)):
                return  # already applied from the replay buffer at start (a new reset never is: a restart)
            del self._replayed_upto[url]
        if url in self._resync:
            # The connection dropped: a restarted worker may have sent its first batches (its reset among
            # them) before this socket reconnected, and continue at the very number expected. Rebuild from
            # its replay buffer when that still starts at its reset; otherwise go on as usual. Without a
            # replay endpoint the worker is unknown until its next AllBlocksCleared.
            self._resync.discard(url)
            history = self._fetch(src.replay_endpoint, 0, seq) if src.replay_endpoint is not None else []
            if history and history[0][0] == 0 and self._starts_clear(history[0][1]):
                self.state.forget(url)
                for s, p in history:
                    self._apply(url, s, p)
                    self.replayed += 1
            elif src.replay_endpoint is None and seq > 0:
                self.state.disconnected(url)
        expected = self.state.next_seq(url)
        if src.replay_endpoint is not None and seq > 0 and seq != expected:
            # missed batches: from the first lost one, or from 0 when first heard or restarted
            first = expected if expected is not None and seq > expected else 0
            for s, p in self._fetch(src.replay_endpoint, first, seq):
                self._apply(url, s, p)
                self.replayed += 1
        self._apply(url, seq, payload)

    def _catch_up(self) -> None:
        """At start, each worker's history from its replay buffer when that still holds its start-up
        reset: an idle worker is known before it publishes again (its reset went out before this
        subscriber connected)."""
        for url, src in self.sources.items():
            if self._stop.is_set():
                return
            if src.replay_endpoint is None or self.state.next_seq(url) is not None:
                continue
            history = self._fetch(src.replay_endpoint, 0, 2**63)
            if history and history[0][0] == 0 and self._starts_clear(history[0][1]):
                for s, p in history:
                    self._apply(url, s, p)
                    self.replayed += 1
                self._replayed_upto[url] = history[-1][0]  # the SUB socket may deliver these again

    @staticmethod
    def _starts_clear(payload: bytes) -> bool:
        try:
            events = decode_batch(payload).events
        except ValueError:
            return False
        return bool(events) and isinstance(events[0], AllBlocksCleared)

    def _apply(self, url: str, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except ValueError as exc:
            self.bad += 1
            if url not in self._warned:  # once a worker: a format this version cannot read repeats every batch
                self._warned.add(url)
                log.warning("kv events from %s: an undecodable batch (seq %d: %s); counted in "
                            "agent_cache_kv_undecodable_total, not logged again", url, seq, exc)
            return
        self.state.apply(url, seq, batch)
        self.batches += 1

    def _fetch(self, endpoint: str, first: int, upto: int) -> list[tuple[int, bytes]]:
        """The publisher's buffered batches numbered ``first`` to ``upto - 1``, from its replay socket. A
        replay socket that does not answer in time is not asked again for ``REPLAY_SILENT_S``: every batch
        after a gap would otherwise wait ``REPLAY_TIMEOUT_MS`` for it, and this one thread serves every
        worker (the worker stays unknown meanwhile, as without a replay endpoint)."""
        import zmq

        if self._silent.get(endpoint, 0.0) > time.monotonic():
            return []
        out: list[tuple[int, bytes]] = []
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
            sock.send_multipart([b"", first.to_bytes(8, "big")])
            while sock.poll(REPLAY_TIMEOUT_MS):
                frames = sock.recv_multipart()  # [b"", seq, payload]; from 0.5.23 [b"", topic, seq, payload]
                if len(frames) not in (3, 4):
                    self.bad += 1
                    break
                seq = sequence_of(frames[-2])
                if seq < 0:  # the end marker (its topic frame, where there is one, is empty)
                    break
                if first <= seq < upto:
                    out.append((seq, frames[-1]))
            else:  # no end marker in time
                self._silent[endpoint] = time.monotonic() + REPLAY_SILENT_S
                log.warning("kv events: the replay endpoint %s did not answer in %d ms; not asked again for "
                            "%.0f s", endpoint, REPLAY_TIMEOUT_MS, REPLAY_SILENT_S)
        finally:
            sock.close()
        return out

    def _close_sockets(self) -> None:
        for sub in self._subs:
            sub.disable_monitor()
            sub.close(linger=0)
        for mon in self._monitors:
            mon.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=REPLAY_TIMEOUT_MS / 1000 + 2)  # a replay fetch ends first
        elif self._thread.ident is None:  # never started: nobody else closes them
            self._close_sockets()


def parse_sources(text: str) -> dict[str, EventSource]:
    """``URL=ENDPOINT[|REPLAY]`` pairs, comma-separated (``--kv-events``); each URL normalised as
    ``--workers`` normalises it. Raises :class:`ConfigError` naming ``kv_events``."""
    from agent_cache.backends.sglang import normalize_worker_url

    out: dict[str, EventSource] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        url, sep, rest = part.partition("=")
        if not sep or not rest:
            raise ConfigError("kv_events", f"expected URL=ENDPOINT[|REPLAY_ENDPOINT], got {part!r}")
        endpoint, replay = (ep.strip() for ep in rest.partition("|")[::2])
        for ep in filter(None, (endpoint, replay)):
            if not ep.startswith(ZMQ_SCHEMES):
                raise ConfigError("kv_events", f"{ep!r} is not a ZeroMQ endpoint ({', '.join(ZMQ_SCHEMES)}...)")
        url = normalize_worker_url(url.strip(), "kv_events")
        if url in out:
            raise ConfigError("kv_events", f"{url} is named twice")
        out[url] = EventSource(endpoint, replay or None)
    if not out:
        raise ConfigError("kv_events", "name at least one worker's publisher: URL=ENDPOINT[|REPLAY_ENDPOINT]")
    return out
