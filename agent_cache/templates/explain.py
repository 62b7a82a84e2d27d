"""Explain cache misses: where a prompt diverged from the best cached prefix, and why.

The cache is modelled without eviction: it holds every earlier prompt of the
same agent plus its output (as a chat turn, and as a completion continuing the
last message). The rendering is the fixed one used across agent-cache
benchmarks: tools JSON first, then ``<|role|>\\ncontent\\n`` per message.
"""

from __future__ import annotations

import argparse
import bisect
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from agent_cache.errors import TemplateError, TraceFormatError
from agent_cache.templates.canonical import STABLE_ROLES, canonical_text, canonicalize, content_text, tools_json
from agent_cache.templates.detectors import detect_spans
from agent_cache.templates.templater import encoder


@dataclass(frozen=True)
class Divergence:
    divergence_char: int  # index in the rendered prompt where it stops matching
    chars_lost: int  # rendered prompt chars after the divergence (not served from cache)
    tokens_lost: int  # tokens of that suffix
    rule: str | None  # detector kind, "tool-order", "whitespace/NFC", "content"; None if nothing lost
    extends: bool  # the cached candidate is a whole prefix: only new content follows
    source: str = ""  # "session", "cross-session" or "none"


@dataclass(frozen=True)
class CallReport:
    session_id: str
    call_index: int
    agent: str
    prompt_chars: int
    divergence: Divergence


@dataclass
class ExplainReport:
    calls: list[CallReport] = field(default_factory=list)

    def by_rule(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for c in self.calls:
            d = c.divergence
            key = d.rule or "none"
            key = "new content" if key == "content" and d.extends else key
            n, t = out.get(key, (0, 0))
            out[key] = (n + 1, t + d.tokens_lost)
        return out


def render_chat(messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None) -> tuple[str, list[tuple[int, int, str]]]:
    """Fixed rendering and the (start, end, role) section of each message."""
    head = tools_json(tools)
    parts = [head + "\n"] if head else []
    pos = len(parts[0]) if parts else 0
    sections = []
    for m in messages:
        s = f"<|{m.get('role')}|>\n{content_text(m.get('content'))}\n"
        sections.append((pos, pos + len(s), str(m.get("role"))))
        parts.append(s)
        pos += len(s)
    return "".join(parts), sections


def _lcp(a: str, b: str) -> int:
    # Binary search on slice equality: C-speed comparisons, O(n log n).
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _tokens(text: str) -> int:
    return len(encoder().encode(text, disallowed_special=())) if text else 0


def _rule(prompt: str, cand: str, d: int, sections: Sequence[tuple[int, int, str]],
          tools_differ_in_order: bool = False, variables: Mapping[str, str] | None = None) -> str:
    if tools_differ_in_order:
        return "tool-order"
    lost = len(prompt) - d
    cp, cc = canonical_text(prompt), canonical_text(cand)
    if len(cp) - _lcp(cp, cc) < lost - (len(prompt) - len(cp)):
        return "whitespace/NFC"
    in_stable = any(s <= d < e and r in STABLE_ROLES for s, e, r in sections)
    if in_stable:
        lo = max(0, d - 80)
        for s, e, kind in detect_spans(prompt[lo:d + 80], variables):
            if lo + s <= d < lo + e:
                return kind.replace("var:", "variable:")
    return "content"


def explain_prompts(a_messages: Sequence[Mapping[str, Any]], b_messages: Sequence[Mapping[str, Any]], *,
                    a_tools: Sequence[Mapping[str, Any]] | None = None,
                    b_tools: Sequence[Mapping[str, Any]] | None = None,
                    variables: Mapping[str, str] | None = None) -> Divergence:
    """How much of prompt ``b`` a cache holding prompt ``a`` would serve, and which rule would fix the rest."""
    a, _ = render_chat(a_messages, a_tools)
    b, sections = render_chat(b_messages, b_tools)
    d = _lcp(a, b)
    if d == len(b):
        return Divergence(d, 0, 0, None, True, "session")
    order = False
    if a_tools and b_tools and tools_json(a_tools) != tools_json(b_tools):
        ca, cb = canonicalize([], a_tools)[1], canonicalize([], b_tools)[1]
        order = ca == cb
    rule = _rule(b, a, d, sections, order, variables)
    return Divergence(d, len(b) - d, _tokens(b[d:]), rule, d == len(a), "session")


def explain_trace(path: str) -> ExplainReport:
    from agent_cache.traces import iter_trace

    report = ExplainReport()
    cached: dict[str, list[str]] = {}  # agent -> sorted cached sequences
    last: dict[str, list[str]] = {}  # session -> its previous call's cached sequences
    for call in iter_trace(path):
        prompt, sections = render_chat(call.messages)
        pool = cached.setdefault(call.agent, [])
        best, best_src, best_cand = 0, "none", ""
        for cand in last.get(call.session_id, []):
            n = _lcp(prompt, cand)
            if n > best:
                best, best_src, best_cand = n, "session", cand
        i = bisect.bisect_left(pool, prompt)
        for j in (i - 1, i):
            if 0 <= j < len(pool):
                n = _lcp(prompt, pool[j])
                if n > best:
                    best, best_src, best_cand = n, "cross-session", pool[j]
        if best == len(prompt):
            div = Divergence(best, 0, 0, None, True, best_src)
        else:
            rule = _rule(prompt, best_cand, best, sections) if best_cand else "content"
            div = Divergence(best, len(prompt) - best, _tokens(prompt[best:]), rule,
                             best == len(best_cand), best_src)
        report.calls.append(CallReport(call.session_id, call.call_index, call.agent, len(prompt), div))
        seqs = [prompt + f"<|assistant|>\n{call.output}\n", prompt[:-1] + call.output]
        last[call.session_id] = seqs
        for s in seqs:
            bisect.insort(pool, s)
    return report


def _positive(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--top must be a positive integer, not {v!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"--top must be a positive integer, not {v!r}")
    return n


def main_explain(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agent-cache explain", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="trace file (JSON Lines, .gz allowed)")
    p.add_argument("--top", type=_positive, default=10, help="worst offenders to list (default 10)")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        report = explain_trace(args.trace)
    except FileNotFoundError:
        print(f"error: no such trace file: {args.trace}", file=sys.stderr)
        return 2
    except (TraceFormatError, TemplateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    calls = report.calls
    total_chars = sum(c.prompt_chars for c in calls) or 1
    cached = sum(c.divergence.divergence_char for c in calls)
    print(f"calls: {len(calls)}  prompt chars: {total_chars}  servable from cache: {cached / total_chars:.1%}")
    print(f"{'rule':<20} {'calls':>7} {'tokens lost':>12}")
    for rule, (n, t) in sorted(report.by_rule().items(), key=lambda kv: -kv[1][1]):
        print(f"{rule:<20} {n:>7} {t:>12}")
    worst = sorted((c for c in calls if not c.divergence.extends), key=lambda c: -c.divergence.tokens_lost)
    print(f"\nworst {args.top} (diverged inside a cached prefix):")
    print(f"{'session':<16} {'call':>4} {'agent':<18} {'at char':>8} {'tokens lost':>11}  rule / source")
    for c in worst[: args.top]:
        d = c.divergence
        print(f"{c.session_id:<16} {c.call_index:>4} {c.agent:<18} {d.divergence_char:>8} {d.tokens_lost:>11}  {d.rule} / {d.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main_explain())
