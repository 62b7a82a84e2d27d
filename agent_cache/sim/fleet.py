"""Run simulated workers: one in a background thread, or a fleet of N.

``SimFleet`` is a context manager, sync and async::

    with SimFleet(2, time_scale=0) as fleet:
        fleet.urls  # ["http://127.0.0.1:41233", "http://127.0.0.1:41235"]
        fleet.stop_worker(0)   # the port now refuses connections
        fleet.start_worker(0)  # same port, empty cache, as a restarted worker
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from typing import Any, Callable

import uvicorn

from agent_cache.sim.engine import Engine, WorkerOptions
from agent_cache.sim.server import SimServer


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class ThreadedServer:
    """Serve an ASGI app with uvicorn in a daemon thread on a loopback port."""

    def __init__(self, app_factory: Callable[[], Any], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app_factory = app_factory
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            return
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app_factory(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"asgi-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.005)
        sock.close()  # uvicorn holds its own duplicate

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None or self._server is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True  # don't wait for open keep-alive connections
        self._thread.join(timeout)
        self._thread = None
        self._server = None

    @property
    def running(self) -> bool:
        return self._thread is not None


class SimWorkerThread(ThreadedServer):
    """One simulated worker; a restart (stop, start) keeps the port and empties the cache."""

    def __init__(self, options: WorkerOptions | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.options = options or WorkerOptions()
        self.sim: SimServer | None = None
        super().__init__(self._new_app, host=host, port=port)

    def _new_app(self) -> Any:
        self.sim = SimServer(self.options)
        return self.sim.app

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        if self.sim is not None:
            self.sim.engine.close()  # its KV event publisher (uvicorn runs here without lifespan events)


class SimFleet:
    """N simulated workers on loopback ports; options apply to every worker."""

    def __init__(self, n: int = 2, *, host: str = "127.0.0.1", **options: Any) -> None:
        if n < 1:
            raise ValueError("a fleet needs at least one worker")
        fields = {f.name for f in dataclasses.fields(WorkerOptions)}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise TypeError(f"unknown worker option(s) {unknown}; known: {sorted(fields)}")
        self.workers = [SimWorkerThread(WorkerOptions(**options), host=host) for _ in range(n)]

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def engine(self, i: int) -> Engine:  # for tests that read the cache directly
        sim = self.workers[i].sim
        assert sim is not None, "worker not running"
        return sim.engine

    def start(self) -> "SimFleet":
        for w in self.workers:
            w.start()
        return self

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def stop_worker(self, i: int) -> None:
        self.workers[i].stop()

    def start_worker(self, i: int) -> None:
        self.workers[i].start()

    def __enter__(self) -> "SimFleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "SimFleet":
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
