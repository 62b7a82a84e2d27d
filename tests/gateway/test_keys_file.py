"""The API keys file: its options parse to grants, and every mistake names the line and never the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_cache.errors import ConfigError
from agent_cache.gateway.keys import ApiKey, key_digest, load_api_keys


def _load(tmp_path: Path, text: str) -> dict[str, ApiKey]:
    path = tmp_path / "keys"
    path.write_text(text)
    return load_api_keys(path)


def test_the_plain_form_still_reads_key_tenant_and_pool(tmp_path: Path) -> None:
    keys = _load(tmp_path, "k1 acme\nk2 beta gpu  # a comment\n")
    assert keys[key_digest("k1")] == ApiKey("acme")
    beta = keys[key_digest("k2")]
    assert (beta.tenant, beta.pool, beta.pools, beta.role) == ("beta", "gpu", frozenset({"gpu"}), "user")
    assert keys[key_digest("k1")].may_use_pool("anything")
    assert not beta.may_use_pool("cpu") and beta.may_use_pool("gpu")


def test_options_give_limits_role_pools_and_allowed_fields(tmp_path: Path) -> None:
    keys = _load(tmp_path, "k1 acme small rpm=60 tpm=100000 role=admin pools=small,large allow=priority "
                           "concurrency=4\n")
    grant = keys[key_digest("k1")]
    assert grant == ApiKey("acme", "small", frozenset({"small", "large"}), 60, 100000, "admin",
                           frozenset({"priority"}), 4)
    assert grant.is_admin and grant.may_use_pool("large") and not grant.may_use_pool("other")


@pytest.mark.parametrize(("line", "says"), [
    ("k1 acme rpm=0", "rpm: takes a whole number above 0"),
    ("k1 acme tpm=ten", "tpm: takes a whole number above 0"),
    ("k1 acme concurrency=-1", "concurrency: takes a whole number above 0"),
    ("k1 acme role=root", "role: takes one of user, admin"),
    ("k1 acme allow=temperature", "allow: names fields that are not reserved: temperature"),
    ("k1 acme limit=5", "limit: unknown option"),
    ("k1 acme rpm=5 rpm=6", "rpm: given twice"),
    ("k1 acme small pools=large", "pools: the pool 'small' is not among pools=large"),
    ("k1", "line: expected 'KEY TENANT [POOL] [name=value ...]'"),
    ("k1 acme rpm=5 gpu", "line: expected 'KEY TENANT [POOL] [name=value ...]'"),
])
def test_a_wrong_line_is_refused_naming_the_line_and_not_the_key(tmp_path: Path, line: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, f"# keys\n{line}\n")
    message = str(caught.value)
    assert ":2: " in message and says in message
    assert "k1" not in message.replace(str(tmp_path), "")
