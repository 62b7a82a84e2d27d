"""What runs when a worker starts draining: the hooks registered on a router (``Router.drain_hooks``).

Prewarming registers one (its hot templates held by the drained worker are
prefilled elsewhere, ``routing/prewarm.py``). ``Router.drain`` runs them for
a drain made directly (``ChatSGLang`` users, tests); the gateway's fleet
applies every drain of a refresh first and runs them afterwards, so no
hook picks a worker that drains in the same pass.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

logger = logging.getLogger(__name__)


class DrainHooks:
    """Callbacks run with a worker's URL once it drains; a failing one is logged and the others run."""

    def __init__(self) -> None:
        self._hooks: list[Callable[[str], None]] = []
        self._lock = threading.Lock()

    def add(self, hook: Callable[[str], None]) -> None:
        with self._lock:
            self._hooks.append(hook)

    def remove(self, hook: Callable[[str], None]) -> None:
        with self._lock:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def run(self, url: str) -> None:
        with self._lock:
            hooks = list(self._hooks)
        for hook in hooks:
            try:
                hook(url)
            except Exception:  # a hook's failure must not stop a drain (nor an admin's DELETE)
                logger.exception("a drain hook failed for %s", url)
