"""The gateway's options and its API keys file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from agent_cache.backends.request_check import TENANT_FIELDS
from agent_cache.errors import ConfigError
from agent_cache.routing.config import check_tenant
from agent_cache.routing.first_byte import DEFAULT_FLOOR
from agent_cache.store.base import DEFAULT_PREFIX
from agent_cache.templates.templater import TemplateMode

DEFAULT_SESSION_HEADER = "x-session-id"
DEFAULT_MAX_CONCURRENCY = 1024  # calls in flight per gateway process; more get 503 with Retry-After
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # a 128k-token prompt is ~0.5 MB; images in base64 need more
# what --extra-fields may not name: the fields the gateway itself sets, checks or refuses
NOT_PASSED_THROUGH = frozenset(TENANT_FIELDS) | {"messages", "prompt", "text", "input_ids", "tools", "stream",
                                                 "stream_options", "user", "rid", "custom_logit_processor"}
DEFAULT_TIMEOUT = 600.0  # seconds a worker may take to answer (non-streaming) or to send its next bytes


@dataclass(frozen=True)
class ApiKey:
    """What one bearer key grants: the tenant whose cache namespace its calls use, and a pool."""

    tenant: str
    pool: str | None = None


def key_digest(key: str) -> str:
    """Keys are held and compared as digests: a dict lookup then leaks no timing about the key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def load_api_keys(path: str | Path) -> dict[str, ApiKey]:
    """Parse an API keys file: one ``KEY TENANT [POOL]`` per line; ``#`` starts a comment.

    Returns key digest -> :class:`ApiKey`. Errors name the line, never the key.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("api_keys", f"cannot read {path}: {exc}") from None
    keys: dict[str, ApiKey] = {}
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) not in (2, 3):
            raise ConfigError("api_keys", f"{path}:{number}: expected 'KEY TENANT [POOL]', got {len(parts)} fields")
        key, tenant = parts[0], parts[1]
        try:
            check_tenant(tenant)
        except ConfigError as exc:
            raise ConfigError("api_keys", f"{path}:{number}: {exc}") from None
        digest = key_digest(key)
        if digest in keys:
            raise ConfigError("api_keys", f"{path}:{number}: this key is already given on an earlier line")
        keys[digest] = ApiKey(tenant, parts[2] if len(parts) == 3 else None)
    if not keys:
        raise ConfigError("api_keys", f"{path} holds no key; leave --api-keys out to serve without keys")
    return keys


@dataclass(frozen=True)
class GatewayConfig:
    """Options of one gateway process (``agent-cache serve --help`` documents each)."""

    workers: Sequence[str | Mapping[str, Any]]
    redis_url: str | None = None
    prefix: str = DEFAULT_PREFIX  # key prefix in Redis: one per deployment
    session_header: str = DEFAULT_SESSION_HEADER
    api_keys: Mapping[str, ApiKey] | None = None  # key digest -> grant; None: no key needed
    templates: str = TemplateMode.SYSTEM.value
    infer_sessions: bool = True
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    timeout: float = DEFAULT_TIMEOUT
    max_attempts: int = 3
    probe_interval: float | None = 5.0
    extra_fields: frozenset[str] = field(default_factory=frozenset)  # request fields passed through unchecked
    worker_api_key: str | None = field(default=None, repr=False)  # the workers' --api-key, sent to them
    first_byte_floor: float = DEFAULT_FLOOR  # the shortest adaptive first-byte deadline of a streamed call

    def __post_init__(self) -> None:
        if not self.workers:
            raise ConfigError("workers", "give at least one worker URL")
        if not self.session_header or any(c.isspace() or c == ":" for c in self.session_header):
            raise ConfigError("session_header", f"not an HTTP header name: {self.session_header!r}")
        try:
            TemplateMode(self.templates)
        except ValueError:
            modes = [m.value for m in TemplateMode]
            raise ConfigError("templates", f"expected one of {modes}, got {self.templates!r}") from None
        for name in ("max_concurrency", "max_body_bytes", "max_attempts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, f"expected an integer >= 1, got {value!r}")
        if not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
            raise ConfigError("timeout", f"expected seconds > 0, got {self.timeout!r}")
        owned = sorted(self.extra_fields & NOT_PASSED_THROUGH)
        if owned:
            raise ConfigError("extra_fields", f"{owned} are set or checked by the gateway and cannot pass through")
        object.__setattr__(self, "session_header", self.session_header.lower())
