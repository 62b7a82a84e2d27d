"""What the default template mode sends, captured on the wire in front of a simulated worker.

Only the leading system prompt is templatized (its date, e-mail and id moved
after the stable part); tools, schema property order and user-message
whitespace arrive exactly as LangChain produced them; two sessions of one
agent share most of the second's prompt tokens.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from agent_cache import ChatSGLang
from agent_cache.sim import SimFleet


class Capture:
    """A loopback HTTP server that records every request body and forwards it to one worker."""

    def __init__(self, upstream: str) -> None:
        self.bodies: list[dict] = []
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                capture.bodies.append(json.loads(raw))
                with httpx.stream("POST", upstream + self.path, content=raw,
                                  headers={"Content-Type": "application/json"}, timeout=30) as r:
                    self.send_response(r.status_code)
                    self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
                    self.end_headers()
                    for chunk in r.iter_raw():
                        self.wfile.write(chunk)

            def do_GET(self) -> None:  # noqa: N802
                r = httpx.get(upstream + self.path, timeout=10)
                self.send_response(r.status_code)
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def capture() -> Iterator[Capture]:
    with SimFleet(1, time_scale=0.0) as fleet:
        cap = Capture(fleet.urls[0])
        yield cap
        cap.close()


def _system(day: str, email: str, request_id: str) -> str:
    return (f"Today is {day}. You are the support agent of Acme Logistics, answering {email}. "
            f"Request id {request_id}.\n" + "Answer from the knowledge base, cite the article, be brief. " * 60)


def search_orders(customer: str, status: str, limit: int) -> str:
    """Search a customer's orders.

    Args:
        customer: the customer id.
        status: open or closed.
        limit: how many orders.
    """
    return ""


def refund(order: str, amount: float) -> str:
    """Refund an order.

    Args:
        order: the order id.
        amount: how much.
    """
    return ""


def test_default_mode_moves_volatile_system_values_and_sends_the_rest_as_given(capture) -> None:
    model = ChatSGLang(model="sim", base_url=capture.url, max_tokens=4)
    tools = [search_orders, refund]  # not in name order, properties not in alphabetical order
    user = "Here is my diff:\n  - old line   \n  + new line\t\n\n"  # trailing whitespace that matters
    first = model.bind_tools(tools).invoke(
        [SystemMessage(_system("2026-12-03", "ann@example.com", "5f0c2a4e-8b1d-4c7e-9a21-3e4f5a6b7c8d")),
         HumanMessage(user)], session_id="s1")
    second = model.bind_tools(tools).invoke(
        [SystemMessage(_system("2026-12-04", "bob@example.org", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")),
         HumanMessage(user)], session_id="s2")
    a, b = capture.bodies
    expected_tools = [convert_to_openai_tool(t) for t in tools]
    assert json.dumps(a["tools"]) == json.dumps(expected_tools)  # byte-identical, order kept
    assert list(a["tools"][0]["function"]["parameters"]["properties"]) == ["customer", "status", "limit"]
    assert a["messages"][-1] == {"role": "user", "content": user}  # whitespace as given
    assert a["messages"][0] == b["messages"][0]  # one stable system prompt for both sessions
    assert "2026-12-03" not in a["messages"][0]["content"] and "ann@example.com" not in a["messages"][0]["content"]
    assert "2026-12-03" in a["messages"][1]["content"] and "ann@example.com" in a["messages"][1]["content"]
    assert first.response_metadata["template_id"] == second.response_metadata["template_id"]
    shared = second.usage_metadata["input_token_details"]["cache_read"] / second.usage_metadata["input_tokens"]
    assert shared >= 0.8, shared
