"""The gateway's one port: the MCP proxies, the agents' challenge wait and the probes.

``create_app(service)`` is one ASGI app (docs/gateway.md#routes):

* ``/mcp/{upstream}``: the upstream's MCP proxy, Streamable HTTP on the agent side (the MCP
  specification's transport, https://modelcontextprotocol.io/specification/2025-11-25/basic/
  transports), built on the ``mcp`` SDK's low-level ``Server`` and its
  ``StreamableHTTPSessionManager``. Every ``/mcp/...`` request first needs an accepted
  ``Host`` and ``Origin`` (``TransportGuard``, DNS rebinding protection), then a valid agent token
  (``svc.gateway.tokens``; 401 otherwise); an MCP session is bound to the caller that opened
  it (another caller gets 404 for it). ``tools/call`` is checked (``GatewayService.call_tool``);
  ``tools/list``, resources (subscriptions too), prompts, completions and
  ``logging/setLevel`` pass through to the upstream's session, and the capabilities announced
  at ``initialize`` are the upstream's (with ``listChanged`` on every list: the upstream's
  ``list_changed`` notifications go to every agent session, and so do the gateway's own after
  the upstream's session opens again). What the upstream sends during a forwarded call
  (progress, log messages, sampling and elicitation requests) goes to that call's agent
  (``AgentRelay``, ``svc.gateway.relay``). A plain ``tools/call`` on an open session takes the
  fast path (``svc.gateway.fastpath``, docs/gateway.md#fast-path) around the SDK.
  Both protocol eras are served (docs/gateway.md#protocol-revisions): the SDK's manager hands a
  2026-07-28 request (one POST, no session, its ``_meta`` envelope and ``Mcp-Method`` /
  ``Mcp-Name`` headers checked against its body) to its stateless entry, which runs the same
  handlers; ``server/discover`` and ``subscriptions/listen`` are served for that revision, and
  a 2026-07-28 agent's call to a handshake-era upstream that asks for input mid-call is held
  (``svc.gateway.rounds``). Each request is counted by agent and revision
  (``svc_gateway_agent_requests_total``).
* ``GET /mcp/challenges/{challenge_qid}?wait=<0..25>``: the caller's challenge wait.
* ``/healthz``, ``/readyz``, ``/version``, ``/metrics`` (``svc.common.health.probe_router``).

``serve`` runs it with uvicorn and httptools in the calling thread
(``svc.common.connect.serve_asgi`` with ``http1``: the gateway serves no gRPC);
``GatewayServer`` in a thread of its own (tests, ``svc up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio.to_thread
import mcp_types as types
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import ListenHandler
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from svc import __version__, web
from svc.common.connect import METRICS_CONTENT_TYPE, ThreadedServer, serve_asgi
from svc.common.health import Readiness, probe_router
from svc.common.limits import PROBE_MAX_BODY_BYTES, harden
from svc.common.problems import Problem, install_problem_handlers, problem_response
from svc.gateway.fastpath import FastPath
from svc.gateway.relay import LEVELS, relayed_capabilities
from svc.gateway.rounds import HeldCalls
from svc.gateway.service import GatewayService, UpstreamUnavailable
from svc.gateway.settings import GatewaySettings
from svc.gateway.tokens import AgentIdentity, AgentTokenVerifier, TokenError

__all__ = ["AgentRelay", "GatewayServer", "McpProxy", "TransportGuard", "create_app", "serve"]

log = logging.getLogger("svc.gateway")

#: The ASGI scope key holding the verified caller of an MCP request.
AGENT_SCOPE_KEY = "svc.agent"


def _agent(ctx: Any) -> AgentIdentity:
    """The verified caller of a handler's request (put in the scope by the token check)."""
    request = getattr(ctx, "request", None)
    ident = request.scope.get(AGENT_SCOPE_KEY) if request is not None else None
    if not isinstance(ident, AgentIdentity):  # never: every request passes the token check
        from mcp.shared.exceptions import MCPError

        raise MCPError(types.INVALID_REQUEST, "no verified agent token on this request")
    return ident


def _base_url(ctx: Any) -> str:
    request = getattr(ctx, "request", None)
    return str(request.base_url) if request is not None else ""


def _revision(ctx: Any) -> str:
    """The protocol revision of a handler's request.

    ``2026-07-28`` (its ``_meta`` envelope), or the version its agent session negotiated at
    ``initialize``.
    """
    return str(getattr(ctx, "protocol_version", "") or "")


def _opted_level(meta: Any) -> types.LoggingLevel | None:
    """The log level a 2026-07-28 request's ``_meta`` opts in to, or None.

    The revision's per-request logging (``io.modelcontextprotocol/logLevel``): without the
    opt-in, no log messages are sent.
    """
    level = (meta or {}).get(types.LOG_LEVEL_META_KEY)
    return level if level in LEVELS else None


def _session_key(ctx: Any) -> str:
    """The agent's MCP session id (``Mcp-Session-Id``) of a handler's request, or ``""``."""
    request = getattr(ctx, "request", None)
    return str(request.headers.get("mcp-session-id", "")) if request is not None else ""


class AgentRelay:
    """The agent's side of one forwarded request (``svc.gateway.relay.Relay``).

    Sends on the agent request's own response stream (``related_request_id``: the MCP
    Streamable HTTP transport's related messages), through the request's ``ServerSession``
    (docs/gateway.md#relaying).

    Args:
        ctx: the agent request's context (the SDK's ``ServerRequestContext``).
        progress_token: the agent's ``_meta.progressToken`` (None: progress is not sent).
        min_level: the agent session's ``logging/setLevel``, or on a 2026-07-28 request the
            level its ``_meta`` opts in to (``io.modelcontextprotocol/logLevel``); None: every
            message is sent (handshake era), none at all (2026-07-28: no opt-in, no logs).
        modern: the agent's request is of the 2026-07-28 revision (one request, no session):
            it has no back channel, so ``request`` raises ``NoBackChannelError``.
        capabilities: the client capabilities the agent declared that the gateway relays
            (sampling, elicitation, roots), sent upstream with its requests to a 2026-07-28
            upstream; None: unknown (the gateway's own are sent).

    """

    def __init__(
        self,
        ctx: Any,
        progress_token: str | int | None,
        min_level: types.LoggingLevel | None,
        *,
        modern: bool = False,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        self.ctx = ctx
        self.progress_token = progress_token
        self.min_level = min_level
        self.modern = modern
        self.capabilities = capabilities

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """A ``notifications/progress`` with the agent's token; nothing without one."""
        if self.progress_token is None:
            return
        await self.ctx.session.send_progress_notification(
            self.progress_token, progress, total, message, related_request_id=self.ctx.request_id
        )

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """A ``notifications/message``, unless below the agent session's level."""
        if self.min_level is None:
            if self.modern:  # 2026-07-28: logs only for a request that opted in
                return
        elif LEVELS.index(params.level) < LEVELS.index(self.min_level):
            return
        await self.ctx.session.send_notification(
            types.LoggingMessageNotification(params=params), related_request_id=self.ctx.request_id
        )

    async def request(self, request: Any, result_type: Any) -> Any:
        """The agent's result of a server-to-client request (sampling, elicitation).

        Raises:
            mcp.shared.exceptions.MCPError: the agent's error; ``NoBackChannelError`` when its
                request's stream cannot carry a request.

        """
        from mcp.shared.message import ServerMessageMetadata

        return await self.ctx.session.send_request(
            request,
            result_type,
            metadata=ServerMessageMetadata(related_request_id=self.ctx.request_id),
        )


#: The 2026-07-28 revision's caching hints (``ttlMs``, ``cacheScope``) the gateway gives a
#: listing or a read whose upstream gave none (an upstream's own hints pass through): stale at
#: once, and private to the caller's authorization context, since the gateway cannot know how
#: long an upstream's lists hold and answers each agent under its own token.
CACHE_HINTS: dict[Any, CacheHint] = {
    method: CacheHint(ttl_ms=0, scope="private")
    for method in (
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
    )
}


class ProxyServer(Server):
    """The SDK's low-level ``Server`` announcing ``listChanged`` on each list it serves.

    The gateway relays the upstream's ``list_changed`` notifications and sends its own when the
    upstream's session opens again (``McpProxy``), so agents may rely on them whatever the
    upstream announced (MCP lifecycle, capability negotiation:
    https://modelcontextprotocol.io/specification/2025-11-25/basic/lifecycle).
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        """The SDK's, with every ``*_changed`` option on unless `notification_options` is given."""
        changes = notification_options or NotificationOptions(
            prompts_changed=True, resources_changed=True, tools_changed=True
        )
        return super().create_initialization_options(changes, experimental_capabilities, extensions)


class McpProxy:
    """One upstream's MCP proxy: a low-level ``Server`` whose handlers forward to the upstream.

    The handlers registered follow the upstream's capabilities each time its session opens
    (before the first, every kind is registered and a request waits for the session). Each
    agent session is remembered from its ``notifications/initialized``, and when the upstream's
    session opens again (after a lost one, or an upstream restarted with other tools) every
    remembered session is sent ``list_changed`` for the lists the upstream serves, so agents
    list again.

    Args:
        service: the gateway's service layer.
        name: the upstream's name.

    """

    def __init__(self, service: GatewayService, name: str) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self.service = service
        self.name = name
        self.server: Any = ProxyServer(name, version=__version__, cache_hints=CACHE_HINTS)
        self._connections = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._install(None)
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized
        )
        service.links[name].on_connected = self._install
        self.manager = StreamableHTTPSessionManager(app=self.server)
        self.held = HeldCalls(service.settings.upstream_timeout_secs)
        self.listen = ListenHandler(service.links[name].relays.bus)
        self.server.add_request_handler(
            "subscriptions/listen", types.SubscriptionsListenRequestParams, self._listen
        )
        self.fast = FastPath(service, name, self.manager)
        # The SDK's 2026-07-28 entry checks a call's Mcp-Param-* headers against the tool's
        # schema: the schemas the upstream last listed, not a tools/list per call.
        self.server.get_tool_input_schema = service.links[name].tool_schemas.get

    def _remember(self, ctx: Any) -> None:
        """Remembers (or marks as recent) the agent session of a handler's message."""
        self.service.links[self.name].relays.note_session(_session_key(ctx), ctx.session)

    def _caller(self, ctx: Any) -> AgentIdentity:
        """The verified caller of a handler's request; its agent session is marked recent.

        The request is counted by caller and protocol revision
        (``svc_gateway_agent_requests_total``, docs/gateway.md#protocol-revisions).
        """
        ident = _agent(ctx)
        self._remember(ctx)
        self.service.count_request(self.name, ident, _revision(ctx))
        return ident

    async def _listen(self, ctx: Any, params: types.SubscriptionsListenRequestParams) -> Any:
        """``subscriptions/listen`` (2026-07-28): the upstream's list changes on this stream.

        The SDK's ``ListenHandler`` over the upstream's list changes (``UpstreamRelays.bus``:
        its ``list_changed`` notifications, and the gateway's own when the upstream's session
        opens again). Resource subscriptions are not honored (the acknowledgement says so):
        the gateway does not subscribe upstream for such a stream.
        """
        self._caller(ctx)
        wanted = params.notifications.model_copy(update={"resource_subscriptions": None})
        return await self.listen(ctx, params.model_copy(update={"notifications": wanted}))

    async def _initialized(self, ctx: Any, params: types.NotificationParams) -> None:
        """``notifications/initialized``: the new agent session is remembered.

        Also a session whose only requests will be fast-path calls, which do not reach the
        SDK's handlers.
        """
        self._remember(ctx)

    def _relay(self, ctx: Any, params: Any) -> AgentRelay:
        """The agent's side of a forwarded request: its progress token and log level."""
        meta = getattr(params, "meta", None) or {}
        token = meta.get("progress_token")
        modern = _revision(ctx) in MODERN_PROTOCOL_VERSIONS
        caps: dict[str, Any] | None
        if modern:
            level = _opted_level(meta)
            caps = relayed_capabilities(meta.get(types.CLIENT_CAPABILITIES_META_KEY))
        else:
            level = self.service.links[self.name].relays.level(_session_key(ctx))
            declared = getattr(getattr(ctx, "session", None), "client_capabilities", None)
            caps = None
            if declared is not None:
                dumped = declared.model_dump(by_alias=True, mode="json", exclude_none=True)
                caps = relayed_capabilities(dumped)
        return AgentRelay(ctx, token, level, modern=modern, capabilities=caps)

    def _passthrough(self, request_type: Any, result_type: Any) -> Callable[..., Awaitable[Any]]:
        async def handle(ctx: Any, params: Any) -> Any:
            self._caller(ctx)
            try:
                return await self.service.forward(
                    self.name, request_type(params=params), result_type, self._relay(ctx, params)
                )
            except UpstreamUnavailable as e:
                from mcp.shared.exceptions import MCPError

                raise MCPError(types.INTERNAL_ERROR, str(e)) from e

        return handle

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        """``tools/call``: checked and forwarded (``GatewayService.call_tool``).

        Either era: a 2026-07-28 request's log level is the one its ``_meta`` opts in to, and an
        upstream's ``InputRequiredResult`` goes back to it as its answer (it retries with the
        responses); a handshake-era agent's level is its session's. A 2026-07-28 agent's call to
        a handshake-era upstream is held (``svc.gateway.rounds``): the upstream's requests for
        input become input-required rounds.
        """
        relay = self._relay(ctx, params)
        held_rounds = relay.modern and not self.service.links[self.name].modern
        try:
            request = getattr(ctx, "request", None)
            scope = request.scope if request is not None else None
            direct = self.fast.adopt(_session_key(ctx), ctx.request_id, scope)
            if direct is not None:  # forwarded by the fast path, its stream to relay
                if held_rounds:
                    return await self.held.start(
                        direct.ident.key(),
                        direct.tool,
                        relay,
                        lambda held: self.service.finish_direct(direct, held),
                    )
                return await self.service.finish_direct(direct, relay)
            ident = self._caller(ctx)
            if held_rounds:
                # A handshake-era upstream asks during the call: rounds for this agent.
                if self.held.resumes(params):
                    return await self.held.resume(ident.key(), params, relay)
                base = _base_url(ctx)
                return await self.held.start(
                    ident.key(),
                    params.name,
                    relay,
                    lambda held: self.service.call_tool(self.name, params, ident, base, held),
                )
            return await self.service.call_tool(self.name, params, ident, _base_url(ctx), relay)
        except UpstreamUnavailable as e:
            from mcp.shared.exceptions import MCPError

            raise MCPError(types.INTERNAL_ERROR, str(e)) from e

    async def _set_level(self, ctx: Any, params: types.SetLevelRequestParams) -> Any:
        """``logging/setLevel``: remembers the agent session's level (docs/gateway.md#relaying).

        The upstream's session is shared, so it is set to the most verbose level any agent
        session asked for, and each agent gets the messages at or above its own.
        """
        self._caller(ctx)
        link = self.service.links[self.name]
        upstream = link.relays.set_level(_session_key(ctx), params.level)
        if not link.modern:  # a 2026-07-28 upstream gets the level with each request instead
            await self._forward(
                types.SetLevelRequest(params=params.model_copy(update={"level": upstream}))
            )
        return types.EmptyResult()

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> Any:
        """``resources/subscribe``: the agent session is told of the resource's updates.

        The upstream is subscribed once for all agent sessions (docs/gateway.md#relaying).
        """
        self._caller(ctx)
        uri = str(params.uri)
        if self.service.links[self.name].relays.subscribe(uri, _session_key(ctx), ctx.session):
            try:
                await self._forward(types.SubscribeRequest(params=params))
            except BaseException:
                self.service.links[self.name].relays.unsubscribe(uri, _session_key(ctx))
                raise
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> Any:
        """``resources/unsubscribe``: the upstream is unsubscribed when no agent session is left."""
        self._caller(ctx)
        if self.service.links[self.name].relays.unsubscribe(str(params.uri), _session_key(ctx)):
            await self._forward(types.UnsubscribeRequest(params=params))
        return types.EmptyResult()

    async def _forward(self, request: Any) -> Any:
        try:
            return await self.service.forward(self.name, request, types.EmptyResult)
        except UpstreamUnavailable as e:
            from mcp.shared.exceptions import MCPError

            raise MCPError(types.INTERNAL_ERROR, str(e)) from e

    def _install(self, init: types.InitializeResult | None) -> None:
        """Registers the handlers of the upstream's capabilities (all of them when None)."""
        caps = init.capabilities if init is not None else None
        # A 2026-07-28 upstream has no resources/subscribe (the revision's subscriptions/listen
        # is not relayed); logging/setLevel is the gateway's own for it (the level goes with
        # each forwarded request).
        modern = init is not None and init.protocol_version in MODERN_PROTOCOL_VERSIONS
        subscribe = caps is None or bool(caps.resources and caps.resources.subscribe and not modern)
        t = types
        table: list[tuple[str, bool, Any, Any]] = [
            (
                "tools/list",
                caps is None or caps.tools is not None,
                t.PaginatedRequestParams,
                self._passthrough(t.ListToolsRequest, t.ListToolsResult),
            ),
            (
                "tools/call",
                caps is None or caps.tools is not None,
                t.CallToolRequestParams,
                self._call_tool,
            ),
            (
                "resources/list",
                caps is None or caps.resources is not None,
                t.PaginatedRequestParams,
                self._passthrough(t.ListResourcesRequest, t.ListResourcesResult),
            ),
            (
                "resources/templates/list",
                caps is None or caps.resources is not None,
                t.PaginatedRequestParams,
                self._passthrough(t.ListResourceTemplatesRequest, t.ListResourceTemplatesResult),
            ),
            (
                "resources/read",
                caps is None or caps.resources is not None,
                t.ReadResourceRequestParams,
                self._passthrough(t.ReadResourceRequest, t.ReadResourceResult),
            ),
            (
                "resources/subscribe",
                subscribe,
                t.SubscribeRequestParams,
                self._subscribe,
            ),
            (
                "resources/unsubscribe",
                subscribe,
                t.UnsubscribeRequestParams,
                self._unsubscribe,
            ),
            (
                "logging/setLevel",
                caps is None or caps.logging is not None or modern,
                t.SetLevelRequestParams,
                self._set_level,
            ),
            (
                "prompts/list",
                caps is None or caps.prompts is not None,
                t.PaginatedRequestParams,
                self._passthrough(t.ListPromptsRequest, t.ListPromptsResult),
            ),
            (
                "prompts/get",
                caps is None or caps.prompts is not None,
                t.GetPromptRequestParams,
                self._passthrough(t.GetPromptRequest, t.GetPromptResult),
            ),
            (
                "completion/complete",
                caps is None or caps.completions is not None,
                t.CompleteRequestParams,
                self._passthrough(t.CompleteRequest, t.CompleteResult),
            ),
        ]
        handlers = self.server._request_handlers  # the SDK's registry (add_request_handler's)
        for method, on, params_type, handler in table:
            if on:
                self.server.add_request_handler(method, params_type, handler)
            else:
                handlers.pop(method, None)
        if init is not None:
            self.server.instructions = init.instructions
            self._connections += 1
            if self._connections > 1:
                self._lists_changed(init.capabilities)

    def _lists_changed(self, caps: types.ServerCapabilities) -> None:
        """Tells every remembered agent session that the upstream's lists may have changed.

        Called when the upstream's session opened again: it may have been restarted with
        other tools, resources or prompts.
        """
        changed: list[Any] = []
        if caps.tools is not None:
            changed.append(types.ToolListChangedNotification())
        if caps.resources is not None:
            changed.append(types.ResourceListChangedNotification())
        if caps.prompts is not None:
            changed.append(types.PromptListChangedNotification())
        if not changed:
            return
        task = asyncio.get_running_loop().create_task(
            self.service.links[self.name].relays.lists_changed(changed)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class TransportGuard:
    """DNS rebinding protection of ``/mcp/...``: the request's ``Host`` and ``Origin`` checked.

    The MCP transport's security warning (https://modelcontextprotocol.io/specification/
    2025-11-25/basic/transports#security-warning: servers MUST validate ``Origin``) and the
    ``mcp`` SDK's own check (``mcp.server.transport_security.TransportSecurityMiddleware``, the
    one its Streamable HTTP transport runs; exact values or ``name:*`` for any port). Accepted:
    the loopback names (``127.0.0.1``, ``localhost``, ``[::1]``) with the port the request came
    in on (and bare, on port 80 or 443), ``public_url``'s host and origin, and
    ``allowed_hosts`` / ``allowed_origins`` (docs/gateway.md#dns-rebinding-protection). A
    request without ``Origin`` is not refused for it.

    Args:
        settings: the gateway's settings.

    """

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._by_port: dict[int, Any] = {}

    def _middleware(self, port: int) -> Any:
        from urllib.parse import urlsplit

        from mcp.server.transport_security import (
            TransportSecurityMiddleware,
            TransportSecuritySettings,
        )

        mw = self._by_port.get(port)
        if mw is None:
            names = ("127.0.0.1", "localhost", "[::1]")
            hosts = [f"{n}:{port}" for n in names]
            if port in (80, 443):
                hosts += list(names)
            origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
            if self.settings.public_url:
                public = urlsplit(self.settings.public_url)
                hosts.append(public.netloc)
                origins.append(f"{public.scheme}://{public.netloc}")
            mw = TransportSecurityMiddleware(
                TransportSecuritySettings(
                    enable_dns_rebinding_protection=True,
                    allowed_hosts=[*hosts, *self.settings.allowed_hosts],
                    allowed_origins=[*origins, *self.settings.allowed_origins],
                )
            )
            self._by_port[port] = mw
        return mw

    async def check(self, scope: Scope) -> Problem | None:
        """The problem to answer a request with, or None when its ``Host`` and ``Origin`` pass.

        Args:
            scope: the request's ASGI scope (``server`` gives the port it came in on).

        Returns:
            None, or a ``Problem``: 421 ``misdirected-request`` for a ``Host`` not accepted
            (the SDK's status), 403 ``origin-not-allowed`` for an ``Origin`` not accepted (the
            MCP transport's).

        """
        from starlette.requests import Request

        server = scope.get("server")
        port = int(server[1]) if server and server[1] is not None else self.settings.port
        refused = await self._middleware(port).validate_request(Request(scope), is_post=False)
        if refused is None:
            return None
        headers = dict(Request(scope).headers)
        if refused.status_code == 421:
            return Problem(
                421,
                "misdirected-request",
                "The Host is not this gateway's",
                f"`Host: {headers.get('host', '')[:128]}` is not one of this gateway's names "
                "(DNS rebinding protection: SVC_GATEWAY_ALLOWED_HOSTS, docs/gateway.md)",
            )
        return Problem(
            403,
            "origin-not-allowed",
            "The Origin is not allowed",
            f"`Origin: {headers.get('origin', '')[:128]}` is not allowed (DNS rebinding "
            "protection: SVC_GATEWAY_ALLOWED_ORIGINS, docs/gateway.md)",
        )


def _bearer(scope: Scope) -> str:
    scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    raise TokenError(
        "no bearer token: send `Authorization: Bearer <agent token>` (docs/gateway.md)",
        missing=True,
    )


def _unauthorized(e: TokenError) -> Problem:
    return Problem(
        401,
        "unauthenticated",
        "The agent token is refused",
        e.detail,
        headers={"WWW-Authenticate": e.www_authenticate()},
    )


def health_app(service: GatewayService, verifier: AgentTokenVerifier) -> FastAPI:
    """The probes and the challenge wait (module docs).

    ``/readyz`` is 200 once every upstream's session is open, the trusted apps, the
    containment list and the outage tiers are loaded, and none of those feeds is stale (no
    successful read within ``feed_max_staleness_secs``); else 503 naming what is missing and
    each stale feed with its last success and last error.

    Args:
        service: the service layer.
        verifier: checks the agents' tokens of the challenge wait.

    Returns:
        The FastAPI app, answering errors as RFC 9457 problems.

    """
    app = FastAPI(title="svc-gateway", version=__version__, docs_url=None, redoc_url=None)
    web.install(app)
    install_problem_handlers(app)
    # Bodies bounded and JSON checked on the probes' app (the challenge wait); the MCP paths
    # bound their own (``fastpath``), and check agents' tokens with ``authenticate``.
    harden(app, max_body_bytes=PROBE_MAX_BODY_BYTES, setting="the gateway's body limit")

    def readiness() -> Readiness:
        reasons = [
            f"upstream `{n}` is not connected: {link.error}"
            for n, link in service.links.items()
            if link.initialized is None or link.error
        ]
        if not service.apps.loaded:
            reasons.append("the trusted apps are not loaded")
        if not service.containments.loaded:
            reasons.append("the containment list is not loaded")
        if not service.tiers.loaded:
            reasons.append("the outage tiers are not loaded")
        # A followed feed without a successful read within the bound: the last good list keeps
        # serving, but the gateway is not ready (docs/gateway.md#readiness-and-feeds).
        reasons += service.feeds.readiness_reasons()
        feeds = service.feeds.report()
        details: dict[str, Any] = {"upstreams": sorted(service.links)}
        if feeds:
            details["feeds"] = {f.pop("feed"): f for f in feeds}
        return Readiness(reasons, details)

    app.include_router(
        probe_router(
            GatewaySettings.component,
            __version__,
            readiness,
            service.metrics.registry,
            ready_description="Ready when every upstream is connected and the trusted apps, "
            "containments and outage tiers are loaded, and none of those feeds went without a "
            "successful read for longer than feed_max_staleness_secs.",
            metrics_content_type=METRICS_CONTENT_TYPE,
        )
    )

    @app.get("/mcp/challenges/{challenge_qid}")
    async def challenge_wait(challenge_qid: str, request: Request) -> JSONResponse:
        """Waits up to ``wait`` seconds (0 to 25) for the caller's challenge.

        docs/gateway.md#challenge-waits: ``{outcome, expires_at, grant_expires_at, retry}``.
        """
        ident = await authenticate(verifier, request.scope, service)
        raw = request.query_params.get("wait", "0")
        if not raw.isdigit() or not 0 <= int(raw) <= 25:
            raise Problem(
                400,
                "invalid-request",
                "The request is not valid",
                f"`wait` must be a whole number of seconds from 0 to 25, not `{raw[:64]}`",
            )
        status, body = await service.wait_challenge(ident, challenge_qid, int(raw))
        if status == 200:
            return JSONResponse(body)
        if status == 404:
            raise Problem(
                404,
                "challenge-not-found",
                "No such challenge",
                "no challenge with this id for this agent and person",
            )
        if status == 400:
            raise Problem(
                400,
                "invalid-request",
                "The request is not valid",
                str(body.get("detail", "the challenge id is not valid")),
            )
        raise Problem(
            503,
            "challenge-service-unavailable",
            "The challenge wait is unavailable",
            str(body.get("detail", f"HTTP {status}")),
            headers={"Retry-After": "1"},
        )

    return app


async def authenticate(
    verifier: AgentTokenVerifier, scope: Scope, service: GatewayService
) -> AgentIdentity:
    """The verified caller of a request (``svc.gateway.tokens``).

    Raises:
        Problem: 401 ``unauthenticated`` with ``WWW-Authenticate: Bearer ...
            error="invalid_token"`` (RFC 6750 section 3.1) when the token is missing or refused.

    """
    try:
        token = _bearer(scope)
        ident = verifier.cached(token)
        if ident is None:
            ident = await anyio.to_thread.run_sync(verifier.verify, token)
    except TokenError as e:
        service.metrics.refused_tokens.inc()
        raise _unauthorized(e) from None
    return ident


def create_app(
    service: GatewayService, verifier: AgentTokenVerifier | None = None
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The gateway's ASGI app (module docs).

    Its lifespan opens the upstream sessions and runs the background tasks
    (``GatewayService.run``), and the containment follower.

    Args:
        service: the service layer.
        verifier: the agent token verifier (default: one over the service's settings and
            trusted apps).

    Returns:
        An ASGI 3 callable (use it for one server run: the MCP session managers run once).

    Raises:
        AuthConfigError: ``person_jwks_url`` is not ``https://`` or the CA file is unreadable.

    """
    verifier = verifier or AgentTokenVerifier(service.settings, service.apps)
    proxies = {name: McpProxy(service, name) for name in service.links}
    http_app = health_app(service, verifier)
    guard = TransportGuard(service.settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for proxy in proxies.values():
                await stack.enter_async_context(proxy.manager.run())
            background = asyncio.create_task(service.run(), name="svc-gateway")
            service.start_follower()
            try:
                yield
            finally:
                for proxy in proxies.values():  # the listen streams end, answered
                    proxy.listen.close()
                background.cancel()
                await asyncio.gather(background, return_exceptions=True)
                await service.aclose()

    http_app.router.lifespan_context = lifespan

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path.startswith("/mcp/"):
                _trim_routing_headers(scope)
                refused = await guard.check(scope)
                if refused is not None:
                    await problem_response(refused)(scope, receive, send)
                    return
                # The agent token first on every /mcp/ path, an unknown upstream's included,
                # before anything reads the body (issue 43).
                try:
                    ident = await authenticate(verifier, scope, service)
                except Problem as p:
                    await problem_response(p)(scope, receive, send)
                    return
                name = path[5:].rstrip("/")
                proxy = proxies.get(name)
                if proxy is not None:
                    _bind_caller(scope, ident)
                    await proxy.fast.serve(
                        ident,
                        scope,
                        receive,
                        send,
                        lambda replayed: proxy.manager.handle_request(scope, replayed, send),
                    )
                    return
        await http_app(scope, receive, send)

    return app


#: The MCP routing headers whose values are compared with a 2026-07-28 request's body.
_ROUTING = frozenset({b"mcp-protocol-version", b"mcp-method", b"mcp-name"})


def _trim_routing_headers(scope: Scope) -> None:
    """Takes the optional whitespace around the MCP routing headers' values out of `scope`.

    A field value excludes its leading and trailing whitespace (RFC 9110 section 5.5), and the
    2026-07-28 revision compares ``Mcp-Method`` and ``Mcp-Name`` with the body exactly, so
    ``Mcp-Name:  read_doc  `` names ``read_doc`` (the HTTP server leaves the spaces in).
    """
    headers = scope["headers"]
    if any(k in _ROUTING and v != v.strip(b" \t") for k, v in headers):
        scope["headers"] = [(k, v.strip(b" \t") if k in _ROUTING else v) for k, v in headers]


def _bind_caller(scope: Scope, ident: AgentIdentity) -> None:
    """Puts the verified caller in an MCP request's scope, for the proxy and the SDK.

    The MCP session is bound to the caller (``AuthenticatedUser``: the session manager answers
    404 to another caller's request for it, and the fast path serves only its owner).
    """
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    who = "|".join(ident.key())
    scope[AGENT_SCOPE_KEY] = ident
    scope["user"] = AuthenticatedUser(
        AccessToken(token="", client_id=ident.issuer, scopes=[], subject=who)
    )


def serve(
    settings: GatewaySettings,
    *,
    service: GatewayService | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs the gateway on ``settings.host:port`` in this thread until stopped.

    Args:
        settings: the gateway's settings.
        service: the service layer (default: made from ``settings``).
        ready: called with the bound port once the socket listens.
        stop: ends the server when set; without it SIGINT/SIGTERM do (main thread only).

    Raises:
        AuthConfigError: as ``create_app``.
        OSError, ValueError: the upstreams file cannot be read; the port cannot be bound.

    """
    service = service or GatewayService(settings)
    serve_asgi(
        create_app(service),
        settings.host,
        settings.port,
        "svc-gateway",
        ready=ready,
        stop=stop,
        http1=True,
    )


class GatewayServer(ThreadedServer):
    """The gateway in a thread of its own: ``start()`` returns once it listens.

    Args:
        settings: the gateway's settings (``port=0`` picks a free port).
        service: the service layer (default: made from ``settings``).

    """

    def __init__(self, settings: GatewaySettings, service: GatewayService | None = None) -> None:
        super().__init__(settings.host, "svc-gateway")
        self.settings = settings
        self.service = service or GatewayService(settings)

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve(self.settings, service=self.service, ready=ready, stop=stop)
