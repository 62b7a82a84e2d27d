"""Import layering: light imports stay light, pure code stays pure, product code does not import the benchmark."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agent_cache"
HEAVY = ("langchain_core", "langchain", "langgraph", "redis", "httpx", "starlette", "uvicorn", "matplotlib")


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _imports(path: Path) -> set[str]:
    """Every module a file imports (at any depth: lazy imports inside functions count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_import_agent_cache_and_the_placement_rule_load_nothing_heavy() -> None:
    assert _loaded_after("import agent_cache, agent_cache.placement") == set()
    assert _loaded_after("from agent_cache import ConfigError") == {"langchain_core"}


def test_the_chat_model_loads_neither_langgraph_nor_redis_nor_servers_nor_plotting() -> None:
    loaded = _loaded_after("from agent_cache import ChatSGLang")
    assert "langchain_core" in loaded and not loaded & {"langgraph", "redis", "starlette", "uvicorn", "matplotlib"}


def test_lazy_names_resolve_and_unknown_ones_raise() -> None:
    import agent_cache
    import agent_cache.store

    assert agent_cache.ChatSGLang.__module__ == "agent_cache.langchain.chat_model"
    assert agent_cache.store.RedisStore.__module__ == "agent_cache.store.redis_store"
    try:
        agent_cache.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_placement_imports_only_the_standard_library_and_itself() -> None:
    for path in (PACKAGE / "placement").glob("*.py"):
        for module in _imports(path):
            assert module.startswith(("agent_cache.placement", "__future__", "dataclasses", "hashlib", "typing")), (
                path.name, module)


def test_store_does_not_import_routing_and_product_code_does_not_import_the_benchmark() -> None:
    for path in (PACKAGE / "store").glob("*.py"):
        assert not any(m.startswith("agent_cache.routing") for m in _imports(path)), path.name
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("bench/") or rel == "cli.py":  # the CLI's `bench` command hands over to the benchmark
            continue
        assert not any(m.startswith("agent_cache.bench") for m in _imports(path)), rel
