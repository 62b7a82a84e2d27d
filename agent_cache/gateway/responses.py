"""The JSON answers the gateway writes itself (errors, health, admin)."""

from __future__ import annotations

from typing import Any

from starlette import responses

from agent_cache.calls.jsonio import dumps_printable

MAX_ERROR_TEXT = 1000  # characters of an error message or field name quoted back


def bounded(text: str) -> str:
    """``text`` cut to :data:`MAX_ERROR_TEXT` characters: an error may quote the request (a field's
    value or name), which need not come back whole."""
    return text if len(text) <= MAX_ERROR_TEXT else f"{text[:MAX_ERROR_TEXT]}... ({len(text)} characters)"


class JSONResponse(responses.JSONResponse):
    """Starlette's JSON answer that cannot fail on what it quotes: an error naming a field the caller
    wrote with a lone surrogate (``"\\udc00"`` is valid JSON, not valid UTF-8) still answers 400."""

    def render(self, content: Any) -> bytes:
        return dumps_printable(content)
