"""What a fleet of many workers costs: no HTTP client per worker, and adding one worker probes that worker
alone, whatever the fleet's size (counted here; the times are in docs/gateway.md)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from agent_cache.backends.sglang import SGLangClient
from agent_cache.routing.fleet import Fleet, FleetConfig
from agent_cache.routing.router import Router
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.store.fleet_board import MemoryFleetBoard

FLEET = 500


class _Counts:
    """How many HTTP clients were built, and which workers' /health was asked (the real methods run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clients = 0
        self.probed: list[str] = []
        self._lock = threading.Lock()
        client_init, health = httpx.Client.__init__, SGLangClient.health

        def counted_init(client: httpx.Client, *args: Any, **kwargs: Any) -> None:
            with self._lock:
                self.clients += 1
            client_init(client, *args, **kwargs)

        def counted_health(client: SGLangClient, **kwargs: Any) -> None:
            with self._lock:
                self.probed.append(client.base_url)
            health(client, **kwargs)

        monkeypatch.setattr(httpx.Client, "__init__", counted_init)
        monkeypatch.setattr(SGLangClient, "health", counted_health)

    def reset(self) -> None:
        with self._lock:
            self.clients, self.probed = 0, []


@pytest.mark.slow
def test_adding_a_worker_to_a_large_fleet_probes_and_builds_for_that_worker_only(monkeypatch) -> None:
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0))
    worker.start()
    counts = _Counts(monkeypatch)
    router = Router([worker.url], probe_interval=3600.0)  # one round at start, then only new workers' probes
    fleet = Fleet(router, MemoryFleetBoard(), FleetConfig(refresh=3600.0))
    try:
        for i in range(FLEET):
            fleet.add(f"http://127.0.0.1:{1 + i}")  # refused: pods still loading
        router.probe_once()  # a full round over the fleet
        # routers of other tests may still probe in this process: only this fleet's workers are counted
        ours = {worker.url} | {f"http://127.0.0.1:{1 + i}" for i in range(FLEET + 1)}
        assert len(set(counts.probed) & ours) == FLEET + 1
        assert counts.clients <= 1  # the probes share one connection pool
        deadline = time.monotonic() + 10
        while len(router.health.down(w.url for w in router.workers)) < FLEET:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        counts.reset()
        new = f"http://127.0.0.1:{1 + FLEET}"
        fleet.add(new)
        deadline = time.monotonic() + 10
        while new not in counts.probed:  # probed at once, without waiting for the next round
            assert time.monotonic() < deadline, "the new worker was not probed"
            time.sleep(0.05)
        time.sleep(0.2)
        assert [u for u in counts.probed if u in ours] == [new] and counts.clients == 0
    finally:
        router.close()
        worker.stop()
