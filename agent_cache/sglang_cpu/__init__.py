"""Real SGLang on a CPU-only machine: set up a release in its own environment and start workers from it.

The reference the simulator is held to and the engine of the ``sglang`` test tier and of the benchmark's real
workers. A tiny Llama with random weights and a locally trained tokenizer (no download) stands in for a
model: outputs are noise, but RadixAttention, the scheduler, ``cached_tokens``, metrics and KV events are
SGLang's own. Nothing on a call's path imports this package; SGLang and torch live only in the environments
it creates (``agent-cache sglang-cpu setup``), never in the project's.
"""

from agent_cache.sglang_cpu.versions import ENGINE_VERSIONS, LATEST_ENGINE, EngineVersion

__all__ = ["ENGINE_VERSIONS", "LATEST_ENGINE", "EngineVersion"]
