"""Background work off the call path: a thread that flushes queued work shortly after it is queued
(:class:`Flusher`), and a thread that runs queued jobs one by one (:class:`Jobs`).

The router's in-flight releases and the template registry's bookkeeping are
queued by the call and written here, so a slow or frozen store never stalls
a call (nor an event loop). A flusher given an async flush writes in the
event loop that kicked it, as a task of its own, rather than waking its
thread for every call (the gateway's calls all kick from its loop).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Awaitable, Callable

logger = logging.getLogger("agent_cache")


class Flusher:
    """A daemon thread that calls ``flush`` ``delay`` seconds after the first :meth:`kick`; or, once
    :meth:`run_in` bound it to an event loop, for a kick from that loop, ``aflush`` run in that loop
    ``delay`` seconds later (one flush at a time; a kick during one starts another round after it)."""

    def __init__(self, delay: float, flush: Callable[[], None], name: str = "agent-cache-flush") -> None:
        self.delay = delay
        self.name = name
        self._flush = flush
        self._kicked = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # the event loop kicks are flushed in, and its state (touched from that loop's thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._aflush: Callable[[], Awaitable[None]] | None = None
        self._scheduled = False
        self._task: asyncio.Task[None] | None = None  # held: the loop's reference to a task is weak
        self._again = False

    def run_in(self, loop: asyncio.AbstractEventLoop, aflush: Callable[[], Awaitable[None]]) -> None:
        """From now on a kick from ``loop`` (a long-lived one, running in this thread) is flushed there."""
        self._loop, self._loop_thread, self._aflush = loop, threading.get_ident(), aflush

    def kick(self) -> None:
        if self._loop is not None and threading.get_ident() == self._loop_thread:
            if self._task is not None:
                self._again = True
            elif not self._scheduled and not self._stopped.is_set():
                self._scheduled = True
                self._loop.call_later(self.delay, self._start)
            return
        if self._thread is None or not self._thread.is_alive():  # first use, or in a forked child
            with self._lock:
                if self._stopped.is_set():
                    return
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread.start()
        if not self._kicked.is_set():  # set() takes a lock: skip it while a flush is already due
            self._kicked.set()

    def _start(self) -> None:
        self._scheduled = False
        if not self._stopped.is_set() and self._loop is not None:
            self._task = self._loop.create_task(self._arun())

    async def _arun(self) -> None:
        assert self._aflush is not None
        try:
            await self._aflush()
        except Exception:  # never let a failed flush go unreported
            logger.exception("%s failed", self.name)
        finally:
            self._task = None
            if self._again:  # kicked during the flush: another round
                self._again = False
                self.kick()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._kicked.wait()
            if self._stopped.wait(self.delay):
                return
            self._kicked.clear()  # before flushing: a kick during the flush starts another round
            try:
                self._flush()
            except Exception:  # never let the flusher die silently
                logger.exception("%s failed", self.name)

    def close(self) -> None:
        self._stopped.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Jobs:
    """A bounded queue of jobs that one daemon thread hands to ``run``, in order, off the caller's path.

    The thread starts with the first job (again in a forked child); a full queue refuses a job
    (:meth:`submit` returns False). ``run`` handles its own failures; one it lets through is logged and
    the thread goes on. :meth:`close` drops what is still queued and waits ``join_timeout`` s for the job
    under way.
    """

    def __init__(self, run: Callable[..., None], name: str, *, max_queued: int, join_timeout: float) -> None:
        self._run = run
        self.name = name
        self.join_timeout = join_timeout
        self._queue: queue.Queue[tuple[object, ...] | None] = queue.Queue(max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.closed = False

    def submit(self, *job: object) -> bool:
        """Queue ``run(*job)``; False when the queue is full or closed (nothing is queued then)."""
        with self._lock:  # under the lock: nothing is queued once close() has emptied the queue
            if self.closed:
                return False
            if self._thread is None or not self._thread.is_alive():  # first use, or in a forked child
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                return False
            return True

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._run(*job)
            except Exception:  # never let the thread die silently
                logger.exception("%s failed", self.name)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            thread = self._thread
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if thread is not None and thread.is_alive():
            self._queue.put(None)  # the queue was just emptied and nothing is queued once closed
            thread.join(timeout=self.join_timeout)
