"""Cost of one forward pass of an SGLang worker (a roofline model).

Shared by the simulated HTTP worker and the virtual-clock fleet simulator
through :mod:`agent_cache.sim.scheduler`, so both tell the same story. The
GPU runs one forward pass at a time; each pass is either a prefill batch or
a decode step of the running batch, and costs:

* a fixed part: ``overhead_s`` of scheduling and kernel launches
  (SGLang's overlap scheduler hides most CPU work, not all of it);
* **prefill**: reading the weights once, plus ``2 x params`` FLOPs per new
  token and the attention FLOPs over every earlier token of the same
  request (cached prefix included: ``4 x layers x hidden`` per pair of
  query and key token), at ``mfu`` of the GPU's dense BF16 peak;
* **decode**: reading the weights plus the batch's KV cache at
  ``bandwidth_efficiency`` of HBM bandwidth, plus the batch's FLOPs (the
  two do not overlap well in practice: published step times grow with the
  batch faster than bandwidth alone explains).

Defaults describe Llama-3.1-8B-Instruct in BF16 on one H100 SXM. Hardware
figures are NVIDIA's H100 SXM datasheet (989 TFLOPS dense BF16, 3.35 TB/s
HBM3); the model shape is Llama-3.1-8B's ``config.json`` (32 layers, 32
attention heads and 8 KV heads of dim 128, 8.03e9 parameters). The three
efficiencies are fitted to published SGLang measurements of Llama-3-8B on
one H100 (``bench_one_batch`` decode steps at batch 1 and 128, prefill of
32k tokens in one batch); ``python -m agent_cache.bench.calibration``
prints the model next to each of them (also in docs/benchmarks.md).
The constants are uncertain (see :data:`LATENCY_PROFILES`): ``fast`` and
``slow`` profiles bound them, and ``--latency-profile``, ``--mfu``,
``--bandwidth-efficiency`` and ``--per-pass-overhead-ms`` set them on the
sim worker and the benchmark.
Not captured: CUDA-graph batch buckets, tensor parallelism, speculative
decoding, mixed prefill-decode batches (off by default in SGLang).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class ModelConfig:
    """The few numbers of a model that fix its KV size and compute."""

    name: str = "meta-llama/Llama-3.1-8B-Instruct"
    params: float = 8.03e9
    num_layers: int = 32
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        """QK^T and AV for one (query, key) token pair, every layer: 2 x 2 x layers x heads x head_dim."""
        return 4 * self.num_layers * self.num_attention_heads * self.head_dim

    def kv_gb(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / 1e9


@dataclass(frozen=True)
class GPUConfig:
    name: str = "H100-SXM"
    bf16_flops: float = 989e12
    hbm_bytes_per_s: float = 3.35e12
    hbm_bytes: float = 80e9
    mfu: float = 0.70  # fitted: 32,768 prefill tokens in 0.756 s (sglang PR #5211)
    bandwidth_efficiency: float = 0.75  # fitted: decode step at batch 1, 7.35 ms (sglang PR #1401)


@dataclass(frozen=True)
class LatencyModel:
    model: ModelConfig = ModelConfig()
    gpu: GPUConfig = GPUConfig()
    overhead_s: float = 0.0009  # per forward pass: sampling, launches, CPU work the overlap scheduler leaves (fitted)

    @property
    def _flops_per_s(self) -> float:
        return self.gpu.bf16_flops * self.gpu.mfu

    @property
    def _bytes_per_s(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.gpu.bandwidth_efficiency

    def prefill_flops(self, new_tokens: int, prefix_tokens: int) -> float:
        """FLOPs to compute ``new_tokens`` after ``prefix_tokens`` of the same request already in KV."""
        n, c = max(0, new_tokens), max(0, prefix_tokens)
        pairs = n * c + n * (n + 1) / 2  # causal attention: token i attends to c + i keys
        return 2 * self.model.params * n + self.model.attention_flops_per_pair * pairs

    def prefill_batch_seconds(self, chunks: Iterable[tuple[int, int]]) -> float:
        """One prefill forward pass over ``(new_tokens, prefix_tokens)`` chunks."""
        flops = sum(self.prefill_flops(n, c) for n, c in chunks)
        return self.overhead_s + self.model.weight_bytes / self._bytes_per_s + flops / self._flops_per_s

    def prefill_seconds(self, new_tokens: int, prefix_tokens: int = 0) -> float:
        """One request prefilled alone in one pass (no chunking)."""
        return self.prefill_batch_seconds([(new_tokens, prefix_tokens)])

    def decode_step_seconds(self, batch_size: int, batch_kv_tokens: int) -> float:
        """One decode step of ``batch_size`` requests holding ``batch_kv_tokens`` of KV between them."""
        if batch_size <= 0:
            return 0.0
        memory = (self.model.weight_bytes + batch_kv_tokens * self.model.kv_bytes_per_token) / self._bytes_per_s
        compute = (2 * self.model.params * batch_size
                   + self.model.attention_flops_per_pair * batch_kv_tokens) / self._flops_per_s
        return self.overhead_s + memory + compute


DEFAULT_LATENCY = LatencyModel()

# The constants are uncertain: they are fitted to a few published batched
# figures, and no published single-request TTFT at 8k-32k tokens was found.
# "fast" and "slow" bound what is plausible on one H100 until
# ``python -m agent_cache.bench.calibrate_gpu`` has measured a GPU: "fast"
# prefills a cold 8k prompt at ~42k tokens/s (the published 32 x 1k batch
# rate), "slow" at ~24k tokens/s (a FLOP count at 45 % MFU, the low end of
# what long single prompts reach with FlashAttention).
LATENCY_PROFILES: dict[str, tuple[float, float, float]] = {
    # name: (mfu, bandwidth_efficiency, overhead_s)
    "fast": (0.80, 0.85, 0.0006),
    "default": (GPUConfig.mfu, GPUConfig.bandwidth_efficiency, LatencyModel.overhead_s),
    "slow": (0.45, 0.65, 0.002),
}


def latency_model(profile: str = "default", *, mfu: float | None = None, bandwidth_efficiency: float | None = None,
                  per_pass_overhead_ms: float | None = None) -> LatencyModel:
    """A named profile of :data:`LATENCY_PROFILES`, with any constant overridden."""
    if profile not in LATENCY_PROFILES:
        raise ValueError(f"latency profile must be one of {sorted(LATENCY_PROFILES)}, got {profile!r}")
    p_mfu, p_bw, p_overhead = LATENCY_PROFILES[profile]
    mfu = p_mfu if mfu is None else mfu
    bw = p_bw if bandwidth_efficiency is None else bandwidth_efficiency
    overhead = p_overhead if per_pass_overhead_ms is None else per_pass_overhead_ms / 1e3
    for name, value in (("mfu", mfu), ("bandwidth_efficiency", bw)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value}")
    if overhead < 0:
        raise ValueError(f"per_pass_overhead_ms must be >= 0, got {overhead * 1e3}")
    return LatencyModel(gpu=GPUConfig(mfu=mfu, bandwidth_efficiency=bw), overhead_s=overhead)
