"""Detectors for volatile spans (dates, ids, e-mails) and the template syntax.

A template is text with ``{name}`` placeholders; literal braces are doubled so
the template is unambiguous and :func:`render` inverts :func:`extract_volatile`.
"""

from __future__ import annotations

import re
from typing import Mapping

from agent_cache.errors import TemplateError

_MON = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
        r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
_DAY = r"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\.?,? )?"
_ZONE = r"(?: ?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}|[A-Z]{2,4}T)\b)?"
_TIME = r"(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d+)?)?(?: ?[AaPp]\.?[Mm]\.?)?" + _ZONE
_TAIL = r"(?:,? (?:at )?" + _TIME + r")?"
_ISO = (r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
        r"(?:[T ](?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2}| ?UTC| ?GMT)?)?")

# (kind, pattern); earlier kinds win when spans overlap.
_DETECTORS: list[tuple[str, re.Pattern[str]]] = [
    ("email", re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")),
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("date", re.compile(
        r"(?<![\w-])(?:" + _ISO
        + r"|" + _DAY + r"\d{1,2} " + _MON + r" \d{4}(?: \d{2}:\d{2}(?::\d{2})?(?: [+-]\d{4}| ?[A-Z]{2,4}\b)?)?"
        + r"|" + _DAY + _MON + r" \d{1,2}(?:st|nd|rd|th)?, \d{4}" + _TAIL
        + r"|" + _DAY + r"\d{1,2}(?:st|nd|rd|th)? " + _MON + r",? \d{4}" + _TAIL
        + r"|\d{1,2}[/.]\d{1,2}[/.]\d{4}" + _TAIL
        + r")(?![\w-])")),
    # Times alone: two-digit hour, or a 12-hour clock with AM/PM (keeps "3:16" literal).
    # These start with a plain digit class (lookbehind after it) so the regex engine can
    # skip ahead to digits instead of trying every position.
    ("time", re.compile(r"[0-9](?<![\d:.][0-9])(?:(?<=[01])\d|(?<=2)[0-3]):[0-5]\d(?::[0-5]\d)?" + _ZONE
                        + r"(?![\d:])|[0-9](?<![\d:.][0-9])(?:(?<=1)[0-2]?|(?<=[2-9])|(?<=0)[1-9]):[0-5]\d ?[AaPp]\.?[Mm]\.?" + _ZONE + r"(?![\d:])")),
    ("timestamp", re.compile(r"[0-9](?<![\w.][0-9])(?:\d{12}|\d{9})(?!\w|\.\d)")),
    ("hex", re.compile(r"(?<![\w-])(?:0x)?[0-9a-fA-F]{16,}(?![\w-])")),
    ("id", re.compile(r"(?<![\w-])[A-Za-z0-9_-]{20,}={0,2}(?![\w=-])")),
]
DETECTOR_KINDS = tuple(k for k, _ in _DETECTORS)

_TS_MIN, _TS_MAX = 1_000_000_000, 4_102_444_800  # 2001-09-09 .. 2100-01-01
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _plausible(kind: str, s: str) -> bool:
    if kind == "timestamp":
        v = int(s) // (1000 if len(s) == 13 else 1)
        return _TS_MIN <= v <= _TS_MAX
    if kind == "hex":
        h = s[2:] if s.startswith("0x") else s
        return any(c.isdigit() for c in h) and any(c.isalpha() for c in h)
    if kind == "id":
        # Mixed digits and letters with several switches between them: ids, not
        # identifiers like "search_documents_v2".
        digits = sum(c.isdigit() for c in s)
        if digits < 2 or digits == len(s.rstrip("=")):
            return False
        switches = sum(1 for a, b in zip(s, s[1:]) if a.isdigit() != b.isdigit())
        return switches >= 4
    return True


# Prefilter. No detector match spans a newline, and every kept match contains a
# digit (date, time, timestamp; hex and id by _plausible), an "@" (email) or
# "-XXXX-" (uuid). Lookarounds only look at one character past a match, and a
# newline and the end of the string look alike to all of them (both are
# non-word, not "-", ":", "." or a digit). So running the detectors on whole
# lines that contain a candidate finds exactly the spans a scan of the whole
# text finds. Both prefilter patterns start with a character class or a
# literal, which the regex engine scans for quickly.
_CANDIDATE = re.compile(r"[\d@]")
_UUID_HINT = re.compile(r"-[0-9a-fA-F]{4}-")
_MERGE_GAP = 256  # join candidate lines closer than this (fewer, larger scans)


def _candidate_lines(text: str, pat: re.Pattern[str], out: list[tuple[int, int]]) -> None:
    pos, n = 0, len(text)
    while pos < n:
        m = pat.search(text, pos)
        if m is None:
            return
        i = m.start()
        lo = text.rfind("\n", 0, i) + 1
        hi = text.find("\n", i)
        if hi < 0:
            hi = n
        out.append((lo, hi))
        pos = hi + 1


def _candidate_lines_ascii(text: str, out: list[tuple[int, int]]) -> None:
    """Same lines as ``_candidate_lines(text, _CANDIDATE, out)`` for ASCII text (where
    ``\\d`` is 0-9), with str.find, which is much faster than a regex class scan."""
    n = len(text)
    nxt = {}
    for c in "0123456789@":
        i = text.find(c)
        if i >= 0:
            nxt[c] = i
    while nxt:
        i = min(nxt.values())
        lo = text.rfind("\n", 0, i) + 1
        hi = text.find("\n", i)
        if hi < 0:
            hi = n
        out.append((lo, hi))
        for c, j in list(nxt.items()):
            if j < hi:
                k = text.find(c, hi)
                if k < 0:
                    del nxt[c]
                else:
                    nxt[c] = k


def _candidate_blocks(text: str) -> list[tuple[int, int]]:
    """Sorted, disjoint ``(lo, hi)`` ranges of whole lines holding every candidate."""
    lines: list[tuple[int, int]] = []
    if text.isascii():
        _candidate_lines_ascii(text, lines)
    else:
        _candidate_lines(text, _CANDIDATE, lines)
    if "-" in text:
        _candidate_lines(text, _UUID_HINT, lines)
        lines.sort()
    blocks: list[tuple[int, int]] = []
    for lo, hi in lines:
        if blocks and lo <= blocks[-1][1] + _MERGE_GAP:
            if hi > blocks[-1][1]:
                blocks[-1] = (blocks[-1][0], hi)
        else:
            blocks.append((lo, hi))
    return blocks


def detect_spans(text: str, variables: Mapping[str, str] | None = None) -> list[tuple[int, int, str]]:
    """Non-overlapping ``(start, end, kind)`` spans; variables are kind ``var:NAME``."""
    found: list[tuple[int, int, int, str]] = []  # start, -priority, end, kind
    prio = 0
    for name, value in sorted((variables or {}).items(), key=lambda kv: -len(kv[1])):
        i = text.find(value)
        while i >= 0:
            found.append((i, prio, i + len(value), f"var:{name}"))
            i = text.find(value, i + len(value))
        prio += 1
    prio = 1000
    blocks = _candidate_blocks(text)
    for kind, pat in _DETECTORS:
        for lo, hi in blocks:
            if kind == "email" and "@" not in text[lo:hi]:  # cheap gate: most prompts have no e-mail
                continue
            for m in pat.finditer(text, lo, hi):
                if _plausible(kind, m.group()):
                    found.append((m.start(), prio, m.end(), kind))
        prio += 1
    if not found:
        return []
    # Highest priority first, then leftmost; drop spans overlapping a kept one.
    found.sort(key=lambda f: (f[1], f[0]))
    kept: list[tuple[int, int, str]] = []
    for start, _p, end, kind in found:
        if all(end <= s or start >= e for s, e, _k in kept):
            kept.append((start, end, kind))
    kept.sort()
    return kept


def _check_variables(variables: Mapping[str, str] | None) -> None:
    for name, value in (variables or {}).items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise TemplateError(f"variables[{name!r}]", "a variable name must be an identifier")
        if not isinstance(value, str) or not value:
            raise TemplateError(f"variables[{name!r}]", "a variable value must be a non-empty string")


def _escape(s: str) -> str:
    return s.replace("{", "{{").replace("}", "}}")


def extract_volatile(text: str, variables: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Template text (``{kind_N}`` / ``{var}`` placeholders) and the extracted values."""
    _check_variables(variables)
    spans = detect_spans(text, variables)
    values: dict[str, str] = {}
    by_value: dict[tuple[str, str], str] = {}
    counts: dict[str, int] = {}
    out: list[str] = []
    pos = 0
    name: str | None
    for start, end, kind in spans:
        value = text[start:end]
        if kind.startswith("var:"):
            name = kind[4:]
        else:
            name = by_value.get((kind, value))
            if name is None:
                counts[kind] = counts.get(kind, 0) + 1
                name = f"{kind}_{counts[kind]}"
                by_value[(kind, value)] = name
        values[name] = value
        out.append(_escape(text[pos:start]))
        out.append("{" + name + "}")
        pos = end
    out.append(_escape(text[pos:]))
    return "".join(out), values


def render(template_text: str, values: Mapping[str, str]) -> str:
    """Inverse of :func:`extract_volatile`."""
    def sub(m: re.Match[str]) -> str:
        tok = m.group()
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        name = m.group(1)
        if name is None:
            raise TemplateError("template_text", f"unescaped brace at offset {m.start()}")
        if name not in values:
            raise TemplateError(f"values[{name!r}]", "no value for this placeholder")
        return values[name]
    return _PLACEHOLDER.sub(sub, template_text)


_NAME_BRACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\}")


def display(template_text: str) -> str:
    """What the model sees: placeholders kept, literal braces single again."""
    # Same tokens as _PLACEHOLDER, found with str.find (a regex scan for a class of
    # two characters is ~10x slower than a literal search over a long prompt).
    t = template_text
    ob, cb = t.find("{"), t.find("}")
    if ob < 0 and cb < 0:
        return t
    out: list[str] = []
    pos = 0
    while True:
        if 0 <= ob < pos:
            ob = t.find("{", pos)
        if 0 <= cb < pos:
            cb = t.find("}", pos)
        if ob < 0 and cb < 0:
            break
        i = ob if cb < 0 or 0 <= ob < cb else cb
        brace = t[i]
        if t.startswith(brace, i + 1):  # "{{" or "}}": a literal brace
            out.append(t[pos:i + 1])
            pos = i + 2
            continue
        end = i + 1
        if brace == "{":
            m = _NAME_BRACE.match(t, i + 1)
            if m is not None:
                end = m.end()
        out.append(t[pos:end])
        pos = end
    out.append(t[pos:])
    return "".join(out)
