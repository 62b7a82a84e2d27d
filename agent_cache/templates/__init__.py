"""Prompt templates: canonical form, volatile-value extraction, template ids."""

from agent_cache.templates.canonical import canonicalize
from agent_cache.templates.detectors import extract_volatile, render
from agent_cache.templates.langchain_vars import variables_from_prompt
from agent_cache.templates.registry import TemplateRegistry, TemplateStore
from agent_cache.templates.templater import NormalizedPrompt, TemplateMode, Templater

__all__ = [
    "NormalizedPrompt", "TemplateMode", "TemplateRegistry", "TemplateStore", "Templater",
    "canonicalize", "extract_volatile", "render", "variables_from_prompt",
]
