"""The demo company's upstream MCP server (``svc.demo.tools_server``, docs/demo.md#the-tools), driven
with the ``mcp`` client over its two transports: stdio (a child process, as ``svc up``'s gateway
starts it) and Streamable HTTP (a child process on a port)."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcpkit import child_env, free_port, python, serving
from svc.demo.company import generate
from svc.demo.token_issuer import AUDIENCE, DevTokenIssuer
from svc.demo.tools_server import TOOLS, DemoData

COMPANY = generate()


def stdio_client() -> Client:
    """A client that starts the server as ``python -m svc.demo.tools_server`` over stdio."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "svc.demo.tools_server"], env=child_env()
    )
    return Client(params)


def structured(result: Any) -> dict[str, Any]:
    """A successful tool result's structured content (asserting it succeeded)."""
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_data_is_the_demo_company() -> None:
    data = DemoData.from_company(COMPANY)
    assert list(data.documents) == [d.id for d in COMPANY.documents]
    assert list(data.tickets) == [t.id for t in COMPANY.tickets]
    first = COMPANY.documents[0]
    assert data.documents[first.id]["owner"] == first.owner
    assert data.documents[first.id]["sensitivity"] == first.attrs["sensitivity"]
    # Same seed, same data.
    assert DemoData.from_company(generate()) == data


def test_stdio_tools_read_and_write() -> None:
    async def run() -> None:
        async with stdio_client() as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == set(TOOLS)
            for name, spec in TOOLS.items():
                assert tools[name].annotations is not None
                assert tools[name].annotations.read_only_hint is spec.read_only, name
                if spec.argument is not None:
                    assert spec.argument in tools[name].input_schema["required"], name

            doc = COMPANY.documents[0]
            got = structured(await c.call_tool("read_document", {"document_id": doc.id}))
            assert (got["id"], got["owner"], got["version"]) == (doc.id, doc.owner, 1)

            new = structured(
                await c.call_tool("update_document", {"document_id": doc.id, "text": "v2 text"})
            )
            assert (new["text"], new["version"]) == ("v2 text", 2)
            again = structured(await c.call_tool("read_document", {"document_id": doc.id}))
            assert again["text"] == "v2 text"

            missing = await c.call_tool("read_document", {"document_id": "doc-9999"})
            assert missing.is_error
            assert "doc-9999" in missing.content[0].text

            open_ticket = next(t for t in COMPANY.tickets if t.attrs["status"] == "open")
            commented = structured(
                await c.call_tool(
                    "comment_ticket", {"ticket_id": open_ticket.id, "comment": "looking"}
                )
            )
            assert commented["comments"] == ["looking"]
            closed = structured(
                await c.call_tool(
                    "close_ticket", {"ticket_id": open_ticket.id, "resolution": "fixed"}
                )
            )
            assert closed["status"] == "closed"
            assert closed["comments"] == ["looking", "closed: fixed"]
            twice = await c.call_tool(
                "close_ticket", {"ticket_id": open_ticket.id, "resolution": "again"}
            )
            assert twice.is_error

    asyncio.run(run())


def test_stdio_resources_and_prompt_pass() -> None:
    async def run() -> None:
        async with stdio_client() as c:
            uris = [str(r.uri) for r in (await c.list_resources()).resources]
            assert uris == ["demo://company"]
            templates = (await c.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["demo://documents/{document_id}"]

            company = await c.read_resource("demo://company")
            counts = json.loads(company.contents[0].text)
            assert counts["documents"] == len(COMPANY.documents)
            assert sum(counts["tickets"].values()) == len(COMPANY.tickets)

            doc = COMPANY.documents[1]
            text = await c.read_resource(f"demo://documents/{doc.id}")
            assert doc.owner in text.contents[0].text

            prompts = [p.name for p in (await c.list_prompts()).prompts]
            assert prompts == ["triage_ticket"]
            prompt = await c.get_prompt("triage_ticket", {"ticket_id": "TCK-1001"})
            assert "TCK-1001" in prompt.messages[0].content.text

    asyncio.run(run())


def test_streamable_http_lists_and_searches() -> None:
    port = free_port()
    argv = python("-m", "svc.demo.tools_server", "--http", "--port", str(port))
    with serving(argv, port) as base:

        async def run() -> None:
            async with Client(f"{base}/mcp") as c:
                opened = structured(await c.call_tool("list_tickets", {"status": "open"}))
                assert opened["tickets"]
                assert {t["status"] for t in opened["tickets"]} == {"open"}
                assert len(opened["tickets"]) == 10

                dept = COMPANY.documents[0].attrs["department"]
                found = structured(
                    await c.call_tool("search_documents", {"query": dept, "limit": 50})
                )
                assert found["documents"]
                assert all(dept in d["title"] for d in found["documents"])
                assert all("text" not in d for d in found["documents"])

                too_many = await c.call_tool("search_documents", {"query": "x", "limit": 500})
                assert too_many.is_error

        asyncio.run(run())


# -- the development token issuer (svc.demo.token_issuer)


def test_token_issuer_serves_jwks_over_https_and_signs_both_shapes(tmp_path: Path) -> None:
    issuer = DevTokenIssuer(tmp_path / "issuer").start()
    try:
        assert issuer.apps == ["copilot", "helpdesk", "crm", "docs"]
        apps = {a["name"]: a for a in issuer.trusted_apps()}
        assert apps["copilot"]["jwks_url"].startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(issuer.ca_file))

        # The certificate chains only to the issuer's own CA.
        with pytest.raises(httpx.ConnectError):
            httpx.get(apps["copilot"]["jwks_url"], timeout=10)
        jwks = httpx.get(apps["copilot"]["jwks_url"], verify=ctx, timeout=10).json()
        assert [k["alg"] for k in jwks["keys"]] == ["ES256"]
        assert httpx.get(f"{issuer.base_url}/nope", verify=ctx, timeout=10).status_code == 404

        def verify(token: str, app: str) -> dict[str, Any]:
            client = jwt.PyJWKClient(apps[app]["jwks_url"], ssl_context=ctx)
            key = client.get_signing_key_from_jwt(token).key
            return dict(
                jwt.decode(
                    token,
                    key,
                    algorithms=["ES256"],
                    audience=apps[app]["aud"],
                    issuer=apps[app]["iss"],
                    options={"require": ["exp", "iat", "sub"]},
                )
            )

        exchanged = verify(
            issuer.mint(
                "copilot.assistant", "ana", human_present=False, work_item_id="jira:DOC-101"
            ),
            "copilot",
        )
        assert exchanged["sub"] == "ana"
        assert exchanged["act"] == {"sub": "copilot.assistant"}
        assert exchanged["svc_human_present"] is False
        assert exchanged["svc_work_item_id"] == "jira:DOC-101"
        assert exchanged["aud"] == AUDIENCE

        alone = verify(issuer.mint("helpdesk.triage"), "helpdesk")
        assert alone["sub"] == "helpdesk.triage"
        assert "act" not in alone and "svc_human_present" not in alone

        # Signed as another app: the copilot key does not verify a helpdesk token.
        foreign = issuer.mint("helpdesk.triage", app="copilot")
        with pytest.raises(jwt.PyJWKClientError):
            verify(foreign, "helpdesk")
        assert (
            jwt.decode(foreign, options={"verify_signature": False})["iss"]
            == apps["copilot"]["iss"]
        )

        expired = issuer.mint("copilot.assistant", "ana", lifetime_secs=-60)
        with pytest.raises(jwt.ExpiredSignatureError):
            verify(expired, "copilot")

        with pytest.raises(ValueError, match="not one of the demo apps"):
            issuer.mint("legacy.reportbot")
        with pytest.raises(ValueError, match=r"<app>\.<name>"):
            issuer.mint("nodot")

        # A second process on the same directory mints with the same keys (svc demo token).
        again = DevTokenIssuer.from_directory(tmp_path / "issuer")
        assert again.trusted_apps() == issuer.trusted_apps()
        assert verify(again.mint("docs.writer", "ana"), "docs")["act"] == {"sub": "docs.writer"}
        assert (tmp_path / "issuer" / "copilot.pem").stat().st_mode & 0o777 == 0o600
    finally:
        issuer.stop()
