"""Every Redis key of a deployment is named in store/keys.py, and the store's Lua scripts spell no key of their
own: their fixed keys arrive declared in KEYS, the others are built by the functions lua.py writes from keys.py."""

from __future__ import annotations

import asyncio
import re
from importlib.resources import files

import redis

from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.ratelimit import RateLimits
from agent_cache.placement.rule import Policy
from agent_cache.store import RedisStore, RouteQuery, WorkerSpec, keys, lua
from agent_cache.store.base import Lease, ReleaseBatch, UsageReport
from agent_cache.store.fleet_board import FleetEntry, RedisFleetBoard

A, B = "http://a:1", "http://b:1"
KINDS = {name: value for name, value in vars(keys).items() if hasattr(value, "suffix") and callable(value)}


def _kind(prefix: str, key: str) -> str | None:
    """The name in keys.py of the kind ``key`` is of; None for a key keys.py does not name."""
    head = keys.tag(prefix) + ":"
    for name, kind in KINDS.items():
        one_of_its_kind = isinstance(kind, type(keys.inflight))  # {prefix}:<suffix>, else {prefix}:<suffix>:<name>
        if key == head + kind.suffix if one_of_its_kind else key.startswith(head + kind.suffix + ":"):
            return name
    return None


def test_the_store_scripts_spell_no_key() -> None:
    for path in (files(lua.__package__) / "lua").iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\.\.\s*'[:{]", text) and not re.search(r"\btag\b\s*\.\.", text), path.name
    for name in ("route", "reports", "abandon", "renew", "release"):  # their layout comes first, from keys.py
        assert lua.store_script(name).startswith("local TAG = ARGV[1]\nlocal K = {inflight = KEYS[1],")


def test_every_key_a_deployment_writes_is_named_in_keys_py(redis_server, prefix) -> None:
    store = RedisStore(redis_server.url, prefix=prefix)
    workers = (WorkerSpec(A, capacity=10_000), WorkerSpec(B, capacity=10_000))
    lease = Lease("router-1", 30.0)
    placed = store.route(RouteQuery("acme", "s1", "t1", "default", workers, 500), Policy(), 1.0, lease=lease)
    assert placed.worker is not None
    report = UsageReport("acme", "s1", placed.worker, placed.epoch, "t1", 800, 0, 2.0)
    store.route(RouteQuery("acme", "s2", "t1", "default", workers, 500), Policy(), 2.0,
                releases=ReleaseBatch("router-1", {placed.worker: 1}, {placed.worker: 1}), lease=lease,
                reports=[report])
    store.renew(lease, {placed.worker: 1}, 3.0)
    store.abandon("acme", "s2", placed.worker, 1, "t1", 3.0)
    store.release_many({placed.worker: 1}, 3.0)
    store.record_template("acme", "t1", 800, "s1", 3.0)
    store.set_worker(A, "up", 10_000, 3.0)
    board = RedisFleetBoard(redis_server.url, prefix)
    assert board.replace(FleetEntry(B, "default", "up", 3.0, "admin"), None)

    async def limited() -> None:
        limits = RateLimits(redis_server.url, prefix)
        assert await limits.admit(ApiKey("acme", rpm=10, tpm=1000), 100) is not None
        await limits.aclose()

    asyncio.run(limited())
    raw = redis.Redis.from_url(redis_server.url)
    written = [k.decode() for k in raw.scan_iter(match=keys.tag(prefix) + "*")]
    store.close()
    strangers = [k for k in written if _kind(prefix, k) is None]
    assert not strangers, f"keys not named in store/keys.py: {strangers}"
    # and each kind keys.py names is one a deployment writes (none is left over from an older layout)
    assert {_kind(prefix, k) for k in written} == set(KINDS)
