"""Content-defined anchors of token sequences: every ``ANCHOR_WINDOW``-token window whose hash is 0 modulo
``ANCHOR_EVERY``. They depend on the tokens alone (a tuple's hash of integers is the same in every process
of one Python version), so a fingerprint of a template's or a session's tokens can be looked for among a
worker's resident pages (kv_state.py)."""

from __future__ import annotations

from typing import Sequence

ANCHOR_WINDOW = 16
ANCHOR_EVERY = 32
FINGERPRINT_ANCHORS = 8


def anchors(tokens: Sequence[int]) -> list[int]:
    """The content-defined anchor hashes of ``tokens``, in order."""
    return [h for _, h in anchors_at(tokens)]


def anchors_at(tokens: Sequence[int]) -> list[tuple[int, int]]:
    """(index of its last token, hash) of each content-defined anchor of ``tokens``, in order."""
    out = []
    w = ANCHOR_WINDOW
    for i in range(len(tokens) - w + 1):
        h = hash(tuple(tokens[i : i + w]))
        if h % ANCHOR_EVERY == 0:
            out.append((i + w - 1, h))
    return out


def fingerprint(tokens: Sequence[int]) -> tuple[int, ...]:
    """Up to ``FINGERPRINT_ANCHORS`` of the anchors of ``tokens``, spread evenly, the last one included."""
    found = list(dict.fromkeys(anchors(tokens)))
    if len(found) <= FINGERPRINT_ANCHORS:
        return tuple(found)
    step = len(found) / FINGERPRINT_ANCHORS
    return tuple(found[min(len(found) - 1, int((k + 1) * step) - 1)] for k in range(FINGERPRINT_ANCHORS))
