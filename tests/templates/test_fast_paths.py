"""The fast paths (prefilter, per-line token counts, str.find display) equal the plain versions."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from agent_cache.templates.canonical import _TRAILING_WS, canonical_text
from agent_cache.templates.detectors import _DETECTORS, _plausible, detect_spans, display
from agent_cache.templates.templater import encoder, token_count

_FRAGS = ["2026-12-02", "T14:03:00Z", " 14:03", "2:03 PM", " PST", "Wed, 02 Dec 2026", "December 2, 2026",
          " at ", "12/02/2026", "1764684000", "1764684000123", "8f2c1a2b-1234-4abc-9def-0123456789ab",
          "abcdefab-abcd-abcd-abcd-abcdefabcdef", "0x1a2b3c4d5e6f7a8b9c", "abc123def456ghi789jkl012",
          "alice@example.com", "@", ".", "-", ":", "=", "\n", "\n\n", " ", "  ", "\t", "\r", "x", "Word", "'s",
          "3:16", "\u0662\u0660\u0662\u0666", "\u00e9", "\u00a0", "\x1c", "\u2028", "{", "}", "{a}", "{{", "}}",
          "<|system|>", "9", "_"]
_text = st.lists(st.sampled_from(_FRAGS), max_size=40).map("".join)


def _spans_full_scan(text: str) -> list[tuple[int, int, str]]:
    # detect_spans without variables and without the prefilter.
    found = []
    for prio, (kind, pat) in enumerate(_DETECTORS, 1000):
        for m in pat.finditer(text):
            if _plausible(kind, m.group()):
                found.append((m.start(), prio, m.end(), kind))
    found.sort(key=lambda f: (f[1], f[0]))
    kept: list[tuple[int, int, str]] = []
    for start, _p, end, kind in found:
        if all(end <= s or start >= e for s, e, _k in kept):
            kept.append((start, end, kind))
    return sorted(kept)


_PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")


@settings(max_examples=400, deadline=None)
@given(_text)
def test_fast_paths_match_reference(text):
    assert detect_spans(text) == _spans_full_scan(text)
    assert token_count(text) == len(encoder().encode(text, disallowed_special=()))
    if text.isascii():  # (non-ASCII text also goes through NFC)
        assert canonical_text(text) == _TRAILING_WS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    assert display(text) == _PLACEHOLDER_RE.sub(lambda m: m.group()[0] if m.group() in ("{{", "}}") else m.group(), text)
