"""langchain-tests standard suites for ChatSGLang against simulated workers."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from agent_cache.langchain import ChatSGLang


class _Features:
    @property
    def chat_model_class(self) -> type[ChatSGLang]:
        return ChatSGLang

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    # the worker serves text chat only
    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False

    @property
    def supports_video_inputs(self) -> bool:
        return False

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}


class TestChatSGLangUnit(_Features, ChatModelUnitTests):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # unit tests never reach the network; any well-formed URL will do
        return {"model": "sim-model", "base_url": "http://127.0.0.1:9"}

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return (
            {"AGENT_CACHE_WORKERS": "http://10.0.0.1:30000, http://10.0.0.2:30000/v1", "AGENT_CACHE_API_KEY": "k"},
            {"model": "sim-model"},
            {"workers": ["http://10.0.0.1:30000", "http://10.0.0.2:30000"], "api_key": "k"},
        )


class TestChatSGLangIntegration(_Features, ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _fleet(self, lc_fleet) -> None:
        type(self)._urls = lc_fleet.urls

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "sim-model", "workers": self._urls, "max_retries": 0}

    @property
    def model_override_value(self) -> str:
        return "sim-model-b"

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        # the same long prefix twice in one session: the second call reads it from cache
        model = ChatSGLang(**self.chat_model_params).bind(session_id="cache-read-probe")
        prompt = [SystemMessage("You are a careful assistant. " * 40), HumanMessage("Say hello.")]
        model.invoke(prompt)
        if stream:
            full = None
            for chunk in model.stream(prompt):
                full = chunk if full is None else full + chunk
            assert isinstance(full, AIMessage)
            return full
        return model.invoke(prompt)
