"""``python -m agent_cache.bench.kv_cost``: what following a worker's KV events costs a router.

Builds 200,000 single-token pages (SGLang's page size 1) in a radix cache
with events on, in the newest release's format (stores that continue each
other merged into one event), then times decoding the
published payload (:func:`agent_cache.kv.events.decode_batch`) and applying
it (:meth:`agent_cache.kv.KvView.apply`, as the subscriber does); then what the state
keeps of them, in bytes a resident token (``tracemalloc``, the payload decoded
again and applied while tracing, as the subscriber feeds it).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc

from agent_cache.kv.events import KVEventBatch, decode_batch, encode_batch
from agent_cache.kv import KvView
from agent_cache.sim.radix import RadixCache
from agent_cache.sim.versions import LATEST_VERSION, SGLangVersion


def measure(tokens: int = 200_000, node: int = 2_000, seed: int = 0) -> dict[str, float]:
    """Microseconds per event to decode and per stored token to index."""
    rng = random.Random(seed)
    ids = [rng.randrange(100_000) for _ in range(tokens)]
    fmt = SGLangVersion.parse(LATEST_VERSION).kv_event_format  # the newest release's events
    cache = RadixCache(10 * tokens, enable_kv_events=True, kv_format=fmt)
    for end in range(node, tokens + 1, node):
        cache.insert(ids[:end])
    events = cache.take_events()
    payload = encode_batch(KVEventBatch(0.0, events), fmt.encoding)
    t0 = time.perf_counter()
    batch = decode_batch(payload)
    t1 = time.perf_counter()
    KvView().apply("worker", 0, batch)
    t2 = time.perf_counter()
    n_events = len(events)
    del batch, events, cache
    gc.collect()
    tracemalloc.start()
    try:
        view = KvView()
        view.apply("worker", 0, decode_batch(payload))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return {"events": float(n_events), "decode_us_per_event": (t1 - t0) / n_events * 1e6,
            "decode_us_per_token": (t1 - t0) / tokens * 1e6,
            "index_us_per_token": (t2 - t1) / tokens * 1e6, "payload_bytes_per_event": len(payload) / n_events,
            "state_bytes_per_token": kept / max(1, view.state.cached_tokens("worker") or 0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_cache.bench.kv_cost", description=__doc__)
    p.add_argument("--tokens", type=int, default=200_000)
    args = p.parse_args(argv)
    m = measure(args.tokens)
    per_s = 1e6 / (m["decode_us_per_token"] + m["index_us_per_token"])
    print(f"{args.tokens:,} stored tokens in {int(m['events']):,} events: decode {m['decode_us_per_token']:.2f} "
          f"us/token, index {m['index_us_per_token']:.2f} us/token, {m['payload_bytes_per_event']:.0f} bytes/event; "
          f"one thread follows about {per_s:,.0f} stored tokens/s at page size 1; the state keeps "
          f"{m['state_bytes_per_token']:.1f} bytes a resident token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
