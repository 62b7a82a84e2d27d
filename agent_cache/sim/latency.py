"""Latency and memory model of one SGLang worker (a roofline model).

Shared by the simulated HTTP worker and the virtual-clock fleet simulator,
so both tell the same story. It is deliberately small:

* **prefill** is compute-bound: ``2 x params`` FLOPs per uncached prompt
  token at ``mfu`` of the GPU's dense BF16 peak;
* **decode** is memory-bound: every step reads the weights once plus the KV
  cache of every running request, at ``bandwidth_efficiency`` of the GPU's
  HBM bandwidth; all running requests advance one token per step
  (continuous batching);
* at most ``max_running_requests`` run at once; the rest queue.

Defaults describe Llama-3.1-8B-Instruct in BF16 on one H100 SXM. Hardware
figures are NVIDIA's H100 SXM datasheet (989 TFLOPS dense BF16, 3.35 TB/s
HBM3); model shape is Llama-3.1-8B's ``config.json`` (32 layers, 8 KV heads,
head dim 128, 8.03e9 parameters). The efficiencies (45 % MFU in prefill, 70 %
of bandwidth in decode) are our assumptions, chosen so the model gives about
27k prefill tokens/s and about 7 ms per decode step at batch 1, the order of
published SGLang single-GPU 8B figures. Not captured: chunked prefill
interleaving, CUDA-graph batch buckets, tensor parallelism, speculative
decoding, CPU overheads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """The few numbers of a model that fix its KV size and compute."""

    name: str = "meta-llama/Llama-3.1-8B-Instruct"
    params: float = 8.03e9
    num_layers: int = 32
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

    def kv_gb(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / 1e9


@dataclass(frozen=True)
class GPUConfig:
    name: str = "H100-SXM"
    bf16_flops: float = 989e12
    hbm_bytes_per_s: float = 3.35e12
    mfu: float = 0.45
    bandwidth_efficiency: float = 0.70


@dataclass(frozen=True)
class LatencyModel:
    model: ModelConfig = ModelConfig()
    gpu: GPUConfig = GPUConfig()
    max_running_requests: int = 64

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.gpu.bf16_flops * self.gpu.mfu / (2 * self.model.params)

    def prefill_seconds(self, uncached_tokens: int) -> float:
        """Time to compute the KV of ``uncached_tokens`` prompt tokens."""
        return max(0, uncached_tokens) / self.prefill_tokens_per_s

    def decode_step_seconds(self, batch_context_tokens: int) -> float:
        """One decode step of the whole batch, whose requests hold ``batch_context_tokens`` of KV."""
        bytes_read = self.model.weight_bytes + batch_context_tokens * self.model.kv_bytes_per_token
        return bytes_read / (self.gpu.hbm_bytes_per_s * self.gpu.bandwidth_efficiency)

    def decode_seconds(self, output_tokens: int, batch_context_tokens: int) -> float:
        """Time to emit ``output_tokens`` after the first, at a steady batch."""
        return max(0, output_tokens - 1) * self.decode_step_seconds(batch_context_tokens)


DEFAULT_LATENCY = LatencyModel()
