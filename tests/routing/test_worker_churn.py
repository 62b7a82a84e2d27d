"""Workers that come and go (admin changes, DNS discovery) leave nothing behind: no probe client, no
metric series, no fleet board entry once every replica has applied the removal."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_cache.routing import RouteRequest
from agent_cache.routing.fleet import GONE_RETENTION, Fleet, FleetConfig
from agent_cache.routing.router import Router
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.store.fleet_board import MemoryFleetBoard


def _series(router: Router) -> int:
    return sum(1 for metric in router.metrics.registry.collect() for s in metric.samples if "worker" in s.labels)


@pytest.mark.slow
def test_adding_and_removing_workers_leaves_no_client_series_or_entry() -> None:
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0))
    worker.start()
    now = [1_000.0]
    router = Router([worker.url], probe_interval=None)
    fleet = Fleet(router, MemoryFleetBoard(), FleetConfig(refresh=0.5, drain_timeout=5.0), clock=lambda: now[0])
    try:
        router.prober.probe_once()
        baseline = (len(router.prober._clients), _series(router))
        for round_ in range(5):
            urls = [f"http://127.0.0.1:{1 + round_ * 100 + i}" for i in range(100)]  # refused: nothing listens
            for url in urls:
                fleet.add(url)
            router.prober.probe_once()  # each probed once, each labelled
            for url in urls:
                router.metrics.child(router.metrics.prompt_tokens, "t", url).inc(5)
            assert len(router.prober._clients) == 101 and _series(router) > baseline[1]
            for url in urls:
                fleet.remove(url)
            now[0] += 6.0  # past the drain timeout: the drains finish
            fleet.refresh()
            assert [w.url for w in router.workers] == [worker.url]
            assert (len(router.prober._clients), _series(router)) == baseline
        assert len(fleet.board.entries()) == 500  # removed workers' entries stay while replicas apply them
        now[0] += GONE_RETENTION + 1
        fleet.refresh()
        assert fleet.board.entries() == {}
    finally:
        router.close()
        worker.stop()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_removed_worker_that_held_sessions_leaves_no_series(store, request) -> None:
    """The store keeps its record of a removed worker that held sessions (the sessions stay until they
    expire); the gauges refreshed after each probe round labelled every worker of that record, so each
    such worker's ``live_sessions`` series came back after the removal dropped it."""
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0))
    worker.start()
    now = [1_000.0]
    shared = {"redis_url": request.getfixturevalue("redis_server").url,
              "prefix": request.getfixturevalue("prefix")} if store == "redis" else {}
    router = Router([worker.url], probe_interval=None, **shared)
    fleet = Fleet(router, MemoryFleetBoard(), FleetConfig(refresh=0.5, drain_timeout=5.0), clock=lambda: now[0])
    try:
        router.done(router.route(RouteRequest("warm")))
        router.prober.probe_once()
        baseline = _series(router)
        urls = [f"http://127.0.0.1:{1 + i}" for i in range(20)]  # refused: nothing listens
        for url in urls:
            fleet.add(url)
        for i in range(60):  # without probes the added workers take new sessions at once
            router.done(router.route(RouteRequest(f"s{i}")))
        router.prober.probe_once()
        assert _series(router) > baseline
        for url in urls:
            fleet.remove(url)
        now[0] += 6.0  # past the drain timeout: the drains finish
        fleet.refresh()
        assert [w.url for w in router.workers] == [worker.url]
        router.prober.probe_once()  # a probe round refreshes the gauges from the store's records
        assert _series(router) == baseline
    finally:
        router.close()
        worker.stop()


class _HeldHealth(BaseHTTPRequestHandler):
    """A worker whose ``/health`` answers 200 once the test lets it."""
    release = threading.Event()
    asked = threading.Event()

    def do_GET(self) -> None:  # noqa: N802
        type(self).asked.set()
        type(self).release.wait(10)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_probe_that_ends_after_its_worker_was_removed_leaves_nothing() -> None:
    """A probe in flight when its worker is removed recorded its result after the removal had dropped
    everything: the worker's client, health record and ``worker_healthy`` series came back for good."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeldHealth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0))
    worker.start()
    router = Router([worker.url], probe_interval=None)
    try:
        router.prober.probe_once()
        baseline = (set(router.prober._clients), _series(router))
        slow = f"http://127.0.0.1:{server.server_address[1]}"
        router.add_worker(slow)
        probing = threading.Thread(target=router.prober.probe_once)
        probing.start()
        assert _HeldHealth.asked.wait(10)  # its probe waits for the answer
        router.remove_worker(slow)
        _HeldHealth.release.set()
        probing.join(10)
        assert (set(router.prober._clients), _series(router)) == baseline
        assert slow not in router.health._breakers
        assert slow not in router.prober.capacity
    finally:
        _HeldHealth.release.set()
        router.close()
        worker.stop()
        server.shutdown()
        server.server_close()
