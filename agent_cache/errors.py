"""One error hierarchy for agent-cache.

Every error derives from :class:`AgentCacheError`::

    AgentCacheError
    ├── ConfigError (also ValueError)           bad configuration; ``field`` names it
    ├── InvalidRequestError (also ValueError)   a caller's request is wrong; ``field`` names the part
    ├── BackendError                            one worker failed; ``url``, ``status``, ``retryable``,
    │   │                                       ``request_fault`` (the request caused it)
    │   ├── WorkerConnectionError  [retryable]  could not be reached, or dropped the connection
    │   ├── WorkerTimeoutError     [retryable]  silent past a deadline (first byte, stall)
    │   ├── WorkerHTTPError                     an HTTP error status
    │   │   ├── WorkerBadRequestError           4xx: another worker would refuse it too
    │   │   │   └── ContextLengthError          the prompt is too long
    │   │   ├── WorkerRefusedError [retryable]  401/403/404/405: this worker's key or path, until a
    │   │   │                                   second worker refuses the same request
    │   │   ├── WorkerRateLimitError [retryable] 429
    │   │   └── WorkerServerError  [retryable]  5xx
    │   ├── MalformedResponseError [retryable]  not HTTP, not JSON, not SGLang's shape
    │   ├── ResponseMismatchError  [request]    a JSON body where a stream was asked (or the reverse)
    │   ├── WorkerAbortedError     [retryable]  ``finish_reason: abort``
    │   └── StreamError            [retryable]  broke mid-stream, no ``[DONE]``, an error event
    ├── TemplateError (also ValueError)         messages or tools cannot be normalised
    ├── StoreError                              the metadata store failed
    │   ├── StoreUnavailableError               unreachable: routing goes on by hashing
    │   └── StoreRefusedError                   Redis refuses the credentials, ACL or database
    │                                           (``field``: ``redis_url``); retrying cannot help
    ├── RoutingError                            no worker can take the call
    │   └── NoHealthyWorkerError
    └── TraceFormatError (also ValueError)

Errors of one part only live with it, on the same base: the gateway's
``RequestRejectedError`` (``agent_cache.gateway.errors``) and the process
harness's ``BenchProcessError`` (``agent_cache.processes``).

Errors a LangChain user may see from a model call also derive from the
matching ``langchain_core.exceptions`` type (WorkerConnectionError and
NoHealthyWorkerError from ModelConnectionError, WorkerTimeoutError from
ModelTimeoutError, WorkerBadRequestError from ModelInvalidRequestError,
ContextLengthError from ContextOverflowError, ResponseMismatchError from
ModelInvalidRequestError, WorkerRateLimitError from
ModelRateLimitError, the other retryable ones from ModelAPIError), so
``except ModelConnectionError`` and ``except WorkerConnectionError`` both
work. That is why this bottom layer imports ``langchain_core.exceptions``:
``except`` matches real subclasses only (it ignores ``__subclasscheck__``),
so the LangChain types must be bases when the classes are made. Where
langchain-core is not installed (the gateway image, which runs no LangChain
code) plain stand-ins of the same names take their place.
"""

from __future__ import annotations

try:
    from langchain_core.exceptions import (
        ContextOverflowError,
        ModelAPIError,
        ModelConnectionError,
        ModelInvalidRequestError,
        ModelRateLimitError,
        ModelTimeoutError,
    )
except ModuleNotFoundError as exc:
    if exc.name != "langchain_core" and not (exc.name or "").startswith("langchain_core."):
        raise  # langchain-core is there but broken: say so

    # nothing can catch LangChain's types where LangChain is absent: the bases only keep the tree
    class _ModelError(Exception):
        is_retryable = False

    class ModelAPIError(_ModelError):  # type: ignore[no-redef]
        is_retryable = True

    class ModelConnectionError(_ModelError):  # type: ignore[no-redef]
        is_retryable = True

    class ModelTimeoutError(_ModelError):  # type: ignore[no-redef]
        is_retryable = True

    class ModelRateLimitError(_ModelError):  # type: ignore[no-redef]
        is_retryable = True

    class ModelInvalidRequestError(_ModelError):  # type: ignore[no-redef]
        pass

    class ContextOverflowError(_ModelError):  # type: ignore[no-redef]
        pass

class AgentCacheError(Exception):
    """Base of every error raised by agent-cache."""


class ConfigError(AgentCacheError, ValueError):
    """Bad configuration or input; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class InvalidRequestError(AgentCacheError, ValueError):
    """A caller's request is wrong (an unknown field, a value out of range, a body that is not JSON):
    the caller's fault, raised before anything is routed or written; ``field`` names the part.

    Not a :class:`ConfigError`: a gateway answers this one 400, while a configuration error met
    serving a call is its own (500)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


# --- backend (SGLang workers) -------------------------------------------------


class BackendError(AgentCacheError):
    """A call to one SGLang worker failed.

    ``url`` is the worker; ``retryable`` says whether the same request sent to
    another worker (or later) may succeed. ``request_fault`` says the request
    itself caused it (a 4xx, an answer that does not match what was asked, a
    5xx a second worker reproduced): answered to the caller, never counted
    against a worker (breakers, passive health, pin moves).
    """

    retryable: bool = False
    request_fault: bool = False

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status: int | None = None,
        retryable: bool | None = None,
    ) -> None:
        self.url = url
        self.status = status
        if retryable is not None:
            self.retryable = retryable
        # langchain-core's ModelError reads ``is_retryable``.
        self.is_retryable = self.retryable
        super().__init__(f"{message} (worker {url})")

    @property
    def second_opinion(self) -> bool:
        """Whether only a second worker can tell who caused this: a 5xx the request may have provoked."""
        return False

    def blame_request(self) -> None:
        """A second worker answered the same request the same way: the request's fault, not retried."""
        self.request_fault = True
        self.retryable = self.is_retryable = False


class WorkerConnectionError(BackendError, ModelConnectionError):
    """The worker could not be reached (refused, reset, DNS)."""

    retryable = True


class WorkerTimeoutError(BackendError, ModelTimeoutError):
    """The worker did not answer in time."""

    retryable = True


class WorkerHTTPError(BackendError):
    """The worker answered with an HTTP error status."""


class WorkerBadRequestError(WorkerHTTPError, ModelInvalidRequestError):
    """HTTP 4xx: the request itself is wrong; another worker would refuse it too."""

    retryable = False
    request_fault = True


class WorkerRefusedError(WorkerHTTPError, ModelAPIError):
    """HTTP 401/403/404/405 to a request the worker should serve (one that passed the gateway's checks, on
    a route SGLang has): most often the worker's configuration (an ``--api-key`` other than the fleet's, a
    path or a proxy in front of it), not the request. Only a second worker can tell: served there, the
    refusal counts against this worker (a hard failure: out of rotation at once); refused there too, it
    is the request's fault (:meth:`blame_request`) and answered as it is."""

    retryable = True

    @property
    def second_opinion(self) -> bool:
        return not self.request_fault


class ContextLengthError(WorkerBadRequestError, ContextOverflowError):
    """The prompt is longer than the worker accepts."""


class WorkerRateLimitError(WorkerHTTPError, ModelRateLimitError):
    """HTTP 429."""

    retryable = True


class WorkerServerError(WorkerHTTPError, ModelAPIError):
    """HTTP 5xx, including 503 while the worker is starting."""

    retryable = True

    @property
    def second_opinion(self) -> bool:
        # 502, 503 and 504 say the worker (or a proxy before it) cannot serve now, whatever was asked
        return not self.request_fault and self.status not in (502, 503, 504)


class MalformedResponseError(BackendError, ModelAPIError):
    """The worker's answer is not the JSON shape SGLang documents."""

    retryable = True


class ResponseMismatchError(BackendError, ModelInvalidRequestError):
    """The worker answered well-formed, but not what the request asked for (a JSON body where a stream
    was asked): an option of the request changed the answer's kind; another worker would do the same."""

    retryable = False
    request_fault = True


class WorkerAbortedError(BackendError, ModelAPIError):
    """The worker aborted the request (SGLang's ``finish_reason: abort``): not an answer; try again."""

    retryable = True


class StreamError(BackendError, ModelAPIError):
    """A stream ended without ``[DONE]`` or carried an error event."""

    retryable = True


# --- templates ----------------------------------------------------------------


class TemplateError(AgentCacheError, ValueError):
    """Messages or tools cannot be normalised; ``field`` names the bad part."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


# --- metadata store and routing ----------------------------------------------


class StoreError(AgentCacheError):
    """The metadata store failed."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached; routing falls back to degraded mode."""


class StoreRefusedError(StoreError):
    """Redis answers but refuses this client (credentials, ACL rules, database index): retrying cannot
    help, so not the degraded mode of an unreachable store; ``field`` is ``redis_url``, the setting to fix."""

    field = "redis_url"

    def __init__(self, message: str) -> None:
        super().__init__(f"redis_url: {message}")


class RoutingError(AgentCacheError):
    """No worker can take the call."""


class NoHealthyWorkerError(RoutingError, ModelConnectionError):
    """Every worker of the session's pool is unhealthy or draining."""

    is_retryable = True


# --- traces -------------------------------------------------------------------


class TraceFormatError(AgentCacheError, ValueError):
    """A trace file line is not valid; ``line`` is its 1-based number."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        super().__init__(f"{path}:{line}: {message}")
