"""The Redis store's Lua scripts, read from the ``.lua`` files beside this module.

A script file may start with ``-- needs: a b``: the shared pieces (``a.lua``,
``b.lua``: local functions) put before it, in that order, so each piece is
written once. ROUTE is a port of :func:`agent_cache.placement.rule.choose_worker`
plus the bookkeeping of :meth:`agent_cache.store.memory.MemoryStore.route`;
keep all three in step (a test compares them on random scenarios).
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

_NEEDS = re.compile(r"\A(?:--[^\n]*\n)*?-- needs: ([a-z_ ]+)\n")


@cache
def _read(name: str) -> str:
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def script(name: str) -> str:
    """The text of script ``name`` with the pieces it needs before it."""
    text = _read(name)
    needs = _NEEDS.match(text)
    pieces = needs.group(1).split() if needs else []
    return "".join(_read(piece) for piece in pieces) + text


def commands(text: str) -> list[str]:
    """The Redis commands a script runs (``redis.call('HSET', ...)``), sorted, for the ACL check."""
    return sorted(set(re.findall(r"redis\.call\('([A-Z]+)'", text)))


ROUTE, REPORTS, ABANDON, RENEW, RELEASE = (script(n) for n in ("route", "reports", "abandon", "renew", "release"))
