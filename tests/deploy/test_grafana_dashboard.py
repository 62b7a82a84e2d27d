"""deploy/grafana: every query parses as PromQL, and each panel's series are on a real gateway's /metrics
(a gateway in front of two simulated workers, after calls that include an early send and a failover):
each selector's name, a sample its label matchers select, and the labels its panel groups by."""

from __future__ import annotations

import json
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_cache.processes import Processes, wait_until
from agent_cache.sim import SimFleet
from tests.conftest import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "agent-cache-gateway.json"


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]


# added by Prometheus as it scrapes a target, so never on the target's own /metrics
TARGET_LABELS = frozenset({"instance", "job"})
_MATCH = {  # by the operator's name (the parser's MatchOp is not hashable)
    "Equal": lambda value, want: value == want,
    "NotEqual": lambda value, want: value != want,
    "Re": lambda value, want: re.fullmatch(want, value) is not None,
    "NotRe": lambda value, want: re.fullmatch(want, value) is None,
}


@dataclass(frozen=True)
class Selector:
    """One series selector of a query: its name, its label matchers, and the labels the aggregations
    around it group by."""

    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator's name, value)
    by: frozenset[str]

    def missing(self, samples: list[dict[str, str]]) -> str | None:
        """What the scraped samples of this name lack, or None."""
        if not samples:
            return f"{self.name}: not on /metrics"
        chosen = [s for s in samples if all(_MATCH[op](s.get(label, ""), want) for label, op, want in self.matchers)]
        if not chosen:
            return f"{self.name}: no sample matches {[(label, want) for label, _, want in self.matchers]}"
        unlabelled = {label for label in self.by - TARGET_LABELS if not any(label in s for s in chosen)}
        return f"{self.name}: no sample has the labels {sorted(unlabelled)}" if unlabelled else None


def _selectors(expr: str) -> list[Selector]:
    # $__rate_interval is Grafana's: it stands for a range before the query reaches Prometheus
    found: list[Selector] = []
    grouping: list[frozenset[str]] = []

    def enter(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            by = node.modifier is not None and node.modifier.type == promql_parser.AggModifierType.By
            grouping.append(frozenset(node.modifier.labels) if by else frozenset())
        elif isinstance(node, promql_parser.VectorSelector):
            matchers = tuple((m.name, str(m.op).rpartition(".")[2], m.value) for m in node.matchers.matchers)
            found.append(Selector(node.name, matchers, frozenset().union(*grouping)))

    def leave(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            grouping.pop()

    promql_parser.walk(promql_parser.parse(expr.replace("$__rate_interval", "5m")), enter, leave)
    return found


def _panels_missing(text: str) -> dict[str, list[str]]:
    """Per panel title, what the scrape ``text`` lacks of its queries' series."""
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    missing: dict[str, list[str]] = {}
    for panel in _dashboard()["panels"]:
        for target in panel["targets"]:
            for selector in _selectors(target["expr"]):
                problem = selector.missing(samples.get(selector.name, []))
                if problem is not None:
                    missing.setdefault(panel["title"], []).append(problem)
    return missing


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
    assert _selectors(expr)  # parses, and reads at least one series


def test_a_broken_query_does_not_parse():
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(agent_cache_gateway_requests_total[5m])")


def test_a_selectors_check_reads_names_matchers_and_grouping():
    text = ('# TYPE t_seconds histogram\nt_seconds_bucket{worker="w",le="+Inf"} 1.0\nt_seconds_count{worker="w"} 1.0\n'
            't_seconds_sum{worker="w"} 0.5\n# TYPE c_total counter\nc_total{kind="a"} 1.0\n')
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))

    def problems(expr: str) -> list[str | None]:
        return [sel.missing(samples.get(sel.name, [])) for sel in _selectors(expr)]

    assert problems("histogram_quantile(0.9, sum by (le, worker) (rate(t_seconds_bucket[$__rate_interval])))") == [None]
    assert problems('sum by (instance) (c_total{kind=~"a|b"})') == [None]  # instance: Prometheus's own
    assert problems("sum by (le, tenant) (rate(t_seconds_bucket[5m]))") == [
        "t_seconds_bucket: no sample has the labels ['tenant']"]
    assert problems('sum(c_total{kind="b"})') == ["c_total: no sample matches [('kind', 'b')]"]
    assert problems("sum(rate(t_seconds[5m]))") == ["t_seconds: not on /metrics"]  # exact names: no suffix, nothing


def test_every_panels_series_are_exposed_by_a_live_gateway(redis_url):
    wanted = {sel.name for e in _exprs() for sel in _selectors(e)}
    assert {"agent_cache_gateway_requests_total", "agent_cache_cached_tokens_total",
            "agent_cache_gen_ai_server_time_to_first_token_seconds_bucket",
            "agent_cache_gen_ai_server_request_duration_seconds_bucket", "agent_cache_tenant_tokens_total"} <= wanted
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
        # a whole answer arrives at once (no time per token): a stream gives that panel its series
        streamed = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers)
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        fleet.stop_worker(fleet.urls.index(first.headers["x-agent-cache-worker"]))
        moved = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)  # fails over
        assert moved.status_code == 200 and moved.headers["x-agent-cache-worker"] != first.headers["x-agent-cache-worker"]
        fleet.stop_worker(fleet.urls.index(moved.headers["x-agent-cache-worker"]))
        failed = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert failed.status_code in (502, 503), failed.text  # no worker left: the server errors' panel has a series
        missing: dict[str, list[str]] = {}

        def all_exposed() -> bool:  # live sessions per worker are read from the store once per probe round (5 s)
            nonlocal missing
            missing = _panels_missing(httpx.get(url + "/metrics").text)
            return not missing

        try:
            wait_until(all_exposed, [proc], "every panel's series", timeout=20.0)
        except Exception:
            raise AssertionError(f"not on /metrics, by panel: {missing}") from None
