"""A session id read from a request header or the ``user`` field, and its bounded echo.

HTTP servers hand header values over as Latin-1 text (the bytes one to one),
so a UTF-8 id such as ``sess-é`` arrives as ``sess-Ã©``: :func:`session_value`
decodes the bytes as UTF-8, so the header and the ``user`` field name the
same session. The echo in ``x-agent-cache-session`` is bounded: an id longer
than :data:`~agent_cache.routing.config.MAX_SESSION_ID` characters is echoed
as ``sha256:<hex>``, the form it is stored under, never in full.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import quote

from agent_cache.backends.request_check import check_text
from agent_cache.errors import InvalidRequestError
from agent_cache.routing.config import session_key

# printable ASCII but "%" is echoed as it is; the rest percent-encoded (a header carries Latin-1 only)
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
# C0/C1 controls and DEL (Cc), line and paragraph separators: refused, as a log line or header could be cut
_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def session_value(value: object, field: str, *, header: bool) -> str:
    """The session id a request names in a header (``header``: decoded as UTF-8) or the ``user``
    field, checked by :func:`check_session_id`."""
    return check_session_id(from_header(value, field) if header and isinstance(value, str) else value, field)


def from_header(value: str, field: str) -> str:
    """A header value as the server passed it (Latin-1 code points, one per byte) decoded as UTF-8.

    Bytes that are not UTF-8 are refused (:class:`InvalidRequestError` naming ``field``) rather than guessed.
    """
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:  # already decoded text (a server that decodes headers itself)
        return value
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(field, f"a session id must be UTF-8 ({exc.reason} at byte {exc.start})") from None


def check_session_id(value: object, field: str) -> str:
    """``value`` if it is a usable session id; else :class:`InvalidRequestError` naming ``field``.

    Any Unicode text is allowed but control characters and line separators (the id reaches logs
    and, encoded, a response header).
    """
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(field, f"a session id must be a non-empty string, got {_short(value)}")
    check_text(value, field)
    if not value.isascii() or not value.isprintable():
        for i, ch in enumerate(value):
            if unicodedata.category(ch) in _REFUSED_CATEGORIES:
                raise InvalidRequestError(field, f"a session id must not contain control characters "
                                         f"(U+{ord(ch):04X} at character {i})")
    return value


def echoed(session_id: str) -> str:
    """The ``x-agent-cache-session`` value for ``session_id``: the id percent-encoded where it is not
    printable ASCII, or ``sha256:<hex>`` for an id too long to store as it is (bounded: at most
    3 x 4 x 256 bytes)."""
    return quote(session_key(session_id), safe=_HEADER_SAFE)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
