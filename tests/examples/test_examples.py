"""The examples run, print what they claim, and their notebooks mirror them.

Each script ends with a ``SUMMARY {json}`` line; the checks below read it.
The scripts run as subprocesses and the notebooks execute with nbclient,
all six at once to stay fast; each notebook runs from a temporary copy, so
the committed notebook and its outputs are never rewritten.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # it executes the example notebooks and scripts end to end

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["react_agent", "reflexion_agent", "multi_worker_routing", "openai_gateway"]


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", EXAMPLES / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1, f"expected one SUMMARY line in:\n{text[-2000:]}"
    return json.loads(lines[0][len("SUMMARY "):])


def check_react_agent(s: dict) -> None:
    assert s["steps"] == 6  # three turns, each a tool call then an answer
    assert len(s["workers"]) == 1  # the whole thread on one worker
    assert s["routing"][0].startswith("placed_") and set(s["routing"][1:]) == {"pinned"}
    cached, inputs = s["cache_read"], s["input_tokens"]
    assert cached[0] == 0
    assert all(a < b for a, b in zip(cached, cached[1:])), cached  # every step reads more from the cache
    assert all(c < i for c, i in zip(cached, inputs))
    assert s["hit_rate"] > 0.6


def check_reflexion_agent(s: dict) -> None:
    assert s["verdicts"] == ["FAIL", "FAIL", "PASS"]
    assert s["trials"] == 3 and s["calls"] == 8  # 3 actor + 3 evaluator + 2 reflection calls
    assert len(s["sessions"]) == 1 and len(s["workers"]) == 1  # one session, one pin
    assert s["routing"][0].startswith("placed_") and set(s["routing"][1:]) == {"pinned"}
    rates = s["hit_rate_per_trial"]
    assert rates[0] < 0.2 < 0.5 < rates[1] < rates[2], rates


def check_multi_worker_routing(s: dict) -> None:
    assert len(s["sessions"]) == 6
    assert s["workers_used"] == 3  # spread over the whole fleet
    moved = s["moved"]
    assert moved["routing"] == ["moved:unhealthy", "pinned"]
    assert moved["workers"][0] == moved["workers"][1] != s["stopped"]  # continued on one live worker
    assert moved["cache_read"][1] > moved["cache_read"][0]  # and hits that worker's cache again
    off, on = s["templates"]["off"], s["templates"]["templatize"]
    assert off["template_ids"] == 4 and on["template_ids"] == 1
    assert on["workers"] == 2  # the second user reuses the first's worker, the third starts a second one
    assert on["cross_session_cache_read"] > 10 * max(off["cross_session_cache_read"], 1)


def check_openai_gateway(s: dict) -> None:
    assert list(s) == ["order-1", "order-2"]
    for run in s.values():
        assert run["actions"] == ["lookup", "calculator", "answer"]
        assert len(run["workers"]) == 1  # every step of a session through the gateway on one worker
        cached, inputs = run["cache_read"], run["input"]
        assert all(0 < c < i for c, i in zip(cached[1:], inputs[1:]))
        assert cached[1:] == inputs[:-1]  # each step reads the whole previous prompt from the cache


CHECKS = {
    "react_agent": check_react_agent,
    "reflexion_agent": check_reflexion_agent,
    "multi_worker_routing": check_multi_worker_routing,
    "openai_gateway": check_openai_gateway,
}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Start every script at once; they run in the background."""
    procs = {}
    for name in NAMES:
        cwd = tmp_path_factory.mktemp(name)  # the scripts save their plots in the working directory
        procs[name] = subprocess.Popen(
            [sys.executable, str(EXAMPLES / f"{name}.py")], cwd=cwd,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", NAMES)
def test_notebook_mirrors_script_and_keeps_outputs(name):
    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    expected = _builder().cells_from_script((EXAMPLES / f"{name}.py").read_text())
    assert [(c.cell_type, c.source) for c in nb.cells] == expected
    assert "simulated" in nb.cells[0].source and "workers=[" in nb.cells[0].source
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    CHECKS[name](_summary(outputs))  # the committed outputs come from a real run


@pytest.fixture(scope="module")
def executed(scripts, tmp_path_factory):
    """Every notebook executed from a temporary copy, concurrently (while the scripts run)."""

    async def run(name):
        workdir = tmp_path_factory.mktemp(f"nb-{name}")
        shutil.copy(EXAMPLES / f"{name}.ipynb", workdir / f"{name}.ipynb")
        nb = nbformat.read(workdir / f"{name}.ipynb", as_version=4)
        client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(workdir)}})
        await client.async_execute()
        return nb

    async def run_all():
        return await asyncio.gather(*(run(name) for name in NAMES), return_exceptions=True)

    return dict(zip(NAMES, asyncio.run(run_all())))


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes(name, executed):
    nb = executed[name]
    if isinstance(nb, BaseException):
        raise nb  # a cell raised (nbclient's CellExecutionError names it) or the kernel failed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    CHECKS[name](_summary("".join(o.get("text", "") for o in outputs if o.output_type == "stream")))


@pytest.mark.parametrize("name", NAMES)
def test_script(name, scripts):
    proc = scripts[name]
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    CHECKS[name](_summary(stdout))
