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

A session's latest prefix is fingerprinted the same way from the end of its
last message (at most ``TAIL_CHARS`` characters: the newest tokens, the
first an LRU cache evicts), asked after each of its served calls
(:meth:`KvTokens.want_session`), so the router knows the worker evicted it
before the next step (``KvState.learn_session``).

Off the call path: a served call only queues its template and its last
message (:meth:`KvTokens.want`); one background thread asks a worker. A
failed template ask is retried after ``RETRY_AFTER`` s, by the next call of
the template. A system prompt too short to have an anchor is learnt as
empty, and its holders stay the router's own marks. A session's last
message not learnt (a full queue, a failed ask) forgets the session's older
fingerprint, so its reported cached tokens decide, as without events.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from agent_cache.background import Jobs
from agent_cache.routing.kv_state import KvState

log = logging.getLogger(__name__)
EDGE = 8  # tokens dropped at each end: a merge with the chat template's text around them may differ
RETRY_AFTER = 30.0
MAX_QUEUED = 256
TOKENIZE_TIMEOUT = 5.0
TAIL_CHARS = 4_000  # about 1,000 tokens: enough for the fingerprint's 8 anchors, a bounded ask per call
TAIL_TOKENS = TAIL_CHARS // 4  # the same end in tokens, at about 4 characters a token (the fleet simulation's)


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


def _sglang_tokenize(url: str, text: str, api_key: str | None) -> Sequence[int]:
    from agent_cache.backends.sglang import SGLangClient

    with SGLangClient(url, timeout=TOKENIZE_TIMEOUT, api_key=api_key) as client:
        tokens = client.tokenize(text, add_special_tokens=False).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ValueError(f"/tokenize of {url} answered no list of token ids")
    return tokens


class KvTokens:
    """Learns templates' and sessions' fingerprints for ``state`` from a worker's ``/tokenize``, on a
    background thread."""

    def __init__(self, state: KvState, *, api_key: str | None = None,
                 tokenize: Callable[[str, str], Sequence[int]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self._tokenize = tokenize or (lambda url, text: _sglang_tokenize(url, text, api_key))
        self._clock = clock
        self._jobs = Jobs(self._learn, "kv-tokens", max_queued=MAX_QUEUED, join_timeout=TOKENIZE_TIMEOUT + 1)
        self._asked: dict[str, float] = {}  # template -> when asked (queued, or failed and not yet retried)
        self._lock = threading.Lock()
        self.learnt = 0
        self.sessions_learnt = 0
        self.failed = 0

    def want(self, template_id: str | None, messages: Sequence[Mapping[str, Any]], worker: str, *,
             tenant: str = "default", session_id: str | None = None) -> None:
        """Queue what a served call teaches (no I/O here): its template, unless known; the session's
        last message (``session_id``: its key in the store), each time."""
        if session_id is not None:
            self.want_session(tenant, session_id, messages, worker)
        self.want_template(template_id, messages, worker)

    def want_session(self, tenant: str, session_id: str, messages: Sequence[Mapping[str, Any]], worker: str) -> None:
        text = last_text(messages)
        # no text, or a full queue: the session's older fingerprint is forgotten, not left to mislead
        if text is None or not self._jobs.submit(self._learn_session, tenant, session_id, text, worker):
            self.state.forget_session(tenant, session_id)

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
            # a full queue (a burst of new templates): the next call of this one asks again after RETRY_AFTER
            self._jobs.submit(self._learn_template, template_id, text, worker)

    @staticmethod
    def _learn(job: Callable[..., None], *args: Any) -> None:
        job(*args)

    def _ids(self, worker: str, text: str, what: str) -> list[int] | None:
        """The text's token ids as ``worker`` tokenizes it, less ``EDGE`` at each end (None: not asked)."""
        try:
            ids = list(self._tokenize(worker, text))
        except Exception as exc:  # a worker down or answering nonsense: the marks decide meanwhile
            self.failed += 1
            log.warning("could not learn %s's tokens from %s: %s", what, worker, exc)
            return None
        return ids[EDGE:-EDGE] if len(ids) > 2 * EDGE else []

    def _learn_template(self, template_id: str, text: str, worker: str) -> None:
        ids = self._ids(worker, text, f"template {template_id}")
        if ids is not None:
            self.state.learn_template(template_id, ids)
            self.learnt += 1

    def _learn_session(self, tenant: str, session_id: str, text: str, worker: str) -> None:
        ids = self._ids(worker, text, "a session's last message")
        if ids is None:
            self.state.forget_session(tenant, session_id)
        else:
            self.state.learn_session(tenant, session_id, ids, worker)
            self.sessions_learnt += 1

    def close(self) -> None:
        """Stop asking: what is still queued is dropped, the ask under way (if any) ends first."""
        self._jobs.close()
