"""KV event batches of every SGLang format decode; wrongly typed ones are refused as ValueError, and the
subscriber thread counts them and goes on."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from agent_cache.kv.events import (
    FORMAT_ARRAYS,
    FORMAT_ARRAYS_MEDIUM,
    FORMAT_MAPS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    sequence_bytes,
)
from agent_cache.kv.indexer import EventSource, KvIndexer
from agent_cache.kv.state import KvState


@pytest.mark.parametrize("fmt", [FORMAT_ARRAYS, FORMAT_ARRAYS_MEDIUM, FORMAT_MAPS])
def test_every_format_round_trips(fmt: str) -> None:
    medium = None if fmt == FORMAT_ARRAYS else "GPU"
    batch = KVEventBatch(12.5, [AllBlocksCleared(), BlockStored([-5, 2**63 - 1], None, [1, 2], 1, None, medium),
                                BlockRemoved([-5], medium)], 0)
    assert decode_batch(encode_batch(batch, fmt)) == batch


BAD = [
    [[1.0], [], 0],  # a timestamp that is a list
    [1.0, [["BlockStored", [], None, [1], 1, None]], 0],  # no hashes
    [1.0, [["BlockStored", [1], None, 5, 1, None]], 0],  # token_ids not a list
    [1.0, [["BlockStored", [1], "p", [1], 1, None]], 0],  # a parent that is a string
    [1.0, [{"type": "BlockStored", "block_hashes": [{"a": 1}], "parent_block_hash": None, "token_ids": [1],
            "block_size": 1}], 0],  # a map as a hash
    [1.0, [{"type": "BlockStored", "block_hashes": [1]}], 0],  # fields missing
    [1.0, [["BlockRemoved", [1.5]]], 0],
    [1.0, [["BlockStored", [1], None, [1], 0, None]], 0],  # a page of 0 tokens
    [1.0, [5], 0],
    [1.0, [{"type": "Unknown"}], 0],
    [1.0, "events", 0],
]


@pytest.mark.parametrize("raw", BAD, ids=range(len(BAD)))
def test_wrongly_typed_batches_are_refused(raw: object) -> None:
    with pytest.raises(ValueError):
        decode_batch(msgpack.packb(raw))


def test_deep_nesting_and_garbage_are_refused() -> None:
    for payload in (b"\x91" * 200_000 + b"\x00", b"\xc1", b""):
        with pytest.raises(ValueError):
            decode_batch(payload)


def test_the_subscriber_counts_a_bad_batch_and_goes_on() -> None:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    state = KvState()
    indexer = KvIndexer(state, {"http://w0": EventSource(f"tcp://127.0.0.1:{port}")}).start()
    try:
        good = [encode_batch(KVEventBatch(1.0, [AllBlocksCleared()], 0), FORMAT_MAPS),
                encode_batch(KVEventBatch(2.0, [AllBlocksCleared(), BlockStored([7, 8], None, [1, 2], 1, None, "GPU")],
                                          0), FORMAT_MAPS)]
        frames = [good[0], *(msgpack.packb(raw) for raw in BAD), good[1]]
        deadline = time.monotonic() + 10
        while state.cached_tokens("http://w0") != 2 and time.monotonic() < deadline:
            for seq, payload in enumerate(frames):  # resent until the subscription is up (PUB drops before)
                pub.send_multipart([b"", sequence_bytes(seq), payload])
            time.sleep(0.2)
        # an undecodable batch is a lost one: the worker is unknown until its next reset, which comes after
        assert state.cached_tokens("http://w0") == 2
        assert indexer.bad >= len(BAD) and indexer._thread.is_alive()
    finally:
        indexer.close()
        pub.close(linger=0)


def test_a_silent_replay_endpoint_is_not_asked_again_for_every_gap() -> None:
    """Each gap would ask the replay endpoint and wait for it (2 s) on the one subscriber thread: one that
    did not answer is left alone for a while, and the batches after it are applied at once."""
    ctx = zmq.Context.instance()
    pub, silent = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    replay_port = silent.bind_to_random_port("tcp://127.0.0.1")  # takes requests, never answers
    state = KvState()
    indexer = KvIndexer(state, {"http://w0": EventSource(f"tcp://127.0.0.1:{port}",
                                                         f"tcp://127.0.0.1:{replay_port}")}).start()
    try:
        time.sleep(2.5)  # the start-up catch-up asks once and waits for it
        payload = encode_batch(KVEventBatch(1.0, [AllBlocksCleared()], 0), FORMAT_MAPS)
        started = time.monotonic()
        for seq in range(1, 41, 2):  # a gap before every batch
            pub.send_multipart([b"", sequence_bytes(seq), payload])
        deadline = time.monotonic() + 15
        while indexer.batches < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert indexer.batches >= 15, indexer.batches  # before: one batch every 2 s
        assert time.monotonic() - started < 6
    finally:
        indexer.close()
        pub.close(linger=0)
        silent.close(linger=0)
