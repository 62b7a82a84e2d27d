"""The session of a call that names none, inferred from its conversation.

Shared by ``ChatSGLang`` and the gateway, so an agent run without a thread id
(or an OpenAI client sending no session header) still sticks to one worker.

A conversation's start (the leading system/developer messages and the first
message after them) names a shared *prefix*, not a session: a chat front-end
sends every user the same system prompt and many open with the same "Hello".
So a call without an assistant turn yet (step 1) gets a session of its own,
``conv-<start hash>-<random>``, and is placed by the placement rule like any new
session of its template. Once a conversation has an assistant turn it has
diverged: its session is ``conv-`` and a hash of the start, the first assistant
turn and the message after it, which every later step repeats, so steps 2, 3, ...
stick to one worker. Conversations that are the same up to there share that
prefix too, so sharing a session costs them nothing.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, Mapping, Sequence

__all__ = ["conversation_session"]

_LEADING = ("system", "developer")


def _turn(m: Mapping[str, Any]) -> list[Any]:
    """The parts of a message that identify it (its tool calls by id and name: arguments are re-serialised
    by some clients)."""
    # any JSON may arrive here: the gateway infers the session before the body's fields are type-checked
    given = m.get("tool_calls")
    calls = [[c.get("id"), f.get("name") if isinstance(f := c.get("function"), Mapping) else None]
             for c in (given if isinstance(given, list) else []) if isinstance(c, Mapping)]
    return [m.get("role"), m.get("content") or "", calls, m.get("tool_call_id")]


def _hash(parts: list[list[Any]]) -> str:
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def conversation_session(messages: Sequence[Mapping[str, Any]]) -> str:
    """The session of a call without an id (see the module docstring).

    Without an assistant turn yet: ``conv-<hash of the start>-<random>``, a new session per call.
    With one: ``conv-<hash>`` of the start, the first assistant turn and the message after it
    (the same for every later step of the conversation).
    """
    parts: list[list[Any]] = []
    i = 0
    while i < len(messages):  # the start: leading system/developer messages and the first one after them
        parts.append(_turn(messages[i]))
        i += 1
        if parts[-1][0] not in _LEADING:
            break
    start = _hash(parts)
    first_reply = next((j for j in range(i, len(messages)) if messages[j].get("role") == "assistant"), None)
    if first_reply is None:
        return f"conv-{start[:16]}-{uuid.uuid4().hex[:16]}"
    parts.extend(_turn(m) for m in messages[i:first_reply + 2])
    return "conv-" + _hash(parts)
