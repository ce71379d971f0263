"""The portal's MCP endpoint (docs/portal.md#mcp-endpoint), against real services.

tests/portalkit.py starts the context, challenge and policy services, `svc pdp` (its decision
log to Kafka) and the portal; `svc history load` loads both topics into chDB and a real intake
(`svc.intake`, on a port) takes the portal's events. Agents and people connect with the `mcp`
SDK's default client. Covered: a person's own token and an agent acting for a person (token
exchange) allowed by policy, another person refused with the decision's qid; an agent acting
alone refused; tool calls that read decisions, who can, risk, containments, challenges and
investigations, and a draft refused with every problem then stored; each call in the history
as an intake event with its decision's qid; a single-exchange (2026-07-28) request.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from gwkit import agent_session
from portalkit import POLICIES, SCHEMA, HistoryLoader, World, logged, pg_schema, until
from serverkit import UUID7
from svc.common.net import tcp_listener
from svc.intake import IntakeSettings, create_app

INTAKE_TOKEN = "portal-intake-token-" + "x" * 24


class Intake:
    """The real intake on a port, writing to `topic`."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        settings = IntakeSettings(
            kafka_url=bootstrap,
            topic=topic,
            token=INTAKE_TOKEN,
            transactional_id=f"portal-intake-{uuid.uuid4().hex[:8]}",
        )
        self.sock = tcp_listener("127.0.0.1", 0)
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(settings), log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        until("intake ready", lambda: self._ready())

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class Stack:
    def __init__(self, world: World, history: HistoryLoader) -> None:
        self.world = world
        self.history = history

    @property
    def mcp(self) -> str:
        return f"{self.world.portal.url}/mcp"


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("portal-mcp")
    token_file = tmp / "intake.token"
    token_file.write_text(INTAKE_TOKEN + "\n")
    with logged(kafka_bootstrap, tmp, "portal") as log:
        intake = Intake(kafka_bootstrap, log.events)
        try:
            with pg_schema(postgres_url) as url:
                w = World(
                    url,
                    tmp,
                    pdp_args=log.pdp_args,
                    history_url=log.history.url,
                    intake_url=intake.url,
                    intake_token_file=str(token_file),
                )
                try:
                    r = w.context.http.post(
                        "/v1/service-accounts",
                        json={
                            "service_accounts": [
                                {"id": "copilot.assistant", "owner": "ana", "ai": True},
                                {"id": "copilot.script", "owner": "ana", "ai": False},
                            ]
                        },
                    )
                    assert r.status_code == 200, r.text
                    yield Stack(w, log.history)
                finally:
                    w.close()
        finally:
            intake.stop()


def call(url: str, token: str | None, tool: str, args: dict[str, Any] | None = None) -> Any:
    """One tool call through a fresh client session (the SDK's default client)."""

    async def run() -> Any:
        async with agent_session(url, token) as session:
            return await session.call_tool(tool, args or {})

    return asyncio.run(run())


def result(r: Any) -> dict[str, Any]:
    assert not r.is_error, r.content
    out: dict[str, Any] = r.structured_content
    return out


def error(r: Any) -> str:
    assert r.is_error, r
    return str(r.content[0].text)


def test_a_person_and_an_agent_for_them_call_tools_others_are_refused(stack: Stack) -> None:
    w = stack.world
    ana = w.idp.mint("ana", "svc-portal")
    cy = w.idp.mint("cy", "svc-portal")
    agent_for_bo = w.copilot.mint("bo", "svc-portal", act="copilot.assistant")
    agent_for_cy = w.copilot.mint("cy", "svc-portal", act="copilot.assistant")

    async def tools() -> list[str]:
        async with agent_session(stack.mcp, ana) as session:
            return sorted(t.name for t in (await session.list_tools()).tools)

    assert asyncio.run(tools()) == [
        "challenges",
        "containments",
        "create_draft",
        "dry_run",
        "explain_decision",
        "investigations",
        "risk",
        "search_decisions",
        "who_can",
    ]
    out = result(call(stack.mcp, ana, "containments"))
    assert out == {"containments": []}
    out = result(call(stack.mcp, agent_for_bo, "investigations"))
    assert out == {"investigations": []}
    msg = error(call(stack.mcp, cy, "containments"))
    assert "may not view the portal's containments" in msg
    qid = msg.split("decision ")[1].rstrip(")")
    assert UUID7.match(qid), msg
    msg = error(call(stack.mcp, agent_for_cy, "investigations"))  # cy may not; the agent neither
    assert "may not view" in msg
    who = result(
        call(
            stack.mcp,
            ana,
            "who_can",
            {"action": "administer", "resource_type": "PortalArea", "resource_id": "directory"},
        )
    )
    assert who["results"] == [{"type": "Human", "id": "ana"}] and UUID7.match(who["qid"])
    assert result(call(stack.mcp, agent_for_bo, "challenges")) == {"challenges": []}


def test_callers_are_verified(stack: Stack) -> None:
    w = stack.world
    refused = {
        "no token": None,
        "an agent acting alone": w.copilot.mint("copilot.assistant", "svc-portal"),
        "another audience": w.idp.mint("ana", "svc-gateway"),
        "expired": w.idp.mint("ana", "svc-portal", lifetime=-120),
        "an untrusted issuer": __import__("gwkit")
        .Issuer("https://x.example.com")
        .mint("ana", "svc-portal"),
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    for what, token in refused.items():
        headers = {"accept": "application/json, text/event-stream"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        r = httpx.post(stack.mcp, json=init, headers=headers, timeout=30)
        assert r.status_code == 401, (what, r.text)
        assert r.headers["content-type"].startswith("application/problem+json"), what
        print(f"{what}: {r.json()['detail']}")


def test_a_single_exchange_request_is_served(stack: Stack) -> None:
    """The 2026-07-28 revision: one POST, no initialize, no session."""
    w = stack.world
    r = httpx.post(
        stack.mcp,
        headers={
            "authorization": f"Bearer {w.idp.mint('bo', 'svc-portal')}",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "containments",
        },
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {
                "name": "containments",
                "arguments": {},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == 7 and body["result"]["structuredContent"] == {"containments": []}, body


def test_drafts_decisions_and_events(stack: Stack) -> None:
    w = stack.world
    ana = w.idp.mint("ana", "svc-portal")
    bad = result(
        call(
            stack.mcp,
            ana,
            "create_draft",
            {
                "files": {
                    "schema.cedarschema": SCHEMA,
                    "p.cedar": "permit (principal, action, resource) when { x };",
                }
            },
        )
    )
    assert bad["stored"] is False and bad["problems"][0]["field"].startswith("p.cedar:1:"), bad
    agent_for_ana = w.copilot.mint("ana", "svc-portal", act="copilot.assistant")
    good = result(
        call(
            stack.mcp,
            agent_for_ana,
            "create_draft",
            {"files": {"schema.cedarschema": SCHEMA, "policies.cedar": POLICIES}},
        )
    )
    assert good["stored"] is True and "portal-auditors-view" in good["policies"]
    # This policy service has no history store: the dry run is refused as unavailable.
    msg = error(
        call(
            stack.mcp,
            agent_for_ana,
            "dry_run",
            {"version": good["version"], "since": "2026-01-01T00:00:00Z"},
        )
    )
    assert "unavailable" in msg.lower(), msg
    script_for_ana = w.copilot.mint("ana", "svc-portal", act="copilot.script")
    assert "may not administer" in error(
        call(stack.mcp, script_for_ana, "create_draft", {"files": {"p.cedar": POLICIES}})
    )
    # The portal's checks are in the decision log; the tools read them back.
    page = until(
        "the tools' checks loaded into the history",
        lambda: (
            (
                p := result(
                    call(
                        stack.mcp,
                        ana,
                        "search_decisions",
                        {"principal_type": "ServiceAccount", "principal_id": "copilot.assistant"},
                    )
                )
            )["decisions"]
            and p
        ),
    )
    row = page["decisions"][0]
    assert row["on_behalf_of"]["type"] == "Human" and row["resource"]["type"] == "PortalArea"
    explained = result(call(stack.mcp, ana, "explain_decision", {"qid": row["qid"]}))
    assert explained["decision"]["qid"] == row["qid"]
    # Each deciding policy comes with its place and what it reads (nothing without its text).
    assert explained["policies"] and all(
        p.keys() >= {"name", "file", "text", "effect", "start_line", "entities", "reads"}
        and isinstance(p["reads"], list)
        and (p["text"] is not None or (p["start_line"] is None and p["reads"] == []))
        for p in explained["policies"]
    ), explained["policies"]
    # Every call is an intake event, found in the history with its decision's qid.
    hist = httpx.Client(base_url=stack.history.url, timeout=30)
    events = until(
        "the MCP calls' events in the history",
        lambda: [
            e
            for e in hist.get(
                "/v1/history/events", params={"principal": "ServiceAccount::copilot.assistant"}
            ).json()
            if e["system"] == "svc-portal" and e["tool"] == "portal/create_draft"
        ],
    )
    hist.close()
    drafts = events
    assert drafts[0]["on_behalf_of"] == {"type": "Human", "id": "ana"}
    assert drafts[0]["outcome"] == "success" and drafts[0]["action"] == "administer"
    assert drafts[0]["resource"] == {"type": "PortalArea", "id": "policies"}
    # The event carries its check's decision, whose explanation lists the event back.
    checked = drafts[0]["attributes"]["decision_qid"]
    assert UUID7.match(checked)

    def explained(qid: str) -> dict[str, Any] | None:
        r = call(stack.mcp, ana, "explain_decision", {"qid": qid})
        return None if r.is_error else result(r)

    back = until("the check loaded with its event", lambda: explained(checked))
    assert back["decision"]["verdict"] == "allow"
    assert [e["tool"] for e in back["events"]] == ["portal/create_draft"], back["events"]
    refused = until(
        "a refused call's event",
        lambda: [
            e
            for e in httpx.get(
                f"{stack.history.url}/v1/history/events",
                params={"principal": "ServiceAccount::copilot.script"},
                timeout=30,
            ).json()
            if e["outcome"] == "failure"
        ],
    )
    assert UUID7.match(json.loads(json.dumps(refused[0]["attributes"]))["decision_qid"])
