"""The ``agent-cache`` command."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Iterable, Sequence, TypeVar

from agent_cache import environment
from agent_cache.errors import ConfigError


def _sim_worker(args: argparse.Namespace) -> int:
    from agent_cache.gateway import serving
    from agent_cache.sim import WorkerOptions, create_app
    from agent_cache.sim.latency_flags import latency_from_args

    options = WorkerOptions(
        served_model_name=args.served_model_name,
        model_path=args.model_path,
        max_total_tokens=args.max_total_tokens,
        context_length=args.context_length,
        page_size=args.page_size,
        radix_eviction_policy=args.radix_eviction_policy,
        disable_radix_cache=args.disable_radix_cache,
        enable_cache_report=args.enable_cache_report,
        enable_metrics=args.enable_metrics,
        max_running_requests=args.max_running_requests,
        schedule_policy=args.schedule_policy,
        chunked_prefill_size=args.chunked_prefill_size,
        max_prefill_tokens=args.max_prefill_tokens,
        sglang_version=args.sglang_version,
        time_scale=args.time_scale,
        startup_seconds=args.startup_seconds,
        latency=latency_from_args(args),
        kv_events_config=args.kv_events_config,
        tokenizer_path=args.tokenizer_path,
    )
    try:
        serving.check_port(args.port, "--port")
        app = create_app(options)  # reads --tokenizer-path
    except ConfigError as exc:
        print(f"agent-cache sim-worker: {exc}", file=sys.stderr)
        return 2
    try:
        sock = serving.listen(args.host, args.port)
    except OSError as exc:
        print(f"agent-cache sim-worker: error: {serving.cannot_listen('--port', args.host, args.port, exc)}",
              file=sys.stderr)
        return 1
    started = serving.run(app, lambda port: f"simulated SGLang worker (not SGLang) on "
                          f"http://{args.host}:{port}", sock, log_level=args.log_level, access_log=False)
    return 0 if started else 1


_Num = TypeVar("_Num", int, float)


def _positive(kind: type[_Num]) -> Callable[[str], _Num]:
    def parse(text: str) -> _Num:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _kv_event_sources(text: str) -> Any:
    import importlib.util

    from agent_cache.kv import parse_sources

    from agent_cache.errors import ConfigError

    if importlib.util.find_spec("zmq") is None or importlib.util.find_spec("msgpack") is None:
        raise argparse.ArgumentTypeError("KV events need pyzmq and msgpack: pip install 'agent-cache[kv]'")
    try:
        return parse_sources(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _kv_events_config(text: str) -> str:
    from agent_cache.sim.kv_publisher import KVEventsConfig

    try:
        KVEventsConfig.from_cli(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    return text


def worker_urls(values: Iterable[str], field: str = "--workers") -> list[str]:
    """Worker URLs as every command takes them: ``a,b``, ``a b`` or the flag repeated; each one checked and
    normalised (a bad one raises ConfigError naming ``field`` and the URL)."""
    from agent_cache.backends.sglang import normalize_worker_url

    urls = [normalize_worker_url(url, field) for value in values for url in value.replace(",", " ").split()]
    if not urls:
        raise ConfigError(field, "no worker URL given")
    return urls


class _WorkersAction(argparse.Action):
    """``--workers`` (and smg's spelling ``--worker-urls``): URLs split by commas or spaces, repeatable; the first
    flag replaces the $AGENT_CACHE_WORKERS default. A bad URL is one line and exit status 2, as argparse's errors."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            urls = worker_urls(values, option_string or "--workers")
        except ConfigError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
        given = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, urls if given is self.default else [*(given or []), *urls])


class _LogLevelAction(argparse.Action):
    """``--log-level``: uvicorn's levels, any case, and ``warn`` (smg's spelling) for warning; another is one
    line naming the flag and the choices, exit status 2."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from agent_cache.telemetry.log_format import log_level

        try:
            setattr(namespace, self.dest, log_level(values, option_string or "--log-level"))
        except ConfigError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")


def _add_log_level(p: argparse.ArgumentParser) -> None:
    from agent_cache.telemetry.log_format import DEFAULT_LEVEL, levels

    p.add_argument("--log-level", action=_LogLevelAction, default=DEFAULT_LEVEL, metavar="LEVEL",
                   help=f"{', '.join(levels())} (or warn; default %(default)s)")


def _add_workers(p: argparse.ArgumentParser, what: str, otherwise: str = "") -> None:
    p.add_argument("--workers", "--worker-urls", dest="workers", nargs="+", action=_WorkersAction, metavar="URL",
                   default=environment.workers(),
                   help=f"{what}: 'URL URL', 'URL,URL' or repeated (default: ${environment.WORKERS}{otherwise})")


def _add_sim_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from agent_cache.sim import WorkerOptions
    from agent_cache.sim.latency_flags import add_latency_args, non_negative
    from agent_cache.sim.scheduler import SCHEDULE_POLICIES
    from agent_cache.sim.versions import LATEST_VERSION, SUPPORTED_VERSIONS

    d = WorkerOptions()  # the defaults are the worker's own, but where the command differs (said below)
    p = sub.add_parser("sim-worker", help="run one simulated SGLang worker (flags named as SGLang's)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", default=d.served_model_name)
    p.add_argument("--model-path", default=d.model_path)
    p.add_argument("--tokenizer-path", default=None, metavar="DIR",
                   help="count tokens with this model folder's tokenizer and chat template, as a real server of that "
                        "model does (default: the simulator's own; needs agent-cache[bench])")
    p.add_argument("--max-total-tokens", type=_positive(int), default=d.max_total_tokens, help="KV capacity in tokens")
    p.add_argument("--context-length", type=_positive(int), default=d.context_length)
    p.add_argument("--page-size", type=_positive(int), default=d.page_size)
    p.add_argument("--radix-eviction-policy", choices=["lru", "lfu"], default=d.radix_eviction_policy)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--enable-cache-report", action=argparse.BooleanOptionalAction, default=d.enable_cache_report,
                   help="report cached_tokens in chat usage (SGLang's --enable-cache-report; on by default here)")
    p.add_argument("--enable-metrics", action="store_true", help="serve /metrics (off by default, as in SGLang)")
    p.add_argument("--max-running-requests", type=_positive(int), default=None,
                   help="default: as SGLang derives it, min(max_total_tokens // 2, request pool of 2048-4096)")
    p.add_argument("--schedule-policy", choices=list(SCHEDULE_POLICIES), default=d.schedule_policy,
                   help="waiting-queue order: fcfs (SGLang's default) or lpm (longest cached prefix first)")
    p.add_argument("--chunked-prefill-size", type=_positive(int), default=d.chunked_prefill_size,
                   help="new tokens per prefill pass (SGLang's default on an 80 GB GPU)")
    p.add_argument("--max-prefill-tokens", type=_positive(int), default=d.max_prefill_tokens)
    p.add_argument("--sglang-version", choices=list(SUPPORTED_VERSIONS), default=d.sglang_version, metavar="0.5.N",
                   help=f"serve this SGLang release's routes and fields (0.5.1-{LATEST_VERSION}; default {LATEST_VERSION})")
    p.add_argument("--time-scale", type=non_negative, default=1.0,  # the worker's own default is instant (tests)
                   help="1 = the latency model in real time, 0 = instant (default 1)")
    p.add_argument("--startup-seconds", type=non_negative, default=d.startup_seconds,
                   help="answer /health with 503 this long")
    p.add_argument("--kv-events-config", type=_kv_events_config, default=None, metavar="JSON",
                   help='publish KV cache events as SGLang does, e.g. \'{"publisher": "zmq", "endpoint": '
                        '"tcp://*:5557", "topic": "kv"}\' (SGLang\'s fields: publisher, endpoint, replay_endpoint, '
                        "buffer_steps, hwm, max_queue_size, topic)")
    add_latency_args(p)
    _add_log_level(p)
    p.set_defaults(func=_sim_worker)


def _demo(args: argparse.Namespace) -> int:
    from agent_cache.demo import run_demo

    try:
        if args.workers:  # flags were checked as parsed; this checks $AGENT_CACHE_WORKERS
            args.workers = worker_urls(args.workers, environment.WORKERS)
        return run_demo(args)
    except ConfigError as exc:  # a bad URL in $AGENT_CACHE_WORKERS, a bad --redis
        print(f"agent-cache demo: {exc}", file=sys.stderr)
        return 2


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from agent_cache.sim.latency_flags import non_negative

    p = sub.add_parser("demo", help="ReAct agents through agent-cache and through round-robin, side by side")
    _add_workers(p, "real SGLang worker URLs, their caches flushed before each run", ", else a simulated fleet")
    p.add_argument("--redis", metavar="URL", default=environment.value(environment.REDIS_URL),
                   help=f"keep routing metadata in this Redis (default: ${environment.REDIS_URL}, else in-process)")
    p.add_argument("--sessions", type=_positive(int), default=40, help="ReAct sessions per run (default 40: 120 calls, so p99 is not just the slowest call)")
    p.add_argument("--concurrency", type=_positive(int), default=4, help="sessions running at once (default 4)")
    p.add_argument("--quick", action="store_true", help="a short run (6 sessions)")
    p.add_argument("--fleet-size", type=_positive(int), default=4, help="simulated workers (default 4)")
    p.add_argument("--time-scale", type=non_negative, default=1.0,
                   help="simulated latency: 1 = the latency model in real time, 0 = instant (default 1)")
    p.add_argument("--model", default=None, help="model name sent to the workers")
    p.set_defaults(func=_demo)


def _add_explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="where prompts of a trace diverge from their cacheable prefix, and why",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _explain(args.rest))


def _explain(rest: list[str]) -> int:
    from agent_cache.templates.explain import main_explain

    return main_explain(rest)


def _stats(args: argparse.Namespace) -> int:
    import json

    from agent_cache.errors import StoreError
    from agent_cache.redact import redact_url
    from agent_cache.store import RedisStore, format_stats, stats_snapshot

    store = RedisStore(args.redis, prefix=args.prefix)
    try:
        snapshot = stats_snapshot(store)
    except StoreError as exc:  # unreachable, or refusing these credentials
        print(f"agent-cache stats: cannot read the store at {redact_url(args.redis)}: {redact_url(exc)}",
              file=sys.stderr)
        return 1
    finally:
        store.close()
    print(json.dumps(snapshot, indent=2, default=str) if args.json else format_stats(snapshot))
    return 0


def _add_deployment_args(p: argparse.ArgumentParser) -> None:
    """``--redis`` (required unless $AGENT_CACHE_REDIS_URL is set) and ``--prefix``: the deployment to read."""
    from agent_cache.store.base import DEFAULT_PREFIX

    default = environment.value(environment.REDIS_URL)
    p.add_argument("--redis", required=default is None, default=default, metavar="URL",
                   help=f"redis://host:6379/0, as given to ChatSGLang (default: ${environment.REDIS_URL})")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="key prefix of the deployment (default %(default)s)")


def _add_stats(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stats", help="the live picture from the metadata store: workers, sessions, templates, hit rates")
    _add_deployment_args(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.set_defaults(func=_stats)


def _store_ready(url: str | None, prefix: str, *, debug: bool, log_format: str) -> bool:
    """Whether Redis takes the gateway's calls, asked as a call asks it (the store's asyncio client, its
    scripts, its ACL rules). A refusal is one line naming the cause (with the traceback under debug): the
    gateway stops before it serves rather than answer every call with an error. An unreachable Redis is
    one warning line (in ``log_format``: the gateway goes on): the gateway starts and routes degraded
    until Redis answers."""
    if url is None:
        return True
    import asyncio
    import traceback

    from agent_cache.errors import ConfigError, StoreError, StoreUnavailableError
    from agent_cache.redact import redact_url
    from agent_cache.store import RedisStore
    from agent_cache.telemetry.log_format import own_line

    async def check(store: RedisStore) -> None:
        try:
            await store.acheck()
        finally:
            await store.aclose()

    try:
        store = RedisStore(url, prefix=prefix)
        try:
            asyncio.run(check(store))
        finally:
            store.close()
    except (ConfigError, StoreError) as exc:
        if debug:
            traceback.print_exc()
        reason = redact_url(str(exc).removeprefix("redis_url: "))
        if isinstance(exc, StoreUnavailableError):
            # Redis may come up after the gateway (a pod restart, a rolling update): route by hashing
            # until it answers, as the gateway does when Redis goes away while it runs.
            reason = f"cannot reach Redis ({reason.removeprefix('redis unavailable: ')})"
            warning = f"--redis {redact_url(url)}: {reason}; routing degraded (by hashing) until it answers"
            if log_format == "text":
                warning = f"agent-cache serve: warning: {warning}"
            print(own_line(log_format, warning, level="warning"), file=sys.stderr)
            return True
        print(f"agent-cache serve: error: --redis {redact_url(url)}: {reason}", file=sys.stderr)
        return False
    return True


def _serve(args: argparse.Namespace) -> int:
    import socket

    from agent_cache.errors import ConfigError
    from agent_cache.gateway import GatewayConfig, admin, create_app, http_limits, load_api_keys, serving
    from agent_cache.gateway import config as gw
    from agent_cache.telemetry import log_format, tracing

    # Every option is checked before anything is bound, started or asked: a bad one is its own one line,
    # never hidden behind a port taken or a Redis away.
    workers: list[str | dict[str, str]] = []
    try:
        if args.workers:  # flags were checked as parsed; this checks $AGENT_CACHE_WORKERS
            workers += worker_urls(args.workers, environment.WORKERS)
        for spec in args.pool or []:
            name, _, urls = spec.partition("=")
            if not name or not urls:
                raise ConfigError("--pool", f"expected NAME=URL[,URL...], got {spec!r}")
            workers += [{"url": u.strip(), "pool": name} for u in urls.split(",") if u.strip()]
        config = GatewayConfig(
            workers, redis_url=args.redis, prefix=args.prefix, session_header=args.session_header,
            api_keys=load_api_keys(args.api_keys) if args.api_keys else None, templates=args.templates,
            infer_sessions=not args.no_infer_sessions, max_concurrency=args.max_concurrency,
            max_body_bytes=args.max_body_bytes, timeout=args.timeout, stall_timeout=args.stall_timeout,
            max_attempts=args.max_attempts,
            extra_fields=frozenset(f.strip() for f in (args.extra_fields or "").split(",") if f.strip()),
            worker_api_key=environment.value(environment.API_KEY), first_byte_floor=args.first_byte_floor,
            fleet=admin.fleet_config(args),
            transport=args.transport, kv_events=args.kv_events,
            host=args.host, port=args.port, metrics_port=args.metrics_port,
            drain_timeout=args.drain_timeout, keep_alive=args.keep_alive, header_limits=http_limits.from_args(args),
            http=args.http, loop=args.loop, log_level=args.log_level, log_format=args.log_format,
        )
    except ConfigError as exc:  # named by its flag
        print(f"agent-cache serve: {gw.flag(exc.field)}: {str(exc).split(': ', 1)[-1]}", file=sys.stderr)
        return 2
    if not _store_ready(config.redis_url, config.prefix, debug=config.log_level == "debug",
                        log_format=config.log_format):
        return 1
    flag, port = "--port", config.port
    listeners: list[socket.socket] = []
    try:
        listeners.append(serving.listen(config.host, port))
        metrics = ""
        if config.metrics_port is not None:
            flag, port = "--metrics-port", config.metrics_port
            bound = serving.start_metrics_listener(config.host, port)
            metrics = f", metrics on http://{config.host}:{bound}/metrics"
    except OSError as exc:  # a port taken, an address not this host's
        for sock in listeners:
            sock.close()
        print(f"agent-cache serve: error: {serving.cannot_listen(flag, config.host, port, exc)}", file=sys.stderr)
        return 1
    try:
        app = create_app(config)
    except ConfigError as exc:
        listeners[0].close()
        print(f"agent-cache serve: {exc}", file=sys.stderr)
        return 2
    keys = "off" if config.api_keys is None else f"{len(config.api_keys)} keys"

    def banner(port: int) -> str:  # printed once the port is bound and the store checked
        return log_format.own_line(config.log_format, (
            f"agent-cache gateway on http://{config.host}:{port} -> {len(workers)} workers "
            f"(store: {'redis' if config.redis_url else 'in-process'}, API keys: {keys}{metrics}, "
            f"tracing: {'on' if tracing.tracer() is not None else 'off'})"))

    limits = config.header_limits
    connections = http_limits.Connections(http_limits.raise_open_file_limit(), limits.max_pending)
    started = serving.run(
        app, banner, listeners[0], connections, log_level=config.log_level, access_log=False,
        log_config=log_format.logging_config(config.log_format, config.log_level),
        timeout_graceful_shutdown=config.drain_timeout, timeout_keep_alive=config.keep_alive, backlog=4096,
        loop=config.loop, proxy_headers=False,  # no client address is used: skip its rewrite
        **http_limits.uvicorn_options(limits, config.http, connections))
    return 0 if started else 1


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from agent_cache.gateway import admin, http_limits
    from agent_cache.gateway import config as gw
    from agent_cache.routing.first_byte import DEFAULT_FACTOR
    from agent_cache.templates.templater import TemplateMode
    from agent_cache.telemetry.log_format import FORMATS

    # every default is GatewayConfig's (gw.default): defined once, with the checks of the whole
    p = sub.add_parser("serve", help="an OpenAI-compatible gateway with sticky, template-aware routing "
                                     "(docs/gateway.md)")
    _add_workers(p, "SGLang worker URLs")
    p.add_argument("--pool", action="append", metavar="NAME=URL,...",
                   help="workers of a named pool (repeatable); a key or the x-agent-cache-pool header picks one")
    p.add_argument("--redis", default=environment.value(environment.REDIS_URL), metavar="URL",
                   help=f"metadata store shared by every replica (default: ${environment.REDIS_URL}; "
                        "none: in-process, one replica)")
    p.add_argument("--prefix", default=gw.default("prefix"), help="key prefix of the deployment (default %(default)s)")
    p.add_argument("--host", default=gw.default("host"))
    p.add_argument("--port", type=int, default=gw.default("port"))
    p.add_argument("--api-keys", metavar="FILE",
                   help="'KEY TENANT [POOL] [rpm= tpm= role= pools= allow=]' per line; calls then need a key")
    p.add_argument("--session-header", default=gw.default("session_header"),
                   help="header naming a call's session (default %(default)s)")
    p.add_argument("--templates", default=gw.default("templates"), choices=[m.value for m in TemplateMode],
                   help="prompt normalisation, as ChatSGLang(templates=...) (default %(default)s)")
    p.add_argument("--no-infer-sessions", action="store_true",
                   help="a chat call without a session header or user field gets a fresh session "
                        "instead of its conversation's")
    p.add_argument("--max-concurrency", type=_positive(int), default=gw.default("max_concurrency"),
                   help="calls in flight before 503 + Retry-After (default %(default)s)")
    p.add_argument("--max-body-bytes", type=_positive(int), default=gw.default("max_body_bytes"),
                   help="largest request body (default %(default)s)")
    p.add_argument("--timeout", type=_positive(float), default=gw.default("timeout"),
                   help="seconds a worker may take to answer or to send its next stream event (default %(default)s)")
    p.add_argument("--stall-timeout", type=_positive(float), default=gw.default("stall_timeout"),
                   help="seconds a stream may stay silent once its first event came; past it the stream ends "
                        "with an error event and its slot and counts are freed (default %(default)s)")
    p.add_argument("--max-attempts", type=_positive(int), default=gw.default("max_attempts"),
                   help="tries per call across workers (default %(default)s)")
    p.add_argument("--first-byte-floor", type=_positive(float), default=gw.default("first_byte_floor"),
                   help=f"a call's first attempt waits {DEFAULT_FACTOR:g} x the worker's recent p95 time to first "
                        "byte, at least this many seconds, before trying another worker (default %(default)s)")
    p.add_argument("--transport", default=gw.default("transport"), choices=list(gw.TRANSPORTS),
                   help="client to the workers: httpx (default) or fast, an asyncio + httptools client "
                        "using less CPU per call (docs/benchmarks.md)")
    p.add_argument("--kv-events", type=_kv_event_sources, default=None, metavar="URL=ENDPOINT[|REPLAY],...",
                   help="read the workers' KV events (SGLang --kv-events-config): each worker URL with the "
                        "endpoint its publisher binds, e.g. http://w0:30000=tcp://w0:5557|tcp://w0:5558 "
                        "(optional replay endpoint); placement then knows which workers hold each template "
                        "(docs/routing.md, \"KV events\"). Needs the kv extra: pip install 'agent-cache[kv]'")
    p.add_argument("--extra-fields", metavar="NAME,...",
                   help="request fields to pass through unchecked (fields of a newer SGLang)")
    p.add_argument("--drain-timeout", type=_positive(float), default=gw.default("drain_timeout"),
                   help="seconds to let in-flight calls finish on SIGTERM (default %(default)s; "
                        "--worker-drain-timeout is a removed worker's)")
    p.add_argument("--keep-alive", type=_positive(int), default=gw.default("keep_alive"),
                   help="seconds an idle client connection stays open (default %(default)s: longer than the "
                        "60 s idle timeout of common load balancers, so they never reuse a closed one)")
    http_limits.add_arguments(p)
    admin.add_arguments(p)
    _add_log_level(p)
    p.add_argument("--log-format", default=gw.default("log_format"), choices=list(FORMATS),
                   help="log lines as text, or one JSON object per line; json also writes an access line per "
                        "call (request id, tenant, session hash, worker, status, latency, cached tokens)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", default=gw.default("metrics_port"),
                   help="serve /metrics on this port too, without an API key (for in-cluster scraping); with "
                        "--api-keys, /metrics on --port needs an admin key")
    p.add_argument("--http", default=gw.default("http"), choices=list(gw.HTTP_PARSERS),
                   help="HTTP parser (default auto: httptools, installed with agent-cache; docs/benchmarks.md)")
    p.add_argument("--loop", default=gw.default("loop"), choices=list(gw.EVENT_LOOPS),
                   help="event loop (default auto: uvloop, installed with agent-cache; docs/benchmarks.md)")
    p.set_defaults(func=_serve)


def _metrics_server(args: argparse.Namespace) -> int:
    import signal
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from agent_cache.redact import redact_url
    from agent_cache.store import RedisStore
    from agent_cache.store.exporter import StoreCollector

    store = RedisStore(args.redis, prefix=args.prefix)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    server, thread = start_http_server(args.port, addr=args.host, registry=registry)
    print(f"agent-cache metrics on http://{args.host}:{args.port}/metrics from {redact_url(args.redis)} "
          f"(prefix {args.prefix})", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(5)
    store.close()
    return 0


def _add_metrics_server(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("metrics-server", help="serve the metadata store's picture (sessions, load, hit rates per "
                                              "worker) as Prometheus metrics")
    _add_deployment_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9464)
    p.set_defaults(func=_metrics_server)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # listed for --help; main() hands the arguments to agent_cache.bench.runner
    sub.add_parser("bench", help="compare routing policies on agent workloads: fleet simulation (--engine sim) "
                   "or real processes with the smg gateway (--engine real); see bench --help")


def _add_sglang_cpu(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # listed for --help; main() hands `sglang-cpu setup` to agent_cache.sglang_cpu.install
    sub.add_parser("sglang-cpu", help="real SGLang on this CPU for tests and benchmarks: `sglang-cpu setup "
                   "[--version 0.5.N]` installs a release in an environment of its own (see docs/real-sglang.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-cache", description="Prefix-cache-aware middleware for LLM agents on SGLang")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_demo(sub)
    _add_explain(sub)
    _add_metrics_server(sub)
    _add_serve(sub)
    _add_sim_worker(sub)
    _add_sglang_cpu(sub)
    _add_stats(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-cache")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from agent_cache import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["explain"]:  # explain and bench own their flags, --help included
        return _explain(argv[1:])
    if argv[:1] == ["bench"]:
        from agent_cache.bench.runner import main_bench

        return main_bench(argv[1:])
    if argv[:2] == ["sglang-cpu", "setup"]:
        from agent_cache.sglang_cpu.install import main as setup_main

        return setup_main(argv[2:])
    args = build_parser().parse_args(argv)
    if args.command == "sglang-cpu":
        print("agent-cache sglang-cpu: the one action is `setup` (agent-cache sglang-cpu setup --help)",
              file=sys.stderr)
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
