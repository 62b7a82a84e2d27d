"""Streaming reader for agent trace files (JSON Lines, gzip by ``.gz`` suffix)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from typing import Any, Iterator

from agent_cache.errors import TraceFormatError


@dataclass(frozen=True)
class TraceCall:
    session_id: str
    call_index: int
    t: float | None
    messages: list[dict]
    output: str
    output_tokens: int | None
    agent: str


def _check(path: str, n: int, d: Any) -> TraceCall:
    if not isinstance(d, dict):
        raise TraceFormatError(path, n, "a line must be a JSON object")
    sid = d.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise TraceFormatError(path, n, "session_id: missing or not a non-empty string")
    ci = d.get("call_index")
    if not isinstance(ci, int) or isinstance(ci, bool) or ci < 0:
        raise TraceFormatError(path, n, "call_index: missing or not a non-negative integer")
    t = d.get("t")
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool)):
        raise TraceFormatError(path, n, "t: must be a number or null")
    if "messages" not in d:
        raise TraceFormatError(path, n, "messages: missing")
    msgs = d["messages"]
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
        raise TraceFormatError(path, n, "messages: must be a list of objects with a string role")
    out = d.get("output", "")
    if out is None:
        out = ""
    if not isinstance(out, str):
        raise TraceFormatError(path, n, "output: must be a string or null")
    ot = d.get("output_tokens")
    if ot is not None and (not isinstance(ot, int) or isinstance(ot, bool)):
        raise TraceFormatError(path, n, "output_tokens: must be an integer or null")
    agent = d.get("agent", "default")
    if not isinstance(agent, str):
        raise TraceFormatError(path, n, "agent: must be a string")
    return TraceCall(sid, ci, None if t is None else float(t), msgs, out, ot, agent)


def iter_trace(path: str) -> Iterator[TraceCall]:
    """Yield the calls of a trace in file order; malformed lines raise TraceFormatError."""
    p = str(path)
    opener = gzip.open if p.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        n = 0
        while True:
            n += 1
            try:
                line = f.readline()
            except (UnicodeDecodeError, OSError, EOFError) as e:
                raise TraceFormatError(p, n, f"unreadable: {e}") from None
            if not line:
                return
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceFormatError(p, n, f"invalid JSON: {e.msg} at column {e.colno}") from None
            yield _check(p, n, d)
