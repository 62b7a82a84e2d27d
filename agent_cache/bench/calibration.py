"""The worker latency model next to published SGLang measurements.

``python -m agent_cache.bench.calibration`` prints one row per published
figure: what it measured, the figure, what :mod:`agent_cache.sim.latency`
gives for the same shape, and the source. The published figures are
Llama-3-8B / Llama-3.1-8B (same shapes) on one H100; where a source leaves a
condition unstated the row says so. Nothing here is measured on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_cache.sim.latency import DEFAULT_LATENCY, LatencyModel
from agent_cache.sim.scheduler import SchedulerConfig, SimRequest, WorkerModel


@dataclass(frozen=True)
class Published:
    what: str
    value: float
    unit: str
    source: str


PUBLISHED = (
    Published("decode step, batch 1, input 128", 7.35, "ms",
              "sglang PR #1401 (v0.3.1, bench_latency, flashinfer, CUDA graph)"),
    Published("decode step, batch 32, input ~512 (batch inferred)", 9.47, "ms",
              "sglang PR #5211 (v0.4.5, bench_one_batch, FA3)"),
    Published("decode step, batch 128, input 128", 11.84, "ms",
              "sglang issue #1008 (v0.2.x, bench_latency, CUDA graph)"),
    Published("prefill of 32 x 1,024 tokens in one batch", 0.756, "s",
              "sglang PR #5211 (v0.4.5, bench_one_batch, FA3)"),
    Published("median TTFT, inputs up to 4,096 (mean ~2k), 1 req/s: CI upper bound", 0.086, "s",
              "sglang test/srt/test_bench_serving.py (a pass limit, not a measurement)"),
)


def single_request_ttft(latency: LatencyModel, prompt_tokens: int) -> float:
    """TTFT of one cold request alone on a worker, chunked as SGLang's defaults chunk it."""
    model = WorkerModel(SchedulerConfig(latency=latency))
    model.submit(SimRequest(prompt=list(range(prompt_tokens)), output_len=2), 0.0)
    now = 0.0
    while True:
        it = model.next_iteration()
        assert it is not None
        now += it.seconds
        for _, event in model.finish_iteration(it, now):
            if event == "first_token":
                return now


def modelled(latency: LatencyModel) -> list[float]:
    return [
        latency.decode_step_seconds(1, 129) * 1e3,
        latency.decode_step_seconds(32, 32 * 520) * 1e3,
        latency.decode_step_seconds(128, 128 * 136) * 1e3,
        latency.prefill_batch_seconds([(1024, 0)] * 32),
        single_request_ttft(latency, 2048),
    ]


def main() -> None:
    lat = DEFAULT_LATENCY
    print(f"latency model: {lat.model.name} on {lat.gpu.name} (mfu {lat.gpu.mfu}, "
          f"bandwidth efficiency {lat.gpu.bandwidth_efficiency}, overhead {lat.overhead_s * 1e3:.1f} ms/pass)\n")
    print("| regime | published | model | source |")
    print("| --- | --- | --- | --- |")
    for p, m in zip(PUBLISHED, modelled(lat)):
        print(f"| {p.what} | {p.value:g} {p.unit} | {m:.3g} {p.unit} | {p.source} |")
    print("\nModel only (no published single-request figure found for these):\n")
    print("| regime | model |")
    print("| --- | --- |")
    for n in (1024, 8192, 32768):
        print(f"| TTFT, one cold {n:,}-token prompt alone | {single_request_ttft(lat, n) * 1e3:.0f} ms |")
    for b in (1, 64):
        step = lat.decode_step_seconds(b, b * 1024)
        print(f"| decode, batch {b}, 1k context each | {step * 1e3:.2f} ms/step, {b / step:,.0f} tok/s |")


if __name__ == "__main__":
    main()
