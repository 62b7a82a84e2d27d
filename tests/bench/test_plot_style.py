"""The benchmark's plots tell every policy apart: at most 8 lines a panel, colour-blind-safe colours, and no two
policies of a run drawn alike."""

from __future__ import annotations

from agent_cache.bench.plot_style import MAX_SERIES, OKABE_ITO, PRODUCT, panels, styles
from agent_cache.bench.registry import REAL_POLICIES, SIM_POLICIES as POLICIES, SWEEP_POLICIES as _SWEEP_POLICIES

EVERY = list(dict.fromkeys([*POLICIES, *REAL_POLICIES]))  # the sim engine's and the real engine's


def test_every_policy_of_a_full_run_looks_unlike_every_other() -> None:
    for plots in ([list(POLICIES), list(_SWEEP_POLICIES)], [list(REAL_POLICIES)], [EVERY]):
        drawn = styles(plots)
        names = {n for plot in plots for n in plot}
        assert set(drawn) == names
        assert len({(s.color, s.linestyle) for s in drawn.values()}) == len(names), drawn
        assert len({s.marker for s in drawn.values()}) == len(names), drawn
        assert {s.color for s in drawn.values()} <= set(OKABE_ITO)
        product = drawn[PRODUCT]  # emphasised, in a colour of its own
        assert all(s.color != product.color and s.linewidth < product.linewidth
                   for n, s in drawn.items() if n != PRODUCT)


def test_at_most_eight_lines_a_panel_each_colour_once() -> None:
    for names in (list(POLICIES), list(REAL_POLICIES), EVERY, list(_SWEEP_POLICIES)):
        layout = panels(names)
        assert {n for panel in layout for n in panel} == set(names)
        drawn = styles([names])
        for panel in layout:
            assert len(panel) <= MAX_SERIES and PRODUCT in panel, layout
            assert len({drawn[n].color for n in panel}) == len(panel), panel
    assert panels(list(_SWEEP_POLICIES)) == [list(_SWEEP_POLICIES)]  # fits: one panel
    # a policy keeps its look across a run's plots, and each plot's panels keep their colours apart
    run = [list(POLICIES), list(_SWEEP_POLICIES)]
    drawn = styles(run)
    for plot in run:
        for panel in panels(plot):
            assert len({drawn[n].color for n in panel}) == len(panel), panel
