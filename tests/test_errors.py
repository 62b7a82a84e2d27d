"""The error tree says what is meant: a caller's bad request is not a configuration error, a Redis refusing the
client is a store error, and errors of one part live with that part on the common base."""

from __future__ import annotations

import json

import pytest

from agent_cache import errors
from agent_cache.calls.prepare import CHAT, prepare
from agent_cache.gateway.app import _error_for
from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.processes import BenchProcessError


def test_a_request_error_is_not_a_config_error() -> None:
    assert not issubclass(errors.InvalidRequestError, errors.ConfigError)
    for cls in (errors.InvalidRequestError, errors.ConfigError):
        assert issubclass(cls, errors.AgentCacheError) and issubclass(cls, ValueError)
    exc = errors.InvalidRequestError("temperature", "must be >= 0")
    assert exc.field == "temperature" and str(exc) == "temperature: must be >= 0"


def test_a_refusing_redis_is_a_store_error_naming_redis_url() -> None:
    exc = errors.StoreRefusedError("WRONGPASS")
    assert isinstance(exc, errors.StoreError) and not isinstance(exc, (errors.ConfigError, errors.StoreUnavailableError))
    assert exc.field == "redis_url" and str(exc) == "redis_url: WRONGPASS"


def test_errors_of_one_part_live_with_it_on_the_common_base() -> None:
    assert issubclass(RequestRejectedError, errors.AgentCacheError)
    assert issubclass(BenchProcessError, errors.AgentCacheError)
    assert not hasattr(errors, "RequestRejectedError") and not hasattr(errors, "BenchProcessError")


def _answer(exc: BaseException) -> tuple[int, dict]:
    response = _error_for(exc)
    return response.status_code, json.loads(bytes(response.body))["error"]


def test_the_gateway_answers_a_request_error_400_and_its_own_configuration_500() -> None:
    status, body = _answer(errors.InvalidRequestError("top_p", "must be within (0, 1]"))
    assert (status, body["code"], body["param"]) == (400, "invalid_value", "top_p")
    status, body = _answer(errors.ConfigError("templater", "a chat request needs the tenant's templater"))
    assert (status, body["code"]) == (500, "gateway_misconfigured") and "templater" not in body["message"]
    status, body = _answer(errors.StoreRefusedError("NOPERM"))
    assert (status, body["code"]) == (500, "store_misconfigured")


def test_a_chat_call_without_a_templater_is_the_doors_configuration_error() -> None:
    with pytest.raises(errors.ConfigError) as err:
        prepare(CHAT, {"messages": [{"role": "user", "content": "hi"}]}, session="s", tenant="default", pool=None,
                extra_key=None, templater=None)
    assert err.value.field == "templater"


def test_a_tenant_that_is_not_text_is_a_configuration_error() -> None:
    from agent_cache.routing.config import check_tenant

    for bad in ("acme\ud800", "ac\nme", ""):
        with pytest.raises(errors.ConfigError) as err:
            check_tenant(bad)
        assert err.value.field == "tenant"
