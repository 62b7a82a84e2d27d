"""A simulated SGLang worker for tests, demos and benchmarks.

It is a simulator, not SGLang: same HTTP endpoints and JSON shapes as SGLang
0.5.x, a real radix prefix cache over token ids, and a roofline latency
model (:mod:`agent_cache.sim.latency`), but no model: outputs are
deterministic text, tool calls or JSON (:mod:`agent_cache.sim.outputs`).
"""

from agent_cache.sim.engine import Engine, WorkerOptions
from agent_cache.sim.fleet import SimFleet, SimWorkerThread, ThreadedServer
from agent_cache.sim.latency import DEFAULT_LATENCY, GPUConfig, LatencyModel, ModelConfig
from agent_cache.sim.radix import RadixCache
from agent_cache.sim.server import SimServer, create_app

__all__ = [
    "DEFAULT_LATENCY",
    "Engine",
    "GPUConfig",
    "LatencyModel",
    "ModelConfig",
    "RadixCache",
    "SimFleet",
    "SimServer",
    "SimWorkerThread",
    "ThreadedServer",
    "WorkerOptions",
    "create_app",
]
