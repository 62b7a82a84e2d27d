"""The SGLang releases the CPU harness can set up, and what each one needs beside its wheel."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineVersion:
    """One SGLang release: the torch pair its CPU path runs on and the CUDA kernel wheel it imports."""

    sglang: str
    torch: str
    torchvision: str
    kernel: str  # the kernel wheel SGLang imports even on CPU (CUDA build; loads beside the stub libcuda)
    extra: tuple[str, ...] = ()  # imported by SGLang but not declared by its wheel


ENGINE_VERSIONS: dict[str, EngineVersion] = {
    "0.5.23": EngineVersion("0.5.23", "2.14.1", "0.29.1", "sglang-kernel==0.4.10", ("msgpack", "dill")),
    "0.5.9": EngineVersion("0.5.9", "2.9.1", "0.24.1", "sgl-kernel==0.3.21", ("msgpack", "dill")),
}
LATEST_ENGINE = "0.5.23"

# Declared dependencies that only serve GPUs (CUDA kernels, NVIDIA libraries) or media, left out on CPU.
# Matched as name prefixes of the normalised distribution name.
GPU_ONLY_PREFIXES = (
    "flashinfer", "nvidia-", "cuda-", "sgl-deep", "sgl-flash", "flash-attn", "humming-kernels", "quack-kernels",
    "tilelang", "nvshmem", "torch-memory-saver", "deepseek-recipe", "kernels", "tml-renderers", "decord",
    "torchaudio", "torchcodec", "torchao", "torch", "torchvision", "sgl-kernel", "sglang-kernel", "av",
)
