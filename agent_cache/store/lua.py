"""The Redis store's Lua scripts, read from the ``.lua`` files beside this module.

A script file may start with ``-- needs: a b``: the shared pieces (``a.lua``,
``b.lua``: local functions) put before it, in that order, so each piece is
written once. The store's scripts (:func:`store_script`) start with their
key layout, written from :mod:`agent_cache.store.keys`. ROUTE is a port of :func:`agent_cache.placement.rule.choose_worker`
plus the bookkeeping of :meth:`agent_cache.store.memory.MemoryStore.route`;
keep all three in step (a test compares them on random scenarios).
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

from agent_cache.store import keys

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


@cache
def _key_layout() -> str:
    """The store scripts' keys, from :mod:`agent_cache.store.keys`: the hash tag (``ARGV[1]`` of every store
    script), the declared deployment keys (``K.<name>``, the first KEYS), where the script's own keys start
    (``OWN``), and one function per kind of key a script names as it runs (``session_key(member)``, ...)."""
    declared = ", ".join(f"{name} = KEYS[{i}]" for i, name in enumerate(keys.SCRIPT_KEYS, 1))
    lines = ["local TAG = ARGV[1]", f"local K = {{{declared}}}", f"local OWN = {len(keys.SCRIPT_KEYS) + 1}"]
    lines += [f"local function {name}_key(name) return TAG .. ':{key.suffix}:' .. name end"
              for name, key in keys.SCRIPT_FAMILIES.items()]
    return "\n".join(lines) + "\n"


def store_script(name: str) -> str:
    """Script ``name`` of the store, after its key layout: called with ``keys.script_keys(prefix)`` and then
    its own keys as KEYS, the hash tag as ``ARGV[1]``."""
    return _key_layout() + script(name)


def commands(text: str) -> list[str]:
    """The Redis commands a script runs (``redis.call('HSET', ...)``), sorted, for the ACL check."""
    return sorted(set(re.findall(r"redis\.call\('([A-Z]+)'", text)))


ROUTE, REPORTS, ABANDON, RENEW, RELEASE = (store_script(n) for n in ("route", "reports", "abandon", "renew", "release"))
