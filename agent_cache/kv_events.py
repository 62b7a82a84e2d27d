"""SGLang's KV cache events on the wire: structures, block hashes, msgpack framing.

Copied from SGLang 0.5.4 (``srt/disaggregation/kv_events.py``, emitted by
``srt/mem_cache/radix_cache.py``, published by the scheduler after each
prefill batch and every ``decode_log_interval`` decode batches when the
server runs with ``--kv-events-config '{"publisher": "zmq", ...}'``):

* each ZeroMQ PUB message is three frames: ``topic`` (UTF-8, default
  empty), ``sequence`` (8-byte big-endian, from 0 per publisher) and the
  payload, a ``KVEventBatch`` encoded by msgspec's msgpack encoder;
* the structs are ``array_like`` and ``tag=True``: a batch is the array
  ``[ts, events, attn_dp_rank]`` (the publisher sets the rank, 0 without
  DP attention); an event is ``["BlockStored",
  block_hashes, parent_block_hash, token_ids, block_size, lora_id]``,
  ``["BlockRemoved", block_hashes]`` or ``["AllBlocksCleared"]``;
* one ``BlockStored`` per page (``page_size`` tokens) of a new radix node,
  one ``BlockRemoved`` per page of an evicted one; a node split is a
  removal of the lower node's pages, then stores of both halves; a cache
  reset (start-up, ``/flush_cache``) is ``AllBlocksCleared``;
* a block's hash is Python's ``hash(tuple(page_token_ids))``: the page's
  own tokens, not chained to its prefix (equal pages anywhere hash alike;
  integer tuples hash the same in every process, whatever PYTHONHASHSEED);
* ``parent_block_hash`` is the previous page of the same node, and None
  for a node's first page (SGLang's test of the parent is always true for
  a non-root node, so no event links a node to its parent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, Union


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]


@dataclass
class AllBlocksCleared:
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass
class KVEventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    attn_dp_rank: int | None = None


def block_hash(page_tokens: Sequence[int]) -> int:
    """SGLang's hash of one page: ``hash(tuple(page_tokens))``."""
    return hash(tuple(page_tokens))


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """SGLang's endpoint of DP rank ``n``: the TCP port + n, or ``_dp<n>`` after an inproc name."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        if ":" in endpoint:
            i = endpoint.rfind(":")
            return f"{endpoint[:i]}:{int(endpoint[i + 1:]) + data_parallel_rank}"
        return endpoint
    raise ValueError("Invalid endpoint: must contain 'inproc' or 'tcp'")


def _event_array(event: KVEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return ["BlockStored", event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
                event.lora_id]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes]
    return ["AllBlocksCleared"]


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload frame, byte for byte as msgspec's encoder writes a ``KVEventBatch``
    (an array-like struct keeps every field, a None rank included)."""
    import msgpack

    body: list[Any] = [batch.ts, [_event_array(e) for e in batch.events], batch.attn_dp_rank]
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def _event(raw: Any) -> KVEvent:
    try:
        tag = raw[0]
        if tag == "BlockStored":  # msgpack gives lists: taken as they are, not copied
            return BlockStored(raw[1], raw[2], raw[3], raw[4], raw[5] if len(raw) > 5 else None)
        if tag == "BlockRemoved":
            return BlockRemoved(raw[1])
    except (IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"not a KV event: {raw!r}") from exc
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event tag {tag!r}")


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload frame back into a batch; ValueError for anything else."""
    import msgpack

    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise ValueError(f"not msgpack: {exc}") from exc
    if not isinstance(raw, (list, tuple)) or len(raw) < 2:
        raise ValueError("not a KVEventBatch")
    rank = raw[2] if len(raw) > 2 else None
    return KVEventBatch(float(raw[0]), [_event(e) for e in raw[1]], rank)


def sequence_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=seq < 0)


def sequence_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)
