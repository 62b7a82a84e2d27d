"""Templates' and sessions' tokens learnt from a worker's /tokenize, for both doors: the fingerprint the state takes
from the system prompt's text names the template inside the prompt the worker renders and caches."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest

from agent_cache import ChatSGLang
from agent_cache.processes import free_port, wait_until
from agent_cache.kv import KvView, parse_sources
from agent_cache.kv.state import KvState
from agent_cache.kv.tokens import EDGE, RETRY_AFTER, KvTokens, system_text
from agent_cache.routing.router import Router
from agent_cache.sim import SimWorkerThread, WorkerOptions

SYSTEM = " ".join(f"Step {i}: open report {i * 3}, compare totals, note any mismatch." for i in range(50))


def _until(ok, what: str) -> None:
    wait_until(ok, [], what, timeout=15.0)


def test_system_text_is_the_leading_system_message_only() -> None:
    assert system_text([{"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert system_text([{"role": "user", "content": "hi"}]) is None
    assert system_text([{"role": "system", "content": ""}]) is None
    assert system_text([]) is None


def test_a_worker_that_does_not_answer_is_asked_again_only_after_the_retry_time() -> None:
    now = [0.0]
    state = KvState()
    learner = KvTokens(state, clock=lambda: now[0])
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    messages = [{"role": "system", "content": SYSTEM}]
    try:
        learner.want_template("t", messages, dead)
        _until(lambda: learner.failed == 1, "the failed ask counted")
        learner.want_template("t", messages, dead)  # within RETRY_AFTER: not asked again
        now[0] = RETRY_AFTER + 1
        learner.want_template("t", messages, dead)
        _until(lambda: learner.failed == 2, "the second ask counted")
        assert not state.knows_template("t") and learner.learnt == 0
    finally:
        learner.close()


@contextmanager
def _chat_model_on_a_worker_with_events() -> Iterator[tuple[SimWorkerThread, KvView, ChatSGLang]]:
    """A sim worker publishing its KV events (with a replay endpoint: the start-up reset is fetched again),
    followed by a view, known to it (an idle flush publishes at once), and a ChatSGLang routed there."""
    pub, replay = free_port(), free_port()
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0, kv_events_config=json.dumps(config)))
    worker.start()
    view = KvView(parse_sources(f"{worker.url}=tcp://127.0.0.1:{pub}|tcp://127.0.0.1:{replay}")).start()
    router = Router([worker.url], kv_events=view, probe_interval=None)
    model = ChatSGLang(router=router, max_tokens=4)
    try:
        with httpx.Client(base_url=worker.url) as client:
            _until(lambda: client.post("/flush_cache").is_success and view.state.known(worker.url),
                   "the worker known")
        yield worker, view, model
    finally:
        model.close()
        router.close()
        view.close()
        worker.stop()


@pytest.mark.parametrize("tools", [None, [{"type": "function", "function": {"name": "sum", "parameters": {}}}]])
def test_chat_sglang_learns_its_template_and_finds_it_in_the_workers_events(tools) -> None:
    with _chat_model_on_a_worker_with_events() as (worker, view, model):
        state = view.state
        llm = model.bind_tools(tools) if tools else model
        answer = llm.invoke([("system", SYSTEM), ("user", "Check the March report.")])
        tid = answer.response_metadata["template_id"]
        _until(lambda: state.knows_template(tid), "the template learnt")
        # the worker's cache holds the template: its events, read against the learnt fingerprint, say so
        _until(lambda: state.holders(tid, [worker.url]) == ({worker.url}, {worker.url}), "the template held")
        with httpx.Client(base_url=worker.url) as client:
            client.post("/flush_cache").raise_for_status()  # an idle flush is published at once
        _until(lambda: state.holders(tid, [worker.url]) == (set(), {worker.url}), "the template gone")


def test_chat_sglang_learns_each_steps_last_message_and_the_events_show_it_evicted() -> None:
    """After each served call the session's last message is tokenized by its worker: its fingerprint is
    found resident in the worker's events ("held"), and gone once the worker's cache is flushed."""
    observation = " ".join(f"row {i}: revenue {i * 17 % 89}, cost {i * 5 % 31}, margin ok." for i in range(40))
    with _chat_model_on_a_worker_with_events() as (worker, view, model):
        state = view.state
        answer = model.invoke([("system", SYSTEM), ("user", observation)], session_id="s-1")
        sid = answer.response_metadata["session_id"]
        _until(lambda: state.sessions == 1, "the last message learnt")
        _until(lambda: state.session_prefix("default", sid, worker.url) == "held", "its prefix resident")
        with httpx.Client(base_url=worker.url) as client:
            client.post("/flush_cache").raise_for_status()
        _until(lambda: state.session_prefix("default", sid, worker.url) == "gone", "its prefix evicted")
        assert view.tokens.sessions_learnt == 1 and view.tokens.failed == 0


def test_a_worker_failing_a_sessions_ask_is_not_asked_for_sessions_until_the_retry_time() -> None:
    now = [0.0]
    state = KvState()
    learner = KvTokens(state, clock=lambda: now[0])
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SYSTEM}]
    try:
        learner.want_session("default", "s1", messages, dead)
        _until(lambda: learner.failed == 1, "the failed ask counted")
        for _ in range(5):  # every call of the next RETRY_AFTER s: not asked, not logged, counted
            learner.want_session("default", "s1", messages, dead)
        assert learner.sessions_dropped == 5 and learner.failed == 1
        now[0] = RETRY_AFTER + 1
        learner.want_session("default", "s1", messages, dead)
        _until(lambda: learner.failed == 2, "asked again")
        assert state.sessions == 0 and learner.sessions_learnt == 0
    finally:
        learner.close()


def test_the_edges_of_the_system_prompt_are_left_out_of_the_fingerprint() -> None:
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0))
    worker.start()
    state = KvState()
    learner = KvTokens(state)
    short = "Be brief. " * 3  # fewer than 2 x EDGE tokens: learnt as nothing to match, asked once
    try:
        learner.want_template("long", [{"role": "system", "content": SYSTEM}], worker.url)
        learner.want_template("short", [{"role": "system", "content": short}], worker.url)
        _until(lambda: state.knows_template("long") and state.knows_template("short"), "both learnt")
        with httpx.Client(base_url=worker.url) as client:
            ids = client.post("/tokenize", json={"prompt": SYSTEM, "add_special_tokens": False}).json()["tokens"]
        fresh = KvState()
        fresh.learn_template("inner", ids[EDGE:-EDGE])
        assert state.fingerprint("long") == fresh.fingerprint("inner") != ()
        assert state.fingerprint("short") == () and state.holders("short", [worker.url]) is None
        assert learner.learnt == 2 and learner.failed == 0
    finally:
        learner.close()
        worker.stop()


def test_the_removed_prewarming_options_are_refused_by_name() -> None:
    import subprocess
    import sys

    from agent_cache.errors import ConfigError
    from agent_cache.gateway import GatewayConfig

    with Router(["http://127.0.0.1:9"], probe_interval=None) as router:
        with pytest.raises(ConfigError, match="'prewarm' any more: prewarming was removed") as err:
            ChatSGLang(router=router, prewarm=True)
        assert err.value.field == "prewarm"
    with pytest.raises(TypeError, match="'prewarm'"):
        GatewayConfig(["http://127.0.0.1:9"], prewarm=True)  # type: ignore[call-arg]
    for flag in (["--prewarm"], ["--prewarm-threshold", "2"]):
        out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "serve", "--workers", "http://127.0.0.1:9",
                              *flag], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and f"unrecognized arguments: {' '.join(flag)}" in out.stderr, out.stderr


def test_a_sessions_last_message_is_its_end_only_and_never_the_template() -> None:
    from agent_cache.kv.tokens import TAIL_CHARS, last_text

    long = "x" * (TAIL_CHARS + 500) + "the newest words"
    assert last_text([{"role": "system", "content": SYSTEM}, {"role": "user", "content": long}]) == long[-TAIL_CHARS:]
    assert last_text([{"role": "system", "content": SYSTEM}]) is None  # the template alone: no step of its own
    assert last_text([{"role": "system", "content": SYSTEM}, {"role": "assistant", "content": None,
                                                               "tool_calls": []}]) is None


def test_a_sessions_head_is_its_first_message_long_enough_for_an_anchor() -> None:
    from agent_cache.kv.tokens import HEAD_MIN_CHARS, TAIL_CHARS, head_text

    question, observation = "What is the capital of Peru?", "Search result: " + "Lima. " * 1_000
    thought = "I should search." * 3
    assert head_text([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]) is None
    steps = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
             {"role": "assistant", "content": thought}, {"role": "tool", "content": observation},
             {"role": "user", "content": "x" * HEAD_MIN_CHARS}]
    assert head_text(steps) == observation[:TAIL_CHARS]  # the question and the thought are too short
    assert head_text([{"role": "user", "content": "y" * HEAD_MIN_CHARS}]) == "y" * HEAD_MIN_CHARS  # no template
