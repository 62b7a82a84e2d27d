"""Breakers: passive ejection capped at a share of the pool, one trial call per half-open spell."""

from __future__ import annotations

from agent_cache.routing.health import CLOSED, HALF_OPEN, OPEN, HealthTracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fail(health: HealthTracker, url: str, pool: list[str], n: int = 3) -> None:
    for _ in range(n):
        health.failure(url, pool=pool)


def test_passive_failures_eject_at_most_ten_percent_and_at_least_one() -> None:
    small = [f"w{i}" for i in range(3)]
    health = HealthTracker(failure_threshold=3, clock=Clock())
    for url in small:
        _fail(health, url, small)
    assert health.down(small) == {"w0"}  # 10 % of 3 rounds to none: one, as Envoy
    large = [f"v{i}" for i in range(20)]
    for url in large:
        _fail(health, url, large)
    assert health.down(large) == {"v0", "v1"}  # 10 % of 20


def test_probes_and_refused_connections_are_not_capped() -> None:
    pool = ["a", "b", "c"]
    health = HealthTracker(failure_threshold=3, clock=Clock())
    _fail(health, "a", pool)
    health.failure("b", hard=True, pool=pool)  # a refused connection
    health.failure("c", hard=True)  # a failed probe
    assert health.down(pool) == {"a", "b", "c"}


def test_a_good_probe_does_not_end_a_passive_ejection_but_a_success_does() -> None:
    pool = ["a", "b", "c"]
    health = HealthTracker(failure_threshold=3, clock=Clock())
    _fail(health, "a", pool)
    assert not health.success("a", probe=True) and health.state("a") == OPEN
    health.failure("b", hard=True)
    assert health.success("b", probe=True) and health.state("b") == CLOSED
    assert health.success("a") and health.state("a") == CLOSED


def test_a_half_open_worker_is_offered_to_one_route_at_a_time() -> None:
    clock = Clock()
    pool = ["a", "b", "c"]
    health = HealthTracker(failure_threshold=3, cooldown=2.0, clock=clock)
    _fail(health, "a", pool)
    assert health.unavailable(pool) == ({"a"}, set())
    clock.now += 2.0
    assert health.state("a") == HALF_OPEN
    assert health.unavailable(pool) == (set(), {"a"})  # this route holds the trial
    assert health.unavailable(pool) == ({"a"}, set())  # every other route sees it out
    assert health.down(pool) == {"a"}
    health.release(["a"])  # the route chose another worker
    assert health.unavailable(pool) == (set(), {"a"})
    health.failure("a", pool=pool)  # the trial failed: open again, cooldown doubled
    clock.now += 2.0
    assert health.state("a") == OPEN
    clock.now += 2.0
    assert health.unavailable(pool) == (set(), {"a"})
    assert health.success("a") and health.down(pool) == set()


def test_the_healthy_gauge_says_what_the_fleet_view_says_once_the_cooldown_ends() -> None:
    """A passively ejected worker that still answers /health: 0 while ejected, 1 once half-open (it
    takes calls again, a trial first), as GET /workers says, before any call went there."""
    from prometheus_client import CollectorRegistry

    from agent_cache.routing.config import WorkerConfig
    from agent_cache.routing.metrics import RouterMetrics
    from agent_cache.routing.prober import Prober
    from agent_cache.sim import SimFleet

    clock = Clock()
    with SimFleet(3) as fleet:
        pool = list(fleet.urls)
        health = HealthTracker(failure_threshold=3, cooldown=2.0, clock=clock)
        registry = CollectorRegistry()
        metrics = RouterMetrics(registry)
        prober = Prober(lambda: [WorkerConfig(u) for u in pool], health, metrics, {}, lambda: None, lambda: None, 5.0)
        _fail(health, pool[0], pool)
        prober.probe_once()
        gauge = lambda: registry.get_sample_value("agent_cache_worker_healthy", {"worker": pool[0]})  # noqa: E731
        assert gauge() == 0.0 and health.down(pool) == {pool[0]}
        clock.now += 2.0
        prober.probe_once()
        assert health.down(pool) == set() and gauge() == 1.0


def test_a_worker_whose_probe_failed_takes_no_trial_call_until_a_probe_answers() -> None:
    # a hung worker: its probes time out; a trial call each cooldown would wait out its first-byte deadline
    clock = Clock()
    pool = ["hung", "b"]
    health = HealthTracker(failure_threshold=3, cooldown=2.0, clock=clock)
    _fail(health, "hung", pool)  # real calls left it: passively ejected
    health.failure("hung", probe=True)  # and its probe timed out
    clock.now += 60.0  # many cooldowns later
    assert health.state("hung") == OPEN and health.unavailable(pool) == ({"hung"}, set())
    assert health.success("hung", probe=True) and health.down(pool) == set()


def test_a_worker_added_while_probing_is_down_until_it_first_answers() -> None:
    clock = Clock()
    health = HealthTracker(clock=clock)
    health.await_probe("new")
    clock.now += 60.0
    assert health.down(["new"]) == {"new"} and health.unproven("new")
    health.failure("new", hard=True, probe=True)  # refused: still loading
    clock.now += 60.0
    assert health.down(["new"]) == {"new"}
    assert health.success("new", probe=True) and health.down(["new"]) == set() and not health.unproven("new")
