"""The session of a call that names none: a fingerprint of its conversation's start.

Shared by ``ChatSGLang`` and the gateway, so an agent run without a thread id
(or an OpenAI client sending no session header) still sticks to one worker.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence


def conversation_session(messages: Sequence[Mapping[str, Any]]) -> str:
    """The session of a call without an id: ``conv-`` and a hash of the conversation's start.

    The start is the leading system/developer messages and the first message
    after them (the task). Runs with the same start share the session, which
    is harmless for caching: they share that prefix too.
    """
    start = []
    for m in messages:
        start.append([m.get("role"), m.get("content")])
        if m.get("role") not in ("system", "developer"):
            break
    text = json.dumps(start, ensure_ascii=False, sort_keys=True, default=str)
    return "conv-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
