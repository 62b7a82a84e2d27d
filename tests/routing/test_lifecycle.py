"""The call lifecycle's pure flow, step by step (its runners: tests/langchain/test_broken_stream.py)."""

from __future__ import annotations

import pytest

from agent_cache.errors import NoHealthyWorkerError, StreamError, WorkerBadRequestError, WorkerConnectionError
from agent_cache.routing.lifecycle import Attempt, Backoff, Choose, Send, Settle, call_flow, next_exclude
from agent_cache.routing.router import Placement

WORKERS = ["http://a", "http://b"]


def _placed(worker: str) -> Placement:
    return Placement(worker, "placed", 1, "s1")


def _attempt(worker: str, error: BaseException | None = None, delivered: bool = False) -> Attempt:
    return Attempt(_placed(worker), value=None if error else f"answer from {worker}", error=error,
                   delivered=delivered)


def test_a_successful_call_is_routed_sent_and_settled_once() -> None:
    flow = call_flow(WORKERS, max_attempts=3, backoff=0.2, last_resort=True)
    assert next(flow) == Choose(frozenset(), last_resort=False)
    assert flow.send(_placed("http://a")) == Send(_placed("http://a"))
    assert flow.send(_attempt("http://a")) == Settle(_placed("http://a"), None, None)
    with pytest.raises(StopIteration) as done:
        flow.send(None)
    assert done.value.value == ("answer from http://a", _placed("http://a"))


def test_a_retryable_failure_settles_backs_off_and_tries_elsewhere_then_the_last_resort() -> None:
    err = WorkerConnectionError("refused", url="http://a")
    flow = call_flow(WORKERS, max_attempts=3, backoff=0.2, last_resort=True)
    next(flow)
    flow.send(_placed("http://a"))
    assert flow.send(_attempt("http://a", err)) == Settle(_placed("http://a"), err, None)
    first = flow.send(None)
    assert isinstance(first, Backoff) and 0.1 <= first.seconds <= 0.2  # 0.2 s, jittered down to half
    assert flow.send(None) == Choose(frozenset({"http://a"}), last_resort=True)
    flow.send(_placed("http://b"))
    flow.send(_attempt("http://b", err))
    second = flow.send(None)
    assert isinstance(second, Backoff) and 0.2 <= second.seconds <= 0.4  # doubling
    # every worker failed once: the exclusions start over rather than leave nothing to try
    assert flow.send(None) == Choose(frozenset(), last_resort=True)
    flow.send(_placed("http://a"))
    flow.send(_attempt("http://a", err))
    with pytest.raises(WorkerConnectionError):  # the attempt budget is spent
        flow.send(None)


@pytest.mark.parametrize("error, delivered", [
    (WorkerBadRequestError("bad", url="http://a"), False),  # the same request fails everywhere
    (StreamError("cut", url="http://a"), True),  # output reached the caller: a retry would duplicate it
    (KeyboardInterrupt(), False),
])
def test_no_retry_after_output_reached_the_caller_or_for_an_error_that_would_repeat(error, delivered) -> None:
    flow = call_flow(WORKERS, max_attempts=3)
    next(flow)
    flow.send(_placed("http://a"))
    assert flow.send(_attempt("http://a", error, delivered)) == Settle(_placed("http://a"), error, None)
    with pytest.raises(type(error)):
        flow.send(None)


def test_no_healthy_worker_raises_the_last_failure_or_itself() -> None:
    flow = call_flow(WORKERS, max_attempts=3)
    next(flow)
    with pytest.raises(NoHealthyWorkerError):  # nothing was tried yet
        flow.throw(NoHealthyWorkerError("none"))
    err = WorkerConnectionError("refused", url="http://a")
    flow = call_flow(WORKERS, max_attempts=3)
    next(flow)
    flow.send(_placed("http://a"))
    flow.send(_attempt("http://a", err))
    assert flow.send(None) == Choose(frozenset({"http://a"}), last_resort=False)  # no backoff asked: none
    with pytest.raises(WorkerConnectionError):
        flow.throw(NoHealthyWorkerError("none"))


def test_next_exclude_starts_over_when_every_worker_failed() -> None:
    assert next_exclude(frozenset(), "http://a", WORKERS) == {"http://a"}
    assert next_exclude(frozenset({"http://a"}), "http://b", WORKERS) == frozenset()


def test_backoff_doubles_with_equal_jitter_over_the_upper_half_of_each_window() -> None:
    import random
    import statistics

    from agent_cache.routing.lifecycle import backoff_seconds

    rng = random.Random(7)
    for attempt, ceiling in enumerate([0.2, 0.4, 0.8]):
        draws = [backoff_seconds(0.2, attempt, rng) for _ in range(4000)]
        assert all(ceiling / 2 <= d <= ceiling for d in draws)
        assert min(draws) < ceiling * 0.51 and max(draws) > ceiling * 0.99  # the whole half is used
        assert abs(statistics.mean(draws) - ceiling * 0.75) < ceiling * 0.02  # uniform over it
    assert backoff_seconds(0.2, 0, random.Random(1)) != backoff_seconds(0.2, 0, random.Random(2))


def _server_error(worker: str, status: int = 500):
    from agent_cache.errors import WorkerServerError

    return WorkerServerError(f"HTTP {status}", url=worker, status=status)


def test_a_5xx_the_second_opinion_reproduces_is_the_requests_fault_and_blames_no_worker() -> None:
    from agent_cache.routing.lifecycle import Judge

    first, second = _server_error("http://a"), _server_error("http://b")
    flow = call_flow(WORKERS, max_attempts=3, backoff=0.2, last_resort=True)
    next(flow)
    flow.send(_placed("http://a"))
    # settled unjudged, then at once (no backoff) one other worker, outside the store
    assert flow.send(_attempt("http://a", first)) == Settle(_placed("http://a"), first, None, judged=False)
    assert flow.send(None) == Choose(frozenset({"http://a"}), last_resort=False, second_opinion=True)
    flow.send(_placed("http://b"))
    assert flow.send(_attempt("http://b", second)) == Judge(_placed("http://a"), first)
    assert first.request_fault and second.request_fault and not second.retryable
    assert flow.send(None) == Settle(_placed("http://b"), second, None)
    with pytest.raises(type(second)) as raised:  # answered, not retried further
        flow.send(None)
    assert raised.value is second


def test_a_5xx_another_worker_does_not_give_is_the_first_workers_fault() -> None:
    from agent_cache.routing.lifecycle import Judge

    first = _server_error("http://a")
    flow = call_flow(WORKERS, max_attempts=3)
    next(flow)
    flow.send(_placed("http://a"))
    flow.send(_attempt("http://a", first))
    flow.send(None)
    flow.send(_placed("http://b"))
    assert flow.send(_attempt("http://b")) == Judge(_placed("http://a"), first)
    assert not first.request_fault
    assert flow.send(None) == Settle(_placed("http://b"), None, None)


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_worker_that_cannot_serve_now_gets_no_second_opinion(status) -> None:
    err = _server_error("http://a", status)
    flow = call_flow(WORKERS, max_attempts=3)
    next(flow)
    flow.send(_placed("http://a"))
    assert flow.send(_attempt("http://a", err)) == Settle(_placed("http://a"), err, None)
    assert flow.send(None) == Choose(frozenset({"http://a"}), last_resort=False)
