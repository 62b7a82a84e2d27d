"""The OpenAI-compatible gateway (``agent-cache serve``): sticky, template-aware routing for any framework."""

from agent_cache.gateway.app import POOL_HEADER, SESSION_HEADER, WORKER_HEADER, Gateway, create_app
from agent_cache.gateway.config import GatewayConfig
from agent_cache.gateway.keys import ApiKey, load_api_keys

__all__ = ["ApiKey", "Gateway", "GatewayConfig", "POOL_HEADER", "SESSION_HEADER", "WORKER_HEADER", "create_app",
           "load_api_keys"]
