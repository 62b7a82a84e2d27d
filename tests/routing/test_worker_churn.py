"""Workers that come and go (admin changes, DNS discovery) leave nothing behind: no probe client, no
metric series, no fleet board entry once every replica has applied the removal."""

from __future__ import annotations

from agent_cache.routing.fleet import GONE_RETENTION, Fleet, FleetConfig
from agent_cache.routing.router import Router
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.store.fleet_board import MemoryFleetBoard


def _series(router: Router) -> int:
    return sum(1 for metric in router.metrics.registry.collect() for s in metric.samples if "worker" in s.labels)


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
