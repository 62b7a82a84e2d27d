"""A ``ChatSGLang`` call's latency series and its tenant's tokens, on a router's registry, after real calls
to simulated workers that take real time (time scale 1): once per call, under the worker that served it."""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import pytest
from langchain_core.messages import BaseMessage
from prometheus_client import CollectorRegistry

from agent_cache.errors import ContextLengthError
from agent_cache.langchain import ChatSGLang
from agent_cache.routing import Router
from agent_cache.sim import SimFleet

TTFT = "agent_cache_gen_ai_server_time_to_first_token_seconds"
TPOT = "agent_cache_gen_ai_server_time_per_output_token_seconds"
DURATION = "agent_cache_gen_ai_server_request_duration_seconds"
ROUTE = "agent_cache_route_duration_seconds"
TOKENS = "agent_cache_tenant_tokens_total"


@pytest.fixture(scope="module")
def timed_fleet() -> Iterator[SimFleet]:
    """Two workers on the latency model in real time: first tokens and decode steps take milliseconds."""
    with SimFleet(2, time_scale=1.0) as fleet:
        yield fleet


def _model(fleet: SimFleet, **kwargs: object) -> ChatSGLang:
    router = Router(fleet.urls, probe_interval=None, registry=CollectorRegistry())
    return ChatSGLang(model="sim", router=router, max_tokens=8, **kwargs)


def _value(model: ChatSGLang, name: str, **labels: str) -> float:
    return model.routing.metrics.registry.get_sample_value(name, labels) or 0.0


def _buckets(model: ChatSGLang, name: str, **labels: str) -> dict[float, float]:
    """Bound -> cumulative count of one histogram series."""
    return {float(s.labels["le"]): s.value for family in model.routing.metrics.registry.collect()
            for s in family.samples
            if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items())}


def _no_later_than(earlier: dict[float, float], later: dict[float, float]) -> None:
    """Each call's ``earlier`` time was at most its ``later`` one: within every bound both histograms have,
    at least as many of the earlier times."""
    shared = earlier.keys() & later.keys()
    assert len(shared) >= 4, shared
    assert all(earlier[le] >= later[le] for le in shared), sorted((le, earlier[le], later[le]) for le in shared)


def _served(messages: list[BaseMessage]) -> Counter[str]:
    return Counter(m.response_metadata["worker"] for m in messages)


async def test_each_call_is_observed_once_under_its_worker_and_tokens_add_up(timed_fleet) -> None:
    model = _model(timed_fleet, tenant="acme")
    try:
        messages: list[BaseMessage] = []
        for i in range(4):  # whole and streamed, sync and async: every way a call goes through the pipeline
            messages.append(model.invoke(f"question {i} " * 10, session_id=f"w{i}"))
            chunks = list(model.stream(f"streamed {i} " * 10, session_id=f"s{i}"))
            messages.append(sum(chunks[1:], chunks[0]))
            messages.append(await model.ainvoke(f"async {i} " * 10, session_id=f"a{i}"))
            achunks = [c async for c in model.astream(f"async streamed {i} " * 10, session_id=f"as{i}")]
            messages.append(sum(achunks[1:], achunks[0]))
        served = _served(messages)
        assert sum(served.values()) == 16 and len(served) == 2, served  # new sessions spread over both workers
        for worker, calls in served.items():
            assert _value(model, TTFT + "_count", worker=worker) == calls
            assert _value(model, DURATION + "_count", worker=worker, outcome="ok") == calls
            assert _value(model, ROUTE + "_count", worker=worker) == calls
            decoded = sum(1 for m in messages if m.response_metadata["worker"] == worker
                          and m.usage_metadata["output_tokens"] > 1)
            assert decoded > 0 and _value(model, TPOT + "_count", worker=worker) == decoded
            # each call's route time <= its time to first token <= its duration: for every bound, at least
            # as many of the earlier times are within it
            ttft = _buckets(model, TTFT, worker=worker)
            _no_later_than(_buckets(model, ROUTE, worker=worker), ttft)
            _no_later_than(ttft, _buckets(model, DURATION, worker=worker, outcome="ok"))
            assert 0 < _value(model, TTFT + "_sum", worker=worker) < _value(model, DURATION + "_sum", worker=worker,
                                                                               outcome="ok")
            assert _value(model, ROUTE + "_sum", worker=worker) < _value(model, TTFT + "_sum", worker=worker)
        usage = [m.usage_metadata for m in messages]
        assert _value(model, TOKENS, tenant="acme", gen_ai_token_type="input") == sum(u["input_tokens"] for u in usage)
        assert _value(model, TOKENS, tenant="acme", gen_ai_token_type="output") == sum(u["output_tokens"]
                                                                                       for u in usage)
        assert _value(model, TOKENS, tenant="acme", gen_ai_token_type="cached") == sum(
            u["input_token_details"]["cache_read"] for u in usage)
    finally:
        model.close()


def test_a_failed_call_and_a_stream_left_early_are_timed_under_their_outcome() -> None:
    with SimFleet(1, time_scale=0.0, max_total_tokens=64) as fleet:
        model = _model(fleet, max_retries=0)
        worker = fleet.urls[0]
        try:
            with pytest.raises(ContextLengthError):
                model.invoke("word " * 500)
            assert _value(model, DURATION + "_count", worker=worker, outcome="error") == 1
            stream = model.stream("hi")
            next(stream)
            stream.close()  # the caller stops reading
            assert _value(model, DURATION + "_count", worker=worker, outcome="cancelled") == 1
            assert _value(model, TTFT + "_count", worker=worker) == 0  # neither was served
            assert _value(model, DURATION + "_count", worker=worker, outcome="ok") == 0
            assert _value(model, ROUTE + "_count", worker=worker) == 2  # both were sent
        finally:
            model.close()


def test_a_removed_workers_latency_series_go_with_it(timed_fleet) -> None:
    model = _model(timed_fleet)
    try:
        messages = [model.invoke("hello", session_id=f"r{i}") for i in range(4)]
        gone = messages[0].response_metadata["worker"]
        labelled = lambda: {s.name for f in model.routing.metrics.registry.collect()  # noqa: E731
                            for s in f.samples if s.labels.get("worker") == gone}
        assert {TTFT + "_count", DURATION + "_count", ROUTE + "_count"} <= labelled()
        model.routing.remove_worker(gone)
        assert labelled() == set()
    finally:
        model.close()
