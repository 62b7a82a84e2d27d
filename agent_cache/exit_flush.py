"""Pending writes flushed when the interpreter exits, within a bounded time.

A router's in-flight releases and usage reports, and a template registry's
records, are written by background threads shortly after a call. A short
script that ends without ``close()`` would lose the last of them (its calls
then stay counted in flight until the lease runs out). Each such object
registers its ``close`` here; at exit the live ones are closed in a daemon
thread the interpreter waits on for at most :data:`EXIT_BUDGET` seconds, so
a store that does not answer never holds the exit up. Objects are held
weakly, and one closed by its owner unregisters.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any, Callable, TypeVar

__all__ = ["EXIT_BUDGET", "flush_all", "register", "unregister"]

EXIT_BUDGET = 3.0  # seconds the interpreter waits at exit for every pending write together
logger = logging.getLogger("agent_cache")
T = TypeVar("T")

_lock = threading.Lock()
_closers: dict[int, tuple[weakref.ref[Any], Callable[[Any], None]]] = {}


def register(owner: T, close: Callable[[T], None]) -> None:
    """Call ``close(owner)`` at interpreter exit, while ``owner`` lives and :func:`unregister` was not called.

    Closed in reverse order of registration (an object made from another is closed before it).
    """
    with _lock:
        for key in [k for k, (ref, _) in _closers.items() if ref() is None]:
            del _closers[key]
        _closers[id(owner)] = (weakref.ref(owner), close)


def unregister(owner: object) -> None:
    """Forget ``owner`` (it was closed already)."""
    with _lock:
        entry = _closers.get(id(owner))
        if entry is not None and entry[0]() is owner:
            del _closers[id(owner)]


def _close_each() -> None:
    with _lock:
        closers = list(_closers.values())
        _closers.clear()
    for ref, close in reversed(closers):
        owner = ref()
        if owner is None:
            continue
        try:
            close(owner)
        except Exception:  # one failing close must not keep the others from writing
            logger.exception("closing %s at exit failed", type(owner).__name__)


def flush_all(budget: float = EXIT_BUDGET) -> bool:
    """Close every registered object, waiting at most ``budget`` seconds; False if time ran out."""
    try:
        thread = threading.Thread(target=_close_each, name="agent-cache-exit", daemon=True)
        thread.start()
    except RuntimeError:  # an interpreter that starts no threads at exit: close here, bounded by socket timeouts
        _close_each()
        return True
    thread.join(budget)
    if thread.is_alive():
        logger.warning("pending agent-cache writes not finished within %.1f s at exit; left unwritten", budget)
        return False
    return True


atexit.register(flush_all)
