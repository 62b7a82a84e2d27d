"""Worker discovery through DNS, as a Kubernetes headless Service publishes its pods.

``--workers-dns [POOL=]NAME:PORT[,...]``: each name is resolved to its
addresses, and each address becomes the worker ``http://ADDRESS:PORT`` (in
``POOL``, default ``default``). A headless Service (``clusterIP: None``)
answers with one A/AAAA record per ready pod, so pods that become ready are
found and pods that go away are no longer listed.

The resolver is the system's (``getaddrinfo``) or, with ``--workers-dns-hosts
FILE``, a hosts-format file read again on every resolution (``ADDRESS NAME
[NAME...]`` per line): for a fixed map outside DNS, and for tests that change
what a name resolves to without touching the machine's resolver.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from agent_cache.errors import ConfigError
from agent_cache.values import DEFAULT_POOL

Resolver = Callable[[str, int], list[str]]  # (name, port) -> addresses; OSError when the name does not resolve


@dataclass(frozen=True)
class DnsTarget:
    """One ``[POOL=]NAME:PORT`` of ``--workers-dns``."""

    name: str
    port: int
    pool: str = DEFAULT_POOL

    def urls(self, addresses: Sequence[str]) -> list[str]:
        out = []
        for address in addresses:
            host = f"[{address}]" if ":" in address else address  # IPv6 in a URL is bracketed
            out.append(f"http://{host}:{self.port}")
        return sorted(set(out))


def parse_targets(specs: Sequence[str], field: str = "workers_dns") -> tuple[DnsTarget, ...]:
    """``[POOL=]NAME:PORT`` items (a string may hold several, comma-separated)."""
    out: list[DnsTarget] = []
    for spec in specs:
        for item in (s.strip() for s in spec.split(",")):
            if not item:
                continue
            pool, _, rest = item.rpartition("=")
            name, _, port = rest.rpartition(":")
            if not name or not port.isdigit() or not 0 < int(port) < 65536 or "/" in name or (pool == "" and "=" in item):
                raise ConfigError(field, f"expected [POOL=]NAME:PORT, got {item!r}")
            out.append(DnsTarget(name, int(port), pool or DEFAULT_POOL))
    return tuple(out)


def system_resolver(name: str, port: int) -> list[str]:
    """The name's addresses from the system resolver (A and AAAA records)."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class HostsFileResolver:
    """Resolves names from a hosts-format file, read again on each call (no system resolver involved)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self, name: str, port: int) -> list[str]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise OSError(f"cannot read {self.path}: {exc}") from None
        found = []
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and name in fields[1:]:
                try:
                    found.append(str(ipaddress.ip_address(fields[0])))
                except ValueError:
                    continue
        if not found:
            raise OSError(f"{name} is not in {self.path}")
        return sorted(set(found))


def discover(targets: Sequence[DnsTarget], resolver: Resolver) -> tuple[dict[str, str], list[str]]:
    """Resolve every target: (worker URL -> pool, the targets that did not resolve, as messages)."""
    found: dict[str, str] = {}
    failed: list[str] = []
    for target in targets:
        try:
            addresses = resolver(target.name, target.port)
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            failed.append(f"{target.name}:{target.port}: {exc}")
            continue
        for url in target.urls(addresses):
            found.setdefault(url, target.pool)
    return found, failed


__all__ = ["DnsTarget", "HostsFileResolver", "Resolver", "discover", "parse_targets", "system_resolver"]
