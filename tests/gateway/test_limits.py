"""Per-tenant ``rpm=`` / ``tpm=``: counted across gateway replicas in one Redis, a replica's share without it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import httpx
import pytest

from agent_cache.backends.protocol import Usage
from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.ratelimit import RateLimits, duration
from agent_cache.sim import SimFleet

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(1) as f:
        yield f


def _replicas(procs: Processes, fleet: SimFleet, redis_url: str, keys: str, tmp_path, *extra: str) -> list[str]:
    path = tmp_path / "keys"
    path.write_text(keys)
    gw = AgentCacheGateways(procs, fleet.urls, redis_url=redis_url, count=2,
                            args=["--prefix", f"t-{uuid.uuid4().hex[:10]}", "--api-keys", str(path), *extra])
    return [u + "/v1/chat/completions" for u in gw.urls]


def _call(client: httpx.Client, url: str, key: str) -> httpx.Response:
    return client.post(url, json=BODY, headers={"authorization": f"Bearer {key}"})


@pytest.mark.slow
def test_rpm_60_refuses_the_61st_call_across_two_replicas_and_no_other_tenant(procs, fleet, redis_url, tmp_path):
    urls = _replicas(procs, fleet, redis_url, "sk-lim team-lim rpm=60\nsk-other team-other rpm=60\n", tmp_path)
    with httpx.Client(timeout=30) as client:
        answers = [_call(client, urls[i % 2], "sk-lim") for i in range(61)]  # every other call on each replica
        assert [r.status_code for r in answers[:60]] == [200] * 60
        assert answers[59].headers["x-ratelimit-remaining-requests"] == "0"
        refused = answers[60]
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        assert 1 <= int(refused.headers["retry-after"]) <= 61
        assert refused.headers["x-ratelimit-limit-requests"] == "60"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
        assert _call(client, urls[0], "sk-lim").status_code == 429  # on either replica
        other = [_call(client, u, "sk-other") for u in urls]  # another tenant is unaffected
        assert [r.status_code for r in other] == [200, 200]
        assert other[1].headers["x-ratelimit-remaining-requests"] == "58"


@pytest.mark.slow
def test_tpm_charges_reported_usage_and_refuses_while_in_debt(procs, fleet, redis_url, tmp_path):
    urls = _replicas(procs, fleet, redis_url, "sk-tok team-tok tpm=120\nsk-other team-other tpm=120\n", tmp_path)
    with httpx.Client(timeout=30) as client:
        spent: list[int] = []
        for i in range(40):
            r = _call(client, urls[i % 2], "sk-tok")
            if r.status_code != 200:
                break
            spent.append(r.json()["usage"]["total_tokens"])
        assert r.status_code == 429, r.text
        assert sum(spent) >= 120  # refused once the reported usage reached the limit...
        assert sum(spent[:-2]) < 120  # ...and not before (a charge lands just after its answer)
        assert r.headers["x-ratelimit-limit-tokens"] == "120" and r.headers["x-ratelimit-remaining-tokens"] == "0"
        assert int(r.headers["retry-after"]) >= 1
        assert _call(client, urls[0], "sk-tok").status_code == 429  # still in debt
        assert _call(client, urls[1], "sk-other").status_code == 200


@pytest.mark.slow
def test_with_redis_away_each_replica_enforces_its_share(procs, fleet, redis_server_factory, tmp_path):
    server = redis_server_factory()
    urls = _replicas(procs, fleet, server.url, "sk-lim team-lim rpm=20\nsk-other team-other rpm=20\n", tmp_path)
    with httpx.Client(timeout=30) as client:
        for i in range(4):  # both replicas register with Redis; 2 calls admitted on each
            assert _call(client, urls[i % 2], "sk-lim").status_code == 200
        server.stop()
        answers = [_call(client, urls[0], "sk-lim") for _ in range(10)]
        # this replica's share: 20 / 2 live replicas = 10 a minute, 2 of them already used here
        assert [r.status_code for r in answers] == [200] * 8 + [429] * 2, [r.text for r in answers]
        assert "share" in answers[8].json()["error"]["message"]
        assert answers[8].headers["x-ratelimit-limit-requests"] == "10"
        assert _call(client, urls[0], "sk-other").status_code == 200  # another tenant is unaffected


def test_the_script_and_the_local_share_agree_on_a_window(redis_url):
    async def run() -> None:
        prefix = f"t-{uuid.uuid4().hex[:10]}"
        shared, alone = RateLimits(redis_url, prefix), RateLimits(None, prefix)
        grant, other = ApiKey("a", rpm=3, tpm=50), ApiKey("b", rpm=3)
        for limits in (shared, alone):
            states = [await limits.admit(grant) for _ in range(3)]
            assert [s.requests.remaining for s in states if s and s.requests] == [2, 1, 0]
            with pytest.raises(RequestRejectedError) as refused:
                await limits.admit(grant)
            assert refused.value.status == 429 and 1 <= refused.value.retry_after <= 61
            assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
            assert (await limits.admit(other)) is not None
        debtor = ApiKey("c", tpm=50)
        for limits in (shared, alone):
            admitted = await limits.admit(debtor)
            assert admitted is not None and admitted.reservation is not None
            admitted.reservation.spent(Usage(40, 20))
            limits.settle(debtor, admitted.reservation)
            await asyncio.sleep(0.05)  # the shared charge is written in the background
            with pytest.raises(RequestRejectedError) as refused:
                await limits.admit(debtor)
            assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"
            assert "tokens per minute: limit 50, used 60" in str(refused.value)
        assert shared.replicas == 1
        assert await shared.admit(ApiKey("d")) is None  # no limits: nothing is counted
        await shared.aclose()
        await alone.aclose()

    asyncio.run(run())


def test_durations_are_written_as_openai_writes_them():
    assert [duration(s) for s in (0.0204, 1.5, 60.0, 59.9996, 75.25)] == ["20ms", "1.5s", "1m0s", "1m0s", "1m15.25s"]


@pytest.mark.slow
def test_concurrency_bounds_one_tenants_calls_in_flight_and_no_other_tenants(procs, tmp_path):
    """concurrency=2: of tenant B's four simultaneous long calls two run and two get 429 at once;
    tenant A's calls pass meanwhile; B's slots are free again once its calls end."""
    path = tmp_path / "keys"
    path.write_text("sk-a team-a\nsk-b team-b concurrency=2\n")
    with SimFleet(2, time_scale=1) as slow:
        url = AgentCacheGateways(procs, slow.urls, args=["--api-keys", str(path)]).urls[0] + "/v1/chat/completions"
        long_call = {**BODY, "max_tokens": 200, "stream": True}  # about 2 s of decoding on the simulated workers

        async def tenant_b() -> list[int]:
            async with httpx.AsyncClient(timeout=60, headers={"authorization": "Bearer sk-b"}) as c:

                async def one() -> int:
                    async with c.stream("POST", url, json=long_call) as r:
                        await r.aread()
                        return r.status_code

                return list(await asyncio.gather(*(one() for _ in range(4))))

        async def both() -> tuple[list[int], list[int]]:
            b = asyncio.create_task(tenant_b())
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient(timeout=60, headers={"authorization": "Bearer sk-a"}) as c:
                a = [(await c.post(url, json=BODY)).status_code for _ in range(3)]
            return await b, a

        b_statuses, a_statuses = asyncio.run(both())
        with httpx.Client(timeout=60) as c:
            again = _call(c, url, "sk-b")
    assert sorted(b_statuses) == [200, 200, 429, 429], b_statuses
    assert a_statuses == [200, 200, 200]
    assert again.status_code == 200, again.text


def _stream_cut(client: httpx.Client, url: str, key: str, events: int) -> tuple[int, int]:
    """A stream of 300 tokens closed after ``events`` events: (status, content events read)."""
    body = {**BODY, "max_tokens": 300, "stream": True, "stream_options": {"include_usage": True},
            "sim_output": " word" * 400}  # the simulated worker says this (cut at max_tokens)
    with client.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            return r.status_code, 0
        read = 0
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                read += 1
                if read >= events:
                    break
    return 200, read


@pytest.mark.slow
def test_streams_closed_before_their_end_cannot_pass_tpm(procs, fleet, redis_url, tmp_path):
    """Each call reserves its prompt's bytes / 4 + max_tokens when admitted; a stream the client closes
    before its usage event keeps its reservation, so cut streams stop at the limit plus one reservation."""
    urls = _replicas(procs, fleet, redis_url, "sk-cut team-cut tpm=1000\n", tmp_path, "--extra-fields", "sim_output")
    with httpx.Client(timeout=30) as client:
        results = [_stream_cut(client, urls[i % 2], "sk-cut", events=290) for i in range(12)]
    admitted = [read for status, read in results if status == 200]
    assert [s for s, _ in results].count(429) >= 8, results
    reservation = 300 + 2_100 // 4  # max_tokens, and the body's bytes / 4 (its sim_output is 2,000 bytes)
    assert sum(admitted) <= 1000 + reservation, results  # before: 12 x 290 = 3,480 tokens delivered
    print(f"\ncut streams: {len(admitted)} of 12 admitted, {sum(admitted)} tokens delivered (tpm 1000)")


@pytest.mark.slow
def test_concurrent_calls_cannot_pass_tpm_by_more_than_one_reservation(procs, fleet, redis_url, tmp_path):
    urls = _replicas(procs, fleet, redis_url, "sk-par team-par tpm=300\n", tmp_path)
    body = {**BODY, "max_tokens": 200}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30, headers={"authorization": "Bearer sk-par"}) as c:
            return list(await asyncio.gather(*(c.post(urls[i % 2], json=body) for i in range(16))))

    answers = asyncio.run(run())
    used = sum(r.json()["usage"]["total_tokens"] for r in answers if r.status_code == 200)
    assert used <= 300 + 200 + 40, [r.status_code for r in answers]  # before: 3,344 tokens (11x)
    print(f"\nconcurrent calls: {16 - [r.status_code for r in answers].count(429)} of 16 admitted, {used} tokens")
    assert [r.status_code for r in answers].count(429) >= 13


def test_a_call_refused_or_failed_gives_its_reservation_back(redis_url):
    async def run() -> None:
        limits = RateLimits(redis_url, f"t-{uuid.uuid4().hex[:10]}")
        grant = ApiKey("r", tpm=1000)
        first = await limits.admit(grant, 600)
        assert first is not None and first.reservation is not None and first.tokens.remaining == 400
        limits.settle(grant, first.reservation)  # ended before any output: nothing charged
        await asyncio.sleep(0.05)
        second = await limits.admit(grant, 600)
        assert second is not None and second.tokens.remaining == 400  # the first one's 600 came back
        second.reservation.spent(Usage(100, 50))
        limits.settle(grant, second.reservation)
        limits.settle(grant, second.reservation)  # once only
        await asyncio.sleep(0.05)
        third = await limits.admit(grant, 0)
        assert third is not None and third.tokens.used == 150
        await limits.aclose()

    asyncio.run(run())
