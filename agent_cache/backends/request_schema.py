"""The types SGLang's request models give each field, as pure checks that name the field.

SGLang (0.5.x) parses a request with pydantic models: ``ChatCompletionRequest``
and ``CompletionRequest`` (``sglang/srt/entrypoints/openai/protocol.py``) and
``GenerateReqInput`` (``sglang/srt/managers/io_struct.py``). A field of the
wrong type would be refused there with a 400 after the request was routed, or
worse, read loosely on the way (``"stream": "false"`` is true to ``bool()``).
The same types are checked here first, field by field, with the path of the
first part that is wrong (``tools[0].function.name``). ``None`` stands for
an absent field, as the OpenAI clients send it. Nesting deeper than
:data:`MAX_DEPTH` is refused anywhere in a request (the walk is iterative, so
no depth can break it).
"""

from __future__ import annotations

from collections.abc import Mapping  # not typing's: isinstance against it is several times slower
from typing import Any, Callable

from agent_cache.errors import InvalidRequestError

MAX_DEPTH = 64
_LEAVES = frozenset({str, int, float, bool, type(None)})  # what JSON holds besides lists and objects

Check = Callable[[Any, str], None]


def _name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _fail(path: str, expected: str, value: Any) -> None:
    raise InvalidRequestError(path, f"expected {expected}, got {_name(value)}")


def boolean(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        _fail(path, "true or false", value)


def integer(value: Any, path: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(path, "an integer", value)


def number(value: Any, path: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _fail(path, "a number", value)


def string(value: Any, path: str) -> None:
    if not isinstance(value, str):
        _fail(path, "a string", value)


def anything(value: Any, path: str) -> None:
    """Any JSON value (its depth and encoding are checked elsewhere)."""


def json_object(value: Any, path: str) -> None:
    if not isinstance(value, Mapping):
        _fail(path, "an object", value)


def optional(check: Check) -> Check:
    def run(value: Any, path: str) -> None:
        if value is not None:
            check(value, path)
    return run


def list_of(item: Check, what: str = "a list") -> Check:
    def run(value: Any, path: str) -> None:
        if not isinstance(value, (list, tuple)):
            _fail(path, what, value)
        for i, v in enumerate(value):
            item(v, f"{path}[{i}]")
    return run


def map_of(item: Check) -> Check:
    def run(value: Any, path: str) -> None:
        json_object(value, path)
        for k, v in value.items():
            item(v, f"{path}.{k}")
    return run


def one_of(expected: str, *checks: Check) -> Check:
    """The first check that passes; else an error naming ``expected`` (or the closest check's own, for
    a value of the right outer kind: an object or list)."""
    def run(value: Any, path: str) -> None:
        errors: list[InvalidRequestError] = []
        for check in checks:
            try:
                check(value, path)
                return
            except InvalidRequestError as exc:
                errors.append(exc)
        deeper = [e for e in errors if e.field != path]
        if deeper:
            raise deeper[0]
        _fail(path, expected, value)
    return run


def literal(*allowed: str) -> Check:
    def run(value: Any, path: str) -> None:
        if value not in allowed or not isinstance(value, str):
            raise InvalidRequestError(path, f"expected one of {list(allowed)}, got {value!r}"[:200])
    return run


def fields(required: Mapping[str, Check], optional_fields: Mapping[str, Check] | None = None) -> Check:
    """An object with ``required`` fields and ``optional_fields`` (null or absent); others are ignored,
    as pydantic ignores them."""
    def run(value: Any, path: str) -> None:
        json_object(value, path)
        for name, check in required.items():
            if value.get(name) is None:
                raise InvalidRequestError(f"{path}.{name}", "required")
            check(value[name], f"{path}.{name}")
        for name, check in (optional_fields or {}).items():
            if value.get(name) is not None:
                check(value[name], f"{path}.{name}")
    return run


_STRINGS = one_of("a string or a list of strings", string, list_of(string))
_OPT_STRINGS = one_of("a string or a list of strings", string, list_of(optional(string)))
_INTS = list_of(integer, "a list of integers")
_INT_LISTS = one_of("a list of integers or of lists of integers", _INTS, list_of(_INTS))
_TOOL = fields({"function": fields({"name": string}, {"description": string, "parameters": json_object,
                                                       "strict": boolean})},
               {"type": string})
_TOOL_CHOICE = one_of("\"auto\", \"required\", \"none\" or a tool choice object",
                      literal("auto", "required", "none"),
                      fields({"function": fields({}, {"name": string})}, {"type": literal("function")}))
_RESPONSE_FORMAT = fields({"type": literal("text", "json_object", "json_schema", "structural_tag")}, {
    "json_schema": fields({"name": string}, {"description": string, "schema": json_object, "strict": boolean}),
    "structures": list_of(fields({"begin": string, "end": string}, {"schema": json_object})),
    "triggers": list_of(string), "format": json_object})
_TOOL_CALL = fields({"function": fields({}, {"name": string, "arguments": one_of("a string or an object", string,
                                                                                   json_object)})},
                    {"id": string, "index": integer, "type": literal("function")})
_CONTENT = one_of("a string, a list of content parts or null", string, list_of(json_object))
MESSAGE = fields({"role": string}, {"content": _CONTENT, "name": string, "tool_call_id": string,
                                    "reasoning_content": string, "tool_calls": list_of(_TOOL_CALL)})

# every OpenAI route
_COMMON: dict[str, Check] = {
    "model": string, "frequency_penalty": number, "presence_penalty": number, "temperature": number,
    "top_p": number, "top_k": integer, "min_p": number, "repetition_penalty": number, "max_tokens": integer,
    "n": integer, "seed": integer, "min_tokens": integer, "stop": _STRINGS, "stream": boolean,
    "stream_options": fields({}, {"include_usage": boolean, "continuous_usage_stats": boolean}),
    "user": string, "logit_bias": map_of(number), "response_format": _RESPONSE_FORMAT,
    "regex": string, "ebnf": string, "json_schema": string, "stop_token_ids": list_of(integer),
    "stop_regex": _STRINGS, "no_stop_trim": boolean, "ignore_eos": boolean, "skip_special_tokens": boolean,
    "lora_path": _OPT_STRINGS, "session_params": json_object, "custom_params": json_object,
    "custom_logit_processor": _OPT_STRINGS, "rid": _STRINGS, "extra_key": _STRINGS, "cache_salt": _STRINGS,
    "priority": integer, "return_hidden_states": boolean, "return_cached_tokens_details": boolean,
    "custom_labels": map_of(string),
}
CHAT: dict[str, Check] = {
    **_COMMON, "messages": list_of(MESSAGE), "logprobs": boolean, "top_logprobs": integer,
    "max_completion_tokens": integer, "tools": list_of(_TOOL, "a list of tools"), "tool_choice": _TOOL_CHOICE,
    "parallel_tool_calls": boolean, "reasoning_effort": literal("low", "medium", "high"),
    "continue_final_message": boolean, "separate_reasoning": boolean, "stream_reasoning": boolean,
    "chat_template_kwargs": json_object,
}
COMPLETIONS: dict[str, Check] = {
    **_COMMON, "logprobs": integer, "best_of": integer, "echo": boolean, "suffix": string,
    "prompt": one_of("a string, a list of strings, or token ids", string, list_of(string), _INT_LISTS),
}
# SGLang's SamplingParams (sglang/srt/sampling/sampling_params.py); keys it does not list are left as they are
SAMPLING: dict[str, Check] = {
    "max_new_tokens": integer, "min_new_tokens": integer, "stop": _STRINGS, "stop_token_ids": list_of(integer),
    "stop_regex": _STRINGS, "temperature": number, "top_p": number, "top_k": integer, "min_p": number,
    "frequency_penalty": number, "presence_penalty": number, "repetition_penalty": number, "n": integer,
    "json_schema": string, "regex": string, "ebnf": string, "structural_tag": string, "ignore_eos": boolean,
    "skip_special_tokens": boolean, "spaces_between_special_tokens": boolean, "no_stop_trim": boolean,
    "custom_params": json_object, "stream_interval": integer, "logit_bias": map_of(number),
    "sampling_seed": integer,
}
_SAMPLING_PARAMS = fields({}, SAMPLING)
_BOOLS = one_of("true, false or a list of them", boolean, list_of(boolean))
_INT_OR_LIST = one_of("an integer or a list of integers", integer, list_of(integer))
_OBJECTS = one_of("an object or a list of objects", json_object, list_of(json_object))
GENERATE: dict[str, Check] = {
    "text": _STRINGS, "input_ids": _INT_LISTS, "sampling_params": one_of("an object or a list of objects", _SAMPLING_PARAMS,
                                                                    list_of(_SAMPLING_PARAMS)), "return_logprob": _BOOLS,
    "logprob_start_len": _INT_OR_LIST, "top_logprobs_num": _INT_OR_LIST, "token_ids_logprob": _INT_LISTS,
    "return_text_in_logprobs": boolean, "stream": boolean, "log_metrics": boolean,
    "return_hidden_states": _BOOLS, "modalities": list_of(string), "session_params": _OBJECTS,
    "lora_path": _OPT_STRINGS, "lora_id": _OPT_STRINGS, "custom_logit_processor": _OPT_STRINGS,
    "priority": integer, "extra_key": _STRINGS, "rid": _STRINGS, "routing_key": string, "no_logs": boolean,
    "custom_labels": map_of(string), "input_embeds": list_of(anything),
}


def check_types(params: Mapping[str, Any], schema: Mapping[str, Check]) -> None:
    """Raise :class:`InvalidRequestError` naming the first field of ``params`` whose type ``schema`` refuses
    (fields it does not list are left as they are: the field list is checked elsewhere)."""
    for name, value in params.items():
        check = schema.get(name)
        if check is not None and value is not None:
            check(value, name)


def check_depth(params: Mapping[str, Any], limit: int = MAX_DEPTH) -> None:
    """Raise :class:`InvalidRequestError` naming the field whose value nests lists and objects deeper than ``limit``
    (iterative: a value nested any depth is walked without recursion)."""
    for name, value in params.items():
        if type(value) in _LEAVES or not isinstance(value, (list, tuple, Mapping)):
            continue
        stack: list[tuple[Any, int]] = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            if depth > limit:
                raise InvalidRequestError(str(name), f"nested deeper than {limit} levels")
            children = item.values() if type(item) is dict or isinstance(item, Mapping) else item
            for child in children:
                kind = type(child)  # JSON's own types first: an ABC's isinstance costs a dozen times more
                if kind is dict or kind is list or (kind not in _LEAVES and isinstance(child, (list, tuple, Mapping))):
                    stack.append((child, depth + 1))