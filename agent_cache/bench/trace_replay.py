"""Trace replay for the fleet simulation: recorded agent calls (a trace file) as sessions to run.

A recorded trace (``trace_path=`` on ``ChatSGLang``, docs/traces.md) is
replayed with each call's recorded prompt and output, in the raw form and in
the templatized one, at its recorded times or at a chosen rate.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from dataclasses import dataclass, field
from typing import Iterator

from agent_cache.bench.workloads import _VOCAB, CallSpec, ChatCall, SessionSpec, arrival_times
from agent_cache.errors import ConfigError
from agent_cache.sim.chat_template import encode_text, render_ids
from agent_cache.templates import Templater


# --- trace replay --------------------------------------------------------------


@dataclass(frozen=True)
class _TraceCall:
    raw: array[int]
    tmpl: array[int] | None  # None: the same ids as raw
    output: array[int]
    n_out: int
    raw_template: str
    tmpl_template: str
    gap_s: float | None
    chat: ChatCall | None = None  # kept by load_trace(chat=True)
    raw_template_tokens: int = 0
    tmpl_template_tokens: int = 0


@dataclass(frozen=True)
class _TraceSession(SessionSpec):
    session_id: str
    tenant: str
    arrival_s: float
    calls: tuple[_TraceCall, ...] = field(repr=False)
    think_s: float = 0.3
    seed: int = 0

    def start(self, chat: bool = False) -> Iterator[CallSpec]:
        if chat and self.calls and self.calls[0].chat is None:
            raise ConfigError("trace", "the chat form of a trace needs load_trace(..., chat=True)")
        rng = random.Random(self.seed)
        for k, c in enumerate(self.calls):
            out = list(c.output)
            if len(out) < c.n_out:  # recorded count larger than our tokenizer's: pad, so decode time matches
                out += [_VOCAB[0]] * (c.n_out - len(out))
            think = 0.0 if k == 0 else (c.gap_s if c.gap_s is not None else rng.expovariate(1.0 / self.think_s))
            raw = list(c.raw)
            yield CallSpec(raw, raw if c.tmpl is None else list(c.tmpl), out, c.raw_template, c.tmpl_template, think,
                           c.chat if chat else None, c.raw_template_tokens, c.tmpl_template_tokens)


DEFAULT_TRACE_RATE = 2.0  # sessions/s when a trace has no times and no rate is given


def load_trace(path: str, *, sessions: int | None = None, rate: float | None = None, speedup: float = 1.0,
               think_s: float = 0.3, arrivals: str = "poisson", seed: int = 0, chat: bool = False) -> list[SessionSpec]:
    """Sessions of a trace file, closed-loop, with the recorded outputs.

    The first ``sessions`` sessions (file order) are kept. Session starts:
    with ``rate``, generated arrivals at that many sessions/s (so a recorded
    trace can be replayed at a load that stresses the fleet); without it, the
    recorded first ``t`` of each session, or generated arrivals at
    ``DEFAULT_TRACE_RATE`` when calls carry no ``t``. Within a session, call
    k+1 waits its recorded gap after call k returns (divided by ``speedup``),
    or a random tool time of mean ``think_s`` when the trace has no times.
    ``chat``: also keep each call's recorded messages and output text (the
    real-process engine sends them as they are).
    """
    if rate is not None and rate <= 0:
        raise ConfigError("rate", f"must be positive, got {rate}")
    if speedup <= 0:
        raise ConfigError("speedup", f"must be positive, got {speedup}")
    from agent_cache.traces import TraceCall, iter_trace

    off, tm = Templater("off"), Templater("templatize")
    by_session: dict[str, list[TraceCall]] = {}
    for call in iter_trace(path):
        if call.session_id not in by_session:
            if sessions is not None and len(by_session) >= sessions:
                continue
            by_session[call.session_id] = []
        by_session[call.session_id].append(call)
    rng = random.Random(seed)
    times = arrival_times(len(by_session), rate or DEFAULT_TRACE_RATE, arrivals, rng)
    t0 = min((c[0].t for c in by_session.values() if c and c[0].t is not None), default=None)
    out: list[SessionSpec] = []
    for i, (sid, calls) in enumerate(by_session.items()):
        calls.sort(key=lambda c: c.call_index)
        specs = []
        for k, c in enumerate(calls):
            raw = render_ids(c.messages)
            n_off = off.normalize(c.messages)
            n_tm = tm.normalize(c.messages)
            tmpl = render_ids(n_tm.messages, n_tm.tools)
            out_ids = encode_text(c.output)
            gap = None
            prev_t = calls[k - 1].t if k > 0 else None
            if c.t is not None and prev_t is not None:
                gap = max(0.0, c.t - prev_t) / speedup
            n_out = c.output_tokens if c.output_tokens is not None else max(1, len(out_ids))
            cc = ChatCall(tuple(c.messages), None, c.output, len(out_ids) or 1) if chat else None
            specs.append(_TraceCall(array("I", raw), None if tmpl == raw else array("I", tmpl), array("I", out_ids),
                                    n_out, f"{c.agent}:{n_off.template_id}", f"{c.agent}:{n_tm.template_id}", gap, cc,
                                    n_off.template_tokens, n_tm.template_tokens))
        start = times[i]
        if rate is None and t0 is not None and calls[0].t is not None:
            start = calls[0].t - t0
        out.append(_TraceSession(sid, "default", start, tuple(specs), think_s,
                                 int(hashlib.sha256(f"{seed}:{sid}".encode()).hexdigest()[:12], 16)))
    out.sort(key=lambda s: s.arrival_s)
    return out
