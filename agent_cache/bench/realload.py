"""Closed-loop async load of the real-process benchmark, one process per router replica.

A replica drives its share of the sessions: session s starts at ``t0 +
s.arrival_s``; call k+1 is sent when call k has returned plus its think time.
Every call is a streamed chat completion with the call's chat form
(:class:`agent_cache.bench.workloads.ChatCall`). A simulated worker is asked
for the workload's output (``sim_output``); a real one (or a simulated one
not ``scripted``) answers for itself, and the session goes on closed-loop
(:func:`closed_loop`): each later step carries that answer as the
assistant's message. Per call the replica records:

* TTFT, from the moment the client starts the call (before templating and
  the routing decision) to the first streamed content token;
* prompt and cached tokens as the worker reports them in the usage chunk
  (``prompt_tokens_details.cached_tokens``);
* the worker that served it.

How a call finds its worker, by the policy's ``path`` in :mod:`agent_cache.bench.registry`:

* ``client`` (``round-robin``, ``random``, ``least-load``, ``consistent-hash``):
  the policy of :mod:`agent_cache.bench.policies`, one state per replica;
* ``agent-cache`` (``agent-cache`` / ``agent-cache-no-templates``): ``ChatSGLang``
  (templates ``templatize`` / ``off``), one per tenant over one ``Router`` on the
  shared Redis store, called with ``astream`` and the session id as an application
  calls it (the call pipeline, failover and the served hook included);
* ``gateway`` (``agent-cache serve``): the session in ``x-session-id``, the tenant
  from its API key, the worker read from ``x-agent-cache-worker``;
* ``smg`` (``smg-*``): the smg gateway picks (with ``--gateways K``, the call goes to
  the K gateways in turn, joined in smg's mesh); the worker is read from smg's
  ``x-smg-routed-worker-id`` response header. ``smg-consistent_hashing``
  sends the session id in ``x-smg-routing-key``.

:class:`Replicas` runs jobs in K spawned processes, reused across policies.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import multiprocessing.connection
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import httpx

from agent_cache.backends.protocol import (
    build_chat_body,
    decode_json,
    http_error,
    parse_chat,
    parse_chat_chunk,
    transport_error,
)
from agent_cache.server_processes import MODEL
from agent_cache.bench.realfleet import (
    GATEWAY_SESSION_HEADER,
    GATEWAY_WORKER_HEADER,
    ROUTED_WORKER_HEADER,
    gateway_key,
)
from agent_cache.bench.registry import REGISTRY, ROUTING_KEY_HEADER
from agent_cache.bench.workloads import CallSpec, ChatCall, SessionSpec
from agent_cache.calls.httpx_transport import HttpxTransport
from agent_cache.calls.jsonio import dumps
from agent_cache.calls.reader import Event, EventReader
from agent_cache.calls.transport import CONNECT_TIMEOUT
from agent_cache.errors import AgentCacheError, MalformedResponseError
from agent_cache.processes import BenchProcessError


@dataclass(frozen=True)
class Job:
    """One policy's share of the sessions for one replica."""

    policy: str
    sessions: Sequence[SessionSpec]
    workers: Sequence[str]
    t0: float  # time.monotonic() of the run's time zero (system-wide clock: shared by every replica)
    replica: int = 0
    seed: int = 0
    gateways: Sequence[str] = ()  # smg-* policies: one or more gateways of one policy
    redis_url: str | None = None  # agent-cache policies
    redis_prefix: str = "agent-cache-bench"
    capacity_tokens: int = 200_000
    timeout_s: float = 300.0
    model: str = MODEL  # the served model name the calls ask for
    scripted: bool = True  # ask simulated workers for the recorded answer (sim_output); real ones answer freely
    answer_tokens: int | None = None  # cap on each call's max_tokens (None: the recorded answer's length)


# One call: (session_id, call index, worker, t_start, t_first_token, t_end, prompt, cached, output tokens)
CallRecord = tuple[str, int, str, float, float, float, int, int, int]


@dataclass
class ReplicaResult:
    calls: list[CallRecord] = field(default_factory=list)
    # completed sessions: (session_id, arrival time (absolute, monotonic), end of its last call)
    sessions: list[tuple[str, float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one per failed session


@dataclass(frozen=True)
class _Reply:
    worker: str
    t_first: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    text: str  # the answer, which the session's next calls carry as the assistant's message


def closed_loop(chat: ChatCall, answers: Mapping[str, str], answer_tokens: int | None) -> ChatCall:
    """``chat`` as the session really went: each recorded assistant message replaced by the answer the worker
    gave (``answers``: recorded text -> returned text), and ``max_tokens`` capped at ``answer_tokens``.

    A model other than the recorded one answers differently, and a prefix cache extends only over what was
    generated: sent with the recorded answers, every step's prompt would diverge from the cached one right
    after the previous step's prompt. A recorded answer quoted inside another message (Reflexion's
    reflection prompt) is left as recorded.
    """
    messages = chat.messages
    if answers:
        messages = tuple({**m, "content": answers[m["content"]]}
                         if m.get("role") == "assistant" and isinstance(m.get("content"), str)
                         and m["content"] in answers else m for m in chat.messages)
    cap = chat.output_tokens if answer_tokens is None else min(chat.output_tokens, answer_tokens)
    return replace(chat, messages=messages, output_tokens=max(1, cap))


def _served_by(resp: httpx.Response, base: str) -> str:
    """The worker that served a call: named by the gateway in front of it (smg's or ours), else ``base``."""
    return (resp.headers.get(ROUTED_WORKER_HEADER) or resp.headers.get(GATEWAY_WORKER_HEADER) or base).rstrip("/")


CHAT = "/v1/chat/completions"


async def _lines(resp: httpx.Response) -> AsyncIterator[bytes]:
    async for line in resp.aiter_lines():
        yield line.encode() + b"\n"


class ChatClient:
    """Sends one chat completion (streamed unless ``stream=False``) and measures it.

    A call straight to a worker (the client-side policies, the direct path) rides the product's
    transport (:class:`~agent_cache.calls.httpx_transport.HttpxTransport`); a call to a gateway, which
    takes the session or routing key in a request header and names the worker in a response header,
    an httpx client. Either stream is read by the product's :class:`~agent_cache.calls.reader.EventReader`.
    """

    def __init__(self, timeout: float, *, stream: bool = True, model: str = MODEL, scripted: bool = True) -> None:
        self.timeout = timeout
        self.transport = HttpxTransport(timeout=timeout, max_connections=512)
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT), limits=limits)
        self.stream = stream
        self.model = model
        self.scripted = scripted

    async def send(self, base: str, chat: ChatCall, headers: dict[str, str] | None = None) -> _Reply:
        """``headers``: a gateway's (sent with httpx, the worker read from the answer's headers)."""
        body = dumps(build_chat_body(list(chat.messages), model=self.model, stream=self.stream, include_usage=True,
                                     url=base, tools=list(chat.tools) if chat.tools else None,
                                     max_tokens=chat.output_tokens, temperature=0.0,
                                     extra_body={"sim_output": chat.output} if self.scripted else None))
        if headers is None:
            if not self.stream:
                return _whole(base, await self.transport.post(base, CHAT, body))
            return await _read(base, self.transport.stream(base, CHAT, body, first_byte_timeout=self.timeout))
        headers = {"content-type": "application/json", **headers}
        try:
            if not self.stream:
                resp = await self.http.post(base + CHAT, content=body, headers=headers)
                if resp.status_code >= 400:
                    raise http_error(resp.status_code, resp.content, base)
                return _whole(_served_by(resp, base), resp.content)
            async with self.http.stream("POST", base + CHAT, content=body, headers=headers) as resp:
                if resp.status_code >= 400:
                    raise http_error(resp.status_code, await resp.aread(), base)
                return await _read(_served_by(resp, base), _lines(resp))
        except httpx.HTTPError as exc:
            raise transport_error(exc, base) from exc

    async def aclose(self) -> None:
        await self.transport.aclose()
        await self.http.aclose()


async def _read(worker: str, lines: AsyncIterator[bytes]) -> _Reply:
    """A streamed answer: its first content token's time, the usage the worker reported, the text."""
    reader = EventReader(worker, CHAT)
    t_first = 0.0
    text: list[str] = []

    def take(event: Event | None) -> None:
        nonlocal t_first
        if event is None or event.payload is None:
            return
        chunk = parse_chat_chunk(event.data(), worker)  # raises on an error event
        if chunk.content:
            t_first = t_first or time.monotonic()
            text.append(chunk.content)

    async for line in lines:
        take(reader.feed(line))
    take(reader.end())
    if reader.usage is None:
        raise MalformedResponseError("no usage chunk in the stream", url=worker)
    usage = reader.usage
    return _Reply(worker, t_first or time.monotonic(), usage.prompt_tokens, usage.cached_tokens or 0,
                  usage.completion_tokens, "".join(text))


def _whole(worker: str, content: bytes) -> _Reply:
    """A non-streamed answer: its first token is its whole answer."""
    result = parse_chat(decode_json(content, worker, "chat completion"), worker)
    if result.usage is None:
        raise MalformedResponseError("no usage in the response", url=worker)
    usage = result.usage
    return _Reply(worker, time.monotonic(), usage.prompt_tokens, usage.cached_tokens or 0, usage.completion_tokens,
                  result.content or "")


class _ClientSide:
    """Client-side routing with a policy of :mod:`agent_cache.bench.policies` (this replica's own state)."""

    def __init__(self, job: Job, client: ChatClient) -> None:
        from agent_cache.bench.registry import make_policies

        self.workers = list(job.workers)
        self.n = len(self.workers)
        (self.policy,) = make_policies((job.policy,), self.n, 1, job.seed * 1000 + job.replica)
        self.client = client
        self._inflight = [0] * self.n

    # FleetView of what this replica dispatched itself
    def inflight(self, i: int) -> int:
        return self._inflight[i]

    async def call(self, session: SessionSpec, call: CallSpec, chat: ChatCall) -> _Reply:
        from agent_cache.bench.policies import Dispatch

        dispatch = Dispatch(session.session_id, session.tenant, call.raw_template, call.raw_template_tokens, 0)
        i = self.policy.route(dispatch, self)
        self._inflight[i] += 1
        try:
            reply = await self.client.send(self.workers[i], chat)
        finally:
            self._inflight[i] -= 1
        self.policy.completed(dispatch, i, reply.prompt_tokens, reply.cached_tokens)
        return reply

    def session_done(self, session_id: str) -> None:
        self.policy.session_done(session_id)

    async def aclose(self) -> None:
        pass


class _AgentCache:
    """``ChatSGLang``, called as an application calls it (one model per tenant, ``astream`` with the session id),
    over one Router on the shared Redis store: templates, routing, the call pipeline and the served hook are
    the product's own."""

    def __init__(self, job: Job, client: ChatClient) -> None:
        from agent_cache.routing import Router

        self.job = job
        self.stream = client.stream  # False: whole answers (ainvoke)
        self.mode = REGISTRY[job.policy].templates
        self.router = Router(list(job.workers), redis_url=job.redis_url, prefix=job.redis_prefix,
                             probe_interval=None, capacities={u: job.capacity_tokens for u in job.workers})
        self._models: dict[str, Any] = {}

    def _model(self, tenant: str) -> Any:
        from agent_cache.langchain import ChatSGLang

        model = self._models.get(tenant)
        if model is None:
            model = self._models[tenant] = ChatSGLang(router=self.router, tenant=tenant, templates=self.mode,
                                                      model=self.job.model, temperature=0.0,
                                                      timeout=self.job.timeout_s)
        return model

    async def call(self, session: SessionSpec, call: CallSpec, chat: ChatCall) -> _Reply:
        options: dict[str, Any] = {"session_id": session.session_id, "max_tokens": chat.output_tokens}
        if chat.tools:
            options["tools"] = list(chat.tools)
        if self.job.scripted:
            options["extra_body"] = {"sim_output": chat.output}
        model = self._model(session.tenant)
        t_first = 0.0
        text: list[str] = []
        last = None
        if not self.stream:  # a whole answer: its first token is all of it
            last = await model.ainvoke(list(chat.messages), **options)
            text.append(str(last.content))
        else:
            async for chunk in model.astream(list(chat.messages), **options):
                if isinstance(chunk.content, str) and chunk.content:
                    t_first = t_first or time.monotonic()
                    text.append(chunk.content)
                if chunk.usage_metadata is not None:
                    last = chunk
        if last is None or last.usage_metadata is None:
            raise MalformedResponseError("no usage in the answer", url="")
        usage = last.usage_metadata
        return _Reply(str(last.response_metadata["worker"]), t_first or time.monotonic(), usage["input_tokens"],
                      int(last.response_metadata.get("cached_tokens") or 0), usage["output_tokens"], "".join(text))

    def session_done(self, session_id: str) -> None:
        pass

    async def aclose(self) -> None:
        for model in self._models.values():
            await model.aclose()
        await self.router.aclose()


class _Gateway:
    """Every call to a gateway (smg, or ``agent-cache serve``), round-robin per call over the
    gateways (as a Service in front of a gateway Deployment spreads requests); the gateway picks
    the worker. agent-cache's gateway gets the session in a header and the tenant from its key."""

    def __init__(self, job: Job, client: ChatClient) -> None:
        assert job.gateways, "a gateway policy needs at least one gateway"
        self.urls = list(job.gateways)
        self.next = job.replica  # replicas start on different gateways
        spec = REGISTRY[job.policy]
        self.ours = spec.path == "gateway"
        self.keyed = spec.smg_policy == "consistent_hashing"
        self.client = client

    async def call(self, session: SessionSpec, call: CallSpec, chat: ChatCall) -> _Reply:
        url = self.urls[self.next % len(self.urls)]
        self.next += 1
        headers = {ROUTING_KEY_HEADER: session.session_id} if self.keyed else None
        if self.ours:
            headers = {GATEWAY_SESSION_HEADER: session.session_id,
                       "authorization": f"Bearer {gateway_key(session.tenant)}"}
        return await self.client.send(url, chat, headers=headers)

    def session_done(self, session_id: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


def call_path(job: Job, client: ChatClient) -> _ClientSide | _AgentCache | _Gateway:
    """How a call of ``job.policy`` reaches its worker (see the module docstring)."""
    path = REGISTRY[job.policy].path
    if path == "client":
        return _ClientSide(job, client)
    if path == "agent-cache":
        return _AgentCache(job, client)
    if path in ("gateway", "smg"):
        return _Gateway(job, client)
    raise ValueError(f"{job.policy!r} does not run in the real engine")


async def run_job(job: Job, on_session_done: Callable[[], None] | None = None) -> ReplicaResult:
    """Drive ``job.sessions`` closed-loop against the fleet; returns every call's measurements."""
    client = ChatClient(job.timeout_s, model=job.model, scripted=job.scripted)
    router = call_path(job, client)
    result = ReplicaResult()

    async def session(spec: SessionSpec) -> None:
        arrival = job.t0 + spec.arrival_s
        await asyncio.sleep(max(0.0, arrival - time.monotonic()))
        end = arrival
        answers: dict[str, str] = {}  # recorded answer -> the worker's (closed loop)
        try:
            for k, call in enumerate(spec.start(chat=True)):
                if k and call.think_s > 0:
                    await asyncio.sleep(call.think_s)
                assert call.chat is not None
                chat = closed_loop(call.chat, answers, job.answer_tokens)
                t_start = time.monotonic()
                reply = await router.call(spec, call, chat)
                answers[call.chat.output] = reply.text
                end = time.monotonic()
                result.calls.append((spec.session_id, k, reply.worker, t_start, reply.t_first, end,
                                     reply.prompt_tokens, reply.cached_tokens, reply.output_tokens))
        except AgentCacheError as exc:  # a worker error, or no healthy worker left: the session fails
            result.errors.append(f"{spec.session_id}: {exc}")
        else:
            result.sessions.append((spec.session_id, arrival, end))
        finally:
            router.session_done(spec.session_id)
            if on_session_done is not None:
                on_session_done()

    try:
        await asyncio.gather(*(session(s) for s in job.sessions))
    finally:
        await router.aclose()
        await client.aclose()
    return result


# --- replica processes -----------------------------------------------------------


def _warm_up() -> None:
    """Load once what a first call would otherwise load inside its measurement (modules, tokenizer, word list)."""
    from agent_cache.bench.workloads import words
    from agent_cache.routing import Router  # noqa: F401
    from agent_cache.templates import Templater

    Templater("templatize").normalize([{"role": "system", "content": "Today is 2026-01-01."}])
    words([1])


def _replica_main(conn: Any, counter: Any) -> None:
    """Body of one replica process: run each job received, send back its result."""
    _warm_up()

    def tick() -> None:
        with counter.get_lock():
            counter.value += 1

    while True:
        try:
            job = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if job is None:
            return
        try:
            conn.send(("ok", asyncio.run(run_job(job, tick))))
        except KeyboardInterrupt:
            return
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class Replicas:
    """K router-replica processes (spawned once, reused for every policy)."""

    def __init__(self, k: int) -> None:
        ctx = mp.get_context("spawn")
        self.sessions_done = ctx.Value("i", 0)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        try:
            for r in range(k):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_replica_main, args=(child, self.sessions_done),
                                   name=f"agent-cache-bench-replica-{r}", daemon=True)
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
        except BaseException:
            self.close()
            raise

    @property
    def k(self) -> int:
        return len(self._procs)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.is_alive()]

    def run(self, jobs: Sequence[Job], progress: Callable[[int], None] | None = None,
            interval: float = 2.0) -> list[ReplicaResult]:
        """Run job i on replica i (all at once); ``progress(sessions done)`` every ``interval`` s."""
        assert len(jobs) == self.k
        with self.sessions_done.get_lock():
            self.sessions_done.value = 0
        for conn, job in zip(self._conns, jobs):
            conn.send(job)
        results: list[ReplicaResult | None] = [None] * self.k
        pending = dict(enumerate(self._conns))
        last = -1
        while pending:
            ready = mp.connection.wait(list(pending.values()), timeout=interval)
            for i, conn in list(pending.items()):
                if conn not in ready:
                    if not self._procs[i].is_alive():
                        raise BenchProcessError(f"load replica {i} died (exit code {self._procs[i].exitcode})")
                    continue
                try:
                    status, value = conn.recv()
                except EOFError:
                    raise BenchProcessError(f"load replica {i} died (exit code {self._procs[i].exitcode})") from None
                if status != "ok":
                    raise BenchProcessError(f"load replica {i} failed:\n{value}")
                results[i] = value
                del pending[i]
            done = self.sessions_done.value
            if progress is not None and done != last and pending:
                progress(done)
                last = done
        return [r for r in results if r is not None]

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(3)
            if proc.is_alive():
                proc.terminate()
                proc.join(3)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs.clear()
        self._conns.clear()

    def __enter__(self) -> "Replicas":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
