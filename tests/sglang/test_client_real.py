"""Every SGLangClient endpoint against a real SGLang server (the sync and async faces)."""

from __future__ import annotations

import pytest

from agent_cache.backends import AsyncSGLangClient, SGLangClient
from agent_cache.sglang_cpu.workers import RealWorker
from tests.sglang.conftest import ENGINE_VERSION, MODEL

WORDS = " ".join(f"word{i}" for i in range(300))


def test_state_endpoints_answer_with_the_fields_the_router_reads(real_pair: list[RealWorker]) -> None:
    with SGLangClient(real_pair[0].url) as client:
        client.health()
        info = client.server_info()
        assert info["max_total_num_tokens"] == real_pair[0].max_total_tokens
        assert info.get("version") == ENGINE_VERSION
        assert client.model_info()["model_path"].endswith("model")
        assert [m["id"] for m in client.models()["data"]] == [MODEL]
        tokens = client.tokenize("hello world")
        assert tokens["count"] == len(tokens["tokens"]) > 0
        metrics = client.metrics()
        assert "sglang:num_running_reqs" in metrics and "sglang:token_usage" in metrics


def test_a_repeated_chat_is_served_from_the_cache_and_flush_empties_it(real_pair: list[RealWorker]) -> None:
    messages = [{"role": "user", "content": "Summarise: " + WORDS}]
    with SGLangClient(real_pair[0].url) as client:
        client.flush_cache()
        first = client.chat(messages, model=MODEL, max_tokens=4)
        second = client.chat(messages, model=MODEL, max_tokens=4)
        assert first.usage is not None and second.usage is not None
        assert first.usage.cached_tokens in (0, None, 1) or first.usage.cached_tokens < 8
        assert second.usage.cached_tokens is not None and second.usage.cached_tokens >= second.usage.prompt_tokens - 1
        client.flush_cache()
        third = client.chat(messages, model=MODEL, max_tokens=4)
        assert third.usage is not None and (third.usage.cached_tokens or 0) < 8


def test_streamed_chat_ends_with_usage_and_generate_reports_cached_tokens(real_pair: list[RealWorker]) -> None:
    with SGLangClient(real_pair[0].url) as client:
        chunks = list(client.stream_chat([{"role": "user", "content": "stream " + WORDS[:400]}], model=MODEL,
                                         max_tokens=6))
        usage = [c.usage for c in chunks if c.usage is not None]
        assert usage and usage[-1].completion_tokens >= 1
        prompt = "generate " + WORDS[:600]
        client.generate(prompt, sampling_params={"max_new_tokens": 2})
        again = client.generate(prompt, sampling_params={"max_new_tokens": 2})
        assert again.cached_tokens >= again.prompt_tokens - 1
        streamed = list(client.stream_generate(prompt, sampling_params={"max_new_tokens": 3}))
        assert streamed and streamed[-1].completion_tokens >= 1


async def test_the_async_face_does_the_same(real_pair: list[RealWorker]) -> None:
    async with AsyncSGLangClient(real_pair[1].url) as client:
        await client.health()
        assert (await client.server_info())["max_total_num_tokens"] == real_pair[1].max_total_tokens
        result = await client.chat([{"role": "user", "content": "async " + WORDS[:300]}], model=MODEL, max_tokens=3)
        assert result.usage is not None and result.usage.prompt_tokens > 10
        chunks = [c async for c in client.stream_chat([{"role": "user", "content": "hi"}], model=MODEL, max_tokens=3)]
        assert any(c.usage is not None for c in chunks)


@pytest.mark.parametrize("bad", [{"max_tokens": -1}, {"temperature": "hot"}])
def test_a_bad_request_is_refused_by_the_real_server_as_a_bad_request(real_pair: list[RealWorker],
                                                                      bad: dict[str, object]) -> None:
    from agent_cache.errors import WorkerBadRequestError

    with SGLangClient(real_pair[1].url) as client, pytest.raises(WorkerBadRequestError):
        client.chat([{"role": "user", "content": "x"}], model=MODEL, **bad)


def _group_alive(pgid: int) -> bool:
    import os

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(  # zombies still count as members until reaped: only living ones matter
        open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z"
        for pid in os.listdir("/proc") if pid.isdigit() and _pgid(int(pid)) == pgid)


def _pgid(pid: int) -> int | None:
    import os

    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_a_killed_or_stopped_server_leaves_none_of_its_processes(engine) -> None:  # type: ignore[no-untyped-def]
    """SGLang starts a scheduler and a detokenizer of its own: a crash (kill) and a stop take them all."""
    from agent_cache.sglang_cpu.workers import RealWorkers

    with RealWorkers(engine) as fleet:
        (worker,) = fleet.start(1, max_total_tokens=2048)
        first = worker.proc.pid
        fleet.kill(worker)
        assert not _group_alive(first)
        with RealWorkers(engine) as other:  # restarted by another fleet, as a test of its own would
            other.restart(worker)
        second = worker.proc.pid
        assert _group_alive(second)  # still its first fleet's: the other's close left it running
    assert not _group_alive(second)
