"""The Redis password never shows: repr, model_dump, dumps, callbacks, errors, logs, `agent-cache stats`.

A private redis-server with ``requirepass`` and a canary password; the
workers are simulated.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.load import dumps
from langchain_core.messages import HumanMessage

from agent_cache import ChatSGLang
from agent_cache.errors import ConfigError, StoreRefusedError
from agent_cache.redact import redact_url

CANARY = "canary-pw-7f3a9"


@pytest.fixture(scope="module")
def locked_redis(redis_server_factory) -> str:
    """A private redis-server that requires the canary password; its URL carries it."""
    return redis_server_factory(password=CANARY).url


class _Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_chat_model_start(self, serialized: dict, messages: Any, **kwargs: Any) -> None:
        self.seen.append(repr(serialized) + repr(kwargs))


def test_redact_url_masks_every_password_form() -> None:
    assert redact_url(f"redis://:{CANARY}@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url(f"redis://alice:{CANARY}@h:6379/0") == "redis://alice:***@h:6379/0"
    assert redact_url(f"redis://h:6379/0?password={CANARY}&db=1") == "redis://h:6379/0?password=***&db=1"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_the_password_shows_nowhere(lc_fleet, locked_redis, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    recorder = _Recorder()
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, redis_url=locked_redis, max_tokens=4)
    msg = model.invoke([HumanMessage("hello")], session_id="s1", config={"callbacks": [recorder]})
    assert msg.content and msg.response_metadata["routing"] != "degraded"  # the password did reach Redis
    shown = [repr(model), str(model), repr(model.model_dump()), str(model.model_dump(mode="json")), dumps(model),
             *recorder.seen, caplog.text]
    for text in shown:
        assert CANARY not in text
    model.close()


@pytest.mark.slow
def test_errors_and_the_stats_command_hide_it(locked_redis) -> None:
    bad_port = locked_redis.replace("127.0.0.1:", "127.0.0.1:99999").rsplit("/", 1)[0] + "/0"
    with pytest.raises(ConfigError) as info:
        ChatSGLang(model="sim", workers=["http://127.0.0.1:1"], redis_url=bad_port)
    assert "redis_url" in str(info.value) and CANARY not in str(info.value)
    wrong = locked_redis.replace(CANARY, CANARY + "-wrong")
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "stats", "--redis", wrong],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and CANARY not in out.stdout + out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "cannot read the store" in out.stderr  # a refusal, said plainly
    ok = subprocess.run([sys.executable, "-m", "agent_cache.cli", "stats", "--redis", locked_redis],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and CANARY not in ok.stdout + ok.stderr
    # the URL may come from AGENT_CACHE_REDIS_URL, as for ChatSGLang
    env = {**os.environ, "AGENT_CACHE_REDIS_URL": locked_redis}
    from_env = subprocess.run([sys.executable, "-m", "agent_cache.cli", "stats"], capture_output=True, text=True,
                              timeout=60, env=env)
    assert from_env.returncode == 0 and from_env.stdout == ok.stdout


def test_a_wrong_password_fails_the_call_with_a_store_refusal(lc_fleet, locked_redis) -> None:
    wrong = locked_redis.replace(CANARY, "not-the-password")
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, redis_url=wrong, max_tokens=4)
    with pytest.raises(StoreRefusedError) as err:
        model.invoke([HumanMessage("hi")], session_id="s-wrong-pw")
    assert err.value.field == "redis_url" and "not-the-password" not in str(err.value)
    assert not model.routing.availability.degraded  # refused, not away: no silent degraded routing
    model.close()
