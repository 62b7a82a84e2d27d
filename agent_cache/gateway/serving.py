"""Running ``agent-cache serve`` (and ``sim-worker``): its listeners and its start-up line.

The command binds its port itself (:func:`listen`) once its configuration is checked, so a port that
cannot be had is one line naming the flag, and uvicorn serves on that socket. The start-up line is
printed once uvicorn's start-up, the application's lifespan with its store check included, has
finished, so a line on stderr means the process serves; it names the port actually bound (``--port 0``
picks a free one). ``--metrics-port`` serves ``/metrics`` on a listener of its own, for in-cluster
scraping without an API key. The gateway's client connections are accepted by
:class:`agent_cache.gateway.accepting.BoundedListener`, within the budget of
:class:`agent_cache.gateway.http_limits.Connections`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any, Callable

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from agent_cache.errors import ConfigError
from agent_cache.gateway.accepting import BoundedListener
from agent_cache.gateway.http_limits import Connections

_uvicorn_log = logging.getLogger("uvicorn.error")  # where uvicorn says why it could not bind


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, banner: Callable[[int], str], connections: Connections | None) -> None:
        super().__init__(config)
        self._banner, self._connections = banner, connections

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        assert sockets, "run() serves on the socket the command bound"
        sock = sockets[0]
        if self._connections is None:  # uvicorn's own listener (the simulated worker)
            await super().startup(sockets)
            if self.started:
                print(self._banner(sock.getsockname()[1]), file=sys.stderr, flush=True)
            return
        # uvicorn's start-up with its listener (the loop's server) replaced by a bounded one
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config
        sock.listen(config.backlog)

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(config=config, server_state=self.server_state,  # type: ignore[call-arg]
                                              app_state=self.lifespan.state)

        listener = BoundedListener(sock, protocol, lambda: len(self.server_state.connections), self._connections.admit)
        self.servers = [listener]  # type: ignore[list-item] # what uvicorn's shutdown uses of a server
        self.started = True
        print(self._banner(sock.getsockname()[1]), file=sys.stderr, flush=True)


def check_port(port: int, flag: str) -> None:
    """ConfigError naming ``flag`` for a port no socket can have (checked with the configuration, before
    anything is bound)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(flag, f"a port is 0-65535, got {port}")


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``, bound as uvicorn binds one (``SO_REUSEADDR``), for :func:`run`;
    OSError when it cannot be (a port taken, an address not this host's). It listens at once: a socket
    only bound would let another (``--metrics-port`` on the same port) bind it too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()  # uvicorn sets its backlog when it serves
    except OSError:
        sock.close()
        raise
    return sock


def cannot_listen(flag: str, host: str, port: int, exc: OSError) -> str:
    """The one line saying why ``flag``'s port could not be had (the reason without its errno)."""
    reason = exc.strerror or str(exc)
    return f"{flag} {port}: cannot listen on {host}:{port}: {reason}"


def start_metrics_listener(host: str, port: int) -> int:
    """Serve the process's Prometheus registry on ``host:port`` (a thread); the port bound.
    Raises OSError when it cannot be bound."""
    from prometheus_client import REGISTRY, start_http_server

    server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_address[1])


def run(app: Any, banner: Callable[[int], str], sock: socket.socket, connections: Connections | None = None,
        **options: Any) -> bool:
    """``uvicorn.run(app, **options)`` on ``sock`` (from :func:`listen`), printing ``banner(port)`` once
    serving; with ``connections`` (the gateway), connections are accepted within its budget (``options["http"]``
    keeps its connections there). False if it never started."""
    server = _Server(uvicorn.Config(app, **options), banner, connections)
    server.run(sockets=[sock])
    return server.started
