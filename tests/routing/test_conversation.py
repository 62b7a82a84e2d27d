"""Session inference reads any JSON a client sends: it runs before the body's fields are type-checked."""

from __future__ import annotations

from typing import Any

import pytest

from agent_cache.routing.conversation import conversation_session

_ODD: list[Any] = [3, "ab", None, True, {"k": 1}, [1, "x", None], [{"function": "f"}], [{"function": 7, "id": []}]]


@pytest.mark.parametrize("tool_calls", _ODD, ids=[repr(v)[:24] for v in _ODD])
def test_a_message_of_any_shape_names_a_session_and_raises_nothing(tool_calls: Any) -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": {"odd": [1]}},
                {"role": "assistant", "content": None, "tool_calls": tool_calls}, {"role": "user", "content": 5}]
    first = conversation_session(messages)
    assert first.startswith("conv-") and first == conversation_session(messages)  # later steps: one session


def test_tool_calls_count_by_id_and_name_only() -> None:
    def step(arguments: str) -> list[dict[str, Any]]:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    assert conversation_session(step('{"a": 1}')) == conversation_session(step('{"a":1}'))
    other = step("{}")
    other[1]["tool_calls"][0]["function"]["name"] = "g"
    assert conversation_session(other) != conversation_session(step("{}"))
