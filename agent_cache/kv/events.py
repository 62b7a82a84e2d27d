"""SGLang's KV cache events on the wire: structures, block hashes, msgpack framing, for each release's format.

Published by the scheduler (after each prefill batch, every ``decode_log_interval`` decode batches and
when idle) when the server runs with ``--kv-events-config '{"publisher": "zmq", ...}'``. Each ZeroMQ PUB
message is ``(topic, sequence, payload)``: the topic (UTF-8, default empty), an 8-byte big-endian
sequence number from 0 per publisher, and a ``KVEventBatch`` encoded by msgspec as the array
``[ts, events, attn_dp_rank]``. What changed between releases, as read from every release's wheel
(``EventFormat``; the simulator follows them by release), 0.5.9 and 0.5.23 also checked against real
servers by the ``sglang`` test tier:

* **0.5.4** (``FORMAT_ARRAYS``): an event is an array, tag first: ``["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id]``, ``["BlockRemoved", block_hashes]``,
  ``["AllBlocksCleared"]``. One event per page; a page's hash is ``hash(tuple(page_tokens))`` (its own
  tokens: equal pages anywhere hash alike); a node's first page has no parent; a node split is a removal
  of the node's pages, then stores of both halves.
* **0.5.6**: block hashes are SHA-256 chains (:func:`chain_hashes`): a page's hash covers every token
  before it, and a node's first page names its parent's last page; a split changes no hash and, from
  0.5.7, sends nothing (0.5.6 alone sends a removal of the split node's pages, which are still resident).
* **0.5.9** (``FORMAT_ARRAYS_MEDIUM``): a trailing ``medium`` (``"GPU"``; a host copy under HiCache is
  ``"CPU_PINNED"``). **0.5.15**: a node's removed pages go in one event. **0.5.18**: a store that
  continues the previous one is merged into it (several hashes, ``block_size`` still the page size).
* **0.5.20** (``FORMAT_MAPS``): events are maps tagged by ``"type"`` with their fields by name (optional
  ones left out when None). **0.5.22**: a replay answer carries the topic as a frame of its own
  (``indexer.py``).

Decoding accepts every format in every release; an event it cannot read is a ValueError, which the
subscriber counts and logs once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

FORMAT_ARRAYS = "arrays"  # event encodings: SGLang 0.5.4-0.5.8
FORMAT_ARRAYS_MEDIUM = "arrays-medium"  # 0.5.9-0.5.19
FORMAT_MAPS = "maps"  # 0.5.20-
DEVICE_MEDIUMS = (None, "GPU")  # events of the device's KV pool; others are host copies (HiCache)


@dataclass(frozen=True)
class EventFormat:
    """How one release publishes: the encoding, and how its radix cache and publisher make the events."""

    encoding: str = FORMAT_ARRAYS
    chained: bool = False  # 0.5.6+: SHA-256 chain hashes, a first page names its parent, a split sends nothing
    merge_removes: bool = False  # 0.5.15+: a node's removed pages in one event, consecutive ones merged
    merge_stores: bool = False  # 0.5.18+: a store continuing the previous one merged into it
    replay_topic: bool = False  # 0.5.22+: replay answers carry the topic frame

    @property
    def medium(self) -> str | None:
        return None if self.encoding == FORMAT_ARRAYS else "GPU"


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None


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
    """SGLang 0.5.4's hash of one page: ``hash(tuple(page_tokens))``."""
    return hash(tuple(page_tokens))


def chain_digest(page_tokens: Sequence[int], prior: bytes | None = None) -> bytes:
    """SGLang 0.5.9+'s SHA-256 of one page: the previous page's digest, then each token as uint32 LE."""
    h = hashlib.sha256(prior or b"")
    h.update(b"".join(t.to_bytes(4, "little") for t in page_tokens))
    return h.digest()


def digest_to_int64(digest: bytes) -> int:
    """The block hash an event carries: the digest's first 8 bytes, big-endian, signed."""
    return int.from_bytes(digest[:8], "big", signed=True)


def chain_hashes(tokens: Sequence[int], page_size: int = 1, prior: bytes | None = None) -> list[int]:
    """The block hashes SGLang 0.5.9+ gives the whole pages of ``tokens`` (from the sequence's start, or
    after the page whose digest is ``prior``)."""
    out = []
    for start in range(0, len(tokens) - page_size + 1, page_size):
        prior = chain_digest(tokens[start : start + page_size], prior)
        out.append(digest_to_int64(prior))
    return out


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


def _event_array(event: KVEvent, medium: bool) -> list[Any]:
    if isinstance(event, BlockStored):
        out = ["BlockStored", event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
               event.lora_id]
        return out + [event.medium] if medium else out
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes] + ([event.medium] if medium else [])
    return ["AllBlocksCleared"]


def _event_map(event: KVEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        out: dict[str, Any] = {"type": "BlockStored", "block_hashes": event.block_hashes,
                               "parent_block_hash": event.parent_block_hash, "token_ids": event.token_ids,
                               "block_size": event.block_size, "lora_id": event.lora_id}
    elif isinstance(event, BlockRemoved):
        out = {"type": "BlockRemoved", "block_hashes": event.block_hashes}
    else:
        return {"type": "AllBlocksCleared"}
    if event.medium is not None:  # optional fields at None are left out
        out["medium"] = event.medium
    return out


def encode_batch(batch: KVEventBatch, fmt: str = FORMAT_ARRAYS) -> bytes:
    """The payload frame, byte for byte as msgspec's encoder writes a ``KVEventBatch`` in ``fmt`` (the batch
    is an array-like struct in every release: every field kept, a None rank included)."""
    import msgpack

    if fmt == FORMAT_MAPS:
        events: list[Any] = [_event_map(e) for e in batch.events]
    else:
        events = [_event_array(e, fmt == FORMAT_ARRAYS_MEDIUM) for e in batch.events]
    out: bytes = msgpack.packb([batch.ts, events, batch.attn_dp_rank], use_bin_type=True)
    return out


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise ValueError(f"{what}: expected a list of integers")
    return value


def _checked(event: KVEvent) -> KVEvent:
    """The event if every field has the type SGLang sends (a wrongly typed record must not reach the state)."""
    if isinstance(event, BlockStored):
        _ints(event.block_hashes, "block_hashes")
        _ints(event.token_ids, "token_ids")  # (EAGLE's bigram token ids are not followed)
        if not event.block_hashes:
            raise ValueError("BlockStored without block_hashes")
        if event.parent_block_hash is not None and type(event.parent_block_hash) is not int:
            raise ValueError("parent_block_hash: expected an integer or null")
        if type(event.block_size) is not int or event.block_size < 1:
            raise ValueError("block_size: expected a positive integer")
    elif isinstance(event, BlockRemoved):
        _ints(event.block_hashes, "block_hashes")
    if isinstance(event, (BlockStored, BlockRemoved)) and not (event.medium is None or isinstance(event.medium, str)):
        raise ValueError("medium: expected a string or null")
    return event


def _event(raw: Any) -> KVEvent:
    return _checked(_event_any(raw))


def _event_any(raw: Any) -> KVEvent:
    if isinstance(raw, Mapping):
        return _event_from_map(raw)
    try:
        tag = raw[0]
        if tag == "BlockStored":  # msgpack gives lists: taken as they are, not copied
            return BlockStored(raw[1], raw[2], raw[3], raw[4], raw[5] if len(raw) > 5 else None,
                               raw[6] if len(raw) > 6 else None)
        if tag == "BlockRemoved":
            return BlockRemoved(raw[1], raw[2] if len(raw) > 2 else None)
    except (IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"not a KV event: {raw!r}"[:200]) from exc
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event tag {tag!r}"[:200])


def _event_from_map(raw: Mapping[Any, Any]) -> KVEvent:
    tag = raw.get("type")
    try:
        if tag == "BlockStored":
            return BlockStored(raw["block_hashes"], raw.get("parent_block_hash"), raw["token_ids"],
                               raw["block_size"], raw.get("lora_id"), raw.get("medium"))
        if tag == "BlockRemoved":
            return BlockRemoved(raw["block_hashes"], raw.get("medium"))
    except KeyError as exc:
        raise ValueError(f"{tag} without {exc}") from None
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event type {tag!r}"[:200])


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload frame of any release's format back into a batch; ValueError for anything else."""
    import msgpack

    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes (nesting too deep included)
        raise ValueError(f"not msgpack: {exc}") from exc
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise ValueError("not a KVEventBatch")
    if type(raw[0]) not in (int, float):
        raise ValueError("not a KVEventBatch: its timestamp is not a number")
    ts = float(raw[0])
    rank = raw[2] if len(raw) > 2 else None
    return KVEventBatch(ts, [_event(e) for e in raw[1]], rank)


def sequence_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=seq < 0)


def sequence_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)
