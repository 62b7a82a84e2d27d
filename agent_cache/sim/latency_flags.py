"""Command-line flags for the latency model's uncertain constants (sim-worker and bench)."""

from __future__ import annotations

import argparse

from agent_cache.sim.latency import LATENCY_PROFILES, LatencyModel, latency_model


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def non_negative(text: str) -> float:
    """An argparse type: a number >= 0."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_latency_args(p: argparse.ArgumentParser) -> None:
    """``--latency-profile``, ``--mfu``, ``--bandwidth-efficiency``, ``--per-pass-overhead-ms``."""
    names = ", ".join(f"{k} (mfu {m:g}, bandwidth {b:g}, {o * 1e3:g} ms/pass)" for k, (m, b, o) in LATENCY_PROFILES.items())
    p.add_argument("--latency-profile", choices=sorted(LATENCY_PROFILES), default="default",
                   help=f"the modelled GPU's speed, uncertain until measured on a GPU: {names}")
    p.add_argument("--mfu", type=_fraction, help="prefill: fraction of the GPU's BF16 peak reached (overrides the profile)")
    p.add_argument("--bandwidth-efficiency", type=_fraction,
                   help="decode: fraction of HBM bandwidth reached (overrides the profile)")
    p.add_argument("--per-pass-overhead-ms", type=non_negative,
                   help="fixed cost of every forward pass in ms (overrides the profile)")


def latency_from_args(args: argparse.Namespace) -> LatencyModel:
    return latency_model(args.latency_profile, mfu=args.mfu, bandwidth_efficiency=args.bandwidth_efficiency,
                         per_pass_overhead_ms=args.per_pass_overhead_ms)
