"""The portal's assistant (docs/portal.md#the-assistant), with a local chat-completions stub.

The model is a stub server speaking the OpenAI chat-completions API on 127.0.0.1: it asks for
the `containments` tool, then answers from what the tool returned. The tool runs as the
signed-in person through the service layer, so it is checked with the real decision point
(tests/portalkit.py starts the rest). Covered: an answer built from a tool's result; the tools
offered are read-only; a person refused the assistant by policy (the decision's qid), and a
tool call refused for the person going back to the model as an error; no model configured.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request

from portalkit import World, pg_schema
from svc.common.net import tcp_listener
from test_portal_graphql import Gql, forbidden

ASK = "query($q: String!) { ask(question: $q) { answer steps { tool arguments ok } } }"


class ChatStub:
    """Asks for `containments` first, then answers with what the tool said."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.requests.append(body)
            tool_answers = [m for m in body["messages"] if m["role"] == "tool"]
            if not tool_answers:
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call-1",
                            "type": "function",
                            "function": {"name": "containments", "arguments": "{}"},
                        }
                    ],
                }
            else:
                message = {
                    "role": "assistant",
                    "content": "From the tool: " + tool_answers[-1]["content"],
                }
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        self.sock = tcp_listener("127.0.0.1", 0)
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, ChatStub]]:
    stub = ChatStub()
    try:
        with pg_schema(postgres_url) as url:
            w = World(url, tmp_path_factory.mktemp("portal-assistant"), model_url=stub.url)
            try:
                yield w, stub
            finally:
                w.close()
    finally:
        stub.stop()


def test_the_assistant_answers_with_read_only_tools_as_the_person(
    stack: tuple[World, ChatStub],
) -> None:
    w, stub = stack
    people = {u: Gql(w.sign_in(u)) for u in ("ana", "cy")}
    people["ana"].ok(
        'mutation { contain(principal: {type: "Human", id: "dee"}, reason: "asked") { changed } }'
    )
    out = people["ana"].ok(ASK, {"q": "Who is contained?"})["ask"]
    assert out["steps"] == [{"tool": "containments", "arguments": {}, "ok": True}]
    assert out["answer"].startswith("From the tool: ") and '"id": "dee"' in out["answer"]
    first = stub.requests[-2]
    offered = sorted(t["function"]["name"] for t in first["tools"])
    assert offered == [
        "containments",
        "explain_decision",
        "investigations",
        "risk_scores",
        "search_decisions",
        "who_can",
    ]
    assert first["messages"][1] == {"role": "user", "content": "Who is contained?"}
    forbidden(people["cy"].refused(ASK, {"q": "Who is contained?"}), "assistant", "view")
    for c in people.values():
        c.http.close()


def test_a_tool_refused_for_the_person_goes_back_to_the_model(
    stack: tuple[World, ChatStub],
) -> None:
    from svc.portal.assistant import Assistant

    w, _ = stack
    # cy may not use the assistant; a tool run for cy anyway is refused by the decision point
    # too, and the refusal is what the model would read.
    assistant = Assistant(w.settings, w.service)
    out = assistant.run_tool("cy", "containments", {})
    assert out["error"].startswith("`cy` may not view the portal's containments")
    assert len(out["decision_qid"]) == 36
    assert assistant.run_tool("ana", "contain", {}) == {"error": "no tool `contain`"}
    msg = json.dumps(assistant.run_tool("ana", "risk_scores", {}))
    assert msg == "[]"


def test_without_a_model_the_assistant_is_unavailable(stack: tuple[World, ChatStub]) -> None:
    from svc.common.problems import Problem
    from svc.portal.assistant import Assistant

    w, _ = stack
    settings = w.settings.model_copy(update={"model_url": None})
    with pytest.raises(Problem) as e:
        Assistant(settings, w.service).ask("ana", "anything")
    assert e.value.status == 503 and "SVC_PORTAL_MODEL_URL" in e.value.detail
