"""ChatSGLang(trace_path=...): every served call appended to a trace that explain and the benchmark read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.errors import ConfigError, InvalidRequestError
from agent_cache.traces import iter_trace


@pytest.mark.parametrize("name", ["agent.jsonl", "agent.jsonl.gz"])
def test_a_recorded_run_reads_back_and_explains(lc_fleet, tmp_path, name) -> None:
    path = tmp_path / name
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, max_tokens=6, trace_path=str(path))
    replies = {}
    for session, day in (("s1", "2026-12-03"), ("s2", "2026-12-04")):
        history = [SystemMessage(f"Today is {day}. You are a careful assistant."), HumanMessage("step 0")]
        for step in range(3):
            reply = model.invoke(history, session_id=session)
            replies[(session, step)] = reply
            history += [reply, HumanMessage(f"step {step + 1}")]
    model.close()
    calls = list(iter_trace(str(path)))
    assert [(c.session_id, c.call_index) for c in calls] == [(s, i) for s in ("s1", "s2") for i in range(3)]
    first = calls[0]
    assert first.messages[0] == {"role": "system", "content": "Today is 2026-12-03. You are a careful assistant."}
    for c in calls:  # the messages as the agent produced them, the answer as it came back
        assert c.messages[-1] == {"role": "user", "content": f"step {c.call_index}"}
        reply = replies[(c.session_id, c.call_index)]
        assert c.output == reply.content and c.output_tokens == reply.usage_metadata["output_tokens"]
        assert c.t is not None and c.t > 0
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "explain", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "date" in out.stdout  # the date that splits the two sessions' prefixes


def test_a_rejected_call_is_not_recorded(lc_fleet, tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    model = ChatSGLang(model="sim", workers=lc_fleet.urls, max_tokens=4, trace_path=str(path))
    with pytest.raises(InvalidRequestError):
        model.invoke([HumanMessage("hi")], session_id="s", temperature=-1.0)
    model.invoke([HumanMessage("hi")], session_id="s")
    model.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["call_index"] == 0


def test_a_trace_path_in_a_missing_directory_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        ChatSGLang(base_url="http://127.0.0.1:9", trace_path=str(tmp_path / "no" / "t.jsonl"))
    assert err.value.field == "trace_path"

