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


# --- import circles ----------------------------------------------------------------------------------------
#
# Every import counts, at any depth: module level, lazy ones inside functions and those under TYPE_CHECKING
# (a circle that only a type checker or a late call walks is still two modules that cannot be read, moved or
# tested apart). An import of a submodule through its package (`from agent_cache.store import keys`) counts
# as an import of the submodule: Python loads a module's packages before it anyway, so that edge is there for
# every module and is not counted; a name taken from a package's `__init__` counts as an import of the package.

# Circles allowed for now, each only while a change that removes it is under way, with that reason.
ALLOWED_CIRCLES: set[frozenset[str]] = set()  # none: a circle found here is a layering mistake to fix


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """agent_cache module -> the agent_cache modules it imports (see above for what counts)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
                targets |= subs or {base}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import each other (directly or through others), as one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle_through(graph, g) for g in groups]


def _circle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself inside the group, to name in a failure."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"{sorted(group)} is not a circle")


def test_the_circle_finder_names_a_circle_and_its_import_rules_hold() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    real = _import_graph()
    assert "agent_cache.routing.router" in real["agent_cache.routing"]  # a name from a package's __init__
    assert "agent_cache.store.keys" in real["agent_cache.store.redis_store"]  # a submodule through its package
    assert "agent_cache.store" not in real["agent_cache.store.redis_store"]
    assert "agent_cache.store.redis_store" in real["agent_cache.routing.router"]  # a lazy import in a function


def test_no_import_circles_among_agent_cache_modules() -> None:
    circles = [c for c in _circles(_import_graph()) if frozenset(c) not in ALLOWED_CIRCLES]
    assert circles == [], "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_kv_package_is_reached_through_its_construction_point_and_its_wire_format_only() -> None:
    """``agent_cache/kv/`` (the KV event path, optional) is reached from outside through the package itself (its
    construction point, ``KvView``) and ``kv.events`` (SGLang's wire format, which the simulator publishes);
    the router and the call pipeline import none of it (they know only ``routing.cache_view.CacheView``), and
    it imports nothing above it (the router, the doors, the call pipeline, the benchmark, the simulator)."""
    public = {"agent_cache.kv", "agent_cache.kv.events"}
    above = ("agent_cache.routing.router", "agent_cache.routing.lifecycle", "agent_cache.calls", "agent_cache.gateway",
             "agent_cache.langchain", "agent_cache.bench", "agent_cache.sim", "agent_cache.cli")
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        imported = _imports(path)
        if rel.startswith("kv/"):
            assert not any(m.startswith(above) for m in imported), (rel, sorted(m for m in imported if m.startswith(above)))
            continue
        kv = {m for m in imported if m == "agent_cache.kv" or m.startswith("agent_cache.kv.")}
        assert kv <= public, (rel, sorted(kv - public))
        if rel.startswith(("routing/", "calls/", "placement/", "store/", "templates/", "backends/")):
            assert not kv, (rel, sorted(kv))


def test_agent_cache_and_its_kv_package_import_without_the_kv_extra() -> None:
    """pyzmq and msgpack are the ``kv`` extra: without them everything imports, a view is made and given to a
    router, and only subscribing says what is missing, naming the option."""
    probe = """
import sys
sys.modules["zmq"] = sys.modules["msgpack"] = None  # not installed
import agent_cache, agent_cache.kv, agent_cache.kv.events, agent_cache.sim, agent_cache.gateway
from agent_cache.errors import ConfigError
from agent_cache.kv import KvView, parse_sources
from agent_cache.routing import Router
view = KvView(parse_sources("http://w0:30000=tcp://w0:5557"))
router = Router(["http://w0:30000"], probe_interval=None, kv_events=view)
try:
    view.start()
except ConfigError as exc:
    print(exc.field, "agent-cache[kv]" in str(exc))
router.close()
view.close()
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["kv_events", "True"], out.stderr[-2000:]


def test_nothing_on_a_calls_path_imports_the_sglang_harness() -> None:
    """The real-SGLang harness serves tests and the benchmark; the product never needs it."""
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("sglang_cpu/", "bench/")) or rel == "cli.py":
            continue
        assert not any(m.startswith("agent_cache.sglang_cpu") for m in _imports(path)), rel


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between the package's first-level rooms (``agent_cache.routing``, ``agent_cache.errors``)."""

    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, set[str]] = {room(m): set() for m in graph}
    for module, targets in graph.items():
        rooms[room(module)] |= {room(t) for t in targets} - {room(module)}
    return rooms


def test_no_import_circles_among_agent_cache_packages() -> None:
    """A room imports another only if that one does not import it back, through any module of either."""
    circles = _circles(_package_graph(_import_graph()))
    assert circles == [], "package import circles: " + "; ".join(" -> ".join(c) for c in circles)
