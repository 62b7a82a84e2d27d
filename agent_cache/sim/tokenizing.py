"""Which tokenizer a simulated worker counts with: its own fixed one, or a real model's.

The default is the simulator's ChatML-like template over tiktoken
(:mod:`agent_cache.sim.chat_template`). ``--tokenizer-path DIR`` gives a
Hugging Face model folder instead (``tokenizer.json`` and the
``chat_template`` of ``tokenizer_config.json``, as SGLang reads them): the
worker then renders and counts prompts as a real server of that model does,
so its pool holds the same number of tokens and its hit rates can be held to
the real server's (``python -m agent_cache.bench.sim_vs_real``). That needs
the ``tokenizers`` and ``jinja2`` packages (the ``bench`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from agent_cache.errors import ConfigError
from agent_cache.sim import chat_template


class ChatTokenizer(Protocol):
    def encode_text(self, text: str) -> Sequence[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_ids(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]: ...


class SimTokenizer:
    """The simulator's own template and tiktoken's ``cl100k_base``."""

    def encode_text(self, text: str) -> Sequence[int]:
        return chat_template.encode_text(text)

    def decode(self, ids: Sequence[int]) -> str:
        return chat_template.decode(ids)

    def render_ids(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        return chat_template.render_ids(messages, tools)


class ModelTokenizer:
    """A model folder's tokenizer and chat template, applied as transformers' ``apply_chat_template`` does
    (rendered in a sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, then encoded
    without adding special tokens: the template writes its own)."""

    def __init__(self, path: str) -> None:
        try:
            import jinja2.sandbox
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError("--tokenizer-path", f"needs the tokenizers and jinja2 packages "
                                                  f"(pip install 'agent-cache[bench]'): {exc}") from None
        folder = Path(path)
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text())
            self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # OSError, ValueError, or the tokenizers library's own Exception
            raise ConfigError("--tokenizer-path", f"no readable tokenizer.json and tokenizer_config.json in "
                                                  f"{path}: {exc}") from None
        source = config.get("chat_template")
        if not isinstance(source, str):
            raise ConfigError("--tokenizer-path", f"{folder / 'tokenizer_config.json'} has no chat_template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
        self._template = env.from_string(source)
        self._specials = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}

    def encode_text(self, text: str) -> Sequence[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def render_ids(self, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        text = self._template.render(messages=list(messages), tools=list(tools) if tools else None,
                                     add_generation_prompt=True, **self._specials)
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def chat_tokenizer(path: str | None) -> ChatTokenizer:
    """The tokenizer of a worker started with ``--tokenizer-path path`` (None: the simulator's own)."""
    return SimTokenizer() if path is None else ModelTokenizer(path)
