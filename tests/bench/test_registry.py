"""The one policy registry: every policy defined once, and what reads it agrees with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_cache.bench.registry import (
    BOUNDS,
    REAL,
    REAL_POLICIES,
    REGISTRY,
    SIM,
    SIM_POLICIES,
    check_names,
    make_policies,
)
from agent_cache.bench.runner import build_parser
from agent_cache.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def test_every_policy_runs_somewhere_and_is_built_under_its_own_name() -> None:
    for name, spec in REGISTRY.items():
        assert spec.engines and spec.description, name
        assert spec.path in (None, "client", "agent-cache", "gateway", "smg"), name
        if spec.path == "client":  # the real engine's client-side baselines are the sim engine's classes
            assert spec.sim is not None, name
    assert [p.name for p in make_policies(SIM_POLICIES, 2, 1, 0)] == list(SIM_POLICIES)
    assert BOUNDS == ("oracle", "no-cache")


def test_help_and_docs_name_every_policy() -> None:
    text = " ".join(build_parser().format_help().split())
    docs = DOCS.read_text()
    for name, spec in REGISTRY.items():
        assert f"{name} ({', '.join(spec.engines)})" in text, name
        assert name in docs or (name.startswith("smg-") and "`smg-*`" in docs), name


@pytest.mark.parametrize(("given", "engine", "says"), [
    ("round-robin,psychic", SIM, "unknown psychic"),
    ("oracle", REAL, "oracle exists only in the sim engine"),
    ("smg-prefix_hash", SIM, "smg-prefix_hash exists only in the real engine"),
])
def test_a_policy_an_engine_does_not_run_is_refused_naming_the_flag(given: str, engine: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_names(given, engine)
    assert err.value.field == "--policies" and says in str(err.value)
    assert check_names(",".join(REAL_POLICIES), REAL) == REAL_POLICIES
