"""``agent-cache demo``: ReAct agents through round-robin, agent-cache routing, and routing with templates.

A batch of ReAct sessions (``langchain.agents.create_agent``, ``ChatSGLang``,
two real local tools: a calculator and a search over a small bundled
document set) runs three times over the same fleet: spread round-robin with
raw prompts, as a plain load balancer would; routed by agent-cache (sticky
sessions) with raw prompts; and routed by agent-cache with templated system
prompts, so each gain shows on its own. Each session's system prompt starts with
today's date and the user's name, as real agent prompts do. Hit rates are
the workers' own reported ``cached_tokens``; TTFT is measured at the client
(first streamed token).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import datetime as _dt
import itertools
import operator
import sys
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from agent_cache.backends import SGLangClient
from agent_cache.percentile import percentile
from agent_cache.redact import redact_url
from agent_cache.langchain import ChatSGLang, SessionMiddleware
from agent_cache.routing.router import Placement, RouteRequest, Router

DOCUMENTS = {
    "eiffel tower": "The Eiffel Tower in Paris is 330 metres tall and was completed in 1889.",
    "great wall": "The Great Wall of China is about 21,196 km long including all its branches.",
    "mount everest": "Mount Everest is 8,849 metres high, on the border of Nepal and China.",
    "nile": "The Nile is about 6,650 km long and flows through eleven countries.",
    "statue of liberty": "The Statue of Liberty is 93 metres tall including its pedestal.",
    "burj khalifa": "The Burj Khalifa in Dubai is 828 metres tall and opened in 2010.",
    "amazon": "The Amazon river discharges about 209,000 cubic metres of water per second.",
    "sydney opera house": "The Sydney Opera House opened in 1973 and hosts 1,500 performances a year.",
}

QUESTIONS = [
    ("Eiffel Tower", "330*3"),
    ("Great Wall", "21196/2"),
    ("Mount Everest", "8849-330"),
    ("Nile", "6650*2"),
    ("Statue of Liberty", "93+828"),
    ("Burj Khalifa", "828/3"),
    ("Amazon", "209000*60"),
    ("Sydney Opera House", "2024-1973"),
]

USERS = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana"]

_AGENT_RULES = (
    "You are a careful research assistant. Answer the user's question using the tools.\n"
    "Rules:\n"
    "1. Always search the documents before answering a factual question.\n"
    "2. Use the calculator for every arithmetic step; never compute in your head.\n"
    "3. Cite the document you used in the final answer.\n"
    "4. If the documents do not contain the answer, say so plainly.\n"
) + "".join(
    f"Example {i}: Question: how tall is landmark {i}? Thought: search it. Action: search_docs. "
    f"Observation: landmark {i} is {100 + i} metres. Answer: {100 + i} metres.\n"
    for i in range(30)
)

_OPS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.USub: operator.neg, ast.Pow: operator.pow, ast.Mod: operator.mod}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers and + - * / % ** are allowed")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '330*3'."""
    try:
        return str(_evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


@tool
def search_docs(query: str) -> str:
    """Search the bundled document set for a landmark or river."""
    q = query.lower()
    hits = [text for name, text in DOCUMENTS.items() if name in q or q in name]
    return "\n".join(hits) or "no document matches"


def system_prompt(user: str, today: str) -> str:
    # Volatile values at the very top, as real agent prompts have them.
    return f"Today is {today}. You are helping {user}.\n{_AGENT_RULES}"


class _RoundRobinRouter(Router):
    """The baseline: every call to the next worker, no pins, no shared state."""

    def __init__(self, workers: list[str]) -> None:
        super().__init__(workers, probe_interval=None)
        self._turn = itertools.count()

    def route(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        urls = [w.url for w in self.workers if w.url not in exclude] or [w.url for w in self.workers]
        return Placement(urls[next(self._turn) % len(urls)], "round_robin", 0, request.session_id, request.tenant)

    async def aroute(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        return self.route(request, exclude=exclude)

    def done(self, placement: Placement) -> None:
        pass

    async def adone(self, placement: Placement) -> None:
        pass

    def report(self, placement: Placement, *, prompt_tokens: int, cached_tokens: int) -> None:
        pass

    async def areport(self, placement: Placement, *, prompt_tokens: int, cached_tokens: int) -> None:
        pass


class _FirstToken(BaseCallbackHandler):
    """Time to first streamed token of every model call."""

    def __init__(self) -> None:
        self.started: dict[Any, float] = {}
        self.ttft: list[float] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.started[run_id] = time.perf_counter()

    def on_llm_new_token(self, token: str | list[str | dict[str, Any]], *, run_id: Any, **kwargs: Any) -> None:
        start = self.started.pop(run_id, None)
        if start is not None:
            self.ttft.append(time.perf_counter() - start)


@dataclass
class RunResult:
    name: str
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    sessions_per_worker: Counter[str] = field(default_factory=Counter)
    calls_per_worker: Counter[str] = field(default_factory=Counter)
    one_worker_sessions: int = 0
    sessions: int = 0
    seconds: float = 0.0
    first_call_cached: int | None = None  # cached tokens of the first call of the first session that ended

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft_pct(self, q: float) -> float:
        if not self.ttft:
            return float("nan")
        return percentile(self.ttft, q)


async def _run_session(agent: Any, index: int, user: str, result: RunResult, timer: _FirstToken, tag: str) -> None:
    landmark, expression = QUESTIONS[index % len(QUESTIONS)]
    question = f"Use search_docs for '{landmark}' and then the calculator on '{expression}'."
    config = {"configurable": {"thread_id": f"{tag}-{index}"}, "callbacks": [timer]}
    state = await agent.ainvoke({"messages": [{"role": "user", "content": question}]}, config)
    replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
    workers = {m.response_metadata["worker"] for m in replies}
    result.sessions += 1
    result.one_worker_sessions += len(workers) == 1
    result.sessions_per_worker[replies[0].response_metadata["worker"]] += 1
    for m in replies:
        usage: Mapping[str, Any] = m.usage_metadata or {}
        cached = (usage.get("input_token_details") or {}).get("cache_read", 0)
        if result.first_call_cached is None:
            result.first_call_cached = cached
        result.calls += 1
        result.prompt_tokens += usage.get("input_tokens", 0)
        result.cached_tokens += cached
        result.calls_per_worker[m.response_metadata["worker"]] += 1


async def _run_policy(name: str, urls: list[str], router: Router, templates: str, sessions: int,
                      concurrency: int, model: str) -> RunResult:
    from langchain.agents import create_agent

    result, timer = RunResult(name), _FirstToken()
    today = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        user = USERS[i % len(USERS)] + ("" if i < len(USERS) else f" {i}")
        llm = ChatSGLang(model=model, workers=urls, router=router, templates=templates, streaming=True,
                         template_variables={"user_name": user}, max_tokens=48)
        agent = create_agent(llm, tools=[search_docs, calculator], system_prompt=system_prompt(user, today),
                             middleware=[SessionMiddleware()])
        try:
            async with gate:
                await _run_session(agent, i, user, result, timer, tag)
            # told as counted, with no await between: other sessions end while this one's model closes
            print(f"  {name}: session {result.sessions}/{sessions}", file=sys.stderr, flush=True)
        finally:
            await llm.aclose()  # its queued template records are written before the run's keys are deleted

    start = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(sessions)])
    result.seconds = time.perf_counter() - start
    result.ttft = timer.ttft
    return result


def _table(results: list[RunResult], urls: list[str]) -> str:
    lines = [
        f"{'':<28}" + "".join(f"{r.name:>18}" for r in results),
        f"{'sessions completed':<28}" + "".join(f"{r.sessions:>18}" for r in results),
        f"{'LLM calls':<28}" + "".join(f"{r.calls:>18}" for r in results),
        f"{'token cache hit rate':<28}" + "".join(f"{r.hit_rate:>17.1%} " for r in results),
        f"{'tokens recomputed':<28}" + "".join(f"{r.prompt_tokens - r.cached_tokens:>18}" for r in results),
        f"{'TTFT p50 (ms)':<28}" + "".join(f"{r.ttft_pct(0.5) * 1000:>18.1f}" for r in results),
        f"{'TTFT p99 (ms)':<28}" + "".join(f"{r.ttft_pct(0.99) * 1000:>18.1f}" for r in results),
        f"{'sessions on one worker':<28}" + "".join(f"{f'{r.one_worker_sessions}/{r.sessions}':>18}" for r in results),
        f"{'wall time (s)':<28}" + "".join(f"{r.seconds:>18.1f}" for r in results),
        "",
        "calls per worker:",
    ]
    for url in urls:
        lines.append(f"  {url:<26}" + "".join(f"{r.calls_per_worker[url]:>18}" for r in results))
    return "\n".join(lines)


class FlushRefused(Exception):
    """A worker did not flush its cache, so a run would start warm and the comparison would be biased."""


def flush_workers(urls: list[str]) -> None:
    """Empty every worker's prefix cache (SGLang's ``POST /flush_cache``, which it refuses while requests run)."""
    from agent_cache.errors import BackendError

    for url in urls:
        try:
            with SGLangClient(url) as client:
                client.flush_cache()
        except BackendError as exc:
            why = ("SGLang refuses while requests run: run the demo while no other traffic reaches the workers"
                   if exc.status == 400 else "the workers must answer POST /flush_cache")
            raise FlushRefused(f"{url} did not flush its cache ({exc}), and each run must start from empty caches "
                               f"to compare fairly; {why}") from exc


def compare(urls: list[str], *, sessions: int, concurrency: int, model: str,
            redis_url: str | None = None) -> list[RunResult]:
    """The three runs over ``urls``, each after every worker's cache was flushed; the Redis keys they wrote
    (two deployments under a fresh prefix) are deleted at the end."""
    prefix = f"agent-cache-demo-{uuid.uuid4().hex[:8]}"
    runs: list[tuple[str, Callable[[], Router], str]] = [
        ("round-robin", lambda: _RoundRobinRouter(urls), "off"),
        ("routing only", lambda: Router(urls, redis_url=redis_url, prefix=prefix + "-r", probe_interval=None), "off"),
        ("agent-cache", lambda: Router(urls, redis_url=redis_url, prefix=prefix, probe_interval=None), "templatize"),
    ]
    results = []
    try:
        for name, make_router, templates in runs:
            flush_workers(urls)
            router = make_router()
            try:
                results.append(asyncio.run(_run_policy(name, urls, router, templates, sessions, concurrency, model)))
            finally:
                router.close()
    finally:
        if redis_url is not None:
            from agent_cache.store.redis_store import delete_deployment

            for deployment in (prefix + "-r", prefix):
                delete_deployment(redis_url, deployment)
    return results


def run_demo(args: argparse.Namespace) -> int:
    sessions = 6 if args.quick else args.sessions
    with ExitStack() as stack:
        urls = args.workers
        simulated = not urls
        if simulated:
            from agent_cache.sim import SimFleet

            # time_scale 1: the latency model (Llama-3.1-8B on one H100) in real time
            urls = stack.enter_context(SimFleet(args.fleet_size, time_scale=args.time_scale)).urls
            print(f"started {len(urls)} simulated SGLang workers (a simulator, not SGLang): {' '.join(urls)}")
        model = args.model or ("sim-llama-3.1-8b" if simulated else "default")
        print(f"{sessions} ReAct sessions per run, {args.concurrency} at a time"
              + ("" if args.redis is None else f", metadata in Redis at {redact_url(args.redis)}"))
        try:
            results = compare(urls, sessions=sessions, concurrency=args.concurrency, model=model,
                              redis_url=args.redis)
        except FlushRefused as exc:
            print(f"agent-cache demo: {exc}", file=sys.stderr)
            return 1
        print()
        print(_table(results, urls))
        rr, routing, ac = results
        if ac.prompt_tokens and rr.prompt_tokens:
            base = max(1, rr.prompt_tokens - rr.cached_tokens)
            saved_routing = 1 - (routing.prompt_tokens - routing.cached_tokens) / base
            saved = 1 - (ac.prompt_tokens - ac.cached_tokens) / base
            print(f"\nagainst round-robin, agent-cache routing alone recomputed {saved_routing:.0%} fewer prompt "
                  f"tokens, and with templates {saved:.0%} fewer.")
        if simulated:
            print("Figures come from simulated workers: hit rates are real radix-cache matches, latencies follow "
                  "the simulator's latency model (docs/architecture.md).")
    return 0
