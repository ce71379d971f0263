"""The gateway's fast path: a ``tools/call`` served without the SDK's session machinery.

docs/gateway.md#fast-path. Most tool calls are one request and one result. Through the ``mcp``
SDK on both sides, such a call costs the gateway several milliseconds of CPU (JSON-RPC
validation, memory streams and task groups per request, an event stream per response), far
more than the checks. So a ``POST /mcp/{upstream}`` that carries exactly one ``tools/call`` on
an open MCP session of the caller's, or as a 2026-07-28 request (one POST, no session, its
headers agreeing with its body as the SDK's entry checks them), is answered here:

1. it is checked as every call is (``GatewayService.check``);
2. when allowed, it is POSTed on the upstream's session directly (``UpstreamLink.post``,
   under an id of the gateway's own), in the upstream's revision (``UpstreamLink.tool_call``);
3. when the upstream's first message back is the result, the agent gets it as one JSON body
   (``application/json``, which the Streamable HTTP transport lets a server answer:
   https://modelcontextprotocol.io/specification/2025-11-25/basic/transports#sending-messages-to-the-server);
4. when the upstream first sends something else (progress, a log message, a sampling or
   elicitation request), the request is handed to the SDK's path, as if it had just
   arrived: the proxy's ``tools/call`` handler takes the call in flight (``adopt``) instead
   of checking and forwarding it again, and relays the rest of its stream to the agent
   (``GatewayService.finish_direct``, ``UpstreamRelays.follow``).

Everything else (an opening request, another method, a batch, a body the fast path does not
read exactly as the SDK would, a stdio upstream, an upstream session not open yet) goes to
the SDK's path unchanged, its body replayed. ``notifications/cancelled`` for a call on the
fast path cancels it and tells the upstream. The fast path keeps the SDK's rules for a
session: only its owner may use it, a terminated or expiring session is the SDK's to answer,
and a call in flight holds off the session's idle timeout as the SDK's requests do.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from svc.gateway.relay import LEVELS, relayed_capabilities
from svc.gateway.service import (
    DirectCall,
    GatewayService,
    UpstreamSessionLost,
    UpstreamUnavailable,
    cancel_message,
)
from svc.gateway.tokens import AgentIdentity

__all__ = ["FastPath"]

log = logging.getLogger("svc.gateway")

#: The params a plain ``tools/call`` may carry (others, such as a task, go the SDK's way).
PLAIN_PARAMS = frozenset({"name", "arguments", "_meta"})
#: The ASGI scope key marking a 2026-07-28 request the fast path handed to the SDK's path.
FAST_MARK = "svc.fast"


def _id_key(request_id: Any) -> tuple[bool, Any]:
    """A JSON-RPC id as a dict key that keeps ``1`` and ``"1"`` apart."""
    return isinstance(request_id, str), request_id


async def _read_body(receive: Receive, limit: int) -> tuple[list[Message], bytes | None]:
    """Reads a request's body: ``(messages read, body)``, body None past `limit` bytes."""
    read: list[Message] = []
    size = 0
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return read, None
        size += len(message.get("body", b""))
        if size > limit:
            return read, None
        if not message.get("more_body", False):
            return read, b"".join(m.get("body", b"") for m in read)


def _replay(read: list[Message], receive: Receive) -> Receive:
    """`receive` with the messages already read given again first."""
    pending = list(read)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def _plain_call(msg: Any) -> tuple[Any, dict[str, Any]] | None:
    """``(id, params)`` of a JSON-RPC ``tools/call`` the fast path takes, else None."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return None
    if msg.get("method") != "tools/call" or set(msg) != {"jsonrpc", "id", "method", "params"}:
        return None
    rid, params = msg["id"], msg["params"]
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or not isinstance(params, dict):
        return None
    if not set(params) <= PLAIN_PARAMS or not isinstance(params.get("name"), str):
        return None
    if not isinstance(params.get("arguments", {}), dict):
        return None
    if not isinstance(params.get("_meta", {}), dict):
        return None
    return rid, params


async def _chain(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> Any:
    yield first
    async for msg in rest:
        yield msg


class FastPath:
    """One upstream proxy's fast path (module docs).

    Args:
        service: the gateway's service layer.
        name: the upstream's name.
        manager: the proxy's ``StreamableHTTPSessionManager`` (its sessions and their owners).

    """

    def __init__(self, service: GatewayService, name: str, manager: Any) -> None:
        from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

        self.service = service
        self.name = name
        self.link = service.links[name]
        self.manager = manager
        self.max_body = DEFAULT_MAX_REQUEST_BODY_SIZE
        self.versions = frozenset(HANDSHAKE_PROTOCOL_VERSIONS)
        self.modern_versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        self._ids = itertools.count(1)
        self._prefix = f"svc-{uuid.uuid4().hex[:8]}-"
        self._running: dict[tuple[str, tuple[bool, Any]], anyio.CancelScope] = {}
        self._handed: dict[tuple[str, tuple[bool, Any]], DirectCall] = {}

    def adopt(
        self, session_id: str, request_id: Any, scope: Scope | None = None
    ) -> DirectCall | None:
        """The call in flight that the fast path handed to the SDK's path, if this is it.

        Args:
            session_id: the agent's ``Mcp-Session-Id``.
            request_id: the agent's JSON-RPC id of the ``tools/call``.
            scope: the agent request's ASGI scope (a 2026-07-28 request, which has no session,
                is known by the mark the fast path put in it).

        Returns:
            The call (taken: a second ``adopt`` answers None), or None.

        """
        mark = scope.get(FAST_MARK) if scope is not None else None
        if mark is not None:
            return self._handed.pop(("", (True, mark)), None)
        return self._handed.pop((session_id, _id_key(request_id)), None)

    def _session(self, scope: Scope, session_id: str | None) -> Any:
        """The caller's open session transport named by `session_id`, or None (SDK's path)."""
        if session_id is None:
            return None
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context

        sessions = getattr(self.manager, "_server_instances", None)
        owners = getattr(self.manager, "_session_owners", None)
        if sessions is None or owners is None:  # another SDK version: always its own path
            return None
        transport = sessions.get(session_id)
        if transport is None or transport.is_terminated:
            return None
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if owners.get(session_id) != requestor:
            return None
        idle = getattr(transport, "idle_scope", None)
        if idle is not None and idle.cancel_called:
            return None
        return transport

    def _takes(self, scope: Scope, headers: Headers, modern: bool = False) -> bool:
        """Whether the request's method and headers are ones the fast path serves."""
        if scope["method"] != "POST" or not self.link.direct_ready():
            return False
        init = self.link.initialized
        if init is None or init.capabilities.tools is None:
            return False
        ctype = headers.get("content-type", "").partition(";")[0].strip().lower()
        accept = headers.get("accept", "").lower()
        version = headers.get("mcp-protocol-version")
        return (
            ctype == "application/json"
            and "application/json" in accept
            and "text/event-stream" in accept
            and (modern or version is None or version in self.versions)
        )

    async def _serve_modern(
        self,
        ident: AgentIdentity,
        scope: Scope,
        receive: Receive,
        send: Send,
        sdk: Callable[[Receive], Awaitable[None]],
        headers: Headers,
        version: str,
    ) -> None:
        """Serves a 2026-07-28 request: one POST, no session (docs/gateway.md#fast-path).

        Taken when it is a plain ``tools/call`` whose headers agree with its body as the SDK's
        entry checks them (the revision's envelope, ``MCP-Protocol-Version``, ``Mcp-Method``,
        ``Mcp-Name``, no routing header twice, the tool's ``Mcp-Param-*`` headers); anything
        else goes the SDK's way, which answers it (a mismatch with its ``-32020`` error).
        """
        from mcp.shared.inbound import (
            InboundLadderRejection,
            classify_inbound_request,
            find_duplicated_routing_header,
            validate_mcp_param_headers,
        )

        if not self._takes(scope, headers, modern=True) or "mcp-session-id" in headers:
            await sdk(receive)
            return
        read, body = await _read_body(receive, self.max_body)
        replay = _replay(read, receive)
        try:
            msg = json.loads(body) if body is not None else None
        except ValueError:
            msg = None
        call = _plain_call(msg)
        if call is None or find_duplicated_routing_header(headers.items()) is not None:
            await sdk(replay)
            return
        verdict = classify_inbound_request(call_body(msg), headers=dict(headers.items()))
        if isinstance(verdict, InboundLadderRejection):
            await sdk(replay)
            return
        params = call[1]
        schema = self.link.tool_schemas.get(params["name"])
        declared = any(k.startswith("mcp-param-") for k in headers)
        if (schema is None and declared) or (
            schema is not None
            and validate_mcp_param_headers(schema, params.get("arguments") or {}, headers)
            is not None
        ):
            await sdk(replay)
            return
        self.service.count_request(self.name, ident, version)
        mark = f"{self._prefix}m{next(self._ids)}"
        scope[FAST_MARK] = mark
        level = (params.get("_meta") or {}).get(types.LOG_LEVEL_META_KEY)
        await self._call(
            ident,
            scope,
            send,
            "",
            None,
            call,
            lambda: sdk(replay),
            modern=True,
            level=level if level in LEVELS else None,
            key=("", (True, mark)),
        )

    async def serve(
        self,
        ident: AgentIdentity,
        scope: Scope,
        receive: Receive,
        send: Send,
        sdk: Callable[[Receive], Awaitable[None]],
    ) -> None:
        """Serves one ``/mcp/{upstream}`` request of a verified caller.

        Args:
            ident: the verified caller (``scope["user"]`` already bound to it).
            scope: the ASGI request's scope.
            receive: its ASGI receive.
            send: its ASGI send.
            sdk: serves the request on the SDK's path, reading its body from the given
                ``receive``.

        """
        headers = Headers(scope=scope)
        version = headers.get("mcp-protocol-version")
        if version in self.modern_versions:
            await self._serve_modern(ident, scope, receive, send, sdk, headers, version)
            return
        session_id = headers.get("mcp-session-id")
        if not self._takes(scope, headers):
            await sdk(receive)
            return
        transport = self._session(scope, session_id)
        if transport is None or session_id is None:
            await sdk(receive)
            return
        read, body = await _read_body(receive, self.max_body)
        replay = _replay(read, receive)
        try:
            msg = json.loads(body) if body is not None else None
        except ValueError:
            msg = None
        call = _plain_call(msg)
        if call is None:
            if isinstance(msg, dict) and msg.get("method") == "notifications/cancelled":
                params = msg.get("params")
                rid = params.get("requestId") if isinstance(params, dict) else None
                running = self._running.get((session_id, _id_key(rid)))
                if running is not None:
                    running.cancel()
            await sdk(replay)
            return
        # The transport's default when a client sends no version (the MCP transport spec).
        version = headers.get("mcp-protocol-version") or "2025-03-26"
        self.service.count_request(self.name, ident, version)
        await self._call(ident, scope, send, session_id, transport, call, lambda: sdk(replay))

    async def _call(
        self,
        ident: AgentIdentity,
        scope: Scope,
        send: Send,
        session_id: str,
        transport: Any,
        call: tuple[Any, dict[str, Any]],
        hand_over: Callable[[], Awaitable[None]],
        *,
        modern: bool = False,
        level: types.LoggingLevel | None = None,
        key: tuple[str, tuple[bool, Any]] | None = None,
    ) -> None:
        """Checks and forwards one plain call; answers it or hands it to the SDK's path.

        Args:
            ident: the verified caller.
            scope: the agent request's ASGI scope.
            send: its ASGI send.
            session_id: its ``Mcp-Session-Id`` (``""`` for a 2026-07-28 request).
            transport: its session's SDK transport (None for a 2026-07-28 request).
            call: ``(id, params)`` of the plain ``tools/call``.
            hand_over: serves the request on the SDK's path (its body replayed).
            modern: the agent's request is of the 2026-07-28 revision (no session: `session_id`
                is ``""``, `transport` None, `key` its mark).
            level: such a request's log opt-in.
            key: the call's key among the calls in flight (default: session and request id).

        """
        rid, params = call
        key = key or (session_id, _id_key(rid))
        tool = params["name"]
        held = _hold(transport)
        try:
            blocked, outcome, mapping, resource = await self.service.check(
                self.name, tool, params.get("arguments") or {}, ident, str(Request(scope).base_url)
            )
            if blocked is not None:
                result = self.service.blocked(self.name, tool, ident, blocked)
                body = result.model_dump(by_alias=True, exclude_none=True, mode="json")
                await _answer(send, session_id, {"jsonrpc": "2.0", "id": rid, "result": body})
                return
            self.service.forwarding(self.name, outcome)
            upstream_id = f"{self._prefix}{next(self._ids)}"
            if modern:
                caps = (params.get("_meta") or {}).get(types.CLIENT_CAPABILITIES_META_KEY)
                declared: dict[str, Any] | None = relayed_capabilities(caps)
            else:  # a handshake-era agent: its session's level (or every message) and caps
                level = self.link.relays.level(session_id) or "debug"
                declared = self.link.relays.capabilities(session_id)
            # The upstream session is shared: its progress tokens must be the gateway's.
            message, extra = self.link.tool_call(params, upstream_id, level, declared)
            timeout = self.service.settings.upstream_timeout_secs
            with anyio.CancelScope() as cancel:
                self._running[key] = cancel
                try:
                    async with contextlib.AsyncExitStack() as stack:
                        sent = time.perf_counter()
                        messages = await self._post(stack, message, timeout, extra)
                        first = await anext(messages, None)
                        self.service.metrics.upstream_seconds.labels(self.name).observe(
                            time.perf_counter() - sent
                        )
                        if first is None:
                            raise UpstreamUnavailable(
                                f"upstream `{self.name}` answered the call with nothing"
                            )
                        if (
                            "method" not in first
                            and first.get("id") == upstream_id
                            and (modern or not _asks(first))
                        ):
                            # Answered: a cancellation from now on is too late to matter.
                            del self._running[key]
                            with anyio.CancelScope(shield=True):
                                await self._result(send, session_id, rid, first, ident, tool,
                                                   mapping, resource, outcome, modern)  # fmt: skip
                            self.service.metrics.fast_path.labels(self.name, "answered").inc()
                            await _drain(messages)
                            return
                        # The upstream relates messages to the call: the SDK's path relays them.
                        self.service.metrics.fast_path.labels(self.name, "relayed").inc()
                        del self._running[key]
                        # The call's stream goes with it: whoever adopts it closes it (a held
                        # call's rounds outlive this request).
                        stream = stack.pop_all()
                        self._handed[key] = DirectCall(
                            self.name, tool, ident, mapping, resource, outcome, upstream_id,
                            _chain(first, messages), params, stream,
                        )  # fmt: skip
                        try:
                            await hand_over()
                        finally:
                            if self._handed.pop(key, None) is not None:  # never adopted
                                with anyio.CancelScope(shield=True):
                                    await stream.aclose()
                        return
                finally:
                    self._running.pop(key, None)
            if cancel.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    try:
                        await self.link.send(cancel_message(upstream_id))
                    except UpstreamUnavailable as e:
                        log.debug("upstream %s: cancellation not sent: %s", self.name, e)
                    # A cancelled request is never answered (MCP cancellation): the stream ends.
                    await _events_end(send, session_id)
        except UpstreamUnavailable as e:
            error = {"code": types.INTERNAL_ERROR, "message": str(e)}
            await _answer(send, session_id, {"jsonrpc": "2.0", "id": rid, "error": error})
        finally:
            _release(transport, held)

    async def _post(
        self,
        stack: contextlib.AsyncExitStack,
        message: dict[str, Any],
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """``UpstreamLink.post`` in `stack`; sent once more on a new session after a 404.

        A 404 means the upstream never took the call (it no longer knows the session: it was
        restarted), so it is sent again once the link has opened a new session (up to 5 s).
        """
        try:
            return await stack.enter_async_context(self.link.post(message, timeout, headers))
        except UpstreamSessionLost:
            if not await self.link.reopened():
                raise
            log.info("upstream %s: the session was lost; the call goes on a new one", self.name)
            return await stack.enter_async_context(self.link.post(message, timeout, headers))

    async def _result(
        self,
        send: Send,
        session_id: str,
        rid: Any,
        response: dict[str, Any],
        ident: AgentIdentity,
        tool: str,
        mapping: Any,
        resource: dict[str, str] | None,
        outcome: str,
        modern: bool = False,
    ) -> None:
        """Passes the upstream's response on under the agent's id; records a result's event.

        A 2026-07-28 agent's result says its ``resultType`` (a handshake-era upstream's does
        not); an ``InputRequiredResult`` (a round of the call) is not recorded.
        """
        result = response.get("result")
        error = response.get("error")
        status = 200
        if isinstance(result, dict):
            if modern and "resultType" not in result:
                result = {**result, "resultType": "complete"}
            out: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "result": result}
            if not _asks(response):
                failed = result.get("isError") is True
                self.service.record(self.name, tool, ident, mapping, resource, failed, outcome)
        elif isinstance(error, dict):
            out = {"jsonrpc": "2.0", "id": rid, "error": error}
            if modern:  # the revision's HTTP status of an error (as the SDK's entry sends it)
                from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

                status = ERROR_CODE_HTTP_STATUS.get(error.get("code"), 200)  # type: ignore[arg-type]
        else:
            message = f"upstream `{self.name}` answered the call with a malformed response"
            out = {"jsonrpc": "2.0", "id": rid, "error": {"code": types.INTERNAL_ERROR,
                                                          "message": message}}  # fmt: skip
        await _answer(send, session_id, out, status)


def call_body(msg: Any) -> dict[str, Any]:
    """A plain call's decoded body (``_plain_call`` took it: a JSON object)."""
    assert isinstance(msg, dict)
    return msg


def _asks(response: dict[str, Any]) -> bool:
    """Whether a response is a 2026-07-28 ``InputRequiredResult`` (a round, not the end)."""
    result = response.get("result")
    return isinstance(result, dict) and result.get("resultType") == "input_required"


async def _drain(messages: AsyncIterator[dict[str, Any]]) -> None:
    """Reads an answered call's stream to its end, for at most a second.

    The upstream ends the stream after the response (the Streamable HTTP transport); read to
    its end, the connection goes back to the pool instead of being closed. Whatever fails now
    concerns no one: the agent has its answer.
    """
    with anyio.move_on_after(1.0):
        try:
            async for _ in messages:
                pass
        except Exception as e:
            log.debug("an answered call's stream ended badly: %s", e)


def _hold(transport: Any | None) -> bool:
    """Holds off the session's idle timeout while a call is in flight, as the SDK's requests do.

    Returns:
        Whether it was held (the SDK version keeps the count this relies on).

    """
    if transport is None:
        return False
    idle = getattr(transport, "idle_scope", None)
    if idle is None or not hasattr(transport, "_requests_in_flight"):
        return False
    transport._requests_in_flight += 1
    idle.deadline = math.inf
    return True


def _release(transport: Any, held: bool) -> None:
    if not held:
        return
    transport._requests_in_flight -= 1
    timeout = getattr(transport, "_idle_timeout", None)
    if not transport._requests_in_flight and timeout is not None:
        transport.idle_scope.deadline = anyio.current_time() + timeout


async def _answer(send: Send, session_id: str, body: dict[str, Any], status: int = 200) -> None:
    """An ``application/json`` response with one JSON-RPC message (no session: ``""``)."""
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]
    if session_id:
        headers.append((b"mcp-session-id", session_id.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _events_end(send: Send, session_id: str) -> None:
    """An event stream with no event: the answer to a request that was cancelled."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"mcp-session-id", session_id.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})
