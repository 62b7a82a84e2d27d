"""Every routing policy the benchmark compares, each defined once: its name, the engines that run it, what
it is (``--help`` and docs/benchmarks.md say it), and how it is built.

* The sim engine builds a policy from its class of :mod:`agent_cache.bench.policies` (:func:`make_policies`).
* The real engine sends a call by the policy's ``path`` (:func:`agent_cache.bench.realload.call_path`):
  ``client`` (that same class, one state per router replica), ``agent-cache`` (``ChatSGLang`` over a
  ``Router`` on Redis, templates ``templates``), ``gateway`` (``agent-cache serve``, following the workers'
  KV events when ``kv_events``) or ``smg`` (the smg binary, ``--policy smg_policy`` plus ``smg_tuning``).

Everything else (the flags' checks and help, the presets' defaults, the sweeps, the real engine's processes)
reads from :data:`REGISTRY`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Sequence

from agent_cache.bench.policies import (
    AgentCache,
    AgentCacheKv,
    AgentCacheNoTemplates,
    AgentCacheRenamed,
    ConsistentHash,
    LeastLoad,
    NoCache,
    Oracle,
    RandomChoice,
    RoundRobin,
    RoutingPolicy,
)
from agent_cache.errors import ConfigError
from agent_cache.placement.rule import Policy

SIM, REAL = "sim", "real"
PRODUCT = "agent-cache"


@dataclass(frozen=True)
class PolicySpec:
    """One policy: ``sim`` its class (sim engine, and the real engine's ``client`` path); ``path`` how the
    real engine sends its calls (None: the sim engine only); ``sweep``: in the sim engine's sweeps."""

    name: str
    description: str
    sim: type[RoutingPolicy] | None = None
    path: str | None = None  # client | agent-cache | gateway | smg
    sweep: bool = False
    templates: str = "templatize"  # path agent-cache: the Templater mode
    kv_events: bool = False  # path gateway: the gateway follows the workers' KV events
    smg_policy: str = ""  # path smg: smg's --policy
    smg_tuning: tuple[str, ...] = ()  # path smg: flags beyond smg's defaults

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(e for e, runs in ((SIM, self.sim is not None), (REAL, self.path is not None)) if runs)

    @property
    def bound(self) -> bool:
        """A bound, not a router: it changes the workers' cache, which only the simulator can."""
        return self.sim is not None and self.sim.cache != "radix"

    def smg_flags(self) -> list[str]:
        """The flags that make this ``smg`` policy differ from smg's defaults."""
        return smg_flags(self.smg_policy, self.smg_tuning)


# consistent_hashing reads the routing key from the headers named by --routing-key-headers
# (smg's documented default, given explicitly); the load sends the session id in it.
ROUTING_KEY_HEADER = "x-smg-routing-key"


def smg_flags(policy: str, tuning: Sequence[str] = ()) -> list[str]:
    """``smg launch``'s flags for smg's ``policy`` with ``tuning``; everything else is smg's default."""
    flags = ["--policy", policy, *tuning]
    if policy == "consistent_hashing":
        flags += ["--routing-key-headers", ROUTING_KEY_HEADER]
    return flags


def _smg(policy: str, description: str, tuning: tuple[str, ...] = ()) -> PolicySpec:
    return PolicySpec("smg-" + policy if not tuning else f"smg-{policy}-conversational", description, path="smg",
                      smg_policy=policy, smg_tuning=tuning)


REGISTRY: dict[str, PolicySpec] = {p.name: p for p in (
    PolicySpec("round-robin", "each replica's own counter", RoundRobin, "client", sweep=True),
    PolicySpec("random", "a uniform choice", RandomChoice, "client"),
    PolicySpec("least-load", "fewest in-flight calls, as each replica counts them", LeastLoad, "client", sweep=True),
    PolicySpec("consistent-hash", "session id on a hash ring: sticky, template-blind", ConsistentHash, "client",
               sweep=True),
    PolicySpec(PRODUCT, "the placement rule over the shared store, prompts templated; real runs call ChatSGLang",
               AgentCache, "agent-cache", sweep=True),
    PolicySpec("agent-cache-kv", "agent-cache fed the workers' KV events", AgentCacheKv),
    PolicySpec("agent-cache-renamed", "agent-cache with its workers named otherwise: its distance from "
               "agent-cache is chance", AgentCacheRenamed),
    PolicySpec("agent-cache-no-templates", "the same rule, prompts sent raw", AgentCacheNoTemplates, "agent-cache",
               sweep=True, templates="off"),
    PolicySpec("oracle", "true least load over one infinite shared cache (upper bound)", Oracle, sweep=True),
    PolicySpec("no-cache", "prefix caching off on every worker (floor)", NoCache, sweep=True),
    PolicySpec("agent-cache-gateway", "agent-cache serve --templates templatize: the same rule behind HTTP",
               path="gateway"),
    PolicySpec("agent-cache-gateway-kv", "the gateway following the workers' KV events", path="gateway",
               kv_events=True),
    _smg("cache_aware", "the smg binary, its cache_aware policy"),
    _smg("consistent_hashing", "smg, consistent_hashing on the session id (x-smg-routing-key)"),
    _smg("prefix_hash", "smg, prefix_hash"),
    _smg("power_of_two", "smg, power_of_two"),
    # smg's documented tuning, beyond its defaults: a low cache threshold (0.1-0.2) is its recommendation
    # for conversational workloads (docs: cache-aware routing, tuning guidelines), i.e. for agents that
    # resend their history every step
    _smg("cache_aware", "smg cache_aware with --cache-threshold 0.1, smg's tuning for conversations",
         ("--cache-threshold", "0.1")),
)}


def names(engine: str) -> tuple[str, ...]:
    """The policies ``engine`` runs, in the registry's order."""
    return tuple(n for n, p in REGISTRY.items() if engine in p.engines)


SIM_POLICIES = names(SIM)
REAL_POLICIES = names(REAL)
SWEEP_POLICIES = tuple(n for n, p in REGISTRY.items() if p.sweep)
BOUNDS = tuple(n for n, p in REGISTRY.items() if p.bound)  # the simulator's bounds (oracle, no-cache)
SMG_POLICIES = tuple(n for n, p in REGISTRY.items() if p.path == "smg")


def check_names(given: str, engine: str) -> tuple[str, ...]:
    """``--policies`` for ``engine``: each name known and run by it, else a ConfigError naming the flag."""
    out = tuple(n.strip() for n in given.split(","))
    runs = names(engine)
    for name in out:
        if name in runs:
            continue
        spec = REGISTRY.get(name)
        if spec is None:
            raise ConfigError("--policies", f"unknown {name}; the {engine} engine runs: {', '.join(runs)}")
        other = spec.engines[0]
        raise ConfigError("--policies", f"{name} exists only in the {other} engine (--engine {other}); "
                                        f"the {engine} engine runs: {', '.join(runs)}")
    return out


def help_text(width: int = 79) -> str:
    """Every policy, the engines that run it and what it is, one a paragraph (``agent-cache bench --help``)."""
    return "policies (the engines that run them):\n" + "\n".join(
        textwrap.fill(f"{n} ({', '.join(p.engines)}): {p.description}", width, initial_indent="  ",
                      subsequent_indent="    ", break_on_hyphens=False) for n, p in REGISTRY.items())


def make_policies(policy_names: Sequence[str], workers: int, replicas: int, seed: int, *, capacity: int = 400_000,
                  redis_url: str | None = None, placement: Policy | None = None) -> list[RoutingPolicy]:
    """Fresh sim-engine policies; agent-cache's routers learn ``capacity`` per worker (as from ``/server_info``).

    ``placement``: agent-cache's placement tunables (default: ``Policy()``).
    """
    out: list[RoutingPolicy] = []
    for n in policy_names:
        cls = REGISTRY[n].sim
        assert cls is not None, f"{n} does not run in the sim engine"
        if issubclass(cls, AgentCache):
            policy: RoutingPolicy = cls(workers, replicas, seed, capacity=capacity, redis_url=redis_url,
                                        policy=placement)
        else:
            policy = cls(workers, replicas, seed)
        policy.name = n
        out.append(policy)
    return out
