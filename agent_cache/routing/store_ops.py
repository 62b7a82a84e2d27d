"""The router's store calls as commands, run by a sync or an async runner.

A router operation (route, settle, flush, ...) is written once, as a
generator that yields :class:`StoreOp` commands and receives their results
(or has their errors thrown in); :func:`run` performs them with the store's
sync methods and :func:`arun` with its async twins (``"a" + method``), as
:func:`~agent_cache.routing.lifecycle.call_flow` does for a whole call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Generic, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True)
class StoreOp:
    """One call of a :class:`~agent_cache.store.base.MetadataStore` method with these arguments."""

    method: str
    args: tuple[Any, ...]


Flow = Generator[StoreOp, Any, T]


class _Steps(Generic[T]):
    """Feeds a flow each command's result or error; holds what it returned."""

    def __init__(self, flow: Flow[T]) -> None:
        self.flow = flow
        self._reply: Any = None
        self._error: BaseException | None = None
        self.result: Any = None

    def answer(self, reply: Any, error: BaseException | None) -> None:
        self._reply, self._error = reply, error

    def next(self) -> StoreOp | None:
        reply, error = self._reply, self._error
        self._reply = self._error = None
        try:
            return self.flow.throw(error) if error is not None else self.flow.send(reply)
        except StopIteration as stop:
            self.result = stop.value
            return None


# the flow decides which errors it handles; the rest come back out of it
def _call(method: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, BaseException | None]:
    try:
        return method(*args), None
    except BaseException as exc:
        return None, exc


async def _acall(method: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> tuple[Any, BaseException | None]:
    try:
        return await method(*args), None
    except BaseException as exc:
        return None, exc


def run(store: Any, flow: Flow[T]) -> T:
    """Run ``flow`` with the store's sync methods."""
    steps = _Steps(flow)
    while (op := steps.next()) is not None:
        steps.answer(*_call(getattr(store, op.method), op.args))
    return cast(T, steps.result)


async def arun(store: Any, flow: Flow[T]) -> T:
    """Run ``flow`` with the store's async methods."""
    steps = _Steps(flow)
    while (op := steps.next()) is not None:
        steps.answer(*await _acall(getattr(store, "a" + op.method), op.args))
    return cast(T, steps.result)
