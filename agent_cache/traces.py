"""Agent trace files (JSON Lines, gzip by ``.gz`` suffix): a streaming reader and an appending writer.

One line per model call (docs/traces.md): ``session_id``, ``call_index``
(0, 1, ... within the session), ``t`` (unix seconds), ``messages`` (OpenAI
chat messages as the agent produced them), ``tools``, ``output`` (the
answer's text), ``output_tokens``, ``agent``.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from agent_cache.errors import ConfigError, TraceFormatError

_SESSIONS_COUNTED = 10_000  # sessions whose next call_index is kept (most recent)


@dataclass(frozen=True)
class TraceCall:
    session_id: str
    call_index: int
    t: float | None
    messages: list[dict[str, Any]]
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
    with opener(p, "rt", encoding="utf-8") as f:
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


class TraceWriter:
    """Appends model calls to a trace file that :func:`iter_trace` (and ``agent-cache explain``) reads.

    Each call is one whole line written and flushed at once, so a process
    that dies leaves no half line. ``call_index`` counts the calls of each
    session this writer saw (the most recent 10,000 sessions).
    """

    def __init__(self, path: str | os.PathLike[str], agent: str = "default") -> None:
        p = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(directory):
            raise ConfigError("trace_path", f"directory {directory!r} does not exist")
        self.path = p
        self.agent = agent
        self._lock = threading.Lock()
        self._next: OrderedDict[str, int] = OrderedDict()
        try:
            self._file: Any = gzip.open(p, "at", encoding="utf-8") if p.endswith(".gz") else open(p, "a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError("trace_path", f"cannot append to {p!r}: {exc}") from None

    def write(self, session_id: str, messages: Sequence[dict[str, Any]], output: str, output_tokens: int | None,
              t: float, tools: Sequence[dict[str, Any]] | None = None) -> None:
        with self._lock:
            index = self._next.pop(session_id, 0)
            self._next[session_id] = index + 1
            if len(self._next) > _SESSIONS_COUNTED:
                self._next.popitem(last=False)
            line = json.dumps({"session_id": session_id, "call_index": index, "t": t, "messages": list(messages),
                               "tools": list(tools) if tools is not None else None, "output": output,
                               "output_tokens": output_tokens, "agent": self.agent}, ensure_ascii=False)
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
