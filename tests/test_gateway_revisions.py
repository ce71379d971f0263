"""Both protocol eras through the MCP gateway (docs/gateway.md#protocol-revisions), every part
real: the agent is the ``mcp`` SDK's high-level ``Client`` in each of its modes (``auto``,
``legacy``, ``2026-07-28``), and meets allow, deny (with ``_meta``), challenge, a pass and the
retry, as tests/test_gateway_flows.py's agent does (its ``World``: the challenge service, a
decision point process, the intake, the upstream and the gateway). A 2026-07-28 request whose
``Mcp-Method`` or ``Mcp-Name`` disagrees with its body is refused with the revision's
``HEADER_MISMATCH`` error; the revision of each agent is a metric label.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import mcp_types as types
import pytest

from gwkit import PYTHON, TESTS, agent_client, wait_until
from svc.challenge.v1 import challenge_pb2 as pb
from svc.gateway.app import GatewayServer
from svc.gateway.settings import Upstream
from test_gateway_flows import TOOLS, Agent, World

MODERN = "2026-07-28"


@pytest.fixture(scope="module", params=["legacy", "modern"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """Every part, the upstream serving the handshake era only (``legacy``) or the 2026-07-28
    revision only (``modern``)."""
    w = World(tmp_path_factory.mktemp("revisions"), era=request.param)
    w.era = request.param  # type: ignore[attr-defined]
    yield w
    w.close()


def _upstream_revision(world: World) -> str:
    return "2025-11-25" if world.era == "legacy" else MODERN  # type: ignore[attr-defined]


def _agent_flow(world: World, mode: str, person: str) -> tuple[str, Agent, dict[str, Any]]:
    """An agent acting for `person` in `mode`: read, denied, write (challenged, passed, retried)."""

    def justify(qid: str) -> None:
        world.stub.Justify(pb.JustifyRequest(qid=qid, person=person, text="a typo"), timeout=30)

    token = world.app.mint(person, "svc-gateway", act="copilot.assistant")
    agent = Agent(world, token, justify)

    async def run() -> tuple[str, dict[str, Any]]:
        async with agent_client(world.url, token, mode) as client:
            got = {
                "read": await agent.call(client, "read_doc", {"doc_id": "plan"}),
                "denied": await agent.call(client, "read_doc", {"doc_id": "secret"}),
                "wrote": await agent.call(
                    client, "write_doc", {"doc_id": f"{mode}-doc", "text": mode}
                ),
                "again": await agent.call(client, "read_doc", {"doc_id": f"{mode}-doc"}),
            }
            return client.protocol_version, got

    version, got = asyncio.run(run())
    return version, agent, got


@pytest.mark.parametrize("mode", ["auto", "legacy", MODERN])
def test_each_client_mode_meets_allow_deny_challenge_pass_and_retry(
    world: World, mode: str
) -> None:
    version, agent, got = _agent_flow(world, mode, "ana")
    assert version == ("2025-11-25" if mode == "legacy" else MODERN)
    assert not got["read"].is_error and got["read"].content[0].text
    denied = got["denied"]
    assert denied.is_error
    assert denied.meta["svc/verdict"] == "deny"
    assert denied.meta["svc/decision_qid"] in denied.content[0].text
    assert "secret-is-secret" in denied.content[0].text
    assert got["wrote"].content[0].text == f"wrote {mode}-doc"
    assert got["again"].content[0].text == mode
    assert agent.steps == ["done", "deny", "challenge", "pending", "passed", "done", "done"]
    # The operator sees which revision the agent speaks.
    label = f'agent="copilot.assistant",protocol_version="{version}",upstream="docs"'
    assert world.metric(f"svc_gateway_agent_requests_total{{{label}}}") >= 4


def test_the_gateway_speaks_the_newest_revision_the_upstream_offers(world: World) -> None:
    link = world.gateway.service.links["docs"]
    assert link.initialized is not None
    assert link.initialized.protocol_version == _upstream_revision(world)
    assert link.modern == (world.era == "modern")  # type: ignore[attr-defined]


async def _sampling(context: Any, params: Any) -> Any:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="yes"), model="m"
    )


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
@pytest.mark.parametrize("mode", ["legacy", MODERN])
def test_logs_and_requests_for_input_reach_the_agent(world: World, mode: str) -> None:
    """docs/gateway.md#relaying in both eras: the agent's log level filters the upstream's log
    messages, and the upstream's sampling request (a request during the call from a
    handshake-era upstream, an input-required round from a 2026-07-28 one) is answered by the
    agent's sampling callback. A 2026-07-28 agent has no back channel: a handshake-era
    upstream's request during the call reaches it as an input-required round of the held call
    (svc.gateway.rounds), a 2026-07-28 upstream's round it answers itself."""
    logs: list[Any] = []

    async def logging(params: Any) -> None:
        logs.append((params.level, params.data))

    async def run() -> Any:
        options: dict[str, Any] = {"sampling_callback": _sampling, "logging_callback": logging}
        if mode == MODERN:
            options["log_level"] = "warning"
        async with agent_client(world.url, world.agent(), mode, **options) as client:
            if mode == "legacy":
                await client.set_logging_level("warning")
            return await client.call_tool("ask_round", {})

    before = world.metric('svc_gateway_tool_calls_total{outcome="forwarded",upstream="docs"}')
    result = asyncio.run(run())
    after = world.metric('svc_gateway_tool_calls_total{outcome="forwarded",upstream="docs"}')
    assert not result.is_error, result
    assert result.content[0].text == "yes"
    assert logs == [("warning", "still asking")]
    # A 2026-07-28 upstream's round is a new call of the agent's, checked again; a held call's
    # round (a handshake-era upstream) is the same call going on.
    rounds = 2 if mode == MODERN and world.era == "modern" else 1  # type: ignore[attr-defined]
    assert after - before == rounds


@pytest.mark.parametrize("mode", ["legacy", MODERN])
def test_a_2026_upstream_is_told_the_agents_capabilities(world: World, mode: str) -> None:
    """A 2026-07-28 request carries its client's capabilities, and a server of the revision
    must not rely on others: the gateway forwards the agent's (those it relays), not its own.
    A handshake-era upstream knows the gateway's session's (sampling and elicitation)."""

    async def run(**options: Any) -> Any:
        async with agent_client(world.url, world.agent(), mode, **options) as client:
            result = await client.call_tool("capabilities", {})
            return json.loads(result.content[0].text)

    bare = asyncio.run(run())
    sampler = asyncio.run(run(sampling_callback=_sampling))
    if world.era == "legacy":  # type: ignore[attr-defined]
        assert set(bare) == set(sampler) == {"sampling", "elicitation"}
        return
    assert "sampling" not in (bare or {}) and "elicitation" not in (bare or {})
    assert "sampling" in sampler and "elicitation" not in sampler


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_stdio_upstream_of_both_eras(world: World, mode: str) -> None:
    """A stdio upstream that serves both eras (``svc up``'s tools server is one) is spoken to
    in 2026-07-28 over its one stream, and agents of either era call it, rounds included."""
    settings = world.gateway.settings.model_copy(
        update={
            "port": 0,
            "intake_url": None,
            "upstreams": {
                "local": Upstream(
                    command=[PYTHON, str(TESTS / "gwupstream.py"), "stdio"],
                    env={"PYTHONPATH": str(TESTS.parent / "python")},
                    tools=TOOLS,
                )
            },
        }
    )
    gw = GatewayServer(settings).start()
    try:
        wait_until(lambda: world.http.get(f"{gw.url}/readyz").status_code == 200)
        link = gw.service.links["local"]
        assert link.initialized is not None and link.initialized.protocol_version == MODERN

        async def run() -> list[Any]:
            url = f"{gw.url}/mcp/local"
            async with agent_client(url, world.agent(), mode, sampling_callback=_sampling) as c:
                return [
                    await c.call_tool("read_doc", {"doc_id": "plan"}),
                    await c.call_tool("read_doc", {"doc_id": "secret"}),
                    await c.call_tool("ask_round", {}),
                ]

        read, denied, asked = asyncio.run(run())
        assert not read.is_error
        assert denied.is_error and denied.meta["svc/verdict"] == "deny"
        assert asked.content[0].text == "yes"
    finally:
        gw.stop()


@pytest.mark.parametrize("mode", ["legacy", MODERN])
def test_an_upstreams_list_changes_reach_agents_of_either_era(world: World, mode: str) -> None:
    """The upstream's tool list changes (a handshake-era upstream's ``list_changed``, a
    2026-07-28 upstream's on the gateway's ``subscriptions/listen`` stream) reach a handshake-era
    agent's session and a 2026-07-28 agent's ``subscriptions/listen`` stream."""
    seen: list[str] = []

    async def note(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            seen.append("session")

    async def run() -> None:
        token = world.agent()
        async with agent_client(world.url, token, mode, message_handler=note) as watcher:
            if mode == MODERN:
                async with watcher.listen(tools_list_changed=True) as sub:
                    assert sub.honored.tools_list_changed
                    async with agent_client(world.url, token, MODERN) as other:
                        await other.call_tool("change_tools", {})
                    event = await asyncio.wait_for(anext(sub), 30)
                    seen.append(type(event).__name__)
            else:
                await watcher.list_tools()
                async with agent_client(world.url, token, MODERN) as other:
                    await other.call_tool("change_tools", {})
                for _ in range(600):
                    if seen:
                        break
                    await asyncio.sleep(0.05)

    asyncio.run(run())
    # A 2026-07-28 client hands the stream's notifications to its message handler too.
    assert seen == (["session", "ToolsListChanged"] if mode == MODERN else ["session"])


def _post(world: World, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    token = world.agent()
    return world.http.post(
        world.url,
        content=json.dumps(body),
        headers={
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **headers,
        },
    )


def _call(name: str, **meta: Any) -> dict[str, Any]:
    envelope = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        **meta,
    }
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": envelope},
    }


def test_a_request_whose_headers_disagree_with_its_body_is_refused(world: World) -> None:
    modern = {"mcp-protocol-version": MODERN}
    good = {**modern, "mcp-method": "tools/call", "mcp-name": "ping"}
    r = _post(world, _call("ping"), good)
    assert r.status_code == 200, r.text
    assert "pong" in r.text
    for headers, what in [
        ({**good, "mcp-name": "launch"}, "mcp-name"),
        ({**good, "mcp-method": "tools/list"}, "mcp-method"),
        ({k: v for k, v in good.items() if k != "mcp-name"}, "mcp-name"),
        ({**good, "mcp-protocol-version": "2025-11-25"}, None),
    ]:
        r = _post(world, _call("ping"), headers)
        if what is None:  # a handshake-era header: the session transport's, which wants a session
            assert r.status_code in (400, 404), r.text
            continue
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == -32020 and what in error["message"], error
    # The envelope's version must be one the gateway serves; the header must say the same.
    r = _post(world, _call("ping"), {**good, "mcp-protocol-version": "2099-01-01"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] in (-32020, -32022)


def test_whitespace_around_a_routing_headers_value_is_not_part_of_it(world: World) -> None:
    """RFC 9110 section 5.5: ``Mcp-Name:  ping  `` names ``ping`` (sent as raw bytes: the HTTP
    clients here would trim it themselves)."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(world.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        body = json.dumps(_call("ping"))
        conn.putrequest("POST", url.path)
        for name, value in [
            ("authorization", f"Bearer {world.agent()}"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", f" {MODERN}"),
            ("mcp-method", "tools/call "),
            ("mcp-name", "  ping  "),
            ("content-length", str(len(body))),
        ]:
            conn.putheader(name, value)
        conn.endheaders(body.encode())
        r = conn.getresponse()
        text = r.read().decode()
    finally:
        conn.close()
    assert r.status == 200, text
    assert "pong" in text


def test_server_discover_names_the_revision_and_the_upstreams_capabilities(world: World) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    r = _post(world, body, {"mcp-protocol-version": MODERN, "mcp-method": "server/discover"})
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert MODERN in result["supportedVersions"]
    assert "tools" in result["capabilities"]
    assert result["instructions"] == "Documents for the gateway's tests."
    listed = _post(
        world,
        {**body, "method": "tools/list"},
        {"mcp-protocol-version": MODERN, "mcp-method": "tools/list"},
    )
    tools = listed.json()["result"]
    assert "read_doc" in {t["name"] for t in tools["tools"]}
    # The revision's caching hints: the upstream gave none, so the gateway's (stale at once,
    # private to the caller).
    assert (tools["ttlMs"], tools["cacheScope"]) == (0, "private")


def _fast(world: World) -> float:
    return world.metric('svc_gateway_fast_path_calls_total{how="answered",upstream="docs"}')


def test_a_plain_call_of_either_era_takes_the_fast_path(world: World) -> None:
    """docs/gateway.md#fast-path: a 2026-07-28 ``tools/call`` (one POST, no session) is
    checked and answered as one JSON body, as a handshake-era session's is, whatever the
    upstream's era; a blocked one too; one whose headers disagree with its body is the SDK's
    to refuse."""
    good = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "read_doc"}
    body = _call("read_doc")
    body["params"]["arguments"] = {"doc_id": "plan"}
    before = _fast(world)
    waited = world.metric('svc_gateway_upstream_seconds_count{upstream="docs"}')
    r = _post(world, body, good)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    result = r.json()["result"]
    assert result["resultType"] == "complete" and not result["isError"]
    assert "mcp-session-id" not in r.headers
    assert _fast(world) - before == 1
    # The wait for the upstream's answer is measured apart from the checks (docs/gateway.md).
    assert world.metric('svc_gateway_upstream_seconds_count{upstream="docs"}') - waited == 1
    body["params"]["arguments"] = {"doc_id": "secret"}
    denied = _post(world, body, good).json()["result"]
    assert denied["isError"] and denied["_meta"]["svc/verdict"] == "deny"
    mismatch = _post(world, body, {**good, "mcp-name": "write_doc"})
    assert mismatch.status_code == 400 and mismatch.json()["error"]["code"] == -32020

    async def legacy() -> Any:
        async with agent_client(world.url, world.agent(), "legacy") as client:
            return await client.call_tool("read_doc", {"doc_id": "plan"})

    before = _fast(world)
    assert not asyncio.run(legacy()).is_error
    assert _fast(world) - before == 1


def test_a_held_call_resumes_only_for_its_caller_and_tool() -> None:
    """``svc.gateway.rounds.HeldCalls``: the upstream's request during the call becomes the
    answer (an ``InputRequiredResult`` naming the held call); a retry with an unknown state,
    another caller's, another tool's or one missing an answer is refused with ``-32602`` and
    loses nothing (the right retry still resumes it); a held call nobody resumes is cancelled."""
    from mcp.shared.exceptions import MCPError

    from svc.gateway.rounds import HeldCalls

    class Inner:
        min_level = None
        capabilities = None

        async def progress(self, *args: Any) -> None:
            pass

        async def log(self, params: Any) -> None:
            pass

    ask = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[
                types.SamplingMessage(
                    role="user", content=types.TextContent(type="text", text="hi")
                )
            ],
            max_tokens=5,
        )
    )
    answer = types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="yes"), model="m"
    )

    async def call(relay: Any) -> Any:
        got = await relay.request(ask, types.CreateMessageResult)
        return types.CallToolResult(content=[got.content])

    def retry(state: str | None, tool: str = "t", answers: Any = None) -> Any:
        return types.CallToolRequestParams(name=tool, request_state=state, input_responses=answers)

    async def run() -> tuple[list[int], Any, bool]:
        held = HeldCalls(timeout_secs=5)
        first = await held.start(("me",), "t", Inner(), call)
        assert isinstance(first, types.InputRequiredResult) and first.request_state
        (key,) = first.input_requests or {}
        refused = []
        for owner, params in [
            (("me",), retry("svc-held:nope", answers={key: answer})),
            (("you",), retry(first.request_state, answers={key: answer})),
            (("me",), retry(first.request_state, tool="other", answers={key: answer})),
            (("me",), retry(first.request_state, answers={})),
        ]:
            try:
                await held.resume(owner, params, Inner())
            except MCPError as e:
                refused.append(e.error.code)
        done = await held.resume(
            ("me",), retry(first.request_state, answers={key: answer}), Inner()
        )
        # Nobody comes back for this one: it is cancelled after the timeout.
        brief = HeldCalls(timeout_secs=0.2)
        second = await brief.start(("me",), "t", Inner(), call)
        await asyncio.sleep(0.5)
        try:
            await brief.resume(("me",), retry(second.request_state, answers={key: answer}), Inner())
            expired = False
        except MCPError:
            expired = True
        return refused, done, expired

    refused, done, expired = asyncio.run(run())
    assert refused == [types.INVALID_PARAMS] * 4
    assert done.content[0].text == "yes"
    assert expired
