"""What differs between SGLang 0.5.x releases, as far as a client can see.

``agent-cache sim-worker --sglang-version X`` serves release X's routes and
fields, so the client is tested against each of them. Facts read from each
release's wheel (``sglang/srt/entrypoints/http_server.py``,
``entrypoints/openai/``, ``mem_cache/radix_cache.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_VERSIONS = tuple(f"0.5.{n}" for n in range(1, 24))
LATEST_VERSION = SUPPORTED_VERSIONS[-1]


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

    @property
    def has_plain_info_routes(self) -> bool:
        """``/server_info`` and ``/model_info``; before 0.5.6 only the ``/get_*`` names."""
        return self.minor >= 6

    @property
    def has_v1_loads(self) -> bool:
        return self.minor >= 8

    @property
    def has_tokenize(self) -> bool:
        return self.minor >= 4

    @property
    def honours_extra_key(self) -> bool:
        """0.5.3-0.5.10 accept ``extra_key``/``cache_salt`` but never pass them to the scheduler."""
        return self.minor >= 11

    @property
    def lfu_counts_hits(self) -> bool:
        """The plain radix cache counts hits from 0.5.10; earlier LFU evicts as LRU (0.5.1-2 have no LFU)."""
        return self.minor >= 10

    @property
    def reports_zero_cached_tokens(self) -> bool:
        """``prompt_tokens_details: {"cached_tokens": 0}`` from 0.5.22; null before."""
        return self.minor >= 22

    @property
    def reports_retractions(self) -> bool:
        """``meta_info.total_retractions`` in 0.5.5-0.5.10."""
        return 5 <= self.minor <= 10

    @property
    def streams_output_delta(self) -> bool:
        """Streamed ``/generate`` chunks carry only new ``output_ids`` before 0.5.6."""
        return self.minor < 6
