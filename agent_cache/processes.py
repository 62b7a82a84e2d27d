"""Subprocesses on loopback ports, each logging to a file: started, waited for, and always stopped.

Used by the benchmark (simulated workers, Redis, smg, gateways) and by the real-SGLang harness. A process
that dies while waited for fails with its log's tail; ``Processes.close()`` stops every one (terminate,
then kill) and removes their log folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Callable, Mapping, Sequence

import httpx

from agent_cache.errors import AgentCacheError


class BenchProcessError(AgentCacheError):
    """A process started here (simulated worker, Redis, smg, load replica, SGLang server) failed.

    The message names the process and carries the tail of its log. Raised only by the benchmark and the
    real-SGLang harness, so it lives with them rather than in the core tree.
    """


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One subprocess and its log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str, env: Mapping[str, str] | None = None,
                 *, group: bool = False) -> None:
        """``group``: the process leads a process group of its own, and stopping it stops the whole group (a
        server that starts worker processes of its own, as SGLang does, leaves none behind)."""
        self.name = name
        self.log_path = log_path
        self.group = group
        self._log = open(log_path, "wb")
        try:
            self.popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT,
                                          env=None if env is None else dict(env), start_new_session=group)
        except OSError as exc:
            self._log.close()
            raise BenchProcessError(f"{name}: cannot start {argv[0]}: {exc}") from exc

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def check(self) -> None:
        if not self.alive():
            raise BenchProcessError(f"{self.name} exited with status {self.popen.returncode}; "
                                    f"log tail:\n{self.tail()}")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process (to its whole group when it leads one)."""
        try:
            if self.group:
                os.killpg(self.popen.pid, sig)
            else:
                self.popen.send_signal(sig)
        except ProcessLookupError:  # gone already
            pass

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (to the group's every process when it leads one)."""
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(10)
        if self.group:
            self.signal(signal.SIGKILL)  # children the leader left behind
        self._log.close()


class Processes:
    """Starts subprocesses and stops all of them (and removes their temp dir) on close."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="agent-cache-procs-")
        self._procs: list[Proc] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
              group: bool = False) -> Proc:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        proc = Proc(name, argv, os.path.join(self.dir, safe + ".log"), env, group=group)
        self._procs.append(proc)
        return proc

    def stop(self, proc: Proc, grace: float = 5.0) -> None:
        proc.stop(grace)
        if proc in self._procs:
            self._procs.remove(proc)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.alive()]

    def close(self) -> None:
        errors = []
        for proc in reversed(self._procs):
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self._procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> "Processes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(ready: Callable[[], bool], procs: Sequence[Proc], what: str, timeout: float = 30.0) -> None:
    """Poll ``ready`` until it is true; fail with the log of a process that died, or on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            p.check()
        try:
            if ready():
                return
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}:\n{p.tail(600)}" for p in procs)
            raise BenchProcessError(f"{what} not ready after {timeout:.0f} s\n{tails}")
        time.sleep(0.1)
