"""The simulator's KV events in SGLang 0.5.9's and 0.5.23's formats, read by an independent decoder.

The structs below are those of each release's ``srt/disaggregation/kv_events.py`` (0.5.9: arrays with a
trailing ``medium``; 0.5.23: tagged maps), decoded by msgspec; block hashes are recomputed here with
hashlib as those releases compute them (SHA-256 of the previous page's digest and the page's tokens as
uint32 little-endian, the first 8 bytes big-endian and signed). What the events leave resident must equal
the pages of the simulator's tree, through inserts, splits, evictions and a reset; and agent_cache's own
decoder and state must count the same tokens.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Optional, Union

import msgspec
import pytest

from agent_cache.kv.events import FORMAT_ARRAYS_MEDIUM, FORMAT_MAPS, KVEventBatch, decode_batch, encode_batch
from agent_cache.sim.versions import SGLangVersion
from agent_cache.kv.state import KvState
from agent_cache.sim.radix import RadixCache


class _Batch(msgspec.Struct, array_like=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


# --- 0.5.9 ------------------------------------------------------------------------------------------------
class _Event59(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class _Stored59(_Event59, tag="BlockStored"):  # type: ignore[call-arg]
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None


class _Removed59(_Event59, tag="BlockRemoved"):  # type: ignore[call-arg]
    block_hashes: list[int]
    medium: Optional[str] = None


class _Cleared59(_Event59, tag="AllBlocksCleared"):  # type: ignore[call-arg]
    pass


class _Batch59(_Batch):
    events: list[Union[_Stored59, _Removed59, _Cleared59]]  # type: ignore[assignment]


# --- 0.5.23 -----------------------------------------------------------------------------------------------
class _Event523(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class _Stored523(_Event523, tag="BlockStored"):  # type: ignore[call-arg]
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class _Removed523(_Event523, tag="BlockRemoved"):  # type: ignore[call-arg]
    block_hashes: list[int]
    medium: Optional[str] = None


class _Cleared523(_Event523, tag="AllBlocksCleared"):  # type: ignore[call-arg]
    pass


class _Batch523(_Batch):
    events: list[Union[_Stored523, _Removed523, _Cleared523]]  # type: ignore[assignment]


DECODERS = {FORMAT_ARRAYS_MEDIUM: msgspec.msgpack.Decoder(_Batch59), FORMAT_MAPS: msgspec.msgpack.Decoder(_Batch523)}


def _sha_chain(tokens: list[int], page: int) -> list[int]:
    prior, out = b"", []
    for i in range(0, len(tokens) // page * page, page):
        prior = hashlib.sha256(prior + b"".join(t.to_bytes(4, "little") for t in tokens[i : i + page])).digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out


def test_the_hash_of_token_zero_is_the_real_servers() -> None:
    assert _sha_chain([0], 1) == [-2360060374177730597]  # as both real releases publish it


def _tree_hashes(cache: RadixCache) -> set[int]:
    """Every resident page's chain hash, recomputed from the tree's token paths."""
    out: set[int] = set()
    stack = [(cache.root, [])]
    while stack:
        node, path = stack.pop()
        path = path + node.key
        if node is not cache.root:
            out.update(_sha_chain(path, cache.page_size)[-(len(node.key) // cache.page_size):])
        stack.extend((c, path) for c in node.children.values())
    return out


@pytest.mark.parametrize("version", ["0.5.9", "0.5.15", "0.5.18", "0.5.23"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_events_follow_the_tree_through_splits_and_evictions(version: str, page_size: int) -> None:
    rng = random.Random(7)
    kv_format = SGLangVersion.parse(version).kv_event_format
    fmt = kv_format.encoding
    cache = RadixCache(600, page_size=page_size, enable_kv_events=True, kv_format=kv_format)
    state = KvState()
    resident: set[int] = set()
    stems = [[rng.randrange(5000) for _ in range(rng.randrange(20, 120))] for _ in range(6)]
    for step in range(60):
        seq = list(rng.choice(stems)) + [rng.randrange(5000) for _ in range(rng.randrange(1, 80))]
        cache.insert(seq[: rng.randrange(len(seq) // 2, len(seq) + 1)])
        if step == 40:
            cache.reset()
        payload = encode_batch(KVEventBatch(float(step), cache.take_events(), 0), fmt)
        for e in DECODERS[fmt].decode(payload).events:
            if isinstance(e, (_Stored59, _Stored523)):
                assert e.medium == "GPU" and e.block_size == page_size
                assert len(e.token_ids) == len(e.block_hashes) * page_size
                resident.update(e.block_hashes)
            elif isinstance(e, (_Removed59, _Removed523)):
                resident.difference_update(e.block_hashes)
            else:
                resident.clear()
        assert resident == _tree_hashes(cache)
        state.apply("w", step, decode_batch(payload))
        assert state.cached_tokens("w") == cache.total_tokens == len(resident) * page_size
    if not kv_format.merge_stores:  # one store per page
        assert all(len(e.block_hashes) == 1 for e in DECODERS[fmt].decode(payload).events
                   if isinstance(e, (_Stored59, _Stored523)))
