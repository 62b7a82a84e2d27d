"""Running ``agent-cache serve``: its listeners and its start-up line.

The start-up line is printed once the port is bound (uvicorn's start-up, the application's lifespan
with its store check included, has finished), so a line on stderr means the gateway serves; it
names the port actually bound (``--port 0`` picks a free one). ``--metrics-port`` serves
``/metrics`` on a listener of its own, for in-cluster scraping without an API key.
"""

from __future__ import annotations

import socket
import sys
from typing import Any, Callable

import uvicorn


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, banner: Callable[[int], str]) -> None:
        super().__init__(config)
        self._banner = banner

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else self.config.port
            print(self._banner(port), file=sys.stderr, flush=True)


def start_metrics_listener(host: str, port: int) -> int:
    """Serve the process's Prometheus registry on ``host:port`` (a thread); the port bound.
    Raises OSError when it cannot be bound."""
    from prometheus_client import REGISTRY, start_http_server

    server, _ = start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_address[1])


def run(app: Any, banner: Callable[[int], str], **options: Any) -> bool:
    """``uvicorn.run(app, **options)``, printing ``banner(port)`` once serving; False if it never started."""
    server = _Server(uvicorn.Config(app, **options), banner)
    server.run()
    return server.started
