"""The gateway's options: every flag of ``agent-cache serve`` is a field of :class:`GatewayConfig` (the fleet's
in :class:`~agent_cache.routing.fleet.FleetConfig`, the header limits' in
:class:`~agent_cache.gateway.http_limits.HeaderLimits`), its default defined once here, and the whole
checked when it is made, before anything is bound, started or asked."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from agent_cache.backends.request_check import TENANT_FIELDS
from agent_cache.errors import ConfigError
from agent_cache.gateway.http_limits import HeaderLimits
from agent_cache.gateway.keys import ApiKey
from agent_cache.gateway.serving import check_port
from agent_cache.routing.config import DEFAULT_MAX_ATTEMPTS, DEFAULT_PROBE_INTERVAL, parse_workers
from agent_cache.routing.first_byte import DEFAULT_FLOOR
from agent_cache.routing.fleet import FleetConfig
from agent_cache.store import keys
from agent_cache.store.base import DEFAULT_PREFIX
from agent_cache.telemetry.log_format import DEFAULT_LEVEL, FORMATS, log_level
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
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# seconds calls in flight may take to finish on SIGTERM; not FleetConfig.drain_timeout (--worker-drain-timeout,
# 120 s), the longest a worker removed from the fleet keeps its calls
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE = 75  # seconds an idle client connection stays open: above load balancers' usual 60 s idle timeout

TRANSPORTS = ("httpx", "fast")  # the first is the default
HTTP_PARSERS = ("auto", "httptools", "h11")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# a field whose flag is not ``--`` and its name with dashes (the fleet's and the header limits' name their flags)
_FLAGS = {"redis_url": "--redis", "infer_sessions": "--no-infer-sessions", "worker_api_key": "AGENT_CACHE_API_KEY"}


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
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    probe_interval: float | None = DEFAULT_PROBE_INTERVAL
    extra_fields: frozenset[str] = field(default_factory=frozenset)  # request fields passed through unchecked
    worker_api_key: str | None = field(default=None, repr=False)  # the workers' --api-key, sent to them
    first_byte_floor: float = DEFAULT_FLOOR  # the shortest adaptive first-byte deadline of a call
    fleet: FleetConfig = field(default_factory=FleetConfig)  # workers added, drained, discovered at run time
    transport: str = TRANSPORTS[0]  # to the workers: httpx (the reference) or fast (asyncio + httptools)
    kv_events: Mapping[str, EventSource] | None = None  # worker URL -> its KV event publisher (docs/routing.md)
    # how the process serves (``agent-cache serve``; an app made with create_app is served by its caller)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    metrics_port: int | None = None  # /metrics on this port too, without an API key
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # on SIGTERM (not fleet.drain_timeout: a removed worker's)
    keep_alive: int = DEFAULT_KEEP_ALIVE
    header_limits: HeaderLimits = field(default_factory=HeaderLimits)
    http: str = HTTP_PARSERS[0]  # uvicorn's HTTP parser; auto: httptools
    loop: str = EVENT_LOOPS[0]  # uvicorn's event loop; auto: uvloop
    log_level: str = DEFAULT_LEVEL
    log_format: str = FORMATS[0]

    def __post_init__(self) -> None:
        if not self.workers and not self.fleet.dns:
            raise ConfigError("workers", "give at least one worker URL (or --workers-dns)")
        parsed = parse_workers(self.workers, allow_empty=True)  # each URL checked before anything starts
        if self.redis_url is not None:
            from agent_cache.store.redis_client import validate_redis_url  # the redis client, only with Redis

            validate_redis_url(self.redis_url)  # its shape here; whether Redis takes the gateway, at start-up
        keys.check_prefix(self.prefix)
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
        for name in ("timeout", "stall_timeout", "first_byte_floor", "drain_timeout", "keep_alive"):
            _seconds(name, getattr(self, name))
        if self.probe_interval is not None:
            _seconds("probe_interval", self.probe_interval)
        for name, value, choices in (("transport", self.transport, TRANSPORTS), ("http", self.http, HTTP_PARSERS),
                                     ("loop", self.loop, EVENT_LOOPS), ("log_format", self.log_format, FORMATS)):
            if value not in choices:
                raise ConfigError(name, f"expected one of {list(choices)}, got {value!r}")
        for name in ("port", "metrics_port"):
            port = getattr(self, name)
            if port is not None:
                check_port(port, name)
        if not isinstance(self.header_limits, HeaderLimits):
            raise ConfigError("header_limits", f"expected HeaderLimits, got {type(self.header_limits).__name__}")
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
        object.__setattr__(self, "log_level", log_level(self.log_level, "log_level"))  # any case, or smg's warn


def _seconds(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConfigError(name, f"expected seconds > 0, got {value!r}")


def default(name: str) -> Any:
    """The default of :class:`GatewayConfig`'s field ``name`` (the command's flags take theirs from here)."""
    found = GatewayConfig.__dataclass_fields__[name]
    return found.default_factory() if found.default_factory is not dataclasses.MISSING else found.default


def flag(field: str) -> str:
    """The flag (or variable) that sets :class:`GatewayConfig`'s field ``field``; another name as it is."""
    if field in _FLAGS:
        return _FLAGS[field]
    return "--" + field.replace("_", "-") if field in GatewayConfig.__dataclass_fields__ else field
