"""Request bodies in and out of the gateway: what JSON allows passes through, what it does not is a
400 naming the body."""

from __future__ import annotations

import json

import pytest

from agent_cache.errors import InvalidRequestError
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.requests import COMPLETIONS, parse_json_body, prepare


def test_json_that_orjson_refuses_but_json_allows_still_parses() -> None:
    # integers past 64 bits are read exactly (orjson would read a float), and need no further check
    assert parse_json_body(b'{"seed": 1180591620717411303425}') == ({"seed": 2**70 + 1}, True)
    assert parse_json_body(b'{"seed": 18446744073709551616}') == ({"seed": 2**64}, True)
    assert parse_json_body(b'{"prompt": "\\ud800"}') == ({"prompt": "\ud800"}, False)  # the field checks name it
    assert parse_json_body(b'{"prompt": "\\ud800\\udc00", "n": 1.5}') == ({"prompt": "\U00010000", "n": 1.5}, True)


@pytest.mark.parametrize("raw", [b'{"temperature": NaN}', b'{"temperature": -Infinity}', b"{not json",
                                 b'{"a": "\xff"}', b"[1]"])
def test_what_json_does_not_allow_is_refused_naming_the_body(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse_json_body(raw)
    assert err.value.field == "body"


def test_the_body_for_the_worker_is_compact_utf8_and_keeps_big_integers() -> None:
    body = {"model": "m", "prompt": "héllo ✓", "seed": 2**70 + 1, "max_tokens": 4}
    call = prepare(COMPLETIONS, dict(body), grant=ApiKey("default"), extra_key=None, session="s", templater=None,
                   pool=None, extra_fields=frozenset())
    assert json.loads(call.body) == body and not call.stream and not call.worker_streams  # a whole call, sent whole
    assert "héllo ✓".encode() in call.body and b", " not in call.body
    small = prepare(COMPLETIONS, {**body, "seed": 7, "stream": True}, grant=ApiKey("default"), extra_key=None,
                    session="s", templater=None, pool=None, extra_fields=frozenset())
    streamed = {**body, "seed": 7, "stream": True, "stream_options": {"include_usage": True}}  # the router's usage
    assert small.body == json.dumps(streamed, ensure_ascii=False, separators=(",", ":")).encode()
