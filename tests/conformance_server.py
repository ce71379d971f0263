"""An MCP server with what the MCP conformance suite's server scenarios call for, for
tests/test_mcp_conformance.py.

The suite (npm ``@modelcontextprotocol/conformance``, ``conformance list``) tests a server by
calling tools, resources and prompts of fixed names (``test_simple_text``,
``test://static-text``, ``test_simple_prompt``, ...) and comparing the answers with what each
scenario's description asks for. This server provides them with the ``mcp`` SDK 2.x
(``MCPServer``), written from those descriptions. Run:
``python tests/conformance_server.py PORT [ERA]`` (Streamable HTTP at ``http://127.0.0.1:PORT/mcp``;
ERA ``both``, the default, serves the handshake era and the 2026-07-28 revision as the SDK does,
``legacy`` the handshake era only: tests/gwupstream.py's ``one_era``).

The suite sends no credentials, and the gateway takes none but a bearer token, so
``python tests/conformance_server.py proxy PORT TARGET TOKEN_FILE`` runs ``bearer_proxy``: a
reverse proxy on ``PORT`` that sends every request to ``TARGET`` (the gateway's base URL) as it
came (method, path, query, headers including ``Host`` and ``Origin``, body) plus
``Authorization: Bearer <the token in TOKEN_FILE>``, and streams the answer back (SSE too).
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.shared.exceptions import MCPError
from mcp_types import (
    AudioContent,
    Completion,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitRequest,
    ElicitRequestFormParams,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    InputRequiredResult,
    ListRootsRequest,
    PromptReference,
    SamplingMessage,
    SetLevelRequestParams,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    UnsubscribeRequestParams,
)
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import BaseModel, Field

# The smallest valid PNG (1x1, transparent) and WAV (no samples) the suite's checks decode.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
    )
).decode()
WAV = base64.b64encode(
    b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (0).to_bytes(4, "little")
).decode()  # fmt: skip


class UserInfo(BaseModel):
    """The form ``test_elicitation`` asks the client to fill in."""

    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


def build() -> MCPServer[Any]:
    """The server (module docs)."""
    server: MCPServer[Any] = MCPServer("svc-conformance", log_level="WARNING")

    @server.tool(description="Returns a simple text response")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @server.tool(description="Returns an image")
    def test_image_content() -> list[ImageContent]:
        return [ImageContent(type="image", data=PNG, mime_type="image/png")]

    @server.tool(description="Returns audio")
    def test_audio_content() -> list[AudioContent]:
        return [AudioContent(type="audio", data=WAV, mime_type="audio/wav")]

    @server.tool(description="Returns an embedded resource")
    def test_embedded_resource() -> list[EmbeddedResource]:
        return [
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="test://embedded-resource",
                    mime_type="text/plain",
                    text="This is an embedded resource content.",
                ),
            )
        ]

    @server.tool(description="Returns text, an image and a resource")
    def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
        return [
            TextContent(type="text", text="Multiple content types test:"),
            ImageContent(type="image", data=PNG, mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text=json.dumps({"test": "data", "value": 123}),
                ),
            ),
        ]

    @server.tool(description="Logs while it runs")
    async def test_tool_with_logging(ctx: Context) -> str:
        await ctx.info("Tool execution started")
        await asyncio.sleep(0.05)
        await ctx.info("Tool processing data")
        await asyncio.sleep(0.05)
        await ctx.info("Tool execution completed")
        return "Tool with logging executed successfully"

    @server.tool(description="Reports progress while it runs")
    async def test_tool_with_progress(ctx: Context) -> str:
        for done in (0, 50, 100):
            await ctx.report_progress(done, 100)
            if done < 100:
                await asyncio.sleep(0.05)
        return "Tool with progress executed successfully"

    @server.tool(description="Always fails")
    def test_error_handling() -> str:
        raise ValueError("This tool intentionally returns an error for testing")

    @server.tool(description="Asks the client for an LLM completion")
    async def test_sampling(prompt: str, ctx: Context) -> str:
        result = await ctx.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=100,
            related_request_id=ctx.request_id,
        )
        content = result.content
        text = content.text if isinstance(content, TextContent) else str(content)
        return f"LLM response: {text}"

    @server.tool(description="Asks the user for input")
    async def test_elicitation(message: str, ctx: Context) -> str:
        result = await ctx.elicit(message, UserInfo)
        data = result.data.model_dump() if result.action == "accept" else None
        return f"User response: action={result.action}, content={json.dumps(data)}"

    @server.tool(description="Asks for a form whose fields have defaults (SEP-1034)")
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "default": "John Doe"},
                "age": {"type": "integer", "default": 30},
                "score": {"type": "number", "default": 95.5},
                "status": {
                    "type": "string",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "default": True},
            },
        }
        result = await ctx.session.elicit_form("Defaults test", schema, ctx.request_id)
        return f"Elicitation completed: action={result.action}, content={result.content}"

    @server.tool(description="Asks for a form with every kind of enum (SEP-1330)")
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        titled = [{"const": f"value{i}", "title": t} for i, t in ((1, "First Option"), (2, "Second Option"), (3, "Third Option"))]  # fmt: skip
        schema = {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {"type": "string", "oneOf": titled},
                "legacyEnum": {
                    "type": "string",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {"type": "array", "items": {"anyOf": titled}},
            },
        }
        result = await ctx.session.elicit_form("Enums test", schema, ctx.request_id)
        return f"Elicitation completed: action={result.action}, content={result.content}"

    @server.resource(
        "test://watched-resource", description="A resource to subscribe to", mime_type="text/plain"
    )
    def watched() -> str:
        return "Watched resource content."

    @server.resource(
        "test://static-text", description="A static text resource", mime_type="text/plain"
    )
    def static_text() -> str:
        return "This is the content of the static text resource."

    @server.resource(
        "test://static-binary", description="A static binary resource", mime_type="image/png"
    )
    def static_binary() -> bytes:
        return base64.b64decode(PNG)

    @server.resource(
        "test://template/{id}/data",
        description="A resource template",
        mime_type="application/json",
    )
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.prompt(description="A simple prompt")
    def test_simple_prompt() -> str:
        return "This is a simple prompt for testing."

    @server.prompt(description="A prompt with arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
        return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"

    @server.prompt(description="A prompt with an embedded resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        return [
            UserMessage(
                content=EmbeddedResource(
                    type="resource",
                    resource=TextResourceContents(
                        uri=resourceUri,
                        mime_type="text/plain",
                        text="Embedded resource content for testing.",
                    ),
                )
            ),
            UserMessage(content="Please process the embedded resource above."),
        ]

    @server.prompt(description="A prompt with an image")
    def test_prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(content=ImageContent(type="image", data=PNG, mime_type="image/png")),
            UserMessage(content="Please analyze the image above."),
        ]

    _input_required(server)

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
        if isinstance(ref, PromptReference):
            words = ["paris", "park", "party"]
            return Completion(values=[w for w in words if w.startswith(argument.value)])
        return Completion(values=[])

    # Logging levels and resource subscriptions (handshake-era methods) are not in MCPServer's
    # decorators; the low-level server takes the handlers.
    subscribed: set[str] = set()
    lowlevel = server._lowlevel_server

    async def set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        subscribed.add(str(params.uri))
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        subscribed.discard(str(params.uri))
        return EmptyResult()

    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return server


def _elicit(message: str, field: str, kind: str = "string") -> ElicitRequest:
    """An ``elicitation/create`` input request for one required field."""
    return ElicitRequest(
        params=ElicitRequestFormParams(
            message=message,
            requested_schema={
                "type": "object",
                "properties": {field: {"type": kind}},
                "required": [field],
            },
        )
    )


def _sample(text: str, max_tokens: int) -> CreateMessageRequest:
    """A ``sampling/createMessage`` input request with one user message."""
    return CreateMessageRequest(
        params=CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=text))],
            max_tokens=max_tokens,
        )
    )


def _answered(ctx: Context, *keys: str) -> dict[str, Any] | None:
    """The round's ``inputResponses`` as JSON when they answer every key of `keys`, else None."""
    got = ctx.input_responses or {}
    if not all(k in got for k in keys):
        return None
    return {k: got[k].model_dump(by_alias=True, mode="json", exclude_none=True) for k in keys}


def _input_required(server: MCPServer[Any]) -> None:
    """The tools and the prompt of the suite's 2026-07-28 input-required scenarios (SEP-2322).

    Each asks in rounds (``InputRequiredResult``: the input requests and, where the scenario
    says, a ``requestState``, which the SDK seals) and answers once the retry carries the
    answers; a retry missing an answer is asked again. The rounds are the 2026-07-28
    revision's: a handshake-era session has no such answer (the SDK refuses to send it).
    """

    def roots_text(answer: dict[str, Any]) -> str:
        return ", ".join(str(r.get("uri")) for r in answer.get("roots", []))

    @server.tool(description="Asks the user's name (elicitation), then greets them")
    def test_input_required_result_elicitation(ctx: Context) -> Any:
        got = _answered(ctx, "user_name")
        if got is None:
            return InputRequiredResult(
                input_requests={"user_name": _elicit("What is your name?", "name")}
            )
        name = (got["user_name"].get("content") or {}).get("name", "")
        return f"Hello, {name}!"

    @server.tool(description="Asks the model a question (sampling), then answers its text")
    def test_input_required_result_sampling(ctx: Context) -> Any:
        got = _answered(ctx, "capital_question")
        if got is None:
            ask = _sample("What is the capital of France?", 100)
            return InputRequiredResult(input_requests={"capital_question": ask})
        content = got["capital_question"].get("content") or {}
        return str(content.get("text", content))

    @server.tool(description="Asks the client's roots (roots/list), then names them")
    def test_input_required_result_list_roots(ctx: Context) -> Any:
        got = _answered(ctx, "client_roots")
        if got is None:
            return InputRequiredResult(input_requests={"client_roots": ListRootsRequest()})
        return f"roots: {roots_text(got['client_roots'])}"

    @server.tool(description="Asks for a confirmation with a requestState it checks")
    def test_input_required_result_request_state(ctx: Context) -> Any:
        got = _answered(ctx, "confirm")
        if got is None or ctx.request_state != "confirm-pending":
            ask = {"confirm": _elicit("Please confirm", "ok", "boolean")}
            return InputRequiredResult(input_requests=ask, request_state="confirm-pending")
        return "state-ok: confirmed"

    @server.tool(description="Asks three things at once (elicitation, sampling, roots)")
    def test_input_required_result_multiple_inputs(ctx: Context) -> Any:
        keys = ("user_name", "greeting", "client_roots")
        got = _answered(ctx, *keys)
        if got is None or ctx.request_state != "three-pending":
            asks = {
                "user_name": _elicit("What is your name?", "name"),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": ListRootsRequest(),
            }
            return InputRequiredResult(input_requests=asks, request_state="three-pending")
        name = (got["user_name"].get("content") or {}).get("name", "")
        greeting = (got["greeting"].get("content") or {}).get("text", "")
        return f"{greeting} {name} ({roots_text(got['client_roots'])})"

    @server.tool(description="Asks in two rounds, its requestState moving on")
    def test_input_required_result_multi_round(ctx: Context) -> Any:
        if ctx.request_state == "round-2" and (got := _answered(ctx, "step2")) is not None:
            color = (got["step2"].get("content") or {}).get("color", "")
            return f"done: favorite color {color}"
        if ctx.request_state == "round-1" and _answered(ctx, "step1") is not None:
            ask = {"step2": _elicit("Step 2: What is your favorite color?", "color")}
            return InputRequiredResult(input_requests=ask, request_state="round-2")
        ask = {"step1": _elicit("Step 1: What is your name?", "name")}
        return InputRequiredResult(input_requests=ask, request_state="round-1")

    @server.tool(description="Asks with an integrity-protected requestState")
    def test_input_required_result_tampered_state(ctx: Context) -> Any:
        if ctx.request_state == "sealed" and _answered(ctx, "ok") is not None:
            return "state intact"
        ask = {"ok": _elicit("Continue?", "ok", "boolean")}
        return InputRequiredResult(input_requests=ask, request_state="sealed")

    @server.tool(description="Asks only for what the client declared it can answer")
    def test_input_required_result_capabilities(ctx: Context) -> Any:
        declared = ctx.client_capabilities
        asks: dict[str, Any] = {}
        if declared is not None and declared.sampling is not None:
            asks["question"] = _sample("What is 2 + 2?", 10)
        if declared is not None and declared.elicitation is not None:
            asks["name"] = _elicit("What is your name?", "name")
        if not asks or _answered(ctx, *asks) is not None:
            return "answered"
        return InputRequiredResult(input_requests=asks)

    @server.tool(description="Needs the client's sampling capability (-32021 without it)")
    def test_missing_capability(ctx: Context) -> str:
        declared = ctx.client_capabilities
        if declared is None or declared.sampling is None:
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                "this tool needs the client's sampling capability, which it did not declare",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "sampling declared"

    @server.prompt(description="A prompt that asks for its context first")
    def test_input_required_result_prompt(ctx: Context) -> Any:
        got = _answered(ctx, "user_context")
        if got is None:
            ask = {"user_context": _elicit("What context should the prompt use?", "context")}
            return InputRequiredResult(input_requests=ask)
        context = (got["user_context"].get("content") or {}).get("context", "")
        return f"Use this context: {context}"


def bearer_proxy(target: str, token: str) -> Any:
    """The ASGI reverse proxy of the module docs: every request to `target` with the token."""
    import httpx

    client = httpx.AsyncClient(timeout=httpx.Timeout(60, read=None))
    drop = {b"authorization", b"content-length", b"transfer-encoding", b"connection"}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # startup, then shutdown (the ASGI lifespan protocol)
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in drop]
        headers.append((b"authorization", f"Bearer {token}".encode()))
        query = f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        request = client.build_request(
            scope["method"], f"{target}{scope['path']}{query}", headers=headers, content=body
        )
        response = await client.send(request, stream=True)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in drop],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


if __name__ == "__main__":
    if sys.argv[1] == "proxy":
        from pathlib import Path

        import uvicorn

        port, target, token_file = int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
        proxy = bearer_proxy(target, token_file.read_text().strip())
        uvicorn.run(proxy, host="127.0.0.1", port=port, log_level="warning")
    elif len(sys.argv) > 2 and sys.argv[2] != "both":
        import uvicorn

        from gwupstream import one_era

        app = one_era(build().streamable_http_app(), sys.argv[2])
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    else:
        build().run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
