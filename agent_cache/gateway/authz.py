"""What an API key may do through the gateway: which pools, which reserved fields, which endpoints,
and what it is told about the workers.

- A key's pools bind it: the pool header can only choose among them (403 naming the header).
- ``priority`` and ``lora_path`` (and ``/generate``'s ``lora_id``, the same adapter choice) are
  refused (403 naming the field) unless the key's ``allow=`` names them.
- ``/metrics`` and readiness detail need an admin key (``role=admin``).
- Workers are named to callers other than admins by an opaque id (:func:`worker_id`): a short,
  stable hash of the URL, the same on every replica; error messages name every URL that way.

Without an API keys file the gateway has one caller, the operator: everything stays allowed.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping

from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.gateway.keys import GRANTABLE_FIELDS, ApiKey

POOL_HEADER = "x-agent-cache-pool"
# the caller of a gateway without API keys: the operator, allowed everything
OPERATOR = ApiKey("default", role="admin", allow=frozenset(GRANTABLE_FIELDS))
# request fields each grant covers (``lora_id`` picks an adapter as ``lora_path`` does)
_GRANTED_BY = {"priority": "priority", "lora_path": "lora_path", "lora_id": "lora_path"}
_URL = re.compile(r"https?://[^\s()'\"<>,;]*[^\s()'\"<>,;.:]")  # a URL, less a sentence's last dot


def worker_id(url: str) -> str:
    """The opaque name of a worker: ``w-`` and 12 hex digits of the SHA-256 of its URL."""
    return "w-" + hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def shown_worker(grant: ApiKey | None, url: str) -> str:
    """How a worker is named to the caller: its URL for an admin, its id for anyone else."""
    return url if grant is not None and grant.is_admin else worker_id(url)


def hide_urls(text: str) -> str:
    """``text`` with every URL in it replaced by its worker id (the URLs the gateway names are workers')."""
    return _URL.sub(lambda m: worker_id(m.group(0)), text) if "://" in text else text


def choose_pool(grant: ApiKey, header: str | None) -> str | None:
    """The pool a call goes to: the pool header where the key allows it, else the key's own pool
    (None: the router's default). A key bound to several pools must choose one by the header."""
    if header is not None:
        if not grant.may_use_pool(header):
            allowed = ", ".join(sorted(grant.pools or ()))
            raise RequestRejectedError(403, f"{POOL_HEADER}: this API key may not use the pool {header!r} "
                                       f"(allowed: {allowed})", code="pool_not_allowed", param=POOL_HEADER)
        return header
    if grant.pool is not None:
        return grant.pool
    if grant.pools is not None:
        if len(grant.pools) == 1:
            return next(iter(grant.pools))
        raise RequestRejectedError(
            400, f"this API key may use the pools {', '.join(sorted(grant.pools))}: choose one with {POOL_HEADER}",
            code="pool_required", param=POOL_HEADER)
    return None


def check_fields(grant: ApiKey, body: Mapping[str, Any]) -> None:
    """Refuse a reserved field (``priority``, ``lora_path``) the key's ``allow=`` does not name."""
    for field, grant_name in _GRANTED_BY.items():
        if body.get(field) is not None and grant_name not in grant.allow:
            raise RequestRejectedError(
                403, f"{field} is reserved: this API key may not set it (the keys file's allow={grant_name})",
                code="field_not_allowed", param=field)


def require_admin(grant: ApiKey) -> None:
    """Refuse a key that is not an admin's (``role=admin``)."""
    if not grant.is_admin:
        raise RequestRejectedError(403, "this endpoint needs an admin API key (role=admin in the keys file)",
                                   code="admin_required")


__all__ = ["OPERATOR", "POOL_HEADER", "check_fields", "choose_pool", "hide_urls", "require_admin", "shown_worker",
           "worker_id"]
