"""The portal and the MCP gateway together (docs/portal.md, docs/gateway.md#agent-tokens).

A trusted app added through the portal's GraphQL is taken by the gateway; its agent, registered
through the portal's agents API, calls a tool through the gateway; retired through the agents
API, the agent's next call is blocked `svc:unregistered` at the decision point the gateway
asks. The time each change took to reach the gateway is printed (`-s`), never asserted (the
rule is about ten seconds). tests/portalkit.py starts the services; tests/gwkit.py the upstream
MCP server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gwkit import Issuer, UpstreamProcess, agent_session
from portalkit import World, pg_schema, until
from svc.gateway.app import GatewayServer
from svc.gateway.settings import GatewaySettings
from test_portal_graphql import Gql


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, GatewayServer]]:
    tmp = tmp_path_factory.mktemp("portal-gateway")
    upstream = UpstreamProcess()
    try:
        with pg_schema(postgres_url) as url:
            w = World(url, tmp)
            gw = GatewayServer(
                GatewaySettings(
                    port=0,
                    pdp_url=w.pdp_url,
                    context_url=w.context.url,
                    trust_refresh_secs=1,
                    jwks_ca_file=str(w.jwks.ca_file),
                    upstreams={"docs": {"url": upstream.url}},
                )
            ).start()
            try:
                until(
                    "gateway ready",
                    lambda: httpx.get(f"{gw.url}/readyz", timeout=30).status_code == 200,
                )
                yield w, gw
            finally:
                gw.stop()
                w.close()
    finally:
        upstream.stop()


def ping(url: str, token: str) -> Any:
    async def run() -> Any:
        async with agent_session(url, token) as s:
            return await s.call_tool("ping", {})

    try:
        return asyncio.run(run())
    except Exception as e:  # a refused token ends the session at initialize
        return e


def test_a_trusted_app_added_in_the_portal_and_its_agent_retired_reach_the_gateway(
    stack: tuple[World, GatewayServer],
) -> None:
    w, gw = stack
    mcp = f"{gw.url}/mcp/docs"
    ana = Gql(w.sign_in("ana"))
    app = Issuer("https://relay.example.com", "ES256")
    jwks = w.jwks.publish("relay", app)
    agent_token = app.mint("relay.bot", "svc-portal")
    assert isinstance(ping(mcp, agent_token), Exception)  # not trusted yet
    start = time.monotonic()
    ana.ok(
        "mutation($a: TrustedAppInput!) { trustApp(app: $a) { name } }",
        {"a": {"name": "relay", "iss": app.iss, "jwksUrl": jwks, "aud": "svc-portal"}},
    )
    r = w.http.put(
        "/api/v1/agents/relay.bot",
        json={"owner": "bo", "ai": True, "description": "relays"},
        headers={"authorization": f"Bearer {app.mint('relay', 'svc-portal')}"},
    )
    assert r.status_code == 201, r.text
    allowed = until(
        "new app's registered agent calls through the gateway",
        lambda: not isinstance(r := ping(mcp, agent_token), Exception) and not r.is_error and r,
    )
    print(f"trust to a forwarded call: {(time.monotonic() - start) * 1000:.0f} ms")
    assert allowed.content[0].text == "pong"
    start = time.monotonic()
    r = w.http.delete(
        "/api/v1/agents/relay.bot",
        headers={"authorization": f"Bearer {app.mint('relay', 'svc-portal')}"},
    )
    assert r.status_code == 204, r.text
    blocked = until(
        "retired agent blocked at the gateway",
        lambda: not isinstance(r := ping(mcp, agent_token), Exception) and r.is_error and r,
    )
    print(f"DELETE to a blocked call: {(time.monotonic() - start) * 1000:.0f} ms")
    meta = blocked.meta or {}
    assert meta.get("svc/verdict") == "deny", blocked
    assert "svc:unregistered" in blocked.content[0].text, blocked.content[0].text
    ana.http.close()
