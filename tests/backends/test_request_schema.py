"""The request checks over random JSON: a request passes or fails with InvalidRequestError naming a field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_cache.backends.protocol import CHAT_FIELDS
from agent_cache.backends.request_check import check_chat_request
from agent_cache.backends.request_schema import CHAT, MAX_DEPTH, check_depth
from agent_cache.errors import InvalidRequestError
from agent_cache.gateway.requests import COMPLETION_FIELDS, GENERATE_FIELDS

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)
_names = st.sampled_from(sorted(CHAT_FIELDS | COMPLETION_FIELDS | GENERATE_FIELDS | {"tools", "bogus"}))
_bodies = st.dictionaries(_names, _json, max_size=6)


def _deep(levels: int) -> Any:
    value: Any = 1
    for i in range(levels):
        value = [value] if i % 2 else {"a": value}
    return value


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(_json, max_size=3), params=_bodies,
       fields=st.sampled_from([CHAT_FIELDS, COMPLETION_FIELDS, GENERATE_FIELDS]))
@pytest.mark.slow
def test_random_json_passes_or_names_a_field(messages, params, fields):
    try:
        check_chat_request(messages, params, {"extra_key": None}, fields=fields)
    except InvalidRequestError as exc:
        assert exc.field and isinstance(exc.field, str)


@settings(max_examples=100, deadline=None)
@given(field=st.sampled_from(sorted(CHAT)), levels=st.integers(MAX_DEPTH + 1, 5000))
def test_any_depth_is_refused_without_recursion(field, levels):
    params = {field: _deep(levels)}
    try:
        check_chat_request([{"role": "user", "content": "x"}], params, {"extra_key": None},
                           fields=CHAT_FIELDS | {field})
    except InvalidRequestError as exc:
        assert exc.field.split(".")[0].split("[")[0] == field
    else:
        raise AssertionError("accepted")


def test_depth_limit_is_exact():
    check_depth({"x": _deep(MAX_DEPTH)})
    try:
        check_depth({"x": _deep(MAX_DEPTH + 1)})
    except InvalidRequestError as exc:
        assert exc.field == "x"
    else:
        raise AssertionError("accepted")


def test_strict_types_name_the_field():
    for params, field in (({"stream": "false"}, "stream"), ({"tools": 5}, "tools"), ({"tools": "zz"}, "tools"),
                          ({"logprobs": 1}, "logprobs"), ({"model": 1}, "model"),
                          ({"tools": [{"function": {"name": "f"}}], "tool_choice": True}, "tool_choice")):
        try:
            check_chat_request([{"role": "user", "content": "x"}], params, {"extra_key": None})
        except InvalidRequestError as exc:
            assert exc.field == field, (params, exc.field)
        else:
            raise AssertionError(f"accepted {params}")
    check_chat_request([{"role": "user", "content": "x"}],
                       {"stream": True, "tools": [{"type": "function", "function": {"name": "f"}}],
                        "tool_choice": "auto", "logprobs": True, "model": "m"}, {"extra_key": None})
