"""KV events of a real SGLang server, followed by the gateway and by the in-process indexer ChatSGLang uses.

The reference count is made here from the raw events, fetched from the server's replay socket (every batch
since its start) and decoded with msgpack alone: block hashes stored minus those removed, after the last
reset. With a 1,024-token pool, evictions are forced; then the worker is restarted. The product's count
must equal the reference after each phase, and a prompt's pages must be found by hashing its tokens as the
server hashes them.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from agent_cache.kv.events import chain_hashes
from agent_cache.processes import Processes, wait_until
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.kv.indexer import EventSource, KvIndexer
from agent_cache.kv.state import KvState
from agent_cache.sglang_cpu.workers import RealWorker, wait_idle
from tests.sglang.conftest import MODEL

POOL = 1024


def _replay_all(endpoint: str) -> list[tuple[int, bytes]]:
    """Every batch the server buffers, from sequence 0, over its replay socket (either framing)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out = []
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        while sock.poll(3000):
            frames = sock.recv_multipart()
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq < 0:
                return out
            out.append((seq, frames[-1]))
    finally:
        sock.close()
    raise AssertionError("the replay never ended")


def _raw_resident(endpoint: str) -> tuple[set[int], int, int]:
    """(resident block hashes, block size, pages removed) from the raw events."""
    resident: set[int] = set()
    size, removed = 1, 0
    batches = _replay_all(endpoint)
    assert [s for s, _ in batches] == list(range(len(batches)))
    for _, payload in batches:
        _ts, events, _rank = msgpack.unpackb(payload, strict_map_key=False)
        for e in events:
            tag, fields = (e["type"], e) if isinstance(e, dict) else (e[0], e)
            if tag == "BlockStored":
                hashes = fields["block_hashes"] if isinstance(e, dict) else e[1]
                size = fields["block_size"] if isinstance(e, dict) else e[4]
                resident.update(hashes)
            elif tag == "BlockRemoved":
                hashes = fields["block_hashes"] if isinstance(e, dict) else e[1]
                removed += len(resident & set(hashes))
                resident.difference_update(hashes)
            elif tag == "AllBlocksCleared":
                resident.clear()
            else:
                raise AssertionError(f"unknown event {tag!r}")
    return resident, size, removed


def _gateway_count(gateway: str, worker: str) -> float | None:
    text = httpx.get(gateway + "/metrics").text
    found = re.search(rf'^agent_cache_kv_cached_tokens{{worker="{re.escape(worker)}"}} (\S+)$', text, re.M)
    return None if found is None else float(found.group(1))


def _drive(worker: RealWorker, seed: int, calls: int = 10) -> list[int]:
    """Distinct prompts of ~250 tokens (``calls`` of them overflow the pool); returns the last prompt's ids."""
    ids: list[int] = []
    with httpx.Client(base_url=worker.url, timeout=120) as client:
        for i in range(calls):
            ids = [(seed * 7919 + i * 131 + k * 17) % 3000 + 10 for k in range(250)]
            r = client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200, r.text
    wait_idle(worker.url)
    return ids


def _settled(endpoint: str, counts: Any) -> None:
    """Until every follower agrees with the raw events (idle servers publish what is left within a second)."""
    def agree() -> bool:
        resident, size, _ = _raw_resident(endpoint)
        return all(c() == len(resident) * size for c in counts)

    try:
        wait_until(agree, [], "the followers' resident counts", timeout=20)
    except Exception:
        resident, size, _ = _raw_resident(endpoint)
        pytest.fail(f"raw events leave {len(resident) * size} tokens; followers count {[c() for c in counts]}")


def test_resident_tokens_equal_the_raw_events_under_eviction_and_after_a_restart(start_workers) -> None:
    (worker,) = start_workers(1, max_total_tokens=POOL, kv_events=True)
    assert worker.kv_endpoint and worker.kv_replay_endpoint
    state = KvState()
    indexer = KvIndexer(state, {worker.url: EventSource(worker.kv_endpoint, worker.kv_replay_endpoint)}).start()
    try:
        with Processes() as procs:
            gateway = AgentCacheGateways(procs, [worker.url], args=[
                "--kv-events", f"{worker.url}={worker.kv_endpoint}|{worker.kv_replay_endpoint}"]).urls[0]
            counts = [lambda: state.cached_tokens(worker.url), lambda: _gateway_count(gateway, worker.url)]
            last = _drive(worker, seed=1)
            _settled(worker.kv_replay_endpoint, counts)
            resident, size, removed = _raw_resident(worker.kv_replay_endpoint)
            assert removed > 0 and len(resident) * size <= POOL  # evictions happened; never more than the pool
            # the last prompt's pages, hashed here as the server hashes them, are resident
            assert set(chain_hashes(last[:-1], size)) <= resident

            start_workers.fleet.restart(worker)  # type: ignore[attr-defined]
            _drive(worker, seed=2, calls=3)
            _settled(worker.kv_replay_endpoint, counts)
            assert indexer.bad == 0
            metrics = httpx.get(gateway + "/metrics").text
            assert re.search(r"^agent_cache_kv_undecodable_total 0\.0$", metrics, re.M), "undecodable batches"
    finally:
        indexer.close()
