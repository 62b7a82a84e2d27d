"""A response's head goes out with its first body bytes (one write), or at the loop's next turn."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_cache.gateway.writes import HeadWithBody

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> Any:
        return name


def test_a_head_is_written_with_the_body_that_follows_it() -> None:
    async def main() -> None:
        inner = _Transport()
        t = HeadWithBody(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(HEAD)
        assert inner.writes == [] and t.get_write_buffer_size() == len(HEAD)
        t.write(b"{}")
        t.write(b"data: more\n\n")  # later writes go as they come
        assert inner.writes == [HEAD + b"{}", b"data: more\n\n"]
        t.write(HEAD)  # a head whose body does not come in the same turn: written at the next
        await asyncio.sleep(0)
        assert inner.writes[-1] == HEAD
        t.write(HEAD)
        t.close()  # written before the connection closes
        assert inner.writes[-1] == HEAD and inner.closed
        t.write(HEAD)
        t.abort()  # an aborted connection sends nothing more
        await asyncio.sleep(0)
        assert inner.writes.count(HEAD) == 2 and inner.aborted
        assert t.get_extra_info("socket") == "socket"  # the rest is the transport's

    asyncio.run(main())
