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


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(allow_nan=False, allow_infinity=False),
                       st.sampled_from(["", "a", "b ", "x\r\ny", "\u00e9", "e\u0301"]))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["type", "description", "enum", "z", "a"]), inner,
                                                 max_size=3)), max_leaves=8)
_tool = st.builds(lambda name, params, extra: {"type": "function", "function": {"name": name, "parameters": params,
                                                                                  **extra}},
                  st.sampled_from(["b", "a", "c", "a"]), _json, st.dictionaries(st.sampled_from(["description"]),
                                                                                  _json_leaf, max_size=1))


@settings(max_examples=200, deadline=None)
@given(tools=st.lists(_tool, max_size=3), mode=st.sampled_from(["off", "system", "canonical", "templatize"]))
def test_tools_kept_for_parsed_json_equal_tools_rebuilt_each_call(tools, mode) -> None:
    import json

    from agent_cache.errors import TemplateError
    from agent_cache.templates.templater import Templater

    messages = [{"role": "system", "content": "You help. Today is 2026-12-04."}, {"role": "user", "content": "hi"}]
    parsed = json.loads(json.dumps(tools))  # what a gateway request holds
    plain, kept = Templater(mode), Templater(mode)
    try:
        expected = plain.normalize(messages, parsed)
    except TemplateError as exc:
        for _ in range(2):  # an error is raised every time, never kept
            try:
                kept.normalize(messages, json.loads(json.dumps(tools)), parsed_json=True)
            except TemplateError as again:
                assert (again.field, str(again)) == (exc.field, str(exc))
            else:
                raise AssertionError("the kept path accepted tools the plain path refused")
        return
    for _ in range(2):  # the second call is served from what the first kept
        got = kept.normalize(messages, json.loads(json.dumps(tools)), parsed_json=True)
        assert (got.tools, got.template_id, got.template_tokens) == (
            expected.tools, expected.template_id, expected.template_tokens)
        if got.tools is not None:
            got.tools.clear()  # the caller's list is its own


@settings(max_examples=200, deadline=None)
@given(lines=st.integers(0, 150), blank_at=st.integers(0, 160), blank=st.sampled_from([" ", "\t", "", "x"]),
       lead=st.sampled_from(["", "\n", " \n"]))
def test_trailing_blanks_are_found_however_many_lines_come_first(lines, blank_at, blank, lead) -> None:
    rows = [f"line {i}" for i in range(lines)]
    if rows and blank_at < len(rows):
        rows[blank_at] += blank
    text = lead + "\n".join(rows) + "\nend"
    assert canonical_text(text) == _TRAILING_WS.sub("", text)


@settings(max_examples=300, deadline=None)
@given(role=st.sampled_from(["system", "developer", "user", "assistant", "tool", "other", None]),
       content=st.one_of(_text, st.none(), st.just([{"type": "text", "text": "a "}])),
       extra=st.sampled_from([{}, {"name": "n"}, {"tool_call_id": "c1"}]))
def test_a_plain_message_takes_the_quick_path_to_the_same_result(role, content, extra) -> None:
    from types import MappingProxyType

    from agent_cache.errors import TemplateError
    from agent_cache.templates.canonical import canonical_message

    msg = {"role": role, "content": content, **extra}
    outcomes = []
    for given_as in (msg, MappingProxyType(msg)):  # a dict may take the quick path; a mapping never does
        try:
            outcomes.append(("ok", list(canonical_message(given_as, 3).items())))
        except TemplateError as exc:
            outcomes.append(("error", exc.field, str(exc)))
    assert outcomes[0] == outcomes[1]


def test_long_texts_kept_stay_within_their_budget() -> None:
    from agent_cache.templates import canonical

    for i in range(200):
        text = f"doc {i} " + "word " * 20_000  # 100 KB each, 20 MB in all
        assert canonical.canonical_text(text) == text.rstrip()
        assert canonical._long_texts_size <= canonical._LONG_TEXTS_BUDGET
    huge = "x" * (canonical._LONG_TEXTS_BUDGET // 16 + 1)
    assert canonical.canonical_text(huge) == huge and huge not in canonical._LONG_TEXTS
