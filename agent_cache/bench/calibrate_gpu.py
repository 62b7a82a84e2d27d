"""Fit the latency model's constants on a real accelerator.

``python -m agent_cache.bench.calibrate_gpu`` builds a Llama-3.1-8B-shaped
decoder in torch with random weights (a config and random init in BF16: no
download), times forward passes shaped as SGLang's scheduler runs them --
one cold prefill of 1k-32k tokens, batches of 1k-token prefills, decode
steps over batch size x context -- and fits the three constants of
:mod:`agent_cache.sim.latency` (``mfu``, ``bandwidth_efficiency``,
``overhead_s``) by least squares on relative error. It prints every shape
with its measured time, the fitted model's and the current model's, then
the fitted constants as the flags that use them
(``--mfu``/``--bandwidth-efficiency``/``--per-pass-overhead-ms``).

What the timed model leaves out (so its figures are a floor for SGLang's):
rotary embeddings, sampling, CUDA graphs and the paged KV layout (decode
reads one contiguous KV tensor per layer, shared by the layers to save
memory). ``--tiny`` runs a small config on CPU in seconds (the test suite
runs it); its constants describe that CPU run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agent_cache.sim.latency import DEFAULT_LATENCY, GPUConfig, LatencyModel, ModelConfig

try:
    import torch
except ImportError:  # pragma: no cover - the calibrate extra is not installed
    torch = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Shape:
    """The decoder's shape (Llama-3.1-8B's config.json by default)."""

    hidden: int = 4096
    intermediate: int = 14336
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 128256

    def params(self) -> int:
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def model_config(self, dtype_bytes: int) -> ModelConfig:
        return ModelConfig(name=f"random-init {self.layers}x{self.hidden}", params=float(self.params()),
                           num_layers=self.layers, num_attention_heads=self.heads, num_kv_heads=self.kv_heads,
                           head_dim=self.head_dim, dtype_bytes=dtype_bytes)


TINY = Shape(hidden=256, intermediate=688, layers=2, heads=4, kv_heads=2, head_dim=64, vocab=1024)


@dataclass(frozen=True)
class Sample:
    kind: str  # "prefill" | "decode"
    batch: int
    tokens: int  # prefill: new tokens per request; decode: context per request
    seconds: float

    def label(self) -> str:
        return f"{self.kind} {self.batch} x {self.tokens:,}"


@dataclass(frozen=True)
class Plan:
    shape: Shape
    prefill_lengths: tuple[int, ...]
    prefill_batches: tuple[tuple[int, int], ...]  # (requests, tokens each)
    decode: tuple[tuple[int, int], ...]  # (batch, context each)
    repeats: int


FULL = Plan(Shape(), prefill_lengths=(1024, 2048, 4096, 8192, 16384, 32768),
            prefill_batches=((4, 1024), (16, 1024), (32, 1024)),
            decode=((1, 1024), (1, 8192), (8, 4096), (32, 2048), (64, 1024), (64, 4096), (128, 1024)), repeats=5)
TINY_PLAN = Plan(TINY, prefill_lengths=(64, 256, 1024), prefill_batches=((4, 128),),
                 decode=((1, 256), (8, 256), (16, 1024)), repeats=3)


class RandomDecoder:
    """Llama's decoder layers with random weights: RMSNorm, GQA attention (SDPA), SwiGLU MLP, LM head."""

    def __init__(self, shape: Shape, device: str, dtype: Any) -> None:
        assert torch is not None
        self.shape, self.device, self.dtype = shape, device, dtype
        s = shape

        def w(*dims: int) -> Any:
            return torch.empty(*dims, device=device, dtype=dtype).normal_(std=0.02)

        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.vocab, s.hidden)
        self.layers = [dict(qkv=w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                            o=w(s.hidden, s.heads * s.head_dim), gate_up=w(2 * s.intermediate, s.hidden),
                            down=w(s.hidden, s.intermediate)) for _ in range(s.layers)]

    def _norm(self, x: Any) -> Any:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def _mlp(self, x: Any, layer: dict[str, Any]) -> Any:
        gate, up = (x @ layer["gate_up"].T).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ layer["down"].T

    def prefill(self, batch: int, length: int) -> None:
        """One prefill pass of ``batch`` cold prompts of ``length`` tokens (logits of the last token each)."""
        s = self.shape
        ids = torch.randint(0, s.vocab, (batch, length), device=self.device)
        x = self.embed[ids]
        for layer in self.layers:
            h = self._norm(x) @ layer["qkv"].T
            q, k, v = h.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
            q = q.view(batch, length, s.heads, s.head_dim).transpose(1, 2)
            k = k.view(batch, length, s.kv_heads, s.head_dim).transpose(1, 2)
            v = v.view(batch, length, s.kv_heads, s.head_dim).transpose(1, 2)
            # K/V expanded to every query head: SDPA's flash kernel then takes it (GQA flags can fall
            # back to the math kernel, whose 32k x 32k scores would not fit); the copy is small next to prefill
            group = s.heads // s.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(batch, length, -1) @ layer["o"].T
            x = x + self._mlp(self._norm(x), layer)
        _ = self._norm(x[:, -1]) @ self.lm_head.T

    def decode(self, batch: int, context: int, kv: tuple[Any, Any]) -> None:
        """One decode step of ``batch`` requests, each attending to ``context`` cached tokens."""
        s = self.shape
        x = self.embed[torch.randint(0, s.vocab, (batch, 1), device=self.device)]
        k_cache, v_cache = kv[0][:batch, :, :context], kv[1][:batch, :, :context]
        for layer in self.layers:
            h = self._norm(x) @ layer["qkv"].T
            # one query token per request: its heads grouped per KV head are queries of that KV head,
            # so attention reads each cached K/V once, as a GQA decode kernel does
            q = h[..., : s.heads * s.head_dim].reshape(batch, s.kv_heads, s.heads // s.kv_heads, s.head_dim)
            a = torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache)
            x = x + a.reshape(batch, 1, -1) @ layer["o"].T
            x = x + self._mlp(self._norm(x), layer)
        _ = self._norm(x[:, -1]) @ self.lm_head.T

    def kv_cache(self, batch: int, context: int) -> tuple[Any, Any]:
        s = self.shape
        dims = (batch, s.kv_heads, context, s.head_dim)
        return (torch.empty(dims, device=self.device, dtype=self.dtype).normal_(),
                torch.empty(dims, device=self.device, dtype=self.dtype).normal_())


def _time(fn: Callable[[], None], repeats: int, device: str) -> float:
    """Median wall time of ``fn`` after one warm-up run."""
    assert torch is not None

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if i:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(plan: Plan, device: str, dtype: Any, log: Callable[[str], None]) -> list[Sample]:
    model = RandomDecoder(plan.shape, device, dtype)
    samples = []
    for batch, length in [(1, n) for n in plan.prefill_lengths] + list(plan.prefill_batches):
        samples.append(Sample("prefill", batch, length, _time(lambda: model.prefill(batch, length), plan.repeats, device)))
        log(f"{samples[-1].label()}: {samples[-1].seconds * 1e3:.2f} ms")
    kv = model.kv_cache(max(b for b, _ in plan.decode), max(c for _, c in plan.decode))
    for batch, context in plan.decode:
        samples.append(Sample("decode", batch, context, _time(lambda: model.decode(batch, context, kv), plan.repeats, device)))
        log(f"{samples[-1].label()}: {samples[-1].seconds * 1e3:.2f} ms")
    return samples


def predict(latency: LatencyModel, s: Sample) -> float:
    if s.kind == "prefill":
        return latency.prefill_batch_seconds([(s.tokens, 0)] * s.batch)
    return latency.decode_step_seconds(s.batch, s.batch * (s.tokens + 1))


def _terms(model: ModelConfig, gpu: GPUConfig, s: Sample) -> tuple[float, float, float]:
    """The three columns the model is linear in: 1 (overhead), bytes / HBM peak, FLOPs / compute peak."""
    probe = LatencyModel(model=model, gpu=GPUConfig(bf16_flops=gpu.bf16_flops, hbm_bytes_per_s=gpu.hbm_bytes_per_s,
                                                    mfu=1.0, bandwidth_efficiency=1.0), overhead_s=0.0)
    if s.kind == "prefill":
        memory = model.weight_bytes / gpu.hbm_bytes_per_s
        return 1.0, memory, probe.prefill_batch_seconds([(s.tokens, 0)] * s.batch) - memory
    kv_tokens = s.batch * (s.tokens + 1)
    memory = (model.weight_bytes + kv_tokens * model.kv_bytes_per_token) / gpu.hbm_bytes_per_s
    return 1.0, memory, probe.decode_step_seconds(s.batch, kv_tokens) - memory


def fit(samples: Sequence[Sample], model: ModelConfig, gpu: GPUConfig) -> LatencyModel:
    """Least squares on relative error: t = overhead + memory / bandwidth_efficiency + compute / mfu."""
    assert torch is not None
    rows = [[x / s.seconds for x in _terms(model, gpu, s)] for s in samples]
    a = torch.tensor(rows, dtype=torch.float64)
    b = torch.ones(len(samples), 1, dtype=torch.float64)
    overhead, inv_bw, inv_mfu = (float(v) for v in torch.linalg.lstsq(a, b).solution.flatten())
    # a coefficient fitted to zero or below means that term explains nothing: keep it finite
    bw = 1.0 / inv_bw if inv_bw > 1e-6 else 1e6
    mfu = 1.0 / inv_mfu if inv_mfu > 1e-6 else 1e6
    return LatencyModel(model=model, gpu=GPUConfig(name=gpu.name, bf16_flops=gpu.bf16_flops,
                                                   hbm_bytes_per_s=gpu.hbm_bytes_per_s, mfu=mfu,
                                                   bandwidth_efficiency=bw), overhead_s=max(0.0, overhead))


def report(samples: Sequence[Sample], fitted: LatencyModel, current: LatencyModel) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for s in samples:
        f, c = predict(fitted, s), predict(current, s)
        rows.append({"shape": s.label(), "measured_s": s.seconds, "fitted_s": f, "fitted_residual": f / s.seconds - 1,
                     "current_s": c, "current_residual": c / s.seconds - 1})
    return {"gpu": fitted.gpu.name, "model": fitted.model.name,
            "fitted": {"mfu": fitted.gpu.mfu, "bandwidth_efficiency": fitted.gpu.bandwidth_efficiency,
                       "per_pass_overhead_ms": fitted.overhead_s * 1e3},
            "current": {"mfu": current.gpu.mfu, "bandwidth_efficiency": current.gpu.bandwidth_efficiency,
                        "per_pass_overhead_ms": current.overhead_s * 1e3},
            "rows": rows}


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"Calibration on {doc['gpu']} ({doc['model']}, random weights)", "",
             "| shape | measured (ms) | fitted (ms) | residual | current (ms) | residual |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in doc["rows"]:
        lines.append(f"| {r['shape']} | {r['measured_s'] * 1e3:.2f} | {r['fitted_s'] * 1e3:.2f} | "
                     f"{r['fitted_residual']:+.1%} | {r['current_s'] * 1e3:.2f} | {r['current_residual']:+.1%} |")
    f, c = doc["fitted"], doc["current"]
    lines += ["", f"fitted:  --mfu {f['mfu']:.3f} --bandwidth-efficiency {f['bandwidth_efficiency']:.3f} "
                  f"--per-pass-overhead-ms {f['per_pass_overhead_ms']:.3f}",
              f"current: --mfu {c['mfu']:.3f} --bandwidth-efficiency {c['bandwidth_efficiency']:.3f} "
              f"--per-pass-overhead-ms {c['per_pass_overhead_ms']:.3f}"]
    return "\n".join(lines) + "\n"


def _gpu(device: str, args: argparse.Namespace) -> GPUConfig:
    """Peak figures of the device: the flags, else the datasheet of a known GPU."""
    assert torch is not None
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    known = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12)}
    flops, hbm = next((v for k, v in known.items() if k in name), (None, None))
    flops, hbm = args.peak_flops or flops, args.peak_bytes_per_s or hbm
    if flops is None or hbm is None:
        raise SystemExit(f"calibrate_gpu: unknown device {name!r}: give --peak-flops and --peak-bytes-per-s")
    return GPUConfig(name=name, bf16_flops=flops, hbm_bytes_per_s=hbm)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_cache.bench.calibrate_gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="a small config on CPU in float32 (seconds; for tests)")
    p.add_argument("--device", help="torch device (default: cuda if available; cpu with --tiny)")
    p.add_argument("--peak-flops", type=float, help="the device's dense peak FLOP/s (default: datasheet of H100/H200/A100)")
    p.add_argument("--peak-bytes-per-s", type=float, help="the device's memory bandwidth (default: datasheet)")
    p.add_argument("--json", metavar="PATH", help="also write the table and constants as JSON")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if torch is None:
        print("calibrate_gpu: needs torch (pip install 'agent-cache[calibrate]')", file=sys.stderr)
        return 2
    if args.tiny:
        device, dtype, plan = args.device or "cpu", torch.float32, TINY_PLAN
        args.peak_flops = args.peak_flops or 1e12  # nominal: only the fit's plumbing is checked on CPU
        args.peak_bytes_per_s = args.peak_bytes_per_s or 1e11
    else:
        device = args.device or ("cuda" if torch.cuda.is_available() else "")
        if not device:
            print("calibrate_gpu: no GPU here (use --tiny for a CPU check of the script)", file=sys.stderr)
            return 2
        dtype, plan = torch.bfloat16, FULL
    gpu = _gpu(device, args)
    model = plan.shape.model_config(4 if dtype == torch.float32 else 2)
    log: Callable[[str], None] = (lambda m: None) if args.quiet else (
        lambda m: print(f"[calibrate] {m}", file=sys.stderr, flush=True))
    samples = measure(plan, device, dtype, log)
    current = LatencyModel(model=model, gpu=GPUConfig(name=gpu.name, bf16_flops=gpu.bf16_flops,
                                                      hbm_bytes_per_s=gpu.hbm_bytes_per_s, mfu=DEFAULT_LATENCY.gpu.mfu,
                                                      bandwidth_efficiency=DEFAULT_LATENCY.gpu.bandwidth_efficiency),
                           overhead_s=DEFAULT_LATENCY.overhead_s)
    doc = report(samples, fit(samples, model, gpu), current)
    print(markdown(doc), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
