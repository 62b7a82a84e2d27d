"""``--preset production``: a KV pool sized as SGLang sizes it, pressed by concurrent long-context sessions.

Instead of shrinking the pool to make memory pressure, each worker gets the
pool SGLang would allocate for Llama-3.1-8B on one 80 GB H100 with default
flags, and the pressure comes from enough concurrent coding-agent sessions
(contexts of 20-60k tokens) to outgrow it. The report puts decode batch
sizes and queue waits next to hit rate and TTFT, so a reader sees which
resource binds: KV (evictions, retractions), the GPU's time (queue waits
with small batches) or neither.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agent_cache.sim.latency import ModelConfig

# torch.cuda.mem_get_info()'s total on an H100 SXM 80 GB (nvidia-smi: 81559MiB)
H100_80GB_MIB = 81_559
# CUDA context, cuBLAS/NCCL workspaces: what the GPU holds beyond the weights when SGLang
# measures free memory after loading them (an estimate: it varies with driver and flags)
RUNTIME_GIB = 1.0


@dataclass(frozen=True)
class KVPool:
    """SGLang's KV pool arithmetic, step by step (``server_args.py``, ``model_runner.py``)."""

    gpu_mib: int
    reserved_mib: float
    mem_fraction_static: float
    weights_gib: float
    available_gib: float
    rest_gib: float
    bytes_per_token: int
    tokens: int

    def lines(self) -> list[str]:
        total = self.gpu_mib / 1024
        return [
            f"GPU memory: {self.gpu_mib:,} MiB = {total:.2f} GiB",
            f"reserved (server_args.py): 512 + chunked_prefill_size 8192 x 1.5 + cuda_graph_max_bs 256 x 2 "
            f"+ tp 1 / 8 x 1024 = {self.reserved_mib:,.0f} MiB (at least 10,240 above 60 GiB)",
            f"mem_fraction_static = round(({self.gpu_mib:,} - {self.reserved_mib:,.0f}) / {self.gpu_mib:,}, 3) "
            f"= {self.mem_fraction_static}",
            f"free after loading the weights: {total:.2f} - {self.weights_gib:.2f} (8.03e9 x 2 bytes) "
            f"- {RUNTIME_GIB:g} (CUDA context, workspaces; estimated) = {self.available_gib:.2f} GiB",
            f"KV memory (model_runner.profile_max_num_token): {self.available_gib:.2f} - {total:.2f} x "
            f"(1 - {self.mem_fraction_static}) = {self.rest_gib:.2f} GiB",
            f"tokens: {self.rest_gib:.2f} GiB / {self.bytes_per_token:,} bytes per token (2 x 32 layers x 8 KV "
            f"heads x 128 x 2 bytes) = {self.tokens:,}",
        ]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arithmetic": self.lines()}


def sglang_kv_pool(model: ModelConfig = ModelConfig(), gpu_mib: int = H100_80GB_MIB, chunked_prefill_size: int = 8192,
                   cuda_graph_max_bs: int = 256, tp_size: int = 1, runtime_gib: float = RUNTIME_GIB) -> KVPool:
    """``max_total_num_tokens`` of one SGLang worker with default flags (no ``--mem-fraction-static``)."""
    # server_args.py _handle_gpu_memory_settings: reserve activations and CUDA graph buffers
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + tp_size / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    total_gib = gpu_mib / 1024
    weights_gib = model.weight_bytes / 2**30
    available = total_gib - weights_gib - runtime_gib
    # model_runner.py profile_max_num_token
    rest = available - total_gib * (1 - fraction)
    tokens = int(rest * (1 << 30) // model.kv_bytes_per_token)
    return KVPool(gpu_mib, reserved, fraction, weights_gib, available, rest, model.kv_bytes_per_token, tokens)


PRODUCTION_POOL = sglang_kv_pool()

# Columns of the production table: what binds, next to hit rate and TTFT
PRODUCTION_COLUMNS = (
    ("token_hit_rate", "hit rate", "{:.1%}"),
    ("ttft_p50_s", "TTFT p50 (ms)", "ms"),
    ("ttft_p99_s", "p99 (ms)", "ms"),
    ("queue_wait_p50_s", "queue wait p50 (ms)", "ms"),
    ("queue_wait_p99_s", "p99 (ms)", "ms"),
    ("decode_batch_p50", "decode batch p50", "{:d}"),
    ("decode_batch_p90", "p90", "{:d}"),
    ("decode_batch_max", "max", "{:d}"),
    ("evicted_tokens", "evicted", "{:,}"),
    ("retractions", "retractions", "{:d}"),
)
