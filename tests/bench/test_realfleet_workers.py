"""The real engine's simulated worker processes: start on any 0.5.x release, and report what their caches hold."""

from __future__ import annotations

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import SimWorkers


@pytest.mark.parametrize("version", ["0.5.3", "0.5.23"])
def test_workers_start_on_any_release_and_count_their_cached_tokens(version: str) -> None:
    """/tokenize exists only from 0.5.4 (the warm-up uses /generate); ``/v1/loads`` ``num_used_tokens``
    (0.5.8+) leaves out the evictable cache, so it reads 0 on an idle worker that holds a whole cache."""
    with Processes() as procs:
        workers = SimWorkers(procs, 1, time_scale=0, capacity_tokens=10_000, sglang_version=version)
        url = workers.urls[0]
        warm = workers.kv_tokens()
        assert warm is not None and warm > 0  # the warm-up call's prompt and output stay cached
        r = httpx.post(url + "/generate", json={"input_ids": list(range(500)), "sampling_params": {"max_new_tokens": 4}})
        r.raise_for_status()
        # the prompt and the output stay cached, from 0.5.23 but the last output token (never computed)
        assert workers.kv_tokens() == warm + 500 + (3 if version == "0.5.23" else 4)
        if version == "0.5.23":
            loads = httpx.get(url + "/v1/loads").json()["loads"][0]
            assert loads["num_used_tokens"] == 0  # what running requests hold: nothing runs now
        workers.flush()
        assert workers.kv_tokens() == 0
        workers.close()
