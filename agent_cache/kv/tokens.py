"""Token ids learnt from the workers, so their KV events can name template holders and evicted sessions.

A template's fingerprint (``KvState.learn_template``) must be made of the
token ids the worker computes. The router sees text, and the chat template
that wraps it lives with the model; but a chat template's special tokens
split the text, so the system prompt's own tokens appear unchanged inside
the rendered prompt, except perhaps where they touch the markers around it.
So the worker's ``/tokenize`` (text only, SGLang 0.5.x; no special tokens
added) is asked for the template's system prompt once, and the first and
last ``EDGE`` tokens are dropped before the fingerprint is taken: every
anchor left lies inside the rendered prompt as well.

A session's latest prefix is fingerprinted the same way at both of its own
ends: the end of its last message (at most ``TAIL_CHARS`` characters: the
newest tokens, the first an LRU cache evicts), asked after each of its
served calls, and the start of its first message after the template long
enough to hold an anchor (the oldest, the last evicted), asked when it
changes (:meth:`KvTokens.want_session`), so the router knows before the
next step whether the worker still holds all of it or none of it
(``KvState.learn_session``).

Off the call path: a served call only queues its template and its last
message (:meth:`KvTokens.want`); background threads ask the worker, one
for templates and one for sessions, through one kept-alive client per
worker. A failed template ask is retried after ``RETRY_AFTER`` s, by the
next call of the template; a worker that failed a session's ask is not
asked for sessions' messages for ``RETRY_AFTER`` s. A system prompt too
short to have an anchor is learnt as empty, and its holders stay the
router's own marks. A session's last
message not learnt (a full queue, a failing worker) forgets the session's
older fingerprint, so its reported cached tokens decide, as without events.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from agent_cache.background import Jobs
from agent_cache.kv.state import KvState

log = logging.getLogger(__name__)
EDGE = 8  # tokens dropped at each end: a merge with the chat template's text around them may differ
RETRY_AFTER = 30.0
MAX_QUEUED = 256
TOKENIZE_TIMEOUT = 5.0
TAIL_CHARS = 4_000  # about 1,000 tokens: enough for the fingerprint's 8 anchors, a bounded ask per call
TAIL_TOKENS = TAIL_CHARS // 4  # the same end in tokens, at about 4 characters a token (the fleet simulation's)
HEAD_MIN_CHARS = 800  # about 200 tokens: some 5 anchors expected (a 40-token question has most often none)
HEAD_MIN_TOKENS = HEAD_MIN_CHARS // 4


def system_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The text of the leading system (or developer) message: a template's stable start."""
    from agent_cache.templates.canonical import STABLE_ROLES, content_text

    if not messages or messages[0].get("role") not in STABLE_ROLES:
        return None
    text = content_text(messages[0].get("content"))
    return text or None


def last_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The end (``TAIL_CHARS``) of the last message's text, unless that message is the template's own
    leading one: a session's newest step. A cut through a token is inside the ``EDGE`` dropped."""
    from agent_cache.templates.canonical import content_text

    if len(messages) < 2:
        return None
    text = content_text(messages[-1].get("content"))
    return text[-TAIL_CHARS:] or None


def head_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The start (``TAIL_CHARS``) of the first message after the template's leading one that has
    ``HEAD_MIN_CHARS`` of text: the oldest part of a session's own prefix with room for an anchor, the last an
    LRU cache evicts (the shorter messages before it, a question say, hold a few dozen tokens at most)."""
    from agent_cache.templates.canonical import STABLE_ROLES, content_text

    start = 1 if messages and messages[0].get("role") in STABLE_ROLES else 0
    for message in messages[start:]:
        text = content_text(message.get("content"))
        if len(text) >= HEAD_MIN_CHARS:
            return text[:TAIL_CHARS]
    return None


def text_key(text: str) -> int:
    """A text's hash, the same in every process (``hash`` of a str is not): never 0."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") or 1


def trim_edges(ids: Sequence[int]) -> list[int]:
    """Token ids less ``EDGE`` at each end (nothing left of a text that short)."""
    return list(ids)[EDGE:-EDGE] if len(ids) > 2 * EDGE else []


class _SGLangTokenizer:
    """``/tokenize`` of each worker, one kept-alive client per worker (an ask per call must not open a
    connection per call)."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, url: str, text: str) -> Sequence[int]:
        from agent_cache.backends.sglang import SGLangClient

        with self._lock:
            client = self._clients.get(url)
            if client is None:
                client = self._clients[url] = SGLangClient(url, timeout=TOKENIZE_TIMEOUT, api_key=self.api_key)
        tokens = client.tokenize(text, add_special_tokens=False).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ValueError(f"/tokenize of {url} answered no list of token ids")
        return tokens

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


class KvTokens:
    """Learns templates' and sessions' fingerprints for ``state`` from a worker's ``/tokenize``, on two
    background threads: templates have their own, so the asks of every call never crowd them out."""

    def __init__(self, state: KvState, *, api_key: str | None = None,
                 tokenize: Callable[[str, str], Sequence[int]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self._own = None if tokenize is not None else _SGLangTokenizer(api_key)
        self._tokenize: Callable[[str, str], Sequence[int]] = tokenize or self._own  # type: ignore[assignment]
        self._clock = clock
        join = TOKENIZE_TIMEOUT + 1
        self._templates = Jobs(self._learn_template, "kv-templates", max_queued=MAX_QUEUED, join_timeout=join)
        self._sessions = Jobs(self._learn_session, "kv-sessions", max_queued=MAX_QUEUED, join_timeout=join)
        self._asked: dict[str, float] = {}  # template -> when asked (queued, or failed and not yet retried)
        self._failing: dict[str, float] = {}  # worker -> when a session ask to it failed: none for RETRY_AFTER s
        self._lock = threading.Lock()
        self.learnt = 0
        self.sessions_learnt = 0
        self.sessions_dropped = 0  # last messages not asked: the queue full, or the worker failing
        self.failed = 0

    def want(self, template_id: str | None, messages: Sequence[Mapping[str, Any]], worker: str, *,
             tenant: str = "default", session_id: str | None = None) -> None:
        """Queue what a served call teaches (no I/O here): its template, unless known; the session's
        last message (``session_id``: its key in the store), each time."""
        self.want_template(template_id, messages, worker)
        if session_id is not None:
            self.want_session(tenant, session_id, messages, worker)

    def want_session(self, tenant: str, session_id: str, messages: Sequence[Mapping[str, Any]], worker: str) -> None:
        text = last_text(messages)
        failed_at = self._failing.get(worker)
        at = time.time()  # when the step was served: the latest learnt step wins, in every process
        if text is not None and (failed_at is None or self._clock() - failed_at >= RETRY_AFTER) \
                and self._sessions.submit(tenant, session_id, text, head_text(messages), worker, at):
            return
        if text is not None:
            self.sessions_dropped += 1
        # not asked: the session's older fingerprints are forgotten, not left to mislead
        self._forget(tenant, session_id, at)

    def want_template(self, template_id: str | None, messages: Sequence[Mapping[str, Any]], worker: str) -> None:
        if not template_id or self.state.knows_template(template_id):
            return
        now = self._clock()
        with self._lock:
            asked = self._asked.get(template_id)
            if asked is not None and now - asked < RETRY_AFTER:
                return
            text = system_text(messages)
            if text is None:
                return
            if len(self._asked) >= self.state.max_templates:
                self._asked.clear()  # bounded; a template still unknown is asked again
            self._asked[template_id] = now
            if not self._templates.submit(template_id, text, worker):
                del self._asked[template_id]  # a full queue (a burst of new templates): its next call asks again

    def _ids(self, worker: str, text: str, what: str) -> list[int] | None:
        """The text's token ids as ``worker`` tokenizes it, less ``EDGE`` at each end (None: not asked)."""
        try:
            return trim_edges(self._tokenize(worker, text))
        except Exception as exc:  # a worker down or answering nonsense: the marks decide meanwhile
            self.failed += 1
            log.warning("could not learn %s's tokens from %s: %s", what, worker, exc)
            return None

    def _learn_template(self, template_id: str, text: str, worker: str) -> None:
        ids = self._ids(worker, text, f"template {template_id}")
        if ids is not None:
            self.state.learn_template(template_id, ids)
            self.learnt += 1

    def _forget(self, tenant: str, session_id: str, at: float) -> None:
        self.state.forget_session(tenant, session_id, at=at)

    def _learn_session(self, tenant: str, session_id: str, text: str, head: str | None, worker: str,
                       at: float) -> None:
        failed_at = self._failing.get(worker)
        if failed_at is not None and self._clock() - failed_at < RETRY_AFTER:
            self.sessions_dropped += 1  # queued before its worker failed: not asked (nor logged) again
            self._forget(tenant, session_id, at)
            return
        ids = self._ids(worker, text, "a session's last message")
        head_key = text_key(head) if head is not None else 0
        head_ids: list[int] | None = None  # the head learnt before serves while its text is the same
        if ids is not None and head is not None and self.state.session_head(tenant, session_id) != head_key:
            head_ids = ids if head == text else self._ids(worker, head, "a session's first message")
            if head_ids is None:
                ids = None  # the worker failed the second ask
        if ids is None:
            self._failing[worker] = self._clock()
            self._forget(tenant, session_id, at)
        else:
            self._failing.pop(worker, None)
            self.state.learn_session(tenant, session_id, ids, worker, head_ids=head_ids, head_text=head_key, at=at)
            self.sessions_learnt += 1

    def close(self) -> None:
        """Stop asking: what is still queued is dropped, the asks under way (if any) end first."""
        self._templates.close()
        self._sessions.close()
        if self._own is not None:
            self._own.close()
