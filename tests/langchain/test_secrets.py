"""The Redis password never shows: repr, model_dump, dumps, callbacks, errors, logs, `agent-cache stats`.

A private redis-server with ``requirepass`` and a canary password; the
workers are simulated.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest
import redis
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.load import dumps
from langchain_core.messages import HumanMessage

from agent_cache import ChatSGLang
from agent_cache.errors import ConfigError
from agent_cache.redact import redact_url

CANARY = "canary-pw-7f3a9"


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server binary not found")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--requirepass", CANARY],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=CANARY, socket_timeout=0.2)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
    client.close()
    yield f"redis://:{CANARY}@127.0.0.1:{port}/0"
    proc.kill()
    proc.wait()


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


def test_errors_and_the_stats_command_hide_it(locked_redis) -> None:
    bad_port = locked_redis.replace("127.0.0.1:", "127.0.0.1:99999").rsplit("/", 1)[0] + "/0"
    with pytest.raises(ConfigError) as info:
        ChatSGLang(model="sim", workers=["http://127.0.0.1:1"], redis_url=bad_port)
    assert "redis_url" in str(info.value) and CANARY not in str(info.value)
    wrong = locked_redis.replace(CANARY, CANARY + "-wrong")
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "stats", "--redis", wrong],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and CANARY not in out.stdout + out.stderr, out.stderr
    ok = subprocess.run([sys.executable, "-m", "agent_cache.cli", "stats", "--redis", locked_redis],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and CANARY not in ok.stdout + ok.stderr
