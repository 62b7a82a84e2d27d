"""``agent-cache demo``: agent-like sessions through a fleet, sticky vs round-robin.

Each session is a ReAct-shaped conversation: one shared system prompt, then
``steps`` calls, each resending the whole history plus the last output and a
new observation. The same sessions run twice over the same fleet (caches
flushed in between): pinned to one worker per session, and spread
round-robin as a plain load balancer would. Hit rates are the workers' own
reported ``cached_tokens``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from agent_cache.backends import SGLangClient

SYSTEM = (
    "You are a research agent. Solve the task by interleaving Thought, Action and Observation steps. "
    "Actions: Search[entity] looks an entity up; Lookup[keyword] finds a keyword in the last page; "
    "Finish[answer] returns the answer.\n" + "Example: Thought: I need to search the river. Action: Search[Nile]\n" * 40
)


@dataclass
class RunStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _run(clients: list[SGLangClient], pick: Callable[[str, int], int], sessions: int, steps: int,
         model: str | None) -> tuple[RunStats, Counter]:
    stats, spread = RunStats(), Counter()
    for s in range(sessions):
        session = f"session-{s}"
        history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {s}: who built tower {s}?"}]
        for step in range(steps):
            index = pick(session, step)
            result = clients[index].chat(history, model=model, max_tokens=40)
            usage = result.usage
            stats.calls += 1
            stats.prompt_tokens += usage.prompt_tokens if usage else 0
            stats.cached_tokens += (usage.cached_tokens or 0) if usage else 0
            spread[clients[index].base_url] += 1
            history += [{"role": "assistant", "content": result.content or ""},
                        {"role": "user", "content": f"Observation {step}: tower {s} has {step + 3} floors."}]
    return stats, spread


def run_demo(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        urls = args.workers
        if not urls:
            from agent_cache.sim import SimFleet

            urls = stack.enter_context(SimFleet(args.fleet_size)).urls
            print(f"started {len(urls)} simulated SGLang workers (a simulator, not SGLang): {' '.join(urls)}")
        clients = [stack.enter_context(SGLangClient(u)) for u in urls]
        rr = itertools.count()
        policies = {
            "sticky": lambda session, step: int(hashlib.sha256(session.encode()).hexdigest(), 16) % len(clients),
            "round-robin": lambda session, step: next(rr) % len(clients),
        }
        print(f"{args.sessions} sessions x {args.steps} steps per policy")
        rows = []
        for name, pick in policies.items():
            for c in clients:
                c.flush_cache()
            stats, spread = _run(clients, pick, args.sessions, args.steps, args.model)
            rows.append((name, stats, spread))
            print(f"  {name}: done ({stats.calls} calls)", file=sys.stderr)
        print(f"{'policy':<12} {'calls':>6} {'prompt tok':>11} {'cached tok':>11} {'hit rate':>9}  calls per worker")
        for name, stats, spread in rows:
            per_worker = " ".join(str(spread[c.base_url]) for c in clients)
            print(f"{name:<12} {stats.calls:>6} {stats.prompt_tokens:>11} {stats.cached_tokens:>11} "
                  f"{stats.hit_rate:>8.1%}  {per_worker}")
    return 0
