"""The gateway's API keys file: who may call, as which tenant, in which pools, how often.

One key per line, ``#`` starts a comment::

    KEY TENANT [POOL] [rpm=N] [tpm=N] [concurrency=N] [role=admin] [pools=a,b] [allow=priority,lora_path]

- ``POOL`` (or ``pools=``) binds the key: its calls go to that pool, or to one of
  ``pools=`` chosen by the pool header; without either the header may choose any pool.
- ``rpm`` / ``tpm``: requests and tokens per minute for the key's tenant.
- ``concurrency``: the tenant's calls in flight at once on each gateway process (429 past it), so
  one tenant's long calls cannot take every ``--max-concurrency`` slot.
- ``role=admin``: the key may also use the admin endpoints (fleet, readiness detail, metrics).
- ``allow=``: request fields reserved to the operator that this key may set.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from agent_cache.errors import ConfigError
from agent_cache.routing.config import check_tenant

ROLES = ("user", "admin")
# fields a tenant may set only where its key allows them (scheduling priority, adapters)
GRANTABLE_FIELDS = ("priority", "lora_path")
_OPTIONS = ("rpm", "tpm", "concurrency", "role", "pools", "allow")


@dataclass(frozen=True)
class ApiKey:
    """What one bearer key grants."""

    tenant: str
    pool: str | None = None  # the pool the key's calls use when the request names none
    pools: frozenset[str] | None = None  # pools the pool header may choose; None: any
    rpm: int | None = None
    tpm: int | None = None
    role: str = "user"
    allow: frozenset[str] = frozenset()
    concurrency: int | None = None  # calls in flight at once, per gateway process

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_use_pool(self, pool: str | None) -> bool:
        return pool is None or self.pools is None or pool in self.pools


def key_digest(key: str) -> str:
    """Keys are held and compared as digests: a dict lookup then leaks no timing about the key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _positive(name: str, value: str) -> int:
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(name, f"takes a whole number above 0, got {value!r}")
    return int(value)


def _names(name: str, value: str) -> frozenset[str]:
    names = frozenset(v for v in value.split(",") if v)
    if not names:
        raise ConfigError(name, f"takes a comma-separated list, got {value!r}")
    return names


def parse_key_line(parts: list[str]) -> tuple[str, ApiKey]:
    """One line's fields (already split) -> (key, grant); ConfigError names the option (or ``line``) that is
    wrong, never the key."""
    positional = [p for p in parts if "=" not in p]
    options = [p for p in parts if "=" in p]
    if len(positional) not in (2, 3) or parts[:len(positional)] != positional:
        raise ConfigError("line", f"expected 'KEY TENANT [POOL] [name=value ...]', got {len(positional)} plain fields")
    key, tenant = positional[0], positional[1]
    check_tenant(tenant)
    given: dict[str, str] = {}
    for option in options:
        name, _, value = option.partition("=")
        if name not in _OPTIONS:
            raise ConfigError(name, f"unknown option; known: {', '.join(_OPTIONS)}")
        if name in given:
            raise ConfigError(name, "given twice")
        given[name] = value
    role = given.get("role", "user")
    if role not in ROLES:
        raise ConfigError("role", f"takes one of {', '.join(ROLES)}, got {role!r}")
    allow = _names("allow", given["allow"]) if "allow" in given else frozenset()
    unknown = sorted(allow - set(GRANTABLE_FIELDS))
    if unknown:
        raise ConfigError("allow", f"names fields that are not reserved: {', '.join(unknown)}; "
                                   f"reserved: {', '.join(GRANTABLE_FIELDS)}")
    pool = positional[2] if len(positional) == 3 else None
    pools = _names("pools", given["pools"]) if "pools" in given else None
    if pool is not None and pools is not None and pool not in pools:
        raise ConfigError("pools", f"the pool {pool!r} is not among pools={given['pools']}")
    if pool is not None and pools is None:
        pools = frozenset({pool})
    counts = {name: _positive(name, given[name]) for name in ("rpm", "tpm", "concurrency") if name in given}
    return key, ApiKey(tenant, pool, pools, counts.get("rpm"), counts.get("tpm"), role, allow,
                       counts.get("concurrency"))


def load_api_keys(path: str | Path) -> dict[str, ApiKey]:
    """Parse an API keys file (see the module docstring): key digest -> :class:`ApiKey`.

    Errors name the file and line, never the key.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("api_keys", f"cannot read {path}: {exc}") from None
    keys: dict[str, ApiKey] = {}
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        try:
            key, grant = parse_key_line(parts)
        except ConfigError as exc:
            raise ConfigError("api_keys", f"{path}:{number}: {exc}") from None
        digest = key_digest(key)
        if digest in keys:
            raise ConfigError("api_keys", f"{path}:{number}: this key is already given on an earlier line")
        keys[digest] = grant
    if not keys:
        raise ConfigError("api_keys", f"{path} holds no key; leave --api-keys out to serve without keys")
    return keys
