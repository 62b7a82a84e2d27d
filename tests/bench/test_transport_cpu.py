"""The transport CPU benchmark runs end to end against a simulated worker and prints its table."""

from __future__ import annotations

import pytest

from agent_cache.bench.transport_cpu import main


@pytest.mark.slow
def test_the_table_has_a_cpu_figure_per_transport(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--calls", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms)" in line]
    assert len(rows) == 3
    for row in rows:
        httpx_ms, fast_ms = (float(cell) for cell in row.strip("| ").split(" | ")[1:])
        assert httpx_ms > 0 and fast_ms > 0
