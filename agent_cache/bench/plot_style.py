"""How the benchmark's plots tell their policies apart.

A run compares up to 14 policies, more than a palette a reader can tell apart. So a plot shows at most
:data:`MAX_SERIES` lines per panel: when a run has more, its policies are split into small multiples by
family (the baselines, agent-cache's variants, smg's policies), each panel with agent-cache's own line
for reference. Colours are Okabe and Ito's colour-blind-safe palette, no two alike in a panel where
seven colours allow; line styles go in turn, and every policy has a marker of its own, so no two
policies of a run look alike, and lines that lie on each other still show both. agent-cache's line is
thick, in a colour no other policy takes. A policy looks the same in every plot of a run:
:func:`styles` is given all of the run's plots.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

PRODUCT = "agent-cache"
MAX_SERIES = 8  # lines per panel, the product's included
# Okabe & Ito, "Color Universal Design" (2008): black, orange, sky blue, bluish green, yellow, blue,
# vermillion, reddish purple. The others take them in this order, yellow last: the faintest on white.
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
PRODUCT_COLOUR = "#D55E00"  # vermillion: agent-cache's alone
_YELLOW = "#F0E442"
_COLOURS = tuple(sorted((c for c in OKABE_ITO if c != PRODUCT_COLOUR), key=lambda c: c == _YELLOW))
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*", "d", "H", "8", "1", "2", "3", "4")


@dataclass(frozen=True)
class Style:
    """How one policy's line is drawn (matplotlib's keywords: :meth:`plot_kwargs`)."""

    color: str
    linestyle: str
    marker: str
    linewidth: float = 1.6
    zorder: float = 2.0

    def plot_kwargs(self) -> dict[str, Any]:
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker,
                "linewidth": self.linewidth, "zorder": self.zorder}


def _family(name: str) -> int:
    # policy names say their family: the real engine's smg policies are "smg-<policy>"
    if name.startswith("smg-"):
        return 2
    return 1 if name.startswith(PRODUCT) else 0


def panels(names: Sequence[str]) -> list[list[str]]:
    """The policies of one plot, panel by panel: one panel when they fit :data:`MAX_SERIES`, else one per
    family (in chunks when a family is larger), each with the product's line when the plot has it."""
    names = list(dict.fromkeys(names))
    if len(names) <= MAX_SERIES:
        return [names]
    reference = [PRODUCT] if PRODUCT in names else []
    room = MAX_SERIES - len(reference)
    out: list[list[str]] = []
    for family in range(3):
        members = [n for n in names if _family(n) == family and n != PRODUCT]
        out += [reference + members[i:i + room] for i in range(0, len(members), room)]
    return out or [reference]


def styles(plots: Sequence[Sequence[str]]) -> dict[str, Style]:
    """A style for every policy of a run's ``plots`` (each plot's policies), the same in all of them: a
    colour no policy sharing a panel with it has, where the palette allows (policies shown most often
    choose first), line styles in turn (lines that coincide still show both colours), and a marker of
    its own; (colour, line style) and the marker are distinct for each."""
    layout = [panel for names in plots for panel in panels(names)]
    shown = Counter(name for panel in layout for name in panel if name != PRODUCT)
    out: dict[str, Style] = {}
    colour_of: dict[str, int] = {}
    for k, name in enumerate(sorted(shown, key=lambda n: -shown[n])):  # stable: first seen first among equals
        near = {colour_of[m] for panel in layout if name in panel for m in panel if m in colour_of}
        uses = Counter(colour_of.values())
        colour = next((c for c in range(len(_COLOURS)) if c not in near),
                      min(range(len(_COLOURS)), key=lambda c: uses[c]))
        colour_of[name] = colour
        taken = {s.linestyle for s in out.values() if s.color == _COLOURS[colour]}
        turn = [_LINESTYLES[(k + i) % len(_LINESTYLES)] for i in range(len(_LINESTYLES))]
        linestyle = next((ls for ls in turn if ls not in taken), turn[0])
        out[name] = Style(_COLOURS[colour], linestyle, _MARKERS[k % len(_MARKERS)])
    if any(PRODUCT in names for names in plots):
        # thick, in a colour of its own, and beneath: a policy that matches it stays in sight on top
        out[PRODUCT] = Style(PRODUCT_COLOUR, "-", _MARKERS[len(out) % len(_MARKERS)], linewidth=3.2, zorder=1.5)
    return out
