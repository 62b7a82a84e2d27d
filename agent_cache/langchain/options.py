"""``ChatSGLang``'s constructor keywords, checked before pydantic sees them (an error names its field)."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Mapping

from pydantic.fields import FieldInfo

from agent_cache import environment
from agent_cache.backends.sglang import normalize_worker_url
from agent_cache.errors import ConfigError
from agent_cache.routing.router import Router


def checked_kwargs(kwargs: dict[str, Any], fields: Mapping[str, FieldInfo]) -> dict[str, Any]:
    """The keywords with the worker URLs resolved (keywords, then the router's, then the environment)
    and normalised; raises ConfigError naming a bad one (an unknown one first, with the option meant)."""
    known = _known(fields)
    for name in kwargs:
        if name not in known:
            raise unknown_option(name, fields)
    kwargs = dict(kwargs)
    base_url, workers = kwargs.get("base_url"), kwargs.get("workers")
    router = kwargs.get("router")
    if isinstance(router, Router):
        urls = [w.url for w in router.workers]
        given = [base_url] if base_url is not None else list(workers or [])
        if given and [normalize_worker_url(u, "workers") for u in given] != urls:
            raise ConfigError("workers", f"router= brings its own workers {urls}; leave base_url/workers out "
                                         "or give the same list")
        if not given:  # the router's workers are the model's
            workers = kwargs["workers"] = urls
    if base_url is None and not workers:  # environment second, after keywords
        base_url = kwargs["base_url"] = environment.value(environment.BASE_URL)
        if base_url is None:
            workers = environment.workers()
            if workers:
                kwargs["workers"] = workers
    if base_url is None and not workers:
        raise ConfigError("base_url", "give base_url (one worker) or workers (a list of worker URLs)")
    if base_url is not None and workers:
        raise ConfigError("workers", "give either base_url or workers, not both")
    if base_url is not None:
        kwargs["base_url"] = normalize_worker_url(base_url, "base_url")
    else:
        kwargs["workers"] = [normalize_worker_url(u, f"workers[{i}]") for i, u in enumerate(workers or [])]
    if kwargs.get("max_retries", 0) < 0:
        raise ConfigError("max_retries", f"must be >= 0, got {kwargs['max_retries']}")
    for name in ("timeout", "stall_timeout"):
        value = kwargs.get(name)
        if value is not None and (not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(name, f"must be a number of seconds > 0 or None, got {value!r}")
    return kwargs


# options ChatSGLang had and no longer has: named as removed rather than taken for a request field
REMOVED = {"prewarm": "prewarming was removed, as it measured no gain (see the CHANGELOG)"}


def unknown_option(name: str, fields: Mapping[str, FieldInfo]) -> ConfigError:
    """The error for an option ChatSGLang does not have, with a hint at the one meant."""
    if name in REMOVED:
        return ConfigError(name, f"ChatSGLang has no option {name!r} any more: {REMOVED[name]}")
    close = difflib.get_close_matches(name, sorted(_known(fields)), n=1, cutoff=0.6)
    if close:
        hint = f"; did you mean {close[0]!r}?"
    elif name in inspect.signature(Router).parameters:
        hint = f"; it is a Router option: ChatSGLang(router=Router(workers, {name}=...), ...)"
    else:
        hint = "; request fields go in model_kwargs or extra_body"
    return ConfigError(name, f"ChatSGLang has no option {name!r}{hint}")


def _known(fields: Mapping[str, FieldInfo]) -> set[str]:
    return set(fields) | {f.alias for f in fields.values() if f.alias}
