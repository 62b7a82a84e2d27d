"""Deterministic hashing shared by every process (and by the Redis Lua script).

SHA-1 is used because Redis Lua exposes ``redis.sha1hex``: the script and
Python compute bit-identical scores, so tie-breaks and degraded-mode choices
agree everywhere without coordination.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

# 12 hex digits = 48 bits: exact in a Lua double (53-bit mantissa).
_HEX_DIGITS = 12


def rendezvous_score(session_id: str, worker: str) -> int:
    """Highest-random-weight score of ``worker`` for ``session_id``."""
    digest = hashlib.sha1(f"{session_id}\n{worker}".encode()).hexdigest()
    return int(digest[:_HEX_DIGITS], 16)


def rendezvous_pick(session_id: str, workers: Iterable[str]) -> str | None:
    """The worker with the highest score; removing a worker moves only its keys."""
    best: str | None = None
    best_score = -1
    for w in workers:
        s = rendezvous_score(session_id, w)
        if s > best_score:
            best, best_score = w, s
    return best


def pool_for_session(session_id: str, fractions: Mapping[str, float]) -> str:
    """Pick a pool by the session hash, so every process puts a session in the same pool."""
    digest = hashlib.sha1(f"pool\n{session_id}".encode()).hexdigest()
    point = int(digest[:_HEX_DIGITS], 16) / float(16**_HEX_DIGITS)
    acc = 0.0
    last = ""
    for name, frac in fractions.items():
        acc += frac
        last = name
        if point < acc:
            return name
    return last
