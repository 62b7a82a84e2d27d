"""DNS discovery's pieces: the --workers-dns syntax, the hosts-file resolver, and names that do not resolve."""

from __future__ import annotations

import pytest

from agent_cache.errors import ConfigError
from agent_cache.routing.discovery import DnsTarget, HostsFileResolver, discover, parse_targets, system_resolver


def test_targets_name_a_port_and_optionally_a_pool():
    assert parse_targets(["sglang:30000,big=sglang-big.inference.svc.cluster.local:8000", "x:1"]) == (
        DnsTarget("sglang", 30000), DnsTarget("sglang-big.inference.svc.cluster.local", 8000, "big"),
        DnsTarget("x", 1))


@pytest.mark.parametrize("bad", ["sglang", "sglang:", ":30000", "sglang:0", "sglang:70000", "=sglang:1",
                                 "http://sglang:30000", "sglang:port"])
def test_a_malformed_target_names_the_flag(bad):
    with pytest.raises(ConfigError, match="NAME:PORT") as err:
        parse_targets([bad], "--workers-dns")
    assert err.value.field == "--workers-dns"


def test_addresses_become_worker_urls_ipv6_bracketed(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# pods\n10.0.0.7 sglang other\n10.0.0.5 sglang\nfd00::9 sglang\nnot-an-ip sglang\n")
    found, failed = discover(parse_targets(["sglang:30000"]), HostsFileResolver(hosts))
    assert failed == []
    assert found == {"http://10.0.0.5:30000": "default", "http://10.0.0.7:30000": "default",
                     "http://[fd00::9]:30000": "default"}


def test_a_name_that_does_not_resolve_is_reported_not_raised(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.7 sglang\n")
    found, failed = discover(parse_targets(["sglang:1,gone:2"]), HostsFileResolver(hosts))
    assert found == {"http://10.0.0.7:1": "default"} and len(failed) == 1 and failed[0].startswith("gone:2")
    found, failed = discover(parse_targets(["no-such-name.invalid:1"]), system_resolver)
    assert found == {} and len(failed) == 1
    assert "127.0.0.1" in system_resolver("localhost", 80)
