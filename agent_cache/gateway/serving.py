"""Running ``agent-cache serve``: its listeners and its start-up line.

The start-up line is printed once the port is bound (uvicorn's start-up, the application's lifespan
with its store check included, has finished), so a line on stderr means the gateway serves; it
names the port actually bound (``--port 0`` picks a free one). ``--metrics-port`` serves
``/metrics`` on a listener of its own, for in-cluster scraping without an API key. Client
connections are accepted by :class:`agent_cache.gateway.accepting.BoundedListener`, within the
budget of :class:`agent_cache.gateway.http_limits.Connections`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any, Callable

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from agent_cache.gateway.accepting import BoundedListener
from agent_cache.gateway.http_limits import Connections

_uvicorn_log = logging.getLogger("uvicorn.error")  # where uvicorn says why it could not bind


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, banner: Callable[[int], str], connections: Connections) -> None:
        super().__init__(config)
        self._banner, self._connections = banner, connections

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn's start-up with its listener (the loop's server) replaced by a bounded one
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config
        try:
            family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
            sock = socket.create_server((config.host, config.port), family=family, backlog=config.backlog)
        except (OSError, OverflowError) as exc:
            _uvicorn_log.error(exc)
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(config=config, server_state=self.server_state,  # type: ignore[call-arg]
                                              app_state=self.lifespan.state)

        listener = BoundedListener(sock, protocol, lambda: len(self.server_state.connections), self._connections.admit)
        self.servers = [listener]  # type: ignore[list-item] # what uvicorn's shutdown uses of a server
        self.started = True
        print(self._banner(sock.getsockname()[1]), file=sys.stderr, flush=True)


def start_metrics_listener(host: str, port: int) -> int:
    """Serve the process's Prometheus registry on ``host:port`` (a thread); the port bound.
    Raises OSError when it cannot be bound."""
    from prometheus_client import REGISTRY, start_http_server

    server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_address[1])


def run(app: Any, banner: Callable[[int], str], connections: Connections, **options: Any) -> bool:
    """``uvicorn.run(app, **options)`` (``options["http"]`` keeps its connections in ``connections``),
    printing ``banner(port)`` once serving; False if it never started."""
    server = _Server(uvicorn.Config(app, **options), banner, connections)
    server.run()
    return server.started
