"""``--log-format`` and ``--log-level``: the gateway's log lines as text (the default) or as one JSON
object per line, and which of them are written.

A JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``; an access log line
adds its fields (:mod:`agent_cache.gateway.access_log`). uvicorn's own loggers use the same format,
and so do the lines the command prints itself while it runs (:func:`own_line`: the start-up line).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from agent_cache.errors import ConfigError

FORMATS = ("text", "json")  # the first is the default
DEFAULT_LEVEL = "warning"
ACCESS_LOGGER = "agent_cache.access"
FIELDS = "access"  # the ``extra`` key an access log record carries its fields under
LEVEL_ALIASES = {"warn": "warning"}  # smg's spelling (``smg launch --log-level warn``)


def levels() -> tuple[str, ...]:
    """The levels ``--log-level`` takes: uvicorn's, which runs the process's logging."""
    from uvicorn.config import LOG_LEVELS

    return tuple(LOG_LEVELS)


def log_level(text: str, flag: str = "--log-level") -> str:
    """``text`` as one of :func:`levels` (any case; ``warn`` for warning); ConfigError naming ``flag``
    and the choices otherwise."""
    name = text.strip().lower()
    name = LEVEL_ALIASES.get(name, name)
    if name not in levels():
        aliases = {v: k for k, v in LEVEL_ALIASES.items()}
        choices = ", ".join(f"{n} (or {aliases[n]})" if n in aliases else n for n in levels())
        raise ConfigError(flag, f"unknown level {text!r}; choose from {choices}")
    return name


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """``LEVEL logger: message``, an access line's fields after it as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname}: {record.name}: {record.getMessage()}"
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def own_line(log_format: str, message: str, *, level: str = "info", logger: str = "agent_cache.gateway") -> str:
    """A line the command prints itself (not through logging: the start-up line is written whatever
    ``--log-level`` is), in ``log_format``: the message as it is, or a JSON line like the others."""
    if log_format != "json":
        return message
    record = logging.LogRecord(logger, logging.getLevelName(level.upper()), __name__, 0, message, None, None)
    return JsonFormatter().format(record)


def logging_config(log_format: str, level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the gateway process (uvicorn's ``log_config``).

    text: uvicorn's own configuration, plus the access lines (INFO) as text when ``level`` lets INFO
    through. json: every logger, uvicorn's included, as JSON lines on stderr at ``level``, and the
    access lines whatever ``level`` is (asking for JSON logs is asking for them).
    """
    import copy

    from uvicorn.config import LOGGING_CONFIG

    level = level.upper()
    if log_format == "text":
        config = copy.deepcopy(LOGGING_CONFIG)
        config["formatters"]["agent_cache"] = {"()": f"{__name__}.TextFormatter"}
        config["handlers"]["agent_cache"] = {"class": "logging.StreamHandler", "formatter": "agent_cache",
                                             "stream": "ext://sys.stderr"}
        config["loggers"][ACCESS_LOGGER] = {"handlers": ["agent_cache"], "level": level, "propagate": False}
        return config
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"agent_cache": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "agent_cache",
                                "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "agent_cache": {"handlers": ["stderr"], "level": level, "propagate": False},
            ACCESS_LOGGER: {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        },
    }
