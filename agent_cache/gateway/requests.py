"""An incoming gateway request made ready to route: its body read, its session found, then prepared
as a :class:`~agent_cache.calls.prepare.Call` by the same :func:`~agent_cache.calls.prepare.prepare`
as a ``ChatSGLang`` call.

Three endpoints are proxied: OpenAI's ``/v1/chat/completions`` and
``/v1/completions`` and SGLang's native ``/generate``. Each request is checked
against the fields SGLang accepts (an unknown field is an error naming it),
its session is found (header, then the OpenAI ``user`` field, then for chat
the conversation's fingerprint), and the tenant's ``extra_key`` is set so
tenants never share cached prompts.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Mapping

from agent_cache.backends.request_schema import check_depth
from agent_cache.calls import prepare as calls
from agent_cache.calls.jsonio import loads, loads_checked
from agent_cache.calls.prepare import CHAT, COMPLETION_FIELDS, COMPLETIONS, FIELDS, GENERATE, GENERATE_FIELDS, Call
from agent_cache.errors import InvalidRequestError, TemplateError
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.session_header import session_value
from agent_cache.templates.templater import Templater

# Fields OpenAI clients send that SGLang has no use for: accepted, not forwarded.
OPENAI_ONLY_FIELDS = frozenset({"store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier",
                                "modalities", "verbosity"})
# refused when tenants share the workers: SGLang keys a request's state by rid (a colliding rid
# takes over another request), and a custom logit processor is code the worker runs
SHARED_REFUSED = frozenset({"rid", "custom_logit_processor"})

_TENANT_HINT = "the gateway sets it from the API key's tenant"


def parse_json_body(raw: bytes) -> tuple[dict[str, Any], bool]:
    """The request body as a JSON object, or InvalidRequestError naming what is wrong; and whether its values
    need no further check (``prepare``'s ``checked_json``)."""
    try:
        body, checked = loads_checked(raw, True)
    except UnicodeDecodeError as exc:
        raise InvalidRequestError("body", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise InvalidRequestError("body", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequestError("body", "JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("body", f"expected a JSON object, got {type(body).__name__}")
    check_depth(body)  # before any walk of it (the session's inference, the templater) can recurse
    return body, checked


def find_session(headers: Mapping[str, str], header: str, body: Mapping[str, Any],
                 infer: Callable[[], str] | None) -> str:
    """The session of a request: the session header, the ``user`` field, the inferred one, or a fresh id."""
    for field, value in ((header, headers.get(header)), ("user", body.get("user"))):
        if value is not None:
            return session_value(value, field, header=field == header)
    return infer() if infer is not None else f"anon-{uuid.uuid4().hex}"


def prepare(path: str, body: dict[str, Any], *, grant: ApiKey, extra_key: str | None, session: str,
            templater: Templater | None, pool: str | None, extra_fields: frozenset[str],
            shared: bool = False, checked_json: bool = False, depth_checked: bool = False,
            started: float | None = None) -> Call:
    """Check one request and build its :class:`Call`; raises InvalidRequestError naming the bad field.

    ``shared``: the gateway serves several tenants (API keys), so fields that reach across requests
    on a worker (a request id another tenant could collide with, code the worker would run) are refused.
    ``checked_json``: every text in ``body`` is valid Unicode and every number finite (orjson read
    it), so that walk is skipped; ``depth_checked``: :func:`parse_json_body` read it (its nesting is checked);
    ``started``: when the request was read (``time.monotonic()``).
    """
    if "extra_body" in body:
        raise InvalidRequestError("extra_body", "not a request field: OpenAI clients merge extra_body into the body")
    if shared:
        for name in SHARED_REFUSED & body.keys():
            raise InvalidRequestError(name, "not accepted by a gateway serving several tenants (--api-keys)")
    dropped = (OPENAI_ONLY_FIELDS if path != GENERATE else frozenset()) - extra_fields
    params = {k: v for k, v in body.items() if k not in dropped}
    try:
        return calls.prepare(path, params, session=session, tenant=grant.tenant, pool=grant.pool or pool,
                             extra_key=extra_key, templater=templater, fields=FIELDS[path] | extra_fields,
                             owner=_TENANT_HINT, checked_json=checked_json, from_json=True,
                             stream_whole=False, depth_checked=depth_checked, started=started)
    except TemplateError as exc:
        field = exc.field if exc.field.startswith(("messages", "tools")) else f"messages.{exc.field}"
        raise InvalidRequestError(field, str(exc).split(": ", 1)[-1]) from None


__all__ = ["CHAT", "COMPLETIONS", "GENERATE", "COMPLETION_FIELDS", "GENERATE_FIELDS", "Call", "find_session",
           "loads", "parse_json_body", "prepare"]
