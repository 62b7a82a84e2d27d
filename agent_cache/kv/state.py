"""Per-worker cache state rebuilt from SGLang's KV events (see docs/routing.md, "KV events").

Each worker's resident pages are kept as a count per block hash (``pages``),
which follows every event format SGLang has published exactly: 0.5.4's hashes of
a page's own tokens (equal pages anywhere hash alike: counted, a node split is a
removal then stores), 0.5.9's per-page events and 0.5.23's coalesced ones with
SHA-256 chain hashes (one hash per prefix position; a split sends nothing and
changes no hash, an eviction removes pages in any order). Over the stored
tokens, content-defined anchors (every ``ANCHOR_WINDOW``-token window whose
hash is 0 modulo ``ANCHOR_EVERY``), each kept with the page it ends in and
gone with it; chains of stored pages are read across events (an
event whose parent is the previous event's last page continues it).
A template's fingerprint is the anchors of its own tokens (a few, spread
over it);
a worker holds the template when every one of them is resident there.
Anchors depend on the tokens alone, so a template is found whatever the
depth or the node boundaries it sits at (a window cut by a split is lost
for both halves, so a template is held when at least
``HOLD_FRACTION`` of its anchors are).

A session's latest prefix is fingerprinted the same way at both of its own
ends (:meth:`KvState.learn_session`): the end of its last message and the
start of its first message after the template. A radix tree evicts leaves
first, so the tail resident means the whole prefix is ("held"), and the
head, once seen resident on the session's worker, absent there means none
of the session's own prefix is left ("gone"): the router knows it before
the next step instead of from that step's reported cached tokens
(:meth:`KvState.annotate` marks the worker).

Bounded: a worker's resident tokens are capped (``max_tokens``); past the cap the
worker's state is dropped and it counts as unknown until its next
``AllBlocksCleared``. A gap in a worker's sequence numbers (lost events,
a subscriber behind its publisher's high-water mark) makes it unknown too,
until a replay fills the gap or the worker restarts. An unknown worker falls
back to the router's own marks. Thread-safe: a subscriber thread applies
batches while routes read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from agent_cache.kv.events import DEVICE_MEDIUMS, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from agent_cache.store.base import WorkerSpec

HOLD_FRACTION = 0.75
ANCHOR_WINDOW = 16
ANCHOR_EVERY = 32
FINGERPRINT_ANCHORS = 8
DEFAULT_MAX_TOKENS = 4_000_000  # per worker: 10x a 400k-token KV pool
DEFAULT_MAX_TEMPLATES = 10_000
DEFAULT_MAX_SESSIONS = 50_000  # about 60 MB (tracemalloc)


@dataclass
class _Worker:
    pages: dict[int, int] = field(default_factory=dict)  # block hash -> copies resident (0.5.4 hashes repeat)
    page_anchors: dict[int, tuple[int, ...]] = field(default_factory=dict)  # block hash -> anchors ending in it
    anchors: dict[int, int] = field(default_factory=dict)  # anchor hash -> resident count
    page_size: int = 1  # tokens a page (the events' block_size)
    tokens: int = 0
    seq: int | None = None  # the last sequence number applied
    known: bool = False  # an AllBlocksCleared was seen and no event was lost since
    stored: int = 0  # pages
    removed: int = 0  # pages


@dataclass(slots=True)
class _SessionPrefix:
    worker: str  # where the session's latest step ran
    tail: tuple[int, ...]  # anchors of the end of that step's last message: resident, its whole prefix is
    head: tuple[int, ...]  # anchors of the start of its first message after the template: gone, all of it is
    head_text: int  # the head's text, hashed: asked of a worker again only when it changes
    at: float = 0.0  # when that step was served
    head_seen: bool = False  # the head was resident there at least once since it was learnt


class KvState:
    """Which workers hold which templates, and how many tokens each caches, from their KV events."""

    def __init__(self, *, max_tokens: int = DEFAULT_MAX_TOKENS, max_templates: int = DEFAULT_MAX_TEMPLATES,
                 max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.max_tokens = max_tokens
        self.max_templates = max_templates
        self.max_sessions = max_sessions
        self._workers: dict[str, _Worker] = {}
        self._templates: dict[str, tuple[int, ...]] = {}
        self._sessions: dict[tuple[str, str], _SessionPrefix] = {}  # (tenant, session key) -> its latest step
        self._tails: dict[tuple[int, ...], int] = {}  # fingerprint -> sessions learnt with it (a copy may be any's)
        self._namespaces: set[str | None] = set()  # the extra_keys of the calls annotated (up to two)
        self._lock = threading.Lock()
        self.gaps = 0  # batches that arrived after a lost one
        self.overflows = 0  # workers dropped past max_tokens
        self.prefixes_gone = 0  # routes that found the session's worker evicted its latest prefix

    # --- templates ------------------------------------------------------------------

    def learn_template(self, template_id: str, token_ids: Sequence[int]) -> None:
        """Remember a template's fingerprint (its token ids as the workers tokenize it)."""
        fp = fingerprint(token_ids)
        with self._lock:
            if template_id not in self._templates and len(self._templates) >= self.max_templates:
                self._templates.pop(next(iter(self._templates)))  # the oldest learned goes
            self._templates[template_id] = fp

    def knows_template(self, template_id: str) -> bool:
        return template_id in self._templates

    def fingerprint(self, template_id: str) -> tuple[int, ...] | None:
        """The anchors learnt for the template (empty: too short to have one; None: not learnt)."""
        return self._templates.get(template_id)

    def holders(self, template_id: str, workers: Iterable[str]) -> tuple[frozenset[str], frozenset[str]] | None:
        """(workers holding the template, workers whose state is known) among ``workers``;
        None when the template's fingerprint is not known (or it has no anchor)."""
        fp = self._templates.get(template_id)
        if not fp:
            return None
        held, known = set(), set()
        with self._lock:
            for url in workers:
                w = self._workers.get(url)
                if w is None or not w.known:
                    continue
                known.add(url)
                if _holds(w, fp):
                    held.add(url)
        return frozenset(held), frozenset(known)

    # --- sessions -------------------------------------------------------------------

    def learn_session(self, tenant: str, session_id: str, tail_ids: Sequence[int], worker: str, *,
                      head_ids: Sequence[int] | None = None, head_text: int = 0, at: float = 0.0) -> None:
        """Remember a session's latest step on ``worker``: the token ids (as that worker tokenizes them) of the
        end of its last message (``tail_ids``) and of the start of its first message after the template
        (``head_ids``; None: the head learnt before, when its text, ``head_text`` hashed, is the same);
        ``at``: when the step was served."""
        key = (tenant, session_id)
        tail, new_head = fingerprint(tail_ids), None if head_ids is None else fingerprint(head_ids)
        with self._lock:
            known = self._sessions.get(key)
            if known is not None and known.at > at:
                return  # a later step is known
            old = self._pop_session(key)  # re-inserted last: the oldest learnt goes first past the bound
            if new_head is not None:
                head = new_head
            else:
                head = old.head if old is not None and old.head_text == head_text else ()
            if not tail and not head and not head_text:
                return
            if len(self._sessions) >= self.max_sessions:
                self._pop_session(next(iter(self._sessions)))
            if tail:
                self._tails[tail] = self._tails.get(tail, 0) + 1
            w = self._workers.get(worker)
            seen = bool(head) and w is not None and w.known and _holds(w, head)
            if old is not None and (old.worker, old.head) == (worker, head):
                seen = seen or old.head_seen  # the same head there: already seen
            self._sessions[key] = _SessionPrefix(worker, tail, head, head_text, at, seen)

    def session_head(self, tenant: str, session_id: str) -> int | None:
        """The hash of the head text learnt for the session, even one without an anchor (None: none)."""
        known = self._sessions.get((tenant, session_id))
        return known.head_text if known is not None and known.head_text else None

    def _pop_session(self, key: tuple[str, str]) -> _SessionPrefix | None:
        known = self._sessions.pop(key, None)
        if known is not None and known.tail:
            n = self._tails[known.tail] - 1
            if n:
                self._tails[known.tail] = n
            else:
                del self._tails[known.tail]
        return known

    def session_prefix(self, tenant: str, session_id: str, worker: str) -> str:
        """What ``worker``'s events show of the session's latest prefix there: "held" (the end of its last
        message is resident, so the whole path to it is: a radix tree evicts leaves first); "gone" (the start
        of its first message after the template, seen resident since it was learnt, is not any more: nothing
        of the session's own prefix is left); "" (not known, or only part of it gone). A tail other sessions
        share (the same last message) is never "held": a copy may be theirs."""
        with self._lock:
            return self._session_prefix((tenant, session_id), worker)

    def _session_prefix(self, key: tuple[str, str], worker: str) -> str:
        known = self._sessions.get(key)
        w = self._workers.get(worker)
        if known is None or known.worker != worker or w is None or not w.known:
            return ""
        if known.head:
            if _holds(w, known.head):
                known.head_seen = True
            elif known.head_seen:
                return "gone"  # no copy at all is left there, whoever's it was
        if known.tail and self._tails.get(known.tail, 0) == 1 and _holds(w, known.tail):
            return "held"
        return ""

    def forget_session(self, tenant: str, session_id: str, *, at: float | None = None) -> None:
        """Forget the session's fingerprints (``at``: those of steps served before then only)."""
        key = (tenant, session_id)
        if key not in self._sessions:  # the common case, without the lock the subscriber thread takes
            return
        with self._lock:
            known = self._sessions.get(key)
            if known is not None and (at is None or known.at <= at):
                self._pop_session(key)

    @property
    def sessions(self) -> int:
        """Sessions whose latest step is fingerprinted."""
        return len(self._sessions)

    def annotate(self, template_id: str | None, specs: tuple[WorkerSpec, ...], *,
                 namespace: str | None = None, session: tuple[str, str] | None = None) -> tuple[WorkerSpec, ...]:
        """The route's workers, each marked "held" / "lacks" for the template where its events tell, and the
        session's worker marked "held" / "gone" for its latest prefix (``session``: tenant, session key).

        ``namespace``: the call's ``extra_key``. Events carry none, and SGLang keeps each namespace's
        cache apart (no ``extra_key`` is one of its own), so once calls of two namespaces were annotated
        a worker's copy may be another's: from then on only the workers holding no copy at all are marked,
        "lacks", and the others keep the store's marks."""
        if len(self._namespaces) < 2:
            self._namespaces.add(namespace)
        last = self._sessions.get(session) if session is not None else None
        if last is not None and session is not None and any(s.url == last.worker for s in specs):
            with self._lock:
                mark = self._session_prefix(session, last.worker)
                self.prefixes_gone += mark == "gone"
            if mark:
                specs = tuple(replace(s, prefix=mark) if s.url == last.worker else s for s in specs)
        found = self.holders(template_id, [s.url for s in specs]) if template_id else None
        if found is None:
            return specs  # nothing known: the store's own marks decide, exactly as without events
        held, known = found
        lacks_only = len(self._namespaces) > 1
        return tuple(s if s.url not in known or (lacks_only and s.url in held)
                     else replace(s, template="held" if s.url in held else "lacks") for s in specs)

    # --- state of a worker ----------------------------------------------------------

    def known(self, url: str) -> bool:
        w = self._workers.get(url)
        return w is not None and w.known

    def cached_tokens(self, url: str) -> int | None:
        """Tokens the worker's radix tree holds now (None: unknown)."""
        w = self._workers.get(url)
        return w.tokens if w is not None and w.known else None

    def workers(self) -> dict[str, int | None]:
        """Every worker heard from -> the tokens its tree holds (None: unknown)."""
        with self._lock:
            return {url: w.tokens if w.known else None for url, w in self._workers.items()}

    @property
    def templates(self) -> int:
        """Templates whose fingerprints are learnt."""
        return len(self._templates)

    def next_seq(self, url: str) -> int | None:
        """The sequence number expected next from ``url`` (None: never heard from)."""
        w = self._workers.get(url)
        return None if w is None or w.seq is None else w.seq + 1

    def disconnected(self, url: str) -> None:
        """The worker's publisher went away: what it holds is unknown until it is heard from again."""
        with self._lock:
            w = self._workers.get(url)
            if w is not None:
                self._clear(w)
                w.known, w.seq = False, None

    def forget(self, url: str) -> None:
        with self._lock:
            self._workers.pop(url, None)

    # --- events ---------------------------------------------------------------------

    def apply(self, url: str, seq: int, batch: KVEventBatch) -> None:
        """Apply one published batch of ``url``'s events (``seq``: its sequence number)."""
        with self._lock:
            w = self._workers.setdefault(url, _Worker())
            if w.seq is not None and seq != w.seq + 1 and not (seq == 0 and _starts_clear(batch)):
                self.gaps += 1
                if seq <= w.seq:  # numbering started again: the worker restarted and its first batches were lost
                    self._clear(w)
                w.known = False  # events were lost: unknown until the worker's next AllBlocksCleared
            w.seq = seq
            self._apply_events(w, batch)

    def _apply_events(self, w: _Worker, batch: KVEventBatch) -> None:
        chain: list[BlockStored] = []  # stored pages that continue each other, read as one token run
        for e in batch.events:
            if isinstance(e, (BlockStored, BlockRemoved)) and e.medium not in DEVICE_MEDIUMS:
                continue  # a host copy (HiCache): not in the device's pool
            if isinstance(e, BlockStored):
                if chain and (e.parent_block_hash is None or e.parent_block_hash != chain[-1].block_hashes[-1]):
                    self._store(w, chain)
                    chain = []
                chain.append(e)
                continue
            if chain:
                self._store(w, chain)
                chain = []
            if isinstance(e, BlockRemoved):
                self._remove(w, e.block_hashes)
            elif isinstance(e, AllBlocksCleared):
                self._clear(w)
                w.known = True
        if chain:
            self._store(w, chain)
        if w.tokens > self.max_tokens:
            self.overflows += 1
            self._clear(w)
            w.known = False

    @staticmethod
    def _clear(w: _Worker) -> None:
        w.pages.clear()
        w.page_anchors.clear()
        w.anchors.clear()
        w.tokens = 0

    def _store(self, w: _Worker, chain: list[BlockStored]) -> None:
        tokens: list[int] = []
        hashes: list[int] = []
        for e in chain:
            tokens.extend(e.token_ids)
            hashes.extend(e.block_hashes)
        if not hashes:
            return
        size = w.page_size = chain[0].block_size  # the page size (decoding refuses one below 1)
        ending: dict[int, list[int]] = {}  # page index -> anchors whose last token is in it
        for end, a in anchors_at(tokens):
            ending.setdefault(end // size, []).append(a)
        for i, h in enumerate(hashes):
            copies = w.pages.get(h, 0)
            w.pages[h] = copies + 1
            w.tokens += size
            w.stored += 1
            if i in ending:
                self._add_anchors(w, h, tuple(ending[i]))

    @staticmethod
    def _add_anchors(w: _Worker, page: int, found: tuple[int, ...]) -> None:
        """``found`` end in ``page``; a 0.5.4 page hash repeats (its own tokens only): the anchors of every
        copy are kept until the last copy goes. Chain hashes never repeat, so there it is exact."""
        w.page_anchors[page] = w.page_anchors.get(page, ()) + found
        for a in found:
            w.anchors[a] = w.anchors.get(a, 0) + 1

    @staticmethod
    def _remove(w: _Worker, hashes: list[int]) -> None:
        """Pages evicted (in any order); a page this index never saw (stored before it subscribed) is skipped."""
        for h in hashes:
            copies = w.pages.get(h)
            if copies is None:
                continue
            w.tokens -= w.page_size
            w.removed += 1
            if copies > 1:
                w.pages[h] = copies - 1
                continue
            del w.pages[h]
            for a in w.page_anchors.pop(h, ()):
                n = w.anchors[a] - 1
                if n:
                    w.anchors[a] = n
                else:
                    del w.anchors[a]


def _holds(w: _Worker, fp: tuple[int, ...]) -> bool:
    """At least ``HOLD_FRACTION`` of the fingerprint's anchors are resident on ``w``."""
    need = max(1, int(len(fp) * HOLD_FRACTION + 0.999))
    return sum(1 for a in fp if a in w.anchors) >= need


def _starts_clear(batch: KVEventBatch) -> bool:
    return bool(batch.events) and isinstance(batch.events[0], AllBlocksCleared)


# --- anchors: they depend on the tokens alone (a tuple's hash of integers is the same in every process of one
# Python version), so a fingerprint of a template's or a session's tokens is found among a worker's resident pages


def anchors(tokens: Sequence[int]) -> list[int]:
    """The content-defined anchor hashes of ``tokens``, in order."""
    return [h for _, h in anchors_at(tokens)]


def anchors_at(tokens: Sequence[int]) -> list[tuple[int, int]]:
    """(index of its last token, hash) of each content-defined anchor of ``tokens``, in order."""
    out = []
    w = ANCHOR_WINDOW
    for i in range(len(tokens) - w + 1):
        h = hash(tuple(tokens[i : i + w]))
        if h % ANCHOR_EVERY == 0:
            out.append((i + w - 1, h))
    return out


def fingerprint(tokens: Sequence[int]) -> tuple[int, ...]:
    """Up to ``FINGERPRINT_ANCHORS`` of the anchors of ``tokens``, spread evenly, the last one included."""
    found = list(dict.fromkeys(anchors(tokens)))
    if len(found) <= FINGERPRINT_ANCHORS:
        return tuple(found)
    step = len(found) / FINGERPRINT_ANCHORS
    return tuple(found[min(len(found) - 1, int((k + 1) * step) - 1)] for k in range(FINGERPRINT_ANCHORS))
