"""Derive template variables from a LangChain ChatPromptTemplate and its inputs."""

from __future__ import annotations

from typing import Any, Mapping


def variables_from_prompt(prompt: Any, inputs: Mapping[str, Any]) -> dict[str, str]:
    """Input values used by the prompt's system messages, as ``{name: str(value)}``."""
    from langchain_core.prompts.chat import SystemMessagePromptTemplate

    out: dict[str, str] = {}
    for msg in getattr(prompt, "messages", []):
        if isinstance(msg, SystemMessagePromptTemplate):
            for name in msg.input_variables:
                if name in inputs and str(inputs[name]):
                    out[name] = str(inputs[name])
    return out
