"""The ``sglang`` tier: the product against real SGLang servers on this CPU (``agent_cache.sglang_cpu``).

Run with ``python -m pytest -m sglang`` after ``agent-cache sglang-cpu setup`` (the release in
``$AGENT_CACHE_SGLANG_VERSION``, default the newest the harness knows; the root conftest leaves the
harness's variables alone). Without that setup every test here
is skipped, with one summary line. Servers are expensive (about 3 GB and 20-50 s each), so one pair is
shared by the whole tier, and the tests that need their own pool size or kill a server start their own.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest

from agent_cache.sglang_cpu import LATEST_ENGINE
from agent_cache.sglang_cpu.install import VERSION_ENV, Installed
from agent_cache.sglang_cpu.workers import SERVED_MODEL as MODEL  # noqa: F401  (the tier's tests import it)
from agent_cache.sglang_cpu.workers import RealWorker, RealWorkers

ENGINE_VERSION = os.environ.get(VERSION_ENV, LATEST_ENGINE)
NO_SGLANG = (f"real SGLang {ENGINE_VERSION} is not set up "
             f"(agent-cache sglang-cpu setup --version {ENGINE_VERSION})")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def engine() -> Installed:
    installed = Installed.find(ENGINE_VERSION)
    if installed is None:
        pytest.skip(NO_SGLANG)
    return installed


@pytest.fixture(scope="session")
def real_pair(engine: Installed) -> Iterator[list[RealWorker]]:
    """Two real workers (8k-token pools, page size 1, KV events on), shared by the tier."""
    with RealWorkers(engine) as fleet:
        yield fleet.start(2, max_total_tokens=8192, kv_events=True)


@pytest.fixture
def start_workers(engine: Installed) -> Iterator[Callable[..., list[RealWorker]]]:
    """Start real workers of one's own (stopped after the test): ``start_workers(n, **RealWorkers.start args)``."""
    fleet = RealWorkers(engine)
    try:
        def start(n: int = 1, **kwargs: object) -> list[RealWorker]:
            return fleet.start(n, **kwargs)  # type: ignore[arg-type]

        start.fleet = fleet  # type: ignore[attr-defined]
        yield start
    finally:
        fleet.close()
