"""Benchmarks: workloads, trace replay, fleet simulation, policy comparison."""
