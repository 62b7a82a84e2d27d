"""A chat completion request checked before it is routed: bad input fails here, naming its field.

Run before the router places the call, so a request that SGLang would refuse
(or that cannot even be encoded as JSON) writes nothing to the store and
costs no worker a round trip. The option ranges are SGLang's own
(``SamplingParams.verify`` in ``sglang/srt/sampling/sampling_params.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping  # not typing's: isinstance against it is several times slower
from typing import Any, Collection, Sequence

from agent_cache.backends import request_schema
from agent_cache.backends.protocol import CHAT_FIELDS
from agent_cache.backends.request_schema import Check, check_depth, check_types
from agent_cache.errors import InvalidRequestError

# Fields that namespace the worker's prefix cache: the router sets them from
# the tenant, so a caller cannot read (or time) another tenant's cached prompts.
TENANT_FIELDS = ("extra_key", "cache_salt")

# option -> (lowest, highest, whether the lowest is allowed), as SGLang verifies them
_RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, math.inf, True),
    "top_p": (0.0, 1.0, False),
    "min_p": (0.0, 1.0, True),
    "frequency_penalty": (-2.0, 2.0, True),
    "presence_penalty": (-2.0, 2.0, True),
    "repetition_penalty": (0.0, 2.0, False),
}
_COUNTS = {"max_tokens": 0, "max_completion_tokens": 0, "min_tokens": 0, "n": 1, "top_logprobs": 0,
           "max_new_tokens": 0, "min_new_tokens": 0}  # the last two: /generate's sampling_params
_INTEGERS = ("top_k", "seed")


def check_chat_request(
    messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any], owned: Mapping[str, str | None],
    fields: Collection[str] = CHAT_FIELDS, owner: str = "give ChatSGLang(tenant=...) instead",
    values_checked: bool = False, schema: Mapping[str, Check] | None = None, depth_checked: bool = False,
) -> None:
    """Raise :class:`InvalidRequestError` naming the field for a request SGLang or the router would refuse.

    ``params``: the chat completion fields (``extra_body`` included, merged
    as the client merges it); ``owned``: the router's value for each of
    :data:`TENANT_FIELDS` (``None``: the field must not be set); ``fields``:
    the request fields accepted; ``owner``: how the caller picks a tenant; ``values_checked``: every
    text is known to be valid Unicode and every number finite (read by a strict JSON parser), so
    only the fields and ranges are checked; ``depth_checked``: the values' nesting was just checked
    (:func:`~agent_cache.backends.request_schema.check_depth`); ``schema``: each field's type
    (:mod:`~agent_cache.backends.request_schema`; by default the one of the route whose ``fields``
    these are: chat, completions or ``/generate``).
    """
    extra = params.get("extra_body") or {}
    if not isinstance(extra, Mapping):
        raise InvalidRequestError("extra_body", f"expected a mapping, got {type(extra).__name__}")
    unknown = sorted(str(k) for k in params if k != "extra_body" and k not in fields)
    if unknown:
        shown = [name[:100] for name in unknown[:10]]  # bounded: the answer need not repeat a huge body
        raise InvalidRequestError(unknown[0][:200], f"not a chat completion field SGLang accepts (unknown: {shown})")
    for field in TENANT_FIELDS:
        for where, source in ((field, params), (f"extra_body.{field}", extra)):
            value = source.get(field)
            if value is not None and value != owned.get(field):
                raise InvalidRequestError(where, "set by the router from the model's tenant, so one tenant cannot reach "
                                         "another's cached prompts; " + owner)
    merged = {**{k: v for k, v in params.items() if k != "extra_body"}, **extra}
    if not depth_checked:
        check_depth({"messages": messages, **merged})  # first: every walk below may then recurse
    if schema is None:
        schema = _schema_for(fields)
    if messages:
        schema.get("messages", request_schema.CHAT["messages"])(messages, "messages")
    check_types(merged, schema)
    _check_options(merged, "")
    sampling = merged.get("sampling_params")  # /generate: the options sit there
    for i, options in enumerate(sampling if isinstance(sampling, list) else [sampling]):
        if isinstance(options, Mapping):
            _check_options(options, "sampling_params." if isinstance(sampling, Mapping) else f"sampling_params[{i}].")
    if values_checked:
        return
    _check_json(messages, "messages")
    for name, value in merged.items():
        _check_json(value, str(name))


def _check_options(values: Mapping[str, Any], prefix: str) -> None:
    """SGLang's ranges for the sampling options in ``values`` (named ``prefix`` + the option)."""
    for name, (low, high, low_ok) in _RANGES.items():
        value = values.get(name)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value):
            raise InvalidRequestError(prefix + name, f"expected a finite number, got {value!r}")
        if value < low or (value == low and not low_ok) or value > high:
            bounds = f"{'[' if low_ok else '('}{low}, {high}]"
            raise InvalidRequestError(prefix + name, f"must be within {bounds}, got {value!r}")
    for name, least in _COUNTS.items():
        value = values.get(name)
        if value is not None and (not _is_integer(value) or value < least):
            raise InvalidRequestError(prefix + name, f"expected an integer >= {least}, got {value!r}")
    for name in _INTEGERS:
        value = values.get(name)
        if value is not None and not _is_integer(value):
            raise InvalidRequestError(prefix + name, f"expected an integer, got {value!r}")


def _schema_for(fields: Collection[str]) -> Mapping[str, Check]:
    if "sampling_params" in fields:
        return request_schema.GENERATE
    if "prompt" in fields:
        return request_schema.COMPLETIONS
    return request_schema.CHAT


def check_text(value: str, field: str) -> None:
    """Raise :class:`InvalidRequestError` naming ``field`` if ``value`` cannot be encoded as UTF-8 (a lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(field, f"not valid Unicode text ({exc.reason} at character {exc.start})") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _clean(value: Any) -> bool:
    """True if strict JSON in UTF-8 carries ``value`` as it is: a walk of exact types only, without
    the paths; anything else (False) gets :func:`_explain`'s walk, which decides and names the part."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _encodes(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _encodes(key)) or not _clean(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if not _clean(item):
                return False
        return True
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is int or kind is bool


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_json(value: Any, path: str) -> None:
    """Raise for the first part of ``value`` that strict JSON in UTF-8 cannot carry, naming its path."""
    if not _clean(value):  # most requests: one quick walk
        _explain(value, path)


def _explain(value: Any, path: str) -> None:
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequestError(path, f"{value!r} is not a number JSON can carry")
        return
    if isinstance(value, str):
        check_text(value, path)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequestError(path, f"keys must be strings, got {key!r}")
            _explain(key, path)
            _explain(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _explain(item, f"{path}[{i}]")
        return
    raise InvalidRequestError(path, f"a {type(value).__name__} cannot be sent as JSON")
