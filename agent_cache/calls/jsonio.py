"""JSON from bytes, fast where it can be and exact where orjson reads differently."""

from __future__ import annotations

import json
from typing import Any, Mapping

import msgspec
import orjson

from agent_cache.errors import MalformedResponseError


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# 19 digits in a row: possibly an integer past 64 bits, which orjson reads as a float. Found by
# mapping digits to 1 and the rest to 0 (C speed: a regular expression took 180 us on 8 KB)
_DIGITS = bytes(49 if 48 <= c <= 57 else 48 for c in range(256))
_NINETEEN = b"1" * 19


def loads(raw: bytes, *, strict: bool = True) -> Any:
    """JSON from bytes: msgspec or orjson (a tenth of the json module's time on a chat body), and the
    json module for what they read differently or refuse and JSON allows (integers past 64 bits,
    lone surrogate escapes, which the field checks then name). ``strict``: NaN and Infinity are
    refused, as JSON refuses them (a request); else read as the json module reads them (a worker's
    answer)."""
    return loads_checked(raw, strict)[0]


def loads_checked(raw: bytes, strict: bool) -> tuple[Any, bool]:
    """:func:`loads`, and whether a strict parser read it (then every text is valid Unicode and every
    number finite: msgspec and orjson refuse the rest).

    msgspec first: it reads integers past 64 bits exactly, so the body needs no scan for them (the
    scan cost twice the parse); it stops short of orjson's depth (its limit is the interpreter's
    recursion limit), so a deeper body goes on to orjson, whose depth the field checks then name."""
    try:
        return msgspec.json.decode(raw), True
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    if _NINETEEN not in raw.translate(_DIGITS):
        try:
            return orjson.loads(raw), True
        except orjson.JSONDecodeError:
            pass
    return (json.loads(raw, parse_constant=_no_constant) if strict else json.loads(raw)), False


def dumps(body: Any) -> bytes:
    """Compact UTF-8 JSON."""
    try:
        return orjson.dumps(body)  # as below, twenty times faster
    except TypeError:  # an integer past 64 bits
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def printable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (JSON's escapes allow one, UTF-8 does not)
    is written out as its escape's characters, so an answer quoting it can still be sent."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def dumps_printable(body: Any) -> bytes:
    """:func:`dumps` for an answer the gateway writes itself (an error may quote the request's own
    text): never fails on a lone surrogate, which is written out by :func:`printable`."""
    try:
        return dumps(body)
    except UnicodeEncodeError:
        return dumps(_printable_tree(body))


def _printable_tree(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, Mapping):
        return {printable(str(k)): _printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable_tree(v) for v in value]
    return value


def json_object(raw: bytes, worker: str) -> dict[str, Any]:
    """A worker's JSON answer or stream event; anything else is a malformed (retryable) answer."""
    try:
        data = loads(raw, strict=False)  # Infinity in logprobs is read as the json module reads it
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise MalformedResponseError("the worker's answer is not a JSON object", url=worker)
    return data
