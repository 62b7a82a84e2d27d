"""Trace reader and explain, on small prompts and on the shipped trace."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from agent_cache.traces import iter_trace
from agent_cache.errors import TraceFormatError
from agent_cache.templates.explain import explain_prompts, explain_trace, main_explain, render_chat

# The project's traces folder, or the shared one next to the checkout; AGENT_CACHE_TRACE_DIR overrides.
_HERE = Path(__file__).resolve()
_DIRS = [os.environ.get("AGENT_CACHE_TRACE_DIR", ""), _HERE.parents[1] / "data", _HERE.parents[3] / "shared" / "traces"]
TRACE = next((Path(d) / "reflexion_hotpotqa.jsonl.gz" for d in _DIRS
              if d and (Path(d) / "reflexion_hotpotqa.jsonl.gz").exists()), None)
GOOD = {"session_id": "s", "call_index": 0, "t": None, "messages": [{"role": "user", "content": "hi"}],
        "output": "x", "output_tokens": None, "agent": "a"}


def test_explain_two_prompts():
    a = [{"role": "system", "content": "Today is 2026-12-02. Be brief."}, {"role": "user", "content": "q"}]
    b = [{"role": "system", "content": "Today is 2026-12-03. Be brief."}, {"role": "user", "content": "q"}]
    d = explain_prompts(a, b)
    rendered, _ = render_chat(b)
    assert d.divergence_char == len("<|system|>\nToday is 2026-12-0")
    assert d.chars_lost == len(rendered) - d.divergence_char and d.rule == "date" and d.tokens_lost > 0
    ws = explain_prompts([{"role": "system", "content": "x  \ny"}], [{"role": "system", "content": "x\ny"}])
    assert ws.rule == "whitespace/NFC"
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    assert explain_prompts([], [], a_tools=tools, b_tools=tools[::-1]).rule == "tool-order"
    assert explain_prompts(a, a + [{"role": "user", "content": "more"}]).rule == "content"
    assert explain_prompts(a, a).rule is None


def _write(tmp_path, lines, gz=False):
    p = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    data = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(p, "wt") as f:
            f.write(data)
    else:
        p.write_text(data)
    return str(p)


@pytest.mark.parametrize("bad,needle", [
    ("{not json", "invalid JSON"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "messages"}), "messages: missing"),
    (json.dumps({**GOOD, "call_index": "3"}), "call_index"),
    (json.dumps({**GOOD, "messages": "hi"}), "messages"),
])
@pytest.mark.parametrize("gz", [False, True])
def test_trace_reader_malformed(tmp_path, bad, needle, gz):
    path = _write(tmp_path, [json.dumps(GOOD), "", bad], gz)
    it = iter_trace(path)
    assert next(it).session_id == "s"
    with pytest.raises(TraceFormatError) as e:
        next(it)
    assert e.value.line == 3 and needle in str(e.value)


def test_cli_errors(tmp_path, capsys):
    assert main_explain([str(tmp_path / "missing.jsonl")]) == 2
    assert "no such trace file" in capsys.readouterr().err
    assert main_explain([str(tmp_path / "x"), "--top", "0"]) == 2
    assert main_explain([_write(tmp_path, ["{bad"]), "--top", "3"]) == 2
    assert ":1:" in capsys.readouterr().err


@pytest.mark.skipif(TRACE is None, reason="shipped trace not found")
@pytest.mark.slow
def test_explain_shared_trace(capsys):
    report = explain_trace(str(TRACE))
    assert len(report.calls) == 2961
    assert sum(n for n, _ in report.by_rule().values()) == 2961
    firsts = [c for c in report.calls if c.call_index == 0]
    assert len(firsts) == 100
    assert firsts[0].divergence.source == "none" and firsts[0].divergence.divergence_char == 0
    for c in report.calls:
        d = c.divergence
        assert d.chars_lost == c.prompt_chars - d.divergence_char
        assert (d.rule is None) == (d.chars_lost == 0)
        assert d.tokens_lost <= d.chars_lost
    # Later calls of a session reuse most of their prompt.
    later = [c for c in report.calls if c.call_index > 0]
    assert sum(c.divergence.divergence_char for c in later) / sum(c.prompt_chars for c in later) > 0.9
    assert main_explain([str(TRACE), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "calls: 2961" in out and "worst 3" in out
