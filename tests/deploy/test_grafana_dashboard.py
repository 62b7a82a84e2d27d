"""deploy/grafana: every query parses as PromQL and reads only series a real gateway exposes on /metrics
(a gateway in front of two simulated workers, after calls that include an early send and a failover)."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest

from agent_cache.bench.realfleet import Processes, wait_until
from agent_cache.sim import SimFleet
from tests.conftest import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "agent-cache-gateway.json"


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]


def _series(expr: str) -> set[str]:
    return set(re.findall(r"\bagent_cache_[a-z_]+\b", expr))


def test_the_dashboard_is_well_formed():
    dash = _dashboard()
    assert dash["uid"] and dash["title"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and panel["fieldConfig"]["defaults"]["unit"]
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, panel["title"]  # panels do not overlap
        cells |= mine
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))


@pytest.mark.parametrize("expr", _exprs())
def test_every_query_parses_as_promql(expr):
    # $__rate_interval is Grafana's: it stands for a range before the query reaches Prometheus
    promql_parser.parse(expr.replace("$__rate_interval", "5m"))


def test_a_broken_query_does_not_parse():
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(agent_cache_gateway_requests_total[5m])")


@pytest.mark.slow
def test_every_series_the_dashboard_reads_is_exposed_by_a_live_gateway(redis_url):
    wanted = set().union(*(_series(e) for e in _exprs()))
    assert {"agent_cache_gateway_requests_total", "agent_cache_cached_tokens_total"} <= wanted
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
    with SimFleet(2) as fleet, Processes() as procs:
        port = free_port()
        proc = procs.start("serve", [sys.executable, "-m", "agent_cache.cli", "serve", "--port", str(port),
                                     "--workers", ",".join(fleet.urls), "--redis", redis_url,
                                     "--prefix", f"t-{uuid.uuid4().hex[:10]}"])
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(url + "/ready", timeout=2.0).status_code == 200, [proc], "agent-cache serve",
                   timeout=60.0)
        headers = {"x-session-id": f"dash-{uuid.uuid4().hex[:8]}"}
        first = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)
        assert first.status_code == 200
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=headers).status_code == 200  # sent early
        fleet.stop_worker(fleet.urls.index(first.headers["x-agent-cache-worker"]))
        moved = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)  # fails over
        assert moved.status_code == 200 and moved.headers["x-agent-cache-worker"] != first.headers["x-agent-cache-worker"]
        missing: set[str] = set()

        def all_exposed() -> bool:  # live sessions per worker are read from the store once per probe round (5 s)
            nonlocal missing
            text = httpx.get(url + "/metrics").text
            names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
            missing = wanted - names  # exact names: a query on `..._requests` (no `_total`) reads nothing
            return not missing

        try:
            wait_until(all_exposed, [proc], "every series of the dashboard", timeout=20.0)
        except Exception:
            raise AssertionError(f"not on /metrics: {sorted(missing)}") from None
