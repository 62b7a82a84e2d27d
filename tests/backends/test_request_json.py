"""The quick JSON walk of request checks agrees with the walk that names the bad part."""

from __future__ import annotations

import enum
from collections import OrderedDict

import pytest

from agent_cache.backends.request_check import _clean, _explain, check_chat_request
from agent_cache.errors import InvalidRequestError


class Level(enum.IntEnum):
    LOW = 1


CASES = [
    {"a": [1, 2.5, None, True, "x", ("t", {"é": "ü"})]},
    {"a": "\ud800"},
    {"\udfff": 1},
    {1: "int key"},
    [float("nan")],
    {"b": float("inf")},
    OrderedDict(a=1),
    {"level": Level.LOW},
    {"raw": b"bytes"},
    {"deep": [[[[{"k": "v"}]]]]},
]


@pytest.mark.parametrize("value", CASES, ids=range(len(CASES)))
def test_the_quick_walk_never_accepts_what_the_naming_walk_refuses(value: object) -> None:
    try:
        _explain(value, "x")
        refused = False
    except InvalidRequestError:
        refused = True
    assert not (_clean(value) and refused)


def test_a_bad_part_deep_in_the_messages_is_named() -> None:
    messages = [{"role": "user", "content": "ok"}, {"role": "tool", "content": [{"type": "text", "text": "a\ud800"}]}]
    with pytest.raises(InvalidRequestError) as err:
        check_chat_request(messages, {}, {"extra_key": None})
    assert err.value.field == "messages[1].content[0].text"
