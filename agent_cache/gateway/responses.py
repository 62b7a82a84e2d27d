"""The JSON answers the gateway writes itself (errors, health, admin)."""

from __future__ import annotations

from typing import Any

from starlette import responses

from agent_cache.calls.jsonio import dumps_printable


class JSONResponse(responses.JSONResponse):
    """Starlette's JSON answer that cannot fail on what it quotes: an error naming a field the caller
    wrote with a lone surrogate (``"\\udc00"`` is valid JSON, not valid UTF-8) still answers 400."""

    def render(self, content: Any) -> bytes:
        return dumps_printable(content)
