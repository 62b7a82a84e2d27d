"""Client round trips for every endpoint, sync and async, against a simulated worker."""

from __future__ import annotations

import asyncio

from agent_cache.backends import AsyncSGLangClient, SGLangClient

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def test_sync_round_trips(worker: str) -> None:
    with SGLangClient(worker + "/v1/") as client:  # a trailing /v1 is accepted
        assert client.base_url == worker
        client.health()
        result = client.chat(MSGS, max_tokens=8, temperature=0.0, top_p=1.0, seed=1, rid="req-1",
                             priority=1, chat_template_kwargs={"enable_thinking": False}, separate_reasoning=True)
        assert result.id == "req-1" and result.finish_reason == "length"
        assert result.usage and result.usage.completion_tokens == 8 and result.usage.total_tokens == result.usage.prompt_tokens + 8
        parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "something."}]
        same = client.chat([MSGS[0], {"role": "user", "content": parts}], max_tokens=8)
        assert same.content == result.content  # list-of-parts content renders like the string
        chunks = list(client.stream_chat(MSGS, max_tokens=8))
        assert "".join(c.content or "" for c in chunks) == result.content
        gen = client.generate("The capital of France is", sampling_params={"max_new_tokens": 4, "temperature": 0})
        assert gen.completion_tokens == 4 and gen.prompt_tokens == 5
        streamed = list(client.stream_generate("The capital of France is", sampling_params={"max_new_tokens": 4}))
        assert streamed[-1].text == gen.text and streamed[-1].cached_tokens == 4
        assert all(streamed[i].text == streamed[-1].text[: len(streamed[i].text)] for i in range(len(streamed)))
        assert client.server_info()["max_total_num_tokens"] > 0
        assert client.model_info()["model_path"]
        assert client.models()["data"][0]["id"] == "sim-llama-3.1-8b"
        assert client.metrics()["sglang:num_requests_total"] == 5
        assert client.tokenize("a b")["count"] == 2
        client.flush_cache()
        assert client.metrics()["sglang:num_used_tokens"] == 0


def test_async_round_trips(worker: str) -> None:
    async def run() -> None:
        async with AsyncSGLangClient(worker) as client:
            await client.health()
            sync = SGLangClient(worker).chat(MSGS, max_tokens=6)
            result = await client.chat(MSGS, max_tokens=6)
            assert result.content == sync.content
            assert result.usage and result.usage.cached_tokens and result.usage.cached_tokens > 0
            text = "".join([c.content or "" async for c in client.stream_chat(MSGS, max_tokens=6)])
            assert text == result.content
            gen = await client.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
            assert gen.completion_tokens == 2
            items = [g async for g in client.stream_generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})]
            assert items[-1].text == gen.text
            assert (await client.server_info())["max_total_num_tokens"] > 0
            assert (await client.model_info())["is_generation"] is True
            assert (await client.models())["object"] == "list"
            assert (await client.metrics())["sglang:num_requests_total"] == 5
            assert (await client.tokenize("a b"))["tokens"]
            await client.flush_cache()

    asyncio.run(run())


def test_many_concurrent_async_requests(worker: str) -> None:
    async def run() -> list[int]:
        async with AsyncSGLangClient(worker) as client:
            results = await asyncio.gather(*[client.chat([{"role": "user", "content": f"q{i}"}], max_tokens=3) for i in range(50)])
            return [r.usage.completion_tokens for r in results if r.usage]

    assert asyncio.run(run()) == [3] * 50
