"""What differs between SGLang 0.5.x releases, as far as a client can see.

``agent-cache sim-worker --sglang-version X`` serves release X's routes and
fields, so the client is tested against each of them. Facts read from each
release's wheel (``sglang/srt/entrypoints/http_server.py``,
``entrypoints/openai/``, ``mem_cache/radix_cache.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from agent_cache.kv.events import EventFormat

SUPPORTED_VERSIONS = tuple(f"0.5.{n}" for n in range(1, 24))
LATEST_VERSION = SUPPORTED_VERSIONS[-1]


Feature = Literal[
    "plain_info_routes", "v1_loads", "tokenize", "extra_key", "lfu_hits", "zero_cached_tokens", "retractions",
    "output_delta", "kv_chain_hashes", "kv_medium", "kv_merged_removes", "kv_merged_stores", "kv_event_maps",
    "kv_replay_topic", "finished_drops_last_token",
]

# feature -> the first and last 0.5.<minor> release that has it (None: every later one)
FEATURES: dict[Feature, tuple[int, int | None]] = {
    "plain_info_routes": (6, None),  # ``/server_info``, ``/model_info``; before 0.5.6 only the ``/get_*`` names
    "v1_loads": (8, None),  # ``/v1/loads``
    "tokenize": (4, None),  # ``/tokenize``, ``/v1/tokenize``
    # 0.5.3-0.5.10 accept ``extra_key``/``cache_salt`` but never pass them to the scheduler
    "extra_key": (11, None),
    # the plain radix cache counts hits from 0.5.10; earlier LFU evicts as LRU (0.5.1-2 have no LFU)
    "lfu_hits": (10, None),
    "zero_cached_tokens": (22, None),  # ``prompt_tokens_details: {"cached_tokens": 0}``; null before
    "retractions": (5, 10),  # ``meta_info.total_retractions``
    "output_delta": (1, 5),  # streamed ``/generate`` chunks carry only the new ``output_ids``
    # KV events (kv/events.py, read from every release's wheel)
    "kv_chain_hashes": (6, None),  # SHA-256 chain hashes, parents named, nothing sent on a split (0.5.6: a removal)
    "kv_medium": (9, None),  # a trailing ``medium``
    "kv_merged_removes": (15, None),  # a node's removed pages in one event
    "kv_merged_stores": (18, None),  # a store continuing the previous one merged into it
    "kv_event_maps": (20, None),  # events as maps tagged by ``type``
    "kv_replay_topic": (22, None),  # replay answers carry the topic frame
    # A finished request leaves its prompt and output in the tree but the last output token (whose KV is
    # never computed). Measured against real servers (tests/sglang/test_sim_differential.py): 0.5.23 drops
    # it, 0.5.9 keeps it; the releases between were not run and are taken as 0.5.9.
    "finished_drops_last_token": (23, None),
}


@dataclass(frozen=True)
class SGLangVersion:
    minor: int  # 0.5.<minor>

    @classmethod
    def parse(cls, text: str) -> "SGLangVersion":
        if text not in SUPPORTED_VERSIONS:
            raise ValueError(f"sglang_version must be one of {', '.join(SUPPORTED_VERSIONS)}, got {text!r}")
        return cls(int(text.split(".")[2]))

    def __str__(self) -> str:
        return f"0.5.{self.minor}"

    def has(self, feature: Feature) -> bool:
        """Whether this release has ``feature`` (see ``FEATURES``)."""
        first, last = FEATURES[feature]
        return first <= self.minor and (last is None or self.minor <= last)

    @property
    def kv_event_format(self) -> "EventFormat":
        """How this release publishes its KV events."""
        from agent_cache.kv.events import FORMAT_ARRAYS, FORMAT_ARRAYS_MEDIUM, FORMAT_MAPS, EventFormat

        encoding = FORMAT_MAPS if self.has("kv_event_maps") else \
            FORMAT_ARRAYS_MEDIUM if self.has("kv_medium") else FORMAT_ARRAYS
        return EventFormat(encoding, self.has("kv_chain_hashes"), self.has("kv_merged_removes"),
                           self.has("kv_merged_stores"), self.has("kv_replay_topic"))

