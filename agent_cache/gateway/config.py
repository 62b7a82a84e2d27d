"""The gateway's options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from agent_cache.backends.request_check import TENANT_FIELDS
from agent_cache.errors import ConfigError
from agent_cache.gateway.keys import ApiKey
from agent_cache.routing.config import parse_workers
from agent_cache.routing.first_byte import DEFAULT_FLOOR
from agent_cache.routing.fleet import FleetConfig
from agent_cache.store.base import DEFAULT_PREFIX
from agent_cache.templates.templater import TemplateMode

if TYPE_CHECKING:
    from agent_cache.kv import EventSource

DEFAULT_SESSION_HEADER = "x-session-id"
DEFAULT_MAX_CONCURRENCY = 1024  # calls in flight per gateway process; more get 503 with Retry-After
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # a 128k-token prompt is ~0.5 MB; images in base64 need more
# what --extra-fields may not name: the fields the gateway itself sets, checks or refuses
NOT_PASSED_THROUGH = frozenset(TENANT_FIELDS) | {"messages", "prompt", "text", "input_ids", "tools", "stream",
                                                 "stream_options", "user", "rid", "custom_logit_processor"}
DEFAULT_TIMEOUT = 600.0  # seconds a worker may take to answer (non-streaming) or to send its next bytes
DEFAULT_STALL_TIMEOUT = 60.0  # seconds a stream may stay silent once its first event came


TRANSPORTS = ("httpx", "fast")


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
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # a hung worker mid-stream frees the call, its slot, its count
    max_attempts: int = 3
    probe_interval: float | None = 5.0
    extra_fields: frozenset[str] = field(default_factory=frozenset)  # request fields passed through unchecked
    worker_api_key: str | None = field(default=None, repr=False)  # the workers' --api-key, sent to them
    first_byte_floor: float = DEFAULT_FLOOR  # the shortest adaptive first-byte deadline of a call
    fleet: FleetConfig = field(default_factory=FleetConfig)  # workers added, drained, discovered at run time
    transport: str = "httpx"  # to the workers: httpx (the reference) or fast (asyncio + httptools)
    kv_events: Mapping[str, EventSource] | None = None  # worker URL -> its KV event publisher (docs/routing.md)

    def __post_init__(self) -> None:
        if not self.workers and not self.fleet.dns:
            raise ConfigError("workers", "give at least one worker URL (or --workers-dns)")
        parsed = parse_workers(self.workers, allow_empty=True)  # each URL checked before anything starts
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
        for name in ("timeout", "stall_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(name, f"expected seconds > 0, got {value!r}")
        if self.transport not in TRANSPORTS:
            raise ConfigError("transport", f"expected one of {list(TRANSPORTS)}, got {self.transport!r}")
        if self.kv_events is not None:
            from agent_cache.kv import EventSource

            if not isinstance(self.kv_events, Mapping) or not all(
                    isinstance(v, EventSource) for v in self.kv_events.values()):
                raise ConfigError("kv_events", "expected worker URL -> EventSource (agent_cache.kv.parse_sources)")
            urls = {w.url for w in parsed}
            strangers = sorted(set(self.kv_events) - urls)
            if strangers:
                raise ConfigError("kv_events", f"{strangers} are not among the workers: name each worker's "
                                               "publisher by the worker's own URL")
        owned = sorted(self.extra_fields & NOT_PASSED_THROUGH)
        if owned:
            raise ConfigError("extra_fields", f"{owned} are set or checked by the gateway and cannot pass through")
        object.__setattr__(self, "session_header", self.session_header.lower())
