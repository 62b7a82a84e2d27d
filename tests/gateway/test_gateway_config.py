"""``agent-cache serve``'s flags are GatewayConfig's fields: one default for each, and the whole checked, each
error naming its flag, before the command asks Redis or binds a port."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from agent_cache.cli import build_parser, main
from agent_cache.errors import ConfigError
from agent_cache.gateway import config as gw
from agent_cache.gateway.http_limits import HeaderLimits
from agent_cache.langchain import ChatSGLang
from agent_cache.routing.config import DEFAULT_MAX_ATTEMPTS, DEFAULT_PROBE_INTERVAL
from agent_cache.routing.fleet import FleetConfig
from agent_cache.routing.router import Router
from tests.conftest import free_port

# fields set otherwise than by a flag of their own name
NOT_FLAGS = {"workers", "redis_url", "api_keys", "infer_sessions", "extra_fields", "worker_api_key", "fleet",
             "header_limits", "kv_events", "probe_interval"}


def test_every_flag_takes_its_default_from_gateway_config() -> None:
    args = build_parser().parse_args(["serve", "--workers", "http://127.0.0.1:1"])
    for field in dataclasses.fields(gw.GatewayConfig):
        if field.name not in NOT_FLAGS:
            assert getattr(args, field.name) == gw.default(field.name), field.name
    limits = HeaderLimits()
    assert (args.max_header_bytes, args.header_timeout, args.send_timeout) == (
        limits.max_bytes, limits.timeout, limits.send_timeout)
    fleet = FleetConfig()
    assert (args.worker_drain_timeout, args.fleet_refresh) == (fleet.drain_timeout, fleet.refresh)
    assert args.worker_drain_timeout != args.drain_timeout  # two settings: a removed worker's, the gateway's own


def test_the_router_and_chat_model_defaults_are_one_constant_each() -> None:
    router = inspect.signature(Router).parameters
    assert router["max_attempts"].default == gw.default("max_attempts") == DEFAULT_MAX_ATTEMPTS
    assert router["probe_interval"].default == gw.default("probe_interval") == DEFAULT_PROBE_INTERVAL
    assert ChatSGLang.model_fields["max_retries"].default == DEFAULT_MAX_ATTEMPTS - 1  # retries, not tries


@pytest.mark.parametrize(("given", "said"), [
    (["--prefix", "a{b}"], "--prefix: prefix must be non-empty without braces"),
    (["--redis", "http://127.0.0.1:6379"], "--redis: unsupported scheme 'http'"),
    (["--port", "70000"], "--port: a port is 0-65535, got 70000"),
    (["--metrics-port", "-1"], "--metrics-port: a port is 0-65535, got -1"),
    (["--extra-fields", "extra_key"], "--extra-fields: ['extra_key'] are set or checked by the gateway"),
])
def test_a_bad_option_is_one_line_naming_its_flag_before_redis_is_asked(given, said, capsys) -> None:
    # a Redis nobody listens on: asking it would print a warning line and go on to bind and serve
    redis = ["--redis", f"redis://127.0.0.1:{free_port()}/0"] if "--redis" not in given else []
    assert main(["serve", "--workers", "http://127.0.0.1:1", *redis, *given]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"agent-cache serve: {said}"), lines


def test_gateway_config_checks_the_serving_options_it_is_given() -> None:
    for field, value in (("http", "h2"), ("loop", "trio"), ("log_format", "xml"), ("keep_alive", 0),
                         ("drain_timeout", -1.0), ("log_level", "loud"), ("first_byte_floor", 0)):
        with pytest.raises(ConfigError) as err:
            gw.GatewayConfig(["http://127.0.0.1:1"], **{field: value})
        assert err.value.field == field and gw.flag(field) == "--" + field.replace("_", "-")
    assert gw.GatewayConfig(["http://127.0.0.1:1"], log_level="WARN").log_level == "warning"
    assert (gw.flag("redis_url"), gw.flag("infer_sessions"), gw.flag("--pool")) == (
        "--redis", "--no-infer-sessions", "--pool")
