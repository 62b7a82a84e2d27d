"""Agent workloads for the fleet simulation: generated sessions (trace replay: :mod:`agent_cache.bench.trace_replay`).

A workload is a list of :class:`SessionSpec`. Each spec is immutable and can
be started any number of times (:meth:`SessionSpec.start`); every start
yields the same calls, so every policy sees the same workload.

Each call carries its prompt in two token forms:

* ``raw``: what a client sends without templates (volatile values such as
  the date and the user's e-mail at the top of the system prompt);
* ``tmpl``: what agent-cache sends after ``Templater("templatize")``
  (volatile values moved to a small system message after the stable part).

For the real-process engine, :meth:`SessionSpec.start` with ``chat=True``
also gives each call its chat form (:class:`ChatCall`): the OpenAI messages
a client without templates sends, from the same random draws, so both
engines run the same sessions. Conversation content becomes text through a
fixed map from token id to a word that is one cl100k token (a leading space
and 3-10 lowercase letters): n ids give n words and n tokens, and identical
ids give identical text, so the text form shares prefixes exactly where the
token form does. agent-cache's templated form is made at send time by the
real Templater, as ``ChatSGLang`` does.

Token ids follow the simulated worker's chat template
(:mod:`agent_cache.sim.chat_template`: each segment encoded on its own, then
concatenated). For speed with 10^4+ sessions, generated sessions do not
render text per call: the system prompt is encoded once per template (the
volatile header once per session), and conversation content (questions,
observations, outputs) is random token ids drawn from the vocabulary with a
per-session RNG. Only lengths and sharing matter to a prefix cache.

Shapes follow published agent measurements: ReAct on HotpotQA takes about
4.7 LLM calls per task with contexts growing to about 3.2k tokens; Reflexion
runs actor trials (up to 5) with a reflection call between failed trials,
so a session alternates between two prompt families.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import Field, dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence

from agent_cache.errors import ConfigError
from agent_cache.sim.chat_template import IM_END, IM_START, encode_text, render_ids, tools_text
from agent_cache.templates import Templater

_VOCAB = list(range(1000, 99_000))  # shared int objects: lists of ids stay 8 bytes a token
# Observations and outputs are slices of one random pool at random offsets: C-speed copies.
# Questions come from rng.choices, so each session's prefix stays its own.
_POOL = random.Random(12345).choices(_VOCAB, k=1 << 20)
_NL = encode_text("\n")
_ROLE = {r: encode_text(r + "\n") for r in ("system", "user", "assistant", "tool")}
GEN_PROMPT: tuple[int, ...] = (IM_START, *_ROLE["assistant"])

_WORDS = ("the", "agent", "search", "answer", "question", "entity", "paragraph", "lookup", "finish", "thought",
          "action", "observation", "wikipedia", "task", "reason", "step", "context", "retrieve", "compare", "result")


def _segment(role: str, ids: Sequence[int]) -> list[int]:
    return [IM_START, *_ROLE[role], *ids, IM_END, *_NL]


@dataclass(frozen=True)
class ChatCall:
    """The chat form of a call: what a client without templates sends, and what the model answers."""

    messages: tuple[dict[str, Any], ...]  # OpenAI chat messages (shared between calls: do not mutate)
    tools: tuple[dict[str, Any], ...] | None
    output: str  # the completion the simulated worker is asked to produce (its ``sim_output``)
    output_tokens: int  # max_tokens for the call


@dataclass(frozen=True)
class CallSpec:
    """One LLM call: prompt in both forms, the output, and the pause before it."""

    raw: list[int]
    tmpl: list[int]
    output: list[int]
    raw_template: str  # template id with templates off (distinct per session when the prompt is volatile)
    tmpl_template: str  # template id after templatize (shared by the sessions of one agent)
    think_s: float  # delay after the previous call returned (tool time); 0 for the first call
    chat: ChatCall | None = None  # only from start(chat=True)
    raw_template_tokens: int = 0  # the Templater's token length of the stable part, templates off ...
    tmpl_template_tokens: int = 0  # ... and templatized (what ChatSGLang sends as the route's estimate)


class SessionSpec:
    """An agent session: id, tenant, arrival time, and a deterministic call generator."""

    session_id: str
    tenant: str
    arrival_s: float

    if TYPE_CHECKING:  # every concrete spec is a dataclass: dataclasses.replace() takes it
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def start(self, chat: bool = False) -> Iterator[CallSpec]:  # pragma: no cover - interface
        """The calls, in order; with ``chat``, each also carries its :class:`ChatCall`."""
        raise NotImplementedError


@lru_cache(maxsize=1)
def _word_list() -> tuple[str, ...]:
    from agent_cache.sim.chat_template import encoding

    enc = encoding()
    out = []
    for i in range(100_000):
        try:
            b = enc.decode_single_token_bytes(i)
        except KeyError:
            continue
        if 4 <= len(b) <= 11 and b[:1] == b" " and b[1:].isalpha() and b[1:].islower() and b[1:].isascii():
            out.append(b.decode())
    return tuple(out)


def words(ids: Sequence[int]) -> str:
    """Text for token ids: one single-token word per id (see the module docstring)."""
    w = _word_list()
    n = len(w)
    return "".join([w[i % n] for i in ids])


# --- generated workloads -----------------------------------------------------


KINDS = ("react", "reflexion", "coding")


@dataclass(frozen=True)
class WorkloadParams:
    kind: str = "react"  # react | reflexion | coding
    sessions: int = 300
    templates: int = 4  # distinct agents (system prompt + tools)
    tenants: int = 2
    fewshot_tokens: int = 1200  # few-shot examples in the system prompt
    tool_schema_tokens: int = 300  # all tool schemas together
    question_tokens: int = 40
    observation_tokens: int = 300  # mean tool observation
    output_tokens: int = 60  # mean thought + action
    reflection_tokens: int = 120  # mean reflection output (Reflexion)
    mean_calls: float = 4.7  # ReAct calls per task
    max_trials: int = 5  # Reflexion
    trial_success: float = 0.4  # Reflexion: chance a trial solves the task
    volatile: bool = True  # timestamp and user e-mail at the top of the system prompt
    rate: float = 8.0  # sessions per second (offered load)
    arrivals: str = "poisson"  # poisson | bursty
    burst_size: float = 8.0  # mean sessions per burst (bursty)
    think_s: float = 0.3  # mean tool time between calls
    seed: int = 0
    # coding: a long-context software-engineering agent (docs/benchmarks.md, "How the simulator works")
    coding_system_tokens: int = 2400  # instructions in the one shared system prompt ...
    coding_tool_tokens: int = 900  # ... and its tool definitions (edit, run, search, open, submit)
    task_tokens: int = 300  # the issue text in the first user message
    min_steps: int = 15
    max_steps: int = 40
    step_output_tokens: int = 150  # mean thought + tool call per step
    tool_output_min: int = 200  # tool outputs are log-uniform in [min, max] tokens
    tool_output_max: int = 4000
    tool_time_min_s: float = 1.0  # tool execution time between steps, log-uniform in [min, max]
    tool_time_max_s: float = 30.0
    early_stop: float = 0.2  # share of sessions that end at a random earlier step
    max_context_tokens: int = 64_000  # a session ends when its next prompt would pass this

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("workload", f"unknown kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ConfigError("min_steps", f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if not 0 < self.tool_output_min <= self.tool_output_max:
            raise ConfigError("tool_output_min", "need 0 < tool_output_min <= tool_output_max")
        if not 0 < self.tool_time_min_s <= self.tool_time_max_s:
            raise ConfigError("tool_time_min_s", "need 0 < tool_time_min_s <= tool_time_max_s")
        if self.arrivals not in ("poisson", "bursty"):
            raise ConfigError("arrivals", f"unknown arrivals {self.arrivals!r}; use poisson or bursty")
        for name in ("sessions", "templates", "tenants"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be at least 1")
        if self.rate <= 0:
            raise ConfigError("rate", "must be positive")


@dataclass(frozen=True)
class _Family:
    """One agent prompt family: stable system text and tools, encoded once."""

    name: str
    tenant: str
    text: str
    tools: tuple[dict[str, Any], ...]
    body_ids: tuple[int, ...]  # system text after the volatile header, plus the tools block


def _filler(rng: random.Random, tokens: int) -> str:
    # about one token per word
    return " ".join(rng.choice(_WORDS) for _ in range(max(0, tokens)))


def _make_family(name: str, tenant: str, intro: str, fewshot: int, tool_tokens: int, seed: int) -> _Family:
    rng = random.Random(f"{seed}:{name}")
    text = f"{intro}\n\nHere are some examples:\n{_filler(rng, fewshot)}"
    n_tools = 3
    tools = tuple(
        {"type": "function", "function": {
            "name": f"{name}_tool_{i}", "description": _filler(rng, max(1, tool_tokens // n_tools - 20)),
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
        for i in range(n_tools))
    body = encode_text("\n\n" + text + "\n\n" + tools_text(tools))
    return _Family(name, tenant, text, tools, body)


@lru_cache(maxsize=4096)
def _shared_head(template_id: str, first: str, tools_key: str) -> tuple[int, ...]:
    # Stable part of the templatized prompt, rendered once per template.
    import json

    tools = json.loads(tools_key) if tools_key else None
    return tuple(render_ids([{"role": "system", "content": first}], tools, add_generation_prompt=False))


class _Heads:
    """Per-session prompt heads for each family, through the real Templater."""

    def __init__(self) -> None:
        self._templaters: dict[tuple[str, str], Templater] = {}

    def _templater(self, mode: str, tenant: str) -> Templater:
        t = self._templaters.get((mode, tenant))
        if t is None:
            t = self._templaters[(mode, tenant)] = Templater(mode, tenant=tenant)
        return t

    def build(self, fam: _Family, header: str) -> "_Head":
        import json

        messages = [{"role": "system", "content": header + "\n\n" + fam.text if header else fam.text}]
        off = self._templater("off", fam.tenant).normalize(messages, list(fam.tools))
        tm = self._templater("templatize", fam.tenant).normalize(messages, list(fam.tools))
        # raw: header and body encoded as two pieces (cheap; see module docstring)
        raw = (IM_START, *_ROLE["system"], *(encode_text(header) if header else ()), *fam.body_ids, IM_END, *_NL)
        first = tm.messages[0]
        shared = _shared_head(tm.template_id, first["content"], json.dumps(tm.tools) if tm.tools else "")
        rest = tuple(render_ids(tm.messages[1:], None, add_generation_prompt=False)) if len(tm.messages) > 1 else ()
        return _Head(raw, shared + rest, off.template_id, tm.template_id, off.template_tokens, tm.template_tokens)


@dataclass(frozen=True)
class _Head:
    """A session's prompt head for one family, in both forms, with its template ids and lengths."""

    raw: tuple[int, ...]
    tmpl: tuple[int, ...]
    raw_tid: str
    tmpl_tid: str
    raw_tokens: int
    tmpl_tokens: int

    def call(self, prompt: list[int], out: list[int], think_s: float, chat: ChatCall | None) -> CallSpec:
        """The call whose prompt is this head followed by ``prompt``."""
        return CallSpec(list(self.raw) + prompt, list(self.tmpl) + prompt, out, self.raw_tid, self.tmpl_tid,
                        think_s, chat, self.raw_tokens, self.tmpl_tokens)


@dataclass(frozen=True)
class _GenSession(SessionSpec):
    session_id: str
    tenant: str
    arrival_s: float
    kind: str
    seed: int
    params: WorkloadParams = field(repr=False)
    heads: tuple[_Head, ...] = field(repr=False)  # per family: its _Head
    header: str = field(default="", repr=False)  # the session's volatile system-prompt header
    families: tuple[_Family, ...] = field(default=(), repr=False)  # the _Family of each head

    def start(self, chat: bool = False) -> Iterator[CallSpec]:
        rng = random.Random(self.seed)
        p = self.params
        question = rng.choices(_VOCAB, k=p.question_tokens)
        if self.kind == "react":
            yield from self._react(rng, p, self.heads[0], question, [], first=True, chat=self._chat_head(0, chat))
        elif self.kind == "coding":
            yield from self._coding(rng, p, self._chat_head(0, chat))
        else:
            yield from self._reflexion(rng, p, question, chat)

    def _chat_head(self, i: int, chat: bool) -> tuple[str, tuple[dict[str, Any], ...]] | None:
        if not chat:
            return None
        fam = self.families[i]
        return (self.header + "\n\n" + fam.text if self.header else fam.text), fam.tools

    def _ids(self, rng: random.Random, mean: int) -> list[int]:
        n = min(max(1, int(rng.expovariate(1.0 / mean))), 4 * mean) if mean > 0 else 0
        off = rng.randrange(len(_POOL) - n)
        return _POOL[off:off + n]

    def _react(self, rng: random.Random, p: WorkloadParams, head: _Head, question: list[int],
               reflections: list[list[int]], first: bool, trajectory: list[int] | None = None,
               chat: tuple[str, tuple[dict[str, Any], ...]] | None = None) -> Iterator[CallSpec]:
        user = list(question)
        for r in reflections:
            user += r
        body = _segment("user", user)
        # chat form: observations come back as user messages (text ReAct), which any gateway accepts
        msgs = None if chat is None else [{"role": "system", "content": chat[0]}, {"role": "user", "content": words(user)}]
        # calls per task: 1 + Poisson(mean - 1), so the mean is mean_calls
        n_calls = 1 + _poisson(rng, max(0.0, p.mean_calls - 1))
        for k in range(min(n_calls, 12)):
            out = self._ids(rng, p.output_tokens)
            prompt = body + list(GEN_PROMPT)
            cc = None if msgs is None else ChatCall(tuple(msgs), chat[1] if chat else None, words(out), len(out))
            yield head.call(prompt, out,
                            0.0 if (first and k == 0) else rng.expovariate(1.0 / p.think_s) if p.think_s > 0 else 0.0,
                            cc)
            obs = self._ids(rng, p.observation_tokens)
            body += _segment("assistant", out) + _segment("tool", obs)
            if msgs is not None and cc is not None:
                msgs += [{"role": "assistant", "content": cc.output}, {"role": "user", "content": "Observation:" + words(obs)}]
            if trajectory is not None:
                trajectory += out + obs

    def _coding(self, rng: random.Random, p: WorkloadParams,
                chat: tuple[str, tuple[dict[str, Any], ...]] | None) -> Iterator[CallSpec]:
        head = self.heads[0]
        task = rng.choices(_VOCAB, k=p.task_tokens)
        body = _segment("user", task)
        msgs = None if chat is None else [{"role": "system", "content": chat[0]}, {"role": "user", "content": words(task)}]
        steps = rng.randint(p.min_steps, p.max_steps)
        if rng.random() < p.early_stop:
            steps = rng.randint(1, steps)
        for k in range(steps):
            prompt = body + list(GEN_PROMPT)
            if len(head.tmpl) + len(prompt) > p.max_context_tokens:
                return  # the agent stops at its context limit
            n_out = min(max(20, int(rng.expovariate(1.0 / p.step_output_tokens))), 4 * p.step_output_tokens)
            out = self._slice(rng, n_out)
            cc = None if msgs is None else ChatCall(tuple(msgs), chat[1] if chat else None, words(out), len(out))
            think = 0.0 if k == 0 else _log_uniform(rng, p.tool_time_min_s, p.tool_time_max_s)
            yield head.call(prompt, out, think, cc)
            obs = self._slice(rng, int(_log_uniform(rng, p.tool_output_min, p.tool_output_max)))
            body += _segment("assistant", out) + _segment("tool", obs)
            if msgs is not None and cc is not None:
                msgs += [{"role": "assistant", "content": cc.output}, {"role": "user", "content": "Observation:" + words(obs)}]

    @staticmethod
    def _slice(rng: random.Random, n: int) -> list[int]:
        off = rng.randrange(len(_POOL) - n)
        return _POOL[off:off + n]

    def _reflexion(self, rng: random.Random, p: WorkloadParams, question: list[int], chat: bool) -> Iterator[CallSpec]:
        reflections: list[list[int]] = []
        for trial in range(p.max_trials):
            trajectory: list[int] = []
            yield from self._react(rng, p, self.heads[0], question, reflections, first=trial == 0, trajectory=trajectory,
                                   chat=self._chat_head(0, chat))
            if trial == p.max_trials - 1 or rng.random() < p.trial_success:
                return
            prompt = _segment("user", question + trajectory) + list(GEN_PROMPT)
            out = self._ids(rng, p.reflection_tokens)
            head = self._chat_head(1, chat)
            cc = None if head is None else ChatCall(
                ({"role": "system", "content": head[0]}, {"role": "user", "content": words(question + trajectory)}),
                head[1], words(out), len(out))
            yield self.heads[1].call(prompt, out, 0.0, cc)
            reflections.append(out)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    scale: float = (high / low) ** rng.random()  # a positive base: a float, not complex
    return low * scale


def _poisson(rng: random.Random, lam: float) -> int:
    # Knuth; lam is small (a few calls)
    limit, k, prod = math.exp(-lam), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return k


def arrival_times(n: int, rate: float, kind: str, rng: random.Random, burst_size: float = 8.0) -> list[float]:
    """Session start times: Poisson at ``rate``, or bursts of about ``burst_size`` at the same mean rate."""
    out: list[float] = []
    t = 0.0
    if kind == "poisson":
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    while len(out) < n:
        size = 1 + _poisson(rng, max(0.0, burst_size - 1))
        for _ in range(min(size, n - len(out))):
            out.append(t + rng.uniform(0, 0.5))  # a burst lands within half a second
        t += rng.expovariate(rate / burst_size)
    return sorted(out)


def generate(params: WorkloadParams) -> list[SessionSpec]:
    """Sessions of a generated workload, deterministic in ``params.seed``."""
    params.check()
    rng = random.Random(params.seed)
    families: list[list[_Family]] = []
    n_templates = 1 if params.kind == "coding" else params.templates  # coding: one agent for every session
    for i in range(n_templates):
        tenant = f"tenant{i % params.tenants}"
        if params.kind == "coding":
            families.append([_make_family("coder", tenant, "You are an autonomous software engineering agent. Fix "
                                          "the issue in the repository using the tools; run the tests before you "
                                          "submit.", params.coding_system_tokens, params.coding_tool_tokens,
                                          params.seed)])
            continue
        actor = _make_family(f"agent{i}", tenant, f"You are agent {i}. Solve a question answering task with "
                             "interleaving Thought, Action, Observation steps.",
                             params.fewshot_tokens, params.tool_schema_tokens, params.seed)
        fams = [actor]
        if params.kind == "reflexion":
            fams.append(_make_family(f"agent{i}_reflect", tenant, "You are an advanced reasoning agent that can "
                                     "improve based on self reflection. Diagnose the failed trial and write a plan.",
                                     params.fewshot_tokens // 2, 0, params.seed))
        families.append(fams)
    heads = _Heads()
    times = arrival_times(params.sessions, params.rate, params.arrivals, rng, params.burst_size)
    out: list[SessionSpec] = []
    for n, t in enumerate(times):
        fams = families[rng.randrange(n_templates)]
        header = ""
        if params.volatile:
            stamp = 1_796_000_000 + int(t) + rng.randrange(86_400)
            header = (f"Current date and time: {_iso(stamp)}\n"
                      f"You are assisting user{rng.randrange(10**6):06d}@example.com.")
        sid = f"s{n:06d}"
        out.append(_GenSession(sid, fams[0].tenant, t, params.kind, rng.randrange(2**63), params,
                               tuple(heads.build(f, header) for f in fams), header, tuple(fams)))
    return out


def _iso(ts: int) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
