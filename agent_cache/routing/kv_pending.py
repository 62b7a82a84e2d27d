"""An unknown worker's latest KV event batches, kept so that a snapshot another router process took of the
worker can be brought up to date (:meth:`agent_cache.routing.kv_state.KvState.install`, kv_snapshots.py)."""

from __future__ import annotations

from collections import deque
from typing import Iterator

from agent_cache.kv_events import BlockStored, KVEventBatch

# Weighed in events plus stored tokens: 2 s of a worker storing 100,000 tokens a second at page size 1
# (decoded: 71 MB, bench/kv_cost.py), held only while the worker is unknown.
DEFAULT_MAX_PENDING_WEIGHT = 400_000


def _weight(batch: KVEventBatch) -> int:
    """What keeping a batch costs: its events, and the token ids stored ones carry."""
    return len(batch.events) + sum(len(e.token_ids) for e in batch.events if isinstance(e, BlockStored))


class PendingBatches:
    """Consecutive batches of one worker, by sequence number; the oldest dropped past a weight and
    past an age (an older snapshot is not written any more)."""

    def __init__(self) -> None:
        self._batches: deque[tuple[int, KVEventBatch]] = deque()
        self.weight = 0

    def __bool__(self) -> bool:
        return bool(self._batches)

    def __iter__(self) -> Iterator[tuple[int, KVEventBatch]]:
        return iter(self._batches)

    @property
    def last_seq(self) -> int | None:
        return self._batches[-1][0] if self._batches else None

    def keep(self, seq: int, batch: KVEventBatch, *, seconds: float, max_weight: int) -> None:
        """Add the batch numbered ``seq``; after a gap the older ones are of no use and dropped."""
        if self._batches and self._batches[-1][0] != seq - 1:
            self.clear()
        self._batches.append((seq, batch))
        self.weight += _weight(batch)
        while len(self._batches) > 1 and (self.weight > max_weight or self._batches[0][1].ts < batch.ts - seconds):
            self.weight -= _weight(self._batches.popleft()[1])

    def since(self, seq: int, ts: float) -> list[KVEventBatch] | None:
        """The batches after the one numbered ``seq`` with timestamp ``ts``; None where that one is not
        kept (older than the batches kept, or of another run of the worker)."""
        at = [b for s, b in self._batches if s == seq]
        if not at or at[0].ts != ts:
            return None
        return [b for s, b in self._batches if s > seq]

    def clear(self) -> None:
        self._batches.clear()
        self.weight = 0
