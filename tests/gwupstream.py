"""A tiny upstream MCP server for the gateway's tests (tests/test_gateway*.py).

Built with the ``mcp`` SDK's ``MCPServer``: tools that read and write documents held in memory
(``read_doc``, ``write_doc``), two that name no resource (``ping``, ``launch``), a resource
template and a prompt; ``ask_later`` sends a request to the client after its call has ended
and ``asked`` tells what it got; ``ask_now`` logs and asks during its call; ``touch`` sends a
resource's update; ``change_tools`` says its tool list changed; ``wait_long`` waits to be
cancelled and ``waits`` tells how such calls ended; ``logging/setLevel`` and resource
subscriptions are accepted.
``python tests/gwupstream.py http [PORT [ERA]]`` serves Streamable HTTP on 127.0.0.1 (on PORT, or a free port) and prints ``listening on <port>``;
ERA is ``both`` (the default: the handshake era and the 2026-07-28 revision, as the SDK serves
them), ``legacy`` (the handshake era only) or ``modern`` (2026-07-28 only) (``one_era``);
``ask_round`` asks in the 2026-07-28 revision's input-required round;
``python tests/gwupstream.py stdio [legacy]`` speaks MCP over its standard input and output
(both eras; with ``legacy`` the handshake era only).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    EmptyResult,
    InputRequiredResult,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    UnsubscribeRequestParams,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from svc.common.net import tcp_listener

DOCS: dict[str, str] = {"plan": "the plan", "secret": "the secret"}

server = MCPServer("gwupstream", instructions="Documents for the gateway's tests.")


@server.tool()
def read_doc(doc_id: str) -> str:
    """The document's text."""
    return DOCS.get(doc_id, "")


@server.tool()
def write_doc(doc_id: str, text: str) -> str:
    """Replaces the document's text."""
    DOCS[doc_id] = text
    return f"wrote {doc_id}"


@server.tool()
def ping() -> str:
    """Answers pong."""
    return "pong"


@server.tool()
def launch() -> str:
    """Launches the rocket (its policy asks the person for a security key)."""
    return "launched"


#: What ``ask_later``'s requests to the client got: the answer, or the error.
ASKED: list[str] = []


@server.tool()
async def ask_later(ctx: Context) -> str:
    """Asks the client for a completion after the call has ended (no call in flight).

    The request goes on the session's standalone stream, related to no request; what it gets is
    kept for ``asked``.
    """
    session = ctx.session

    async def ask() -> None:
        await asyncio.sleep(0.2)
        try:
            got = await session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text="hi"))],
                max_tokens=10,
            )
            ASKED.append(f"answered: {got.model_dump_json()}")
        except MCPError as e:
            ASKED.append(f"error {e.error.code}: {e.error.message}")

    TASKS.add(asyncio.get_running_loop().create_task(ask()))
    return "asked"


@server.tool()
def asked() -> str:
    """What ``ask_later``'s requests got, as a JSON list."""
    return json.dumps(ASKED)


@server.tool()
async def ask_now(ctx: Context) -> str:
    """Asks the client for a completion during the call, logs at two levels; answers its text."""
    await ctx.info("asking")
    await ctx.warning("still asking")
    got = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(type="text", text="hi"))],
        max_tokens=10,
        related_request_id=ctx.request_id,
    )
    return got.content.text if isinstance(got.content, TextContent) else str(got.content)


@server.tool()
async def touch(ctx: Context, uri: str) -> str:
    """Tells the subscribers of `uri` that it changed (``notifications/resources/updated``)."""
    await ctx.session.send_resource_updated(uri)
    return f"touched {uri}"


@server.tool()
async def change_tools(ctx: Context) -> str:
    """Tells the client its tool list changed (``notifications/tools/list_changed``; in the
    2026-07-28 revision on the clients' ``subscriptions/listen`` streams)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await ctx.notify_tools_changed()
    else:
        await ctx.session.send_tool_list_changed()
    return "changed"


#: How the calls of ``wait_long`` ended: ``cancelled`` or ``done``.
WAITS: list[str] = []


@server.tool()
async def wait_long(seconds: float) -> str:
    """Waits `seconds` (for a call to cancel); ``waits`` tells how each call ended."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        WAITS.append("cancelled")
        raise
    WAITS.append("done")
    return "waited"


@server.tool()
def waits() -> str:
    """How the calls of ``wait_long`` ended, as a JSON list."""
    return json.dumps(WAITS)


@server.tool()
async def ask_round(ctx: Context) -> Any:
    """Asks the client for a completion in the 2026-07-28 revision's way.

    An input-required round: it logs at two levels and answers ``InputRequiredResult`` with
    the request, then the retry carries the answer, whose text it answers. On a handshake-era
    session it is ``ask_now``.
    """
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return await ask_now(ctx)
    answers = ctx.input_responses or {}
    got = answers.get("q")
    if got is None:
        await ctx.info("asking")
        await ctx.warning("still asking")
        ask = CreateMessageRequest(
            params=CreateMessageRequestParams(
                messages=[
                    SamplingMessage(role="user", content=TextContent(type="text", text="hi"))
                ],
                max_tokens=10,
            )
        )
        return InputRequiredResult(input_requests={"q": ask}, request_state="asked")
    assert ctx.request_state == "asked", ctx.request_state
    content = getattr(got, "content", None)
    return content.text if isinstance(content, TextContent) else str(got)


@server.tool()
def capabilities(ctx: Context) -> str:
    """The client capabilities this request declared (its session's, or its 2026-07-28
    envelope's), as JSON."""
    declared = ctx.client_capabilities
    return json.dumps(declared.model_dump(mode="json", exclude_none=True) if declared else None)


#: The background tasks of ``ask_later`` (held so they are not collected while running).
TASKS: set[asyncio.Task[None]] = set()


@server.resource("doc://{name}")
def doc(name: str) -> str:
    """A document as a resource."""
    return DOCS.get(name, "")


@server.prompt()
def summarize(doc_id: str) -> str:
    """A prompt asking for a summary."""
    return f"Summarize {doc_id}."


# Logging levels and subscriptions are not among MCPServer's decorators: the low-level server
# takes their handlers (its capabilities then announce them).
async def _empty(ctx: Any, params: Any) -> EmptyResult:
    return EmptyResult()


for _method, _params in (
    ("logging/setLevel", SetLevelRequestParams),
    ("resources/subscribe", SubscribeRequestParams),
    ("resources/unsubscribe", UnsubscribeRequestParams),
):
    server._lowlevel_server.add_request_handler(_method, _params, _empty)


def one_era(app: Any, era: str) -> Any:
    """`app` serving only one protocol era over Streamable HTTP, as a server of that era would.

    ``legacy``: a request naming a 2026-07-28 ``MCP-Protocol-Version`` gets what a server
    older than the revision answers (400, a JSON-RPC ``-32600`` naming the version), so
    ``server/discover`` fails and clients fall back to ``initialize``. ``modern``: a request
    of the handshake era (``initialize``, a session's GET or DELETE) gets ``-32022`` naming the
    one revision served. ``both``: `app` unchanged (the ``mcp`` SDK serves both).
    """
    if era == "both":
        return app

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        version = dict(scope["headers"]).get(b"mcp-protocol-version", b"").decode()
        modern = version in MODERN_PROTOCOL_VERSIONS
        if era == "legacy" and version and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            error = {"code": -32600, "message": f"Unsupported protocol version: {version}"}
        elif era == "modern" and not modern:
            data = {"supported": list(MODERN_PROTOCOL_VERSIONS), "requested": version or None}
            error = {"code": -32022, "message": "Unsupported protocol version", "data": data}
        else:
            await app(scope, receive, send)
            return
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return guarded


async def legacy_stdio() -> None:
    """Serves stdio in the handshake era only, as a server older than 2026-07-28 does.

    The ``mcp`` SDK's handshake-only loop (``serve_loop``): ``server/discover`` is not a method
    there (``-32601``), so clients fall back to ``initialize``.
    """
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    low = server._lowlevel_server
    async with stdio_server() as (r, w), low.lifespan(low) as state:
        await serve_loop(
            low, r, w, lifespan_state=state, init_options=low.create_initialization_options()
        )


def main() -> None:
    """Serves over the transport named by the first argument (module docs)."""
    if sys.argv[1:] == ["stdio"]:
        server.run("stdio")
        return
    if sys.argv[1:] == ["stdio", "legacy"]:
        asyncio.run(legacy_stdio())
        return
    sock = tcp_listener("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    sock.listen(128)  # connections wait in the backlog from the moment the line is printed
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    era = sys.argv[3] if len(sys.argv) > 3 else "both"
    config = uvicorn.Config(one_era(server.streamable_http_app(), era), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
