"""ChatSGLang's options: a typo or an unknown option is an error naming it, conflicts raise, small conveniences."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent_cache import ChatSGLang, __version__
from agent_cache.errors import ConfigError
from agent_cache.routing import Router

URL = "http://127.0.0.1:9"  # never contacted

# (typo, the option it should point to; None: no close option)
TYPOS = [
    ("temprature", "temperature"), ("temperture", "temperature"), ("max_token", "max_tokens"),
    ("maxtokens", "max_tokens"), ("max_tokns", "max_tokens"), ("redis", "redis_url"), ("redisurl", "redis_url"),
    ("redis_uri", "redis_url"), ("base_uri", "base_url"), ("baseurl", "base_url"), ("worker", "workers"),
    ("tennant", "tenant"), ("templates_mode", "templates"), ("template", "templates"), ("timout", "timeout"),
    ("max_retry", "max_retries"), ("streamming", "streaming"), ("apikey", "api_key"), ("model_kwarg", "model_kwargs"),
    ("extrabody", "extra_body"),
]


@pytest.mark.parametrize("typo,meant", TYPOS)
def test_a_misspelt_option_raises_naming_it_and_the_closest(typo, meant):
    with pytest.raises(ConfigError) as err:
        ChatSGLang(base_url=URL, **{typo: "x"})
    assert err.value.field == typo and f"did you mean {meant!r}" in str(err.value)


@pytest.mark.parametrize("typo,meant", [("base_ulr", "base_url"), ("wokers", "workers"), ("base_uri", "base_url")])
def test_a_lone_misspelt_worker_option_is_named_not_reported_missing(typo, meant, monkeypatch):
    monkeypatch.delenv("AGENT_CACHE_BASE_URL", raising=False)
    monkeypatch.delenv("AGENT_CACHE_WORKERS", raising=False)
    with pytest.raises(ConfigError) as err:
        ChatSGLang(**{typo: URL})
    assert err.value.field == typo and f"did you mean {meant!r}" in str(err.value)


def test_a_router_option_points_at_the_router():
    with pytest.raises(ConfigError) as err:
        ChatSGLang(base_url=URL, session_ttl=10)
    assert err.value.field == "session_ttl" and "Router(" in str(err.value)


def test_router_and_other_workers_conflict():
    router = Router([URL], probe_interval=None)
    with pytest.raises(ConfigError) as err:
        ChatSGLang(router=router, workers=["http://127.0.0.1:10"])
    assert err.value.field == "workers"
    assert ChatSGLang(router=router).workers == [URL]  # the router's workers are the model's
    router.close()


def test_unknown_pool_and_bad_tenant_fail_at_construction():
    with pytest.raises(ConfigError) as err:
        ChatSGLang(base_url=URL, pool="gpu-a")
    assert err.value.field == "pool"
    with pytest.raises(ConfigError) as err:
        ChatSGLang(base_url=URL, tenant="x" * 129)
    assert err.value.field == "tenant"
    with pytest.raises(ConfigError) as err:
        ChatSGLang(base_url=URL, temperature=float("nan"))
    assert err.value.field == "temperature"


def test_token_counts_come_from_tiktoken():
    model = ChatSGLang(base_url=URL)
    assert model.get_num_tokens("hello world") == 2  # cl100k: "hello", " world"
    assert model.get_token_ids("hello world") == [15339, 1917]


def test_cli_version():
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"agent-cache {__version__}"


@pytest.mark.slow
def test_type_checkers_see_every_option(tmp_path):
    """The constructor's runtime checks are hidden from type checkers, which see pydantic's typed fields."""
    pytest.importorskip("mypy", reason="mypy is not installed (it comes with the test extra)")
    snippet = tmp_path / "uses_model.py"
    snippet.write_text(
        "from agent_cache.langchain.chat_model import ChatSGLang\n"
        "ok = ChatSGLang(model='m', base_url='http://h:1', temperature=0.2, max_tokens=5, stop_sequences=['x'])\n"
        "typo = ChatSGLang(base_url='http://h:1', temprature=0.1)\n"
        "wrong = ChatSGLang(base_url='http://h:1', max_tokens='many')\n"
    )
    out = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
                          "--no-incremental", str(snippet)], capture_output=True, text=True, timeout=300)
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, out.stdout
    assert ':3: error: Unexpected keyword argument "temprature"' in errors[0]
    assert ':4: error: Argument "max_tokens"' in errors[1]


def test_environment_defaults_yield_to_keywords_and_to_a_router(monkeypatch, redis_url) -> None:
    monkeypatch.setenv("AGENT_CACHE_API_KEY", "from-env")
    monkeypatch.setenv("AGENT_CACHE_REDIS_URL", redis_url)
    url = "http://127.0.0.1:9"
    from_env = ChatSGLang(base_url=url)
    try:
        assert from_env.api_key is not None and from_env.api_key.get_secret_value() == "from-env"
        assert from_env.redis_url is not None and type(from_env.routing.store).__name__ == "RedisStore"
    finally:
        from_env.routing.close()
    given = ChatSGLang(base_url=url, api_key="mine")
    assert given.api_key is not None and given.api_key.get_secret_value() == "mine"
    given.routing.close()
    router = Router([url], probe_interval=None)
    with_router = ChatSGLang(router=router)
    assert with_router.redis_url is None and with_router.routing is router  # the router's store, not the env's
    router.close()
