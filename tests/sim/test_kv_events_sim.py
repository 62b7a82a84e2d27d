"""The simulated worker publishes SGLang's KV events: checked by an independent subscriber.

The subscriber here does not use agent_cache's decoder: it decodes with
msgspec and the struct definitions of SGLang 0.5.4's
``srt/disaggregation/kv_events.py``, copied below, and reads the ZeroMQ
frames itself (topic, 8-byte big-endian sequence, payload).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any, Optional, Union

import httpx
import msgspec
import pytest
import zmq

from agent_cache.processes import free_port
from agent_cache.kv.events import (
    AllBlocksCleared as OurCleared,
    BlockRemoved as OurRemoved,
    BlockStored as OurStored,
    KVEventBatch as OurBatch,
    decode_batch,
    encode_batch,
)
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.sim.radix import RadixCache


# --- SGLang 0.5.4's definitions, verbatim but for the type-ignore comments -----------------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # type: ignore[assignment]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


# --- the bytes -------------------------------------------------------------------------------------------


def test_our_payload_is_byte_for_byte_what_sglangs_msgspec_encoder_writes() -> None:
    rng = random.Random(3)
    for rank in (None, 0, 2):
        tokens = [rng.randrange(128_000) for _ in range(4)]
        h = hash(tuple(tokens))
        ours = OurBatch(1733.25, [OurCleared(), OurStored([h], None, tokens, 4, None),
                                  OurStored([-h], h, tokens[:2], 2, None), OurRemoved([h])], rank)
        theirs = KVEventBatch(1733.25, [AllBlocksCleared(), BlockStored([h], None, tokens, 4, None),
                                        BlockStored([-h], h, tokens[:2], 2, None), BlockRemoved([h])], rank)
        assert encode_batch(ours) == msgspec.msgpack.encode(theirs)
        assert decode_batch(msgspec.msgpack.encode(theirs)) == ours


# --- what the radix cache emits ----------------------------------------------------------------------------


def _replay(events: list[Any], resident: dict[int, int]) -> None:
    for e in events:
        if isinstance(e, AllBlocksCleared):
            resident.clear()
        elif isinstance(e, BlockStored):
            for h in e.block_hashes:
                resident[h] = resident.get(h, 0) + 1
        else:
            for h in e.block_hashes:
                resident[h] -= 1
                if not resident[h]:
                    del resident[h]


def _tree_pages(cache: RadixCache) -> dict[int, int]:
    out: dict[int, int] = {}
    stack = [cache.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        for i in range(0, len(node.key), cache.page_size):
            h = hash(tuple(node.key[i : i + cache.page_size]))
            out[h] = out.get(h, 0) + 1
    return out


@pytest.mark.parametrize("page_size", [1, 4])
def test_events_replayed_give_exactly_the_pages_in_the_tree(page_size: int) -> None:
    rng = random.Random(page_size)
    cache = RadixCache(400, page_size=page_size, enable_kv_events=True)
    resident: dict[int, int] = {}
    removed = 0
    stems = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    for step in range(300):
        seq = rng.choice(stems)[: rng.randrange(8, 40)] + [rng.randrange(50) for _ in range(rng.randrange(30))]
        cache.insert(seq)
        if step % 97 == 96:
            cache.reset()
        raw = encode_batch(OurBatch(1.0, cache.take_events()))
        events = DECODER.decode(raw).events
        removed += sum(isinstance(e, BlockRemoved) for e in events)
        _replay(events, resident)
        assert resident == _tree_pages(cache)
    assert removed > 100  # evictions and splits were exercised


def test_a_split_is_a_removal_then_both_halves_stored_pages_chained_within_a_node() -> None:
    cache = RadixCache(100, page_size=2, enable_kv_events=True)
    assert cache.take_events() == [OurCleared()]  # the start-up reset, as SGLang's RadixCache.__init__
    cache.insert([1, 2, 3, 4, 5, 6])
    h = [hash((1, 2)), hash((3, 4)), hash((5, 6))]
    assert cache.take_events() == [OurStored([h[0]], None, [1, 2], 2), OurStored([h[1]], h[0], [3, 4], 2),
                                   OurStored([h[2]], h[1], [5, 6], 2)]
    cache.insert([1, 2, 3, 4, 9, 9, 7])  # the last token is not a whole page: not stored
    assert cache.take_events() == [
        OurRemoved([h[0]]), OurRemoved([h[1]]), OurRemoved([h[2]]),
        OurStored([h[0]], None, [1, 2], 2), OurStored([h[1]], h[0], [3, 4], 2),  # the upper half
        OurStored([h[2]], None, [5, 6], 2),  # the lower half: a new node, no parent link
        OurStored([hash((9, 9))], None, [9, 9], 2),
    ]
    assert RadixCache(100).take_events() == []  # events off: nothing is queued


# --- on the wire, from a running simulated worker -----------------------------------------------------------


def _recv(sub: zmq.Socket[bytes], timeout: float) -> list[bytes] | None:
    if sub.poll(int(timeout * 1000)):
        return sub.recv_multipart()
    return None


def _replay_from(ctx: zmq.Context[Any], endpoint: str, first: int) -> list[tuple[int, bytes]]:
    req = ctx.socket(zmq.DEALER)
    req.connect(endpoint)
    req.send_multipart([b"", first.to_bytes(8, "big")])
    out = []
    try:
        while True:
            got = _recv(req, 5)
            assert got is not None
            _, seq_bytes, payload = got
            if int.from_bytes(seq_bytes, "big", signed=True) == -1:
                return out
            out.append((int.from_bytes(seq_bytes, "big"), payload))
    finally:
        req.close(linger=0)


def test_a_running_sim_worker_publishes_sglang_frames_an_independent_subscriber_decodes() -> None:
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.bind("tcp://127.0.0.1:*")  # workers connect to the subscriber (SGLang connects when there is no '*')
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    replay = f"tcp://127.0.0.1:{free_port()}"
    config = {"publisher": "zmq", "endpoint": endpoint, "topic": "kv", "replay_endpoint": replay}
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0, page_size=4, kv_events_config=json.dumps(config),
                                           sglang_version="0.5.4"))  # the release whose structs are above
    worker.start()
    try:
        frames: list[list[bytes]] = []
        with httpx.Client(base_url=worker.url, timeout=10) as client:
            for i in range(20):  # until the PUB socket has connected (ZeroMQ drops what is sent before)
                body = {"model": "m", "messages": [{"role": "user", "content": f"warm up {i}"}], "max_tokens": 2}
                client.post("/v1/chat/completions", json=body).raise_for_status()
                got = _recv(sub, 0.3)
                if got is not None:
                    frames.append(got)
                    break
            assert frames
            messages = [{"role": "system", "content": "You are a careful agent who reads files."},
                        {"role": "user", "content": "Open the file."}]
            prompt = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
            for _ in range(2):  # the second call's prefill pass publishes the first call's insert
                body = {"model": "m", "messages": messages, "max_tokens": 3}
                client.post("/v1/chat/completions", json=body).raise_for_status()
        while (got := _recv(sub, 0.5)) is not None:
            frames.append(got)
        seqs = [int.from_bytes(f[1], "big") for f in frames]
        assert {f[0] for f in frames} == {b"kv"} and seqs == list(range(seqs[0], seqs[0] + len(frames)))
        batches = [DECODER.decode(f[2]) for f in frames]
        assert {b.attn_dp_rank for b in batches} == {0}
        stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
        assert stored and all(e.block_size == 4 == len(e.token_ids) and e.block_hashes == [hash(tuple(e.token_ids))]
                              for e in stored)
        pages = {tuple(e.token_ids) for e in stored}
        whole = len(prompt) // 4 * 4
        assert {tuple(prompt[i : i + 4]) for i in range(0, whole, 4)} <= pages  # the prompt, page by page
        # a late subscriber asks the replay socket for everything from sequence 0
        replayed = _replay_from(ctx, replay, 0)
        assert [s for s, _ in replayed] == list(range(seqs[-1] + 1))
        assert [p for s, p in replayed if s >= seqs[0]] == [f[2] for f in frames]
        events = [e for _, p in replayed for e in DECODER.decode(p).events]
        assert isinstance(events[0], AllBlocksCleared)  # the cache's start-up reset goes out with the first batch
        assert worker.sim is not None
        cache = worker.sim.engine.model.cache
        resident: dict[int, int] = {}
        pending = DECODER.decode(encode_batch(OurBatch(0.0, list(cache.kv_events or [])))).events
        _replay(events + pending, resident)  # + what waits in the cache's queue for the next prefill pass
        assert resident == _tree_pages(cache)
    finally:
        worker.stop()
        sub.close(linger=0)
