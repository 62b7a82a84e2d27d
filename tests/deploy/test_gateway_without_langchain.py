"""The gateway image installs agent-cache with --no-deps beside the distributions of
deploy/docker/gateway-requirements.txt alone, without the LangChain stack: `agent-cache serve` must
import, start and serve calls with every other installed distribution refused."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import httpx

from agent_cache.processes import Processes, wait_until
from agent_cache.sim import SimFleet
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
LANGCHAIN_STACK = {"langchain", "langchain_core", "langgraph", "langsmith"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _refused_modules() -> set[str]:
    """Top-level modules that only distributions outside the image provide."""
    text = (ROOT / "deploy" / "docker" / "gateway-requirements.txt").read_text()
    allowed = {_canonical(m) for m in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", text, re.MULTILINE)}
    allowed.add("agent-cache")
    return {module for module, dists in packages_distributions().items()
            if module != "agent_cache" and not {_canonical(d) for d in dists} & allowed}


def _refusing(refused: set[str]) -> str:
    """Code for a finder ahead of every other that refuses ``refused``, as if they were not installed."""
    return f"""
import importlib.abc, sys
REFUSED = {sorted(refused)!r}
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Refuse())
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _refusing(_refused_modules()) + code, *args],
                          capture_output=True, text=True, timeout=120)


def test_the_image_leaves_the_langchain_stack_out_and_the_refusal_works():
    refused = _refused_modules()
    assert LANGCHAIN_STACK <= refused
    out = _run("import agent_cache.langchain")
    assert out.returncode != 0 and "No module named 'langchain" in out.stderr


def test_the_gateway_and_the_error_tree_import_with_the_image_distributions_alone():
    out = _run("import agent_cache.gateway, agent_cache.telemetry.otel, agent_cache.errors as e;"
               "assert issubclass(e.WorkerConnectionError, e.BackendError);"
               "assert e.WorkerConnectionError('x', url='u').is_retryable")
    assert out.returncode == 0, out.stderr
    help_text = _run("from agent_cache.cli import main; sys.exit(main())", "serve", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--workers-dns" in help_text.stdout


def test_serve_answers_whole_and_streamed_calls_with_the_image_distributions_alone():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = _refusing(_refused_modules()) + "from agent_cache.cli import main; sys.exit(main())"
    with SimFleet(1) as fleet, Processes() as procs:
        proc = procs.start("serve", [sys.executable, "-c", serve, "serve", "--port", str(port),
                                     "--workers", fleet.urls[0]])
        wait_until(lambda: httpx.get(url + "/ready", timeout=2.0).status_code == 200, [proc], "GET /ready",
                   timeout=60.0)
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        whole = httpx.post(url + "/v1/chat/completions", json=body, timeout=30.0)
        assert whole.status_code == 200, whole.text
        assert whole.json()["choices"][0]["message"]["role"] == "assistant"
        streamed = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30.0)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text
        proc.check()  # still serving: nothing it needed later was refused
