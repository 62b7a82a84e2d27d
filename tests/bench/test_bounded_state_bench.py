"""``python -m agent_cache.bench.bounded_state``: one template per session through the real model, router and Redis."""

from __future__ import annotations

import pytest

from agent_cache.bench.bounded_state import main, run


@pytest.mark.slow
def test_keys_without_ttl_and_series_stay_flat_as_sessions_grow(redis_server) -> None:
    small, large = run(redis_server.url, [60, 150], session_ttl=5.0)  # past the 50 template labels
    assert (small.sessions, large.sessions) == (60, 150)
    assert large.keys_loaded > small.keys_loaded  # the load did leave per-session state...
    assert large.no_ttl_after == small.no_ttl_after  # ...but what outlives expiry without a TTL does not grow
    assert large.series == small.series
    assert large.purge_steps >= 1 and large.rss_mb > 0


def test_sessions_must_increase(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--redis", "redis://127.0.0.1:6379/0", "--sessions", "10", "5"])
    assert "--sessions" in capsys.readouterr().err
