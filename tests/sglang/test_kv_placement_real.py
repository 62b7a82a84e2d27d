"""The gateway's KV-event placement on real SGLang workers: the same tests as on simulated ones
(tests/gateway/test_kv_events_serve.py), run against the tier's real pair. Templates and sessions'
last messages are tokenized by the real workers and recognised among their real events."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from agent_cache.sglang_cpu.workers import RealWorker
from tests.gateway.test_kv_events_serve import (  # noqa: F401  (collected here, against real workers)
    test_a_new_session_goes_where_the_events_say_the_template_is,
    test_the_gateway_learns_a_sessions_last_message_and_finds_it_evicted,
)


@pytest.fixture
def workers(real_pair: list[RealWorker]) -> Iterator[list[tuple[RealWorker, str]]]:
    for w in real_pair:  # every test starts from empty caches
        httpx.post(w.url + "/flush_cache", timeout=30).raise_for_status()
    yield [(w, f"{w.url}={w.kv_endpoint}|{w.kv_replay_endpoint}") for w in real_pair]
