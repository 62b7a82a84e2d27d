"""Tools and structured output for ``ChatSGLang`` (``bind_tools``, ``with_structured_output``)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Literal, Sequence, cast

from langchain_core.language_models import BaseChatModel, LanguageModelInput, LanguageModelOutput
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import TypeBaseModel, is_basemodel_subclass

from agent_cache.errors import ConfigError


def tool_kwargs(tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
                tool_choice: str | bool | dict[str, Any] | None) -> dict[str, Any]:
    """The request fields that offer ``tools`` (OpenAI's format) with ``tool_choice``."""
    formatted = [convert_to_openai_tool(t) for t in tools]
    out: dict[str, Any] = {"tools": formatted}
    if tool_choice is not None and tool_choice is not False:
        out["tool_choice"] = _tool_choice(tool_choice, formatted)
    return out


def structured_output(model: BaseChatModel, schema: dict[str, Any] | type | None, *,
                      method: Literal["json_schema", "function_calling", "json_mode"],
                      include_raw: bool, strict: bool | None) -> Runnable[LanguageModelInput, Any]:
    """``model.with_structured_output(...)``: ``json_schema`` constrains decoding with SGLang's grammar backend."""
    # a pydantic model class (v2 or v1): is_basemodel_subclass checks that but is no TypeGuard
    pydantic = cast(TypeBaseModel, schema) if isinstance(schema, type) and is_basemodel_subclass(schema) else None
    llm: Runnable[LanguageModelInput, AIMessage]
    parser: Runnable[LanguageModelOutput, Any]
    if method == "json_mode":
        llm = model.bind(response_format={"type": "json_object"}, ls_structured_output_format={
            "kwargs": {"method": method}, "schema": schema})
        parser = PydanticOutputParser(pydantic_object=pydantic) if pydantic is not None else JsonOutputParser()
    else:
        if schema is None:
            raise ConfigError("schema", f"method {method!r} needs a schema")
        tool = convert_to_openai_tool(schema, strict=strict)
        fn = tool["function"]
        ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": tool}
        if method == "function_calling":
            llm = model.bind_tools([tool], tool_choice=fn["name"], ls_structured_output_format=ls_format)
            parser = (
                PydanticToolsParser(tools=[pydantic], first_tool_only=True)
                if pydantic is not None
                else JsonOutputKeyToolsParser(key_name=fn["name"], first_tool_only=True)
            )
        elif method == "json_schema":
            spec: dict[str, Any] = {"name": fn["name"], "schema": fn.get("parameters") or {}}
            if strict is not None:
                spec["strict"] = strict
            llm = model.bind(
                response_format={"type": "json_schema", "json_schema": spec},
                ls_structured_output_format=ls_format,
            )
            parser = PydanticOutputParser(pydantic_object=pydantic) if pydantic is not None else JsonOutputParser()
        else:
            raise ConfigError("method", f"expected json_schema, function_calling or json_mode, got {method!r}")
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    fallback = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")


def _tool_choice(choice: str | bool | dict[str, Any], tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        return choice
    if choice is True or choice in ("any", "required"):
        # one offered tool and "True" means that tool, as in other providers
        if choice is True and len(tools) == 1:
            return {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        return "required"
    if choice in ("auto", "none"):
        return choice
    names = [t["function"]["name"] for t in tools]
    if choice not in names:
        raise ConfigError("tool_choice", f"{choice!r} is not one of the bound tools {names}")
    return {"type": "function", "function": {"name": choice}}
