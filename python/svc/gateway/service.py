"""The gateway's logic: check each tool call, forward it, tiers in an outage, intake events.

docs/gateway.md describes the behaviour; the pieces:

* ``PdpClient``: the decision point (docs/api.md): gRPC ``Check`` for the checks, ``POST
  /v1/access/challenge`` for the challenge waits.
* ``UpstreamLink``: one MCP client session (the ``mcp`` SDK's ``ClientSession`` over Streamable
  HTTP or stdio) per upstream, shared by every agent, in the newest protocol revision the
  upstream offers (``server/discover``, else ``initialize``: docs/gateway.md#protocol-revisions),
  opened again under the shared reconnect policy (``svc.common.retry``) when lost; the fast
  path POSTs plain tool calls on the same session directly (``tool_call``, ``post``, ``send``).
* ``Containments``: who is contained, from the challenge service's ``WatchContainments`` feed
  (``svc.pdp.containment_follower.ContainmentFollower``, docs/challenges.md) or a file, so
  that a contained principal's call is never forwarded while the decision point is away.
* ``OutageTiers``: each tool's outage tier (``fail_closed``, ``cached``, ``fail_open``;
  docs/policy.md#outage-fallbacks) from the policy service's ``GetOutageFallback`` or a file.
* ``EventSink``: each forwarded call as an intake event (docs/intake.md), batched in the
  background: a bounded queue, flushed by size or time, never blocking a call; events past
  the bound are dropped, counted and logged.
* ``GatewayService``: ``call_tool`` (the check and the forward; ``check``, ``blocked``,
  ``forwarding``, ``record`` and ``finish_direct`` are its parts the fast path,
  ``svc.gateway.fastpath``, uses), ``wait_challenge`` (the agent's challenge wait), and the
  background tasks (``run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import mcp_types as types
from mcp_types.methods import INPUT_REQUIRED_METHODS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from svc import __version__
from svc.common.retry import Reconnect
from svc.gateway.relay import Relay, RelayTagging, UpstreamRelays, event_data, event_lines
from svc.gateway.settings import GatewaySettings, ToolMapping, Upstream, read_token_file
from svc.gateway.tokens import AgentIdentity, TrustedApps, parse_trusted_apps
from svc.pdp.feeds import FeedHealth, RepeatedRetries

__all__ = [
    "CALL",
    "TOOL_TYPE",
    "Blocked",
    "Containments",
    "DirectCall",
    "EventSink",
    "GatewayMetrics",
    "GatewayService",
    "OutageTiers",
    "PdpClient",
    "PdpRefused",
    "PdpUnreachable",
    "UpstreamLink",
    "UpstreamSessionLost",
    "UpstreamUnavailable",
    "cancel_message",
]

log = logging.getLogger("svc.gateway")
#: The feeds' reconnect lines; one that repeats the same failure is written once per window.
feed_log = logging.getLogger("svc.gateway.feeds")
feed_log.addFilter(RepeatedRetries())

#: The action checked on the tool itself, and the entity type of tools (docs/gateway.md).
CALL = "call"
TOOL_TYPE = "Tool"
#: Outage tiers (docs/policy.md#outage-fallbacks).
Tier = Literal["fail_closed", "cached", "fail_open"]
TIERS: tuple[Tier, ...] = ("fail_closed", "cached", "fail_open")
#: The longest challenge wait (docs/architecture.md#limits).
MAX_WAIT_SECS = 25
#: How long an upstream may take to answer ``initialize`` before the session is tried again.
INITIALIZE_SECS = 30.0
#: Allows remembered for the ``cached`` outage tier (the oldest are forgotten first).
MAX_CACHED_ALLOWS = 100_000
#: Control characters the intake refuses in identifiers (docs/intake.md): C0, DEL, C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


#: The gateway's feeds (``svc.pdp.feeds``; docs/gateway.md#readiness-and-feeds).
TRUSTED_APPS = "trusted_apps"
CONTAINMENTS = "containments"
OUTAGE_TIERS = "outage_tiers"


def _feed_error(e: BaseException) -> str:
    """A feed failure's text: the exception's message, else its type's name."""
    text = str(e)
    if isinstance(e, httpx.HTTPStatusError):
        text = f"HTTP {e.response.status_code}: {e.response.text[:200]}"
    return text or type(e).__name__


def _token_reader(path: str | None, what: str) -> Callable[[], str | None]:
    """A function answering the token in `path`.

    It reads the file at each call; None when unset or unreadable (logged).
    """

    def token() -> str | None:
        try:
            return read_token_file(path)
        except OSError as e:
            log.error("cannot read the %s token file %s: %s", what, path, e)
            return None

    return token


class GatewayMetrics:
    """The gateway's Prometheus metrics (``/metrics``), in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "svc_gateway_tool_calls",
            "Tool calls by upstream and outcome (forwarded, deny, challenge, unavailable, "
            "outage_fail_open, outage_cached).",
            ["upstream", "outcome"],
            registry=self.registry,
        )
        self.fast_path = Counter(
            "svc_gateway_fast_path_calls",
            "Tool calls forwarded on the fast path (docs/gateway.md#fast-path) by how they went "
            "on: answered (the result came first) or relayed (handed to the SDK's path to relay "
            "what the upstream sent first).",
            ["upstream", "how"],
            registry=self.registry,
        )
        self.refused_tokens = Counter(
            "svc_gateway_tokens_refused", "Agent tokens refused (401).", registry=self.registry
        )
        self.check_seconds = Histogram(
            "svc_gateway_check_seconds",
            "Time of the decision point's checks of one tool call.",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5),
        )
        self.upstream_seconds = Histogram(
            "svc_gateway_upstream_seconds",
            "Time from forwarding a tool call on the fast path to the upstream's first message "
            "back (docs/gateway.md#fast-path).",
            ["upstream"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0),
        )
        self.events_sent = Counter(
            "svc_gateway_events_sent",
            "Intake events accepted by the intake.",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "svc_gateway_events_dropped",
            "Intake events dropped: the queue was full (the intake slow or down) or the intake "
            "refused the batch.",
            registry=self.registry,
        )
        self.agent_requests = Counter(
            "svc_gateway_agent_requests",
            "MCP requests by upstream, agent (the token's principal id) and the protocol revision "
            "the agent speaks: 2026-07-28 (stateless requests), or the version its session "
            "negotiated at initialize (docs/gateway.md#protocol-revisions).",
            ["upstream", "agent", "protocol_version"],
            registry=self.registry,
        )
        self.upstream_up = Gauge(
            "svc_gateway_upstream_up",
            "1 while the upstream's session is open.",
            ["upstream"],
            registry=self.registry,
        )
        self.contained = Gauge(
            "svc_gateway_contained",
            "Principals contained, as the gateway follows them.",
            registry=self.registry,
        )


# ------------------------------------------------------------------------- decision point


class PdpUnreachable(Exception):
    """The decision point did not answer: connection refused or lost, timeout, or a 5xx."""


class PdpRefused(Exception):
    """The decision point refused the request (a 4xx other than 404 on a wait).

    Attributes:
        status: the HTTP status.
        body: its problem document (RFC 9457), or ``{}``.

    """

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('detail', '')}")
        self.status = status
        self.body = body


class PdpClient:
    """The decision point (docs/api.md): ``POST /v1/access/evaluation`` for each check.

    A tool call's checks go at once, each an HTTP evaluation over one keep-alive ``aiohttp``
    session on the gateway's event loop (docs/gateway.md#checks). Measured in the whole gateway
    beside one sending both in a gRPC ``BatchCheck`` over ``grpc.aio``
    (docs/benchmarks.md#mcp-gateway), this took 0.19 to 0.58 ms off each call at p50 (three
    runs): grpc.aio hands every answer from its poller thread to the event loop, a thread and a
    wake-up more per call. Challenge waits, which hold for up to 25 s and are rare,
    use ``POST /v1/access/challenge``.

    Args:
        base_url: ``http://host:port`` (gRPC and HTTP share the port).
        token: returns the bearer token (audience ``svc-pdp``), or None to send none.
        timeout_secs: how long a check may take before it counts as unreachable.

    """

    def __init__(self, base_url: str, token: Callable[[], str | None], timeout_secs: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_secs = timeout_secs
        self._checks: Any = None  # the aiohttp session, made on first use (in the running loop)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout_secs,
            limits=httpx.Limits(max_keepalive_connections=16, keepalive_expiry=60),
        )

    def _headers(self) -> dict[str, str]:
        bearer = self.token()
        return {"authorization": f"Bearer {bearer}"} if bearer else {}

    async def evaluate(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Decides `requests`, each a ``POST /v1/access/evaluation``, all at once.

        Args:
            requests: the checks, each ``{principal, action, resource[, on_behalf_of,
                human_present, work_item_id]}`` (docs/decisions.md#request).

        Returns:
            One decision per request, in order, as ``POST /v1/access/evaluation`` answers it:
            ``{qid, verdict, challenges, policies, on_behalf_of, mode[, challenge_qid]}``.

        Raises:
            PdpUnreachable: a check got no answer within ``timeout_secs``, a lost connection,
                or any status but 200 and those below.
            PdpRefused: 400 (a request does not fit the bundle's schema), 401 or 403 (the
                gateway's own token), with the problem document; a refusal is raised before
                an unreachable check. The other checks of the call are decided all the same.

        """
        import aiohttp

        if self._checks is None:
            self._checks = aiohttp.ClientSession(
                self.base_url, timeout=aiohttp.ClientTimeout(total=self.timeout_secs)
            )
        headers = {"content-type": "application/json", **self._headers()}
        answers = await asyncio.gather(
            *(self._check(r, headers) for r in requests), return_exceptions=True
        )
        for refused in answers:
            if isinstance(refused, PdpRefused):
                raise refused
        decisions: list[dict[str, Any]] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            decisions.append(answer)
        return decisions

    async def _check(self, request: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """One ``POST /v1/access/evaluation``; raises as ``evaluate``.

        Sent once more when a kept-alive connection turns out closed before any answer
        (``ServerDisconnectedError``: the decision point ended it while idle).
        """
        import aiohttp

        data = json.dumps(request, separators=(",", ":")).encode()
        for attempt in (1, 2):
            try:
                async with self._checks.post(
                    "/v1/access/evaluation", data=data, headers=headers
                ) as r:
                    status, body = r.status, await r.read()
                break
            except aiohttp.ServerDisconnectedError as e:
                if attempt == 2:
                    raise PdpUnreachable(f"{e.__class__.__name__}: {e}") from e
            except (aiohttp.ClientError, TimeoutError) as e:
                raise PdpUnreachable(f"{e.__class__.__name__}: {e}") from e
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if status == 200 and isinstance(doc, dict):
            return doc
        if status in (400, 401, 403):
            raise PdpRefused(status, doc if isinstance(doc, dict) else {})
        raise PdpUnreachable(f"HTTP {status}: {body[:200].decode(errors='replace')}")

    async def wait_challenge(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``POST /v1/access/challenge`` (docs/api.md#challenge-waits).

        Args:
            request: ``{challenge_qid, principal, on_behalf_of?, wait_secs}``.

        Returns:
            ``(status, body)``: 200 with the wait's answer, 404 for a challenge that is not the
            caller's, 400 for a bad request, 503 when the challenge service is away.

        Raises:
            PdpUnreachable: the decision point did not answer within ``wait_secs`` plus
                ``timeout_secs``.

        """
        timeout = float(request.get("wait_secs", 0)) + self.timeout_secs + 5.0
        try:
            r = await self._client.post(
                "/v1/access/challenge", json=request, headers=self._headers(), timeout=timeout
            )
        except httpx.HTTPError as e:
            raise PdpUnreachable(f"{e.__class__.__name__}: {e}") from e
        return r.status_code, _json_object(r)

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._client.aclose()
        if self._checks is not None:
            await self._checks.close()


def _json_object(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


# ------------------------------------------------------------------------------ upstreams


class UpstreamUnavailable(Exception):
    """The upstream's session is not open (it cannot be reached now)."""


class UpstreamSessionLost(UpstreamUnavailable):
    """The upstream answered 404 for the shared session: it no longer knows it (restarted).

    The request was not processed (the MCP Streamable HTTP transport: a server answers 404 to a
    session ID it does not know), so it may be sent again once a new session is open.
    """


class UpstreamLink:
    """One upstream MCP server, reached through one shared ``ClientSession`` (module docs).

    ``run`` keeps the session open (opening it again when it is lost, under the shared reconnect
    policy, ``svc.common.retry``); ``session`` waits up to ``wait_secs`` for it.

    Args:
        name: the upstream's name (``/mcp/{name}``).
        config: where it is (URL or command) and its tool mappings.
        metrics: the gateway's metrics (``svc_gateway_upstream_up``).
        on_connected: called with the upstream's ``InitializeResult`` each time a session opens
            (the proxy takes its capabilities from it).

    """

    def __init__(
        self,
        name: str,
        config: Upstream,
        metrics: GatewayMetrics,
        on_connected: Callable[[types.InitializeResult], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.metrics = metrics
        self.on_connected = on_connected
        self.initialized: types.InitializeResult | None = None
        self.error = "not connected yet"
        self.relays = UpstreamRelays(name, stdio=config.command is not None)
        self._session: Any = None
        self._ready = asyncio.Event()
        self._tagging: RelayTagging | None = None
        self._direct: Any = None
        self._forgotten = asyncio.Event()
        #: The tools' input schemas, by name, as the upstream last listed them (``note_tools``).
        self.tool_schemas: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def _streams(self) -> AsyncIterator[tuple[Any, Any]]:
        if self.config.url is not None:
            import aiohttp
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            tagging = RelayTagging()
            async with (
                httpx2.AsyncClient(
                    headers=self.config.headers,
                    timeout=httpx2.Timeout(30, read=300),
                    transport=tagging,
                ) as hc,
                aiohttp.ClientSession(
                    headers=self.config.headers,
                    timeout=aiohttp.ClientTimeout(sock_connect=30, sock_read=300),
                ) as direct,
                streamable_http_client(self.config.url, http_client=hc) as (r, w),
            ):
                self._tagging, self._direct = tagging, direct
                try:
                    yield r, w
                finally:
                    self._tagging = self._direct = None
        else:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            assert self.config.command is not None
            params = StdioServerParameters(
                command=self.config.command[0],
                args=self.config.command[1:],
                env={**_stdio_env(), **self.config.env},
                cwd=self.config.cwd,
            )
            async with stdio_client(params) as (r, w):
                yield r, w

    async def run(self) -> None:
        """Keeps the session open until cancelled.

        The shared reconnect policy (``svc.common.retry.Reconnect``: full-jitter exponential
        backoff from 0.2 s up to 10 s): a session that could not be opened is tried again after
        the backoff; one that was open and was lost is opened again at once, the backoff
        starting over.
        """
        reconnect = Reconnect(f"upstream {self.name}", log, initial_secs=0.2, max_secs=10.0)
        await reconnect.forever_async(self._connect)

    async def _connect(self) -> None:
        """One session: opened, then served until it is lost (one attempt of ``run``).

        Returns:
            When the session was open and has been lost (``self.error`` says how).

        Raises:
            UpstreamUnavailable: the session could not be opened.

        """
        opened = False
        try:
            async with (
                self._streams() as (r, w),
                upstream_session_class()(
                    r,
                    w,
                    client_info=types.Implementation.model_validate(GATEWAY_INFO),
                    sampling_callback=self.relays.sampling,
                    elicitation_callback=self.relays.elicitation,
                    logging_callback=self.relays.logging,
                    message_handler=self.relays.message,
                ) as session,
            ):
                init = await asyncio.wait_for(self._negotiate(session), INITIALIZE_SECS)
                await self._resubscribe(session)
                self.initialized = init
                if self.on_connected is not None:
                    self.on_connected(init)
                self._session = session
                self.error = ""
                self._ready.set()
                self.metrics.upstream_up.labels(self.name).set(1)
                opened = True
                log.info(
                    "upstream %s: session open (%s, %s)",
                    self.name,
                    init.server_info.name,
                    init.protocol_version,
                )
                self._forgotten.clear()
                follower = (
                    asyncio.get_running_loop().create_task(
                        self._follow_changes(session, init.capabilities)
                    )
                    if self.modern
                    else None
                )
                try:
                    await _until_closed(session, self._forgotten, modern=self.modern)
                finally:
                    if follower is not None:
                        follower.cancel()
                        await asyncio.gather(follower, return_exceptions=True)
                self.error = "the session ended"
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self.error = f"{e.__class__.__name__}: {_first_error(e)}"
            if not opened:
                raise UpstreamUnavailable(self.error) from e
        finally:
            self._session = None
            self._ready.clear()
            self.metrics.upstream_up.labels(self.name).set(0)
        log.warning("upstream %s: %s; connecting again", self.name, self.error)

    async def _follow_changes(self, session: Any, caps: types.ServerCapabilities) -> None:
        """Relays a 2026-07-28 upstream's list changes, read on a ``subscriptions/listen`` stream.

        The revision has no standalone stream: a client that wants the changes listens for
        them (the ``mcp`` SDK's ``listen``). Each change goes where a handshake-era upstream's
        ``list_changed`` goes (the SDK gives it to ``UpstreamRelays.message``: every agent
        session, and the 2026-07-28 agents' listen streams). A stream that fails is opened
        again under the shared reconnect policy; one the upstream ends is opened again at once.
        Nothing when the upstream announces no list changes.
        """
        from mcp.client.subscriptions import listen

        tools = bool(caps.tools and caps.tools.list_changed)
        prompts = bool(caps.prompts and caps.prompts.list_changed)
        resources = bool(caps.resources and caps.resources.list_changed)
        if not (tools or prompts or resources):
            return

        async def follow() -> None:
            async with listen(
                session,
                tools_list_changed=tools,
                prompts_list_changed=prompts,
                resources_list_changed=resources,
            ) as changes:
                # The SDK hands each of the stream's notifications to the session's message
                # handler too (``UpstreamRelays.message``), which relays it: here they are
                # only read, so the stream keeps flowing.
                async for _ in changes:
                    pass

        changes = Reconnect(f"upstream {self.name} list changes", log, max_secs=10.0)
        await changes.forever_async(follow)

    @property
    def modern(self) -> bool:
        """True while the open session speaks the 2026-07-28 revision (stateless requests)."""
        session = self._session
        return session is not None and session.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def _negotiate(self, session: Any) -> types.InitializeResult:
        """Opens `session` in the newest revision the upstream offers.

        As the ``mcp`` SDK's ``Client`` in mode ``auto`` does: ``server/discover`` proposing
        2026-07-28 (on ``-32022`` the newest revision both name), and the ``initialize``
        handshake when the upstream does not answer it with a revision the SDK speaks.

        Returns:
            The ``InitializeResult``, or for a 2026-07-28 upstream one made of its
            ``DiscoverResult`` (its capabilities and instructions, its ``serverInfo`` stamp),
            so the proxy reads either the same way.

        Raises:
            mcp.shared.exceptions.MCPError: the handshake failed too.

        """
        from mcp.shared.exceptions import MCPError

        try:
            found = await session.discover()
        except (MCPError, RuntimeError) as e:  # not a 2026-07-28 server: the handshake
            log.debug("upstream %s: server/discover refused (%s); initialize", self.name, e)
            init: types.InitializeResult = await session.initialize()
            if init.capabilities.tools is not None:
                with contextlib.suppress(MCPError, ValueError):
                    self.note_tools(await session.list_tools())
            return init
        info = session.server_info or types.Implementation(name=self.name, version="")
        # The 2026-07-28 revision drops ``ping``, ``logging/setLevel`` and subscriptions; the
        # tools' ``x-mcp-header`` arguments are known from a listing (the SDK's session keeps
        # them, and sends their ``Mcp-Param-*`` headers on each call).
        with contextlib.suppress(MCPError, ValueError):
            self.note_tools(await session.list_tools())
        return types.InitializeResult(
            protocol_version=session.protocol_version,
            capabilities=found.capabilities,
            server_info=info,
            instructions=found.instructions,
        )

    async def _resubscribe(self, session: Any) -> None:
        """Gives a new session the agents' log level and resource subscriptions.

        Each request waits up to ``INITIALIZE_SECS``; one that fails is logged and skipped. A
        2026-07-28 session has neither (the level goes in each forwarded request's ``_meta``).
        """
        if session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        level = self.relays.upstream_level()
        if level is not None:
            try:
                await session.send_request(
                    types.SetLevelRequest(params=types.SetLevelRequestParams(level=level)),
                    types.EmptyResult,
                    request_read_timeout_seconds=INITIALIZE_SECS,
                )
            except Exception as e:
                log.warning("upstream %s: log level not set again: %s", self.name, e)
        for uri in self.relays.subscribed():
            try:
                await session.send_request(
                    types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)),
                    types.EmptyResult,
                    request_read_timeout_seconds=INITIALIZE_SECS,
                )
            except Exception as e:  # the resource may be gone: the agents keep asking
                log.warning("upstream %s: not subscribed again to %s: %s", self.name, uri, e)

    def direct_ready(self) -> bool:
        """True when requests can be POSTed on the open session directly (``post``).

        That is: a Streamable HTTP upstream whose session is open, and for the handshake era
        whose protocol version the SDK's client has sent (it does from
        ``notifications/initialized`` on); a 2026-07-28 session has no state to join.
        """
        if self._session is None or self._direct is None or self._tagging is None:
            return False
        return self.modern or self._tagging.protocol_version is not None

    def note_tools(self, result: Any) -> None:
        """Remembers the input schemas of a ``tools/list`` page the upstream answered.

        They give the ``Mcp-Param-*`` headers of a 2026-07-28 call (a tool's arguments marked
        ``x-mcp-header``), checked on the agent's requests and sent on the gateway's.
        """
        for tool in getattr(result, "tools", None) or []:
            self.tool_schemas[tool.name] = tool.input_schema

    def tool_call(
        self,
        params: dict[str, Any],
        upstream_id: str,
        level: types.LoggingLevel | None,
        capabilities: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """An agent's ``tools/call`` as the gateway POSTs it to this upstream (``post``).

        The agent's envelope is taken out of ``_meta`` and its progress token replaced by
        `upstream_id` (the session is shared). To a 2026-07-28 upstream the call carries the
        gateway's envelope, the log level `level` opts in to, and the revision's headers
        (``Mcp-Method``, ``Mcp-Name``, the tool's ``Mcp-Param-*``).

        Args:
            params: the call's params as the agent sent them (``name``, ``arguments``,
                ``_meta``).
            upstream_id: the JSON-RPC id the gateway sends it under.
            level: the agent's log level (2026-07-28 upstreams; None: no log messages).
            capabilities: the agent's relayed client capabilities (2026-07-28 upstreams; None:
                the gateway's own).

        Returns:
            ``(message, headers)``: the JSON-RPC request and the headers to add.

        """
        from mcp.shared.inbound import encode_header_value, mcp_param_headers, x_mcp_header_map

        meta = {k: v for k, v in (params.get("_meta") or {}).items() if k not in ENVELOPE_KEYS}
        if "progressToken" in meta:
            meta["progressToken"] = upstream_id
        forwarded = dict(params)
        headers: dict[str, str] = {}
        session = self._session
        if session is not None and session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            meta[types.PROTOCOL_VERSION_META_KEY] = session.protocol_version
            meta[types.CLIENT_INFO_META_KEY] = GATEWAY_INFO
            meta[types.CLIENT_CAPABILITIES_META_KEY] = (
                GATEWAY_CAPABILITIES if capabilities is None else capabilities
            )
            if level is not None:
                meta[types.LOG_LEVEL_META_KEY] = level
            name = str(params["name"])
            headers = {"mcp-method": "tools/call", "mcp-name": encode_header_value(name)}
            schema = self.tool_schemas.get(name)
            if schema:
                headers.update(
                    mcp_param_headers(x_mcp_header_map(schema), params.get("arguments") or {})
                )
        if meta:
            forwarded["_meta"] = meta
        else:
            forwarded.pop("_meta", None)
        message = {"jsonrpc": "2.0", "id": upstream_id, "method": "tools/call", "params": forwarded}
        return message, headers

    def _direct_headers(self) -> dict[str, str]:
        assert self._tagging is not None and self._session is not None
        version = self._session.protocol_version if self.modern else self._tagging.protocol_version
        headers = {
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": str(version),
        }
        if self._tagging.session_id is not None and not self.modern:
            headers["mcp-session-id"] = self._tagging.session_id
        return headers

    def _post(self, message: dict[str, Any], **options: Any) -> Any:
        """The ``aiohttp`` POST of one JSON-RPC message on the open session (to enter).

        Raises:
            UpstreamUnavailable: no open session (``direct_ready`` is False).

        """
        direct, url = self._direct, self.config.url
        if direct is None or url is None or not self.direct_ready():
            raise UpstreamUnavailable(f"upstream `{self.name}` cannot be reached: {self.error}")
        extra = options.pop("headers", None) or {}
        return direct.post(
            url,
            data=json.dumps(message, separators=(",", ":")).encode(),
            headers={"content-type": "application/json", **self._direct_headers(), **extra},
            **options,
        )

    @contextlib.asynccontextmanager
    async def post(
        self, message: dict[str, Any], timeout_secs: float, headers: dict[str, str] | None = None
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """POSTs one JSON-RPC request on the open session, outside the SDK's client.

        The MCP Streamable HTTP transport (https://modelcontextprotocol.io/specification/
        2025-11-25/basic/transports#sending-messages-to-the-server): the answer is one JSON
        object or an event stream of the request's related messages, its response last. Sent
        with ``aiohttp``, which takes a quarter of the CPU of the SDK's ``httpx2`` per request
        (docs/dependencies.md).

        Args:
            message: the JSON-RPC request (its id a string, so it never meets the SDK
                client's integer ids on the shared session).
            timeout_secs: how long the upstream may take to answer (and between events).
            headers: headers to add (a 2026-07-28 call's, ``tool_call``).

        Yields:
            The messages that come back, in order (dicts as sent; events without data, such
            as priming events, are skipped). The response is open until the block ends.

        Raises:
            UpstreamUnavailable: no open session (``direct_ready`` is False), the request could
                not be sent or read, or the upstream answered with an HTTP error or something
                that is not JSON-RPC.

        """
        import aiohttp

        try:
            async with self._post(
                message,
                timeout=aiohttp.ClientTimeout(sock_connect=30, sock_read=timeout_secs),
                headers=headers,
            ) as response:
                if response.status != 200:
                    text = await response.text(errors="replace")
                    status = response.status
                    answer = _error_answer(text) if self.modern else None
                    if answer is not None:  # the revision answers errors with an HTTP status
                        yield _one(answer)
                        return
                    problem = f"upstream `{self.name}` answered HTTP {status}: {text[:200]}"
                    if response.status == 404:  # the upstream forgot the session (restarted)
                        self._forgotten.set()
                        raise UpstreamSessionLost(problem)
                    raise UpstreamUnavailable(problem)
                yield _messages(response)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise UpstreamUnavailable(
                f"upstream `{self.name}` failed: {e.__class__.__name__}: {e}"
            ) from e

    async def reopened(self, wait_secs: float = 5.0) -> bool:
        """Waits for a session other than the one the upstream answered 404 for.

        Returns:
            True once a new session is open and ready for ``post``; False after `wait_secs`.

        """
        lost = self._tagging.session_id if self._tagging is not None else None
        deadline = time.monotonic() + wait_secs
        while time.monotonic() < deadline:
            tagging = self._tagging
            if (
                not self._forgotten.is_set()
                and self.direct_ready()
                and tagging is not None
                and tagging.session_id != lost
            ):
                return True
            await asyncio.sleep(0.05)
        return False

    async def send(self, message: dict[str, Any]) -> None:
        """POSTs a JSON-RPC response or notification on the open session (202 expected).

        A 2026-07-28 upstream is sent no notification: the revision has none from the client
        over HTTP (a call is cancelled by closing its stream, which the gateway does).

        Raises:
            UpstreamUnavailable: as ``post``.

        """
        import aiohttp

        if self.modern and "id" not in message:
            return

        try:
            async with self._post(message) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamUnavailable(f"upstream `{self.name}` failed: {e}") from e
        if r.status >= 300:
            raise UpstreamUnavailable(f"upstream `{self.name}` answered HTTP {r.status}")

    async def session(self, wait_secs: float = 5.0) -> Any:
        """The open ``ClientSession``.

        Raises:
            UpstreamUnavailable: none opened within `wait_secs`.

        """
        if self._session is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), wait_secs)
        if self._session is None:
            raise UpstreamUnavailable(f"upstream `{self.name}` cannot be reached: {self.error}")
        return self._session


async def _messages(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an upstream's answer (an ``aiohttp`` response).

    One JSON body (an object, or a batch of them) or an event stream whose events carry one
    message each (``svc.gateway.relay.event_lines``).

    Raises:
        ValueError: neither, or a message that is not a JSON object.

    """
    ctype = response.content_type
    if ctype == "application/json":
        body = json.loads(await response.read())
        for msg in body if isinstance(body, list) else [body]:
            yield _json_rpc(msg)
    elif ctype == "text/event-stream":
        async for lines, ended in event_lines(response.content.iter_any()):
            data = event_data(lines) if ended else ""
            if data:
                yield _json_rpc(json.loads(data))
    else:
        raise ValueError(f"the answer's content type is {ctype or 'missing'}")


def _error_answer(text: str) -> dict[str, Any] | None:
    """A JSON-RPC error response in a body, or None.

    A 2026-07-28 server answers a request's error with the HTTP status of its code (400, 404).
    """
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and "id" in body:
        return body
    return None


async def _one(message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """One message as the stream of an answer."""
    yield message


def _json_rpc(msg: Any) -> dict[str, Any]:
    """`msg` when it is a JSON object (a JSON-RPC message); raises ``ValueError`` otherwise."""
    if not isinstance(msg, dict):
        raise ValueError("a JSON-RPC message is not an object")
    return msg


async def _until_closed(session: Any, forgotten: asyncio.Event, *, modern: bool = False) -> None:
    """Returns when `session`'s connection ends: pings it every 15 s; a failed ping ends it.

    A 2026-07-28 session has no ``ping`` (the revision drops it): it is sent
    ``server/discover`` instead, which every server of the revision answers.

    Raises:
        ConnectionError: a ping failed, or `forgotten` was set (the upstream answered 404 for
            the session: the MCP transport's sign that the session is gone).

    """
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(forgotten.wait(), 15)
        if forgotten.is_set():
            raise ConnectionError("the upstream no longer knows the session (HTTP 404)")
        try:
            if modern:
                await asyncio.wait_for(session.send_discover(session.protocol_version), 10)
            else:
                await asyncio.wait_for(session.send_ping(), 10)
        except Exception as e:
            raise ConnectionError(f"ping failed: {_first_error(e)}") from e


def _first_error(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return str(e) or e.__class__.__name__


def _stdio_env() -> dict[str, str]:
    """The environment of a stdio upstream: the SDK's safe default set."""
    from mcp.client.stdio import get_default_environment

    return get_default_environment()


# ------------------------------------------------------------------- containments, tiers


class Containments:
    """The principals contained now, as ``(type, id)`` pairs (docs/challenges.md).

    Fed by ``ContainmentFollower`` (it calls ``set_containments``, ``contain`` and ``lift``, the
    engine's methods it drives in a decision point) or by ``load_file``. ``loaded`` is False
    until the first whole list is in.
    """

    def __init__(self, metrics: GatewayMetrics | None = None) -> None:
        self._held: frozenset[tuple[str, str]] = frozenset()
        self._lock = threading.Lock()
        self.loaded = False
        self.metrics = metrics

    def _set(self, held: frozenset[tuple[str, str]]) -> None:
        self._held = held
        if self.metrics is not None:
            self.metrics.contained.set(len(held))

    def set_containments(self, refs: list[dict[str, str]]) -> None:
        """Replaces the whole list (refs ``{"type", "id"}``)."""
        with self._lock:
            self._set(frozenset((r["type"], r["id"]) for r in refs))
            self.loaded = True

    def contain(self, refs: list[dict[str, str]]) -> None:
        """Adds principals."""
        with self._lock:
            self._set(self._held | {(r["type"], r["id"]) for r in refs})

    def lift(self, refs: list[dict[str, str]]) -> None:
        """Removes principals."""
        with self._lock:
            self._set(self._held - {(r["type"], r["id"]) for r in refs})

    def holds(self, ident: AgentIdentity) -> bool:
        """Whether the caller or the person it acts for is contained."""
        held = self._held
        if (ident.principal["type"], ident.principal["id"]) in held:
            return True
        obo = ident.on_behalf_of
        return obo is not None and (obo["type"], obo["id"]) in held

    def load_file(self, path: str) -> None:
        """Replaces the list with a JSON file's ``[{"type", "id"}]``.

        Raises:
            OSError, ValueError: the file cannot be read or is not such a list.

        """
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(raw, list) or not all(
            isinstance(r, dict) and isinstance(r.get("type"), str) and isinstance(r.get("id"), str)
            for r in raw
        ):
            raise ValueError(f'{path}: expected a JSON list of {{"type", "id"}}')
        self.set_containments(raw)


class OutageTiers:
    """Each tool's outage tier (docs/policy.md#outage-fallbacks).

    Entries name a tool (``docs/search``), an upstream's tools (``docs/*``) or every tool
    (``*``); for a tool the most specific entry wins; with no entry the tier is
    ``fail_closed``.
    """

    def __init__(self) -> None:
        self._entries: dict[str, Tier] = {}
        self.loaded = False

    def replace(self, entries: dict[str, Tier]) -> None:
        """Puts `entries` (pattern -> tier) in force."""
        if entries != self._entries:
            log.info("outage tiers: %s", entries or "none (every tool fails closed)")
        self._entries = dict(entries)
        self.loaded = True

    def tier(self, tool: str) -> Tier:
        """The tier of `tool` (``<upstream>/<name>``)."""
        e = self._entries
        if tool in e:
            return e[tool]
        upstream = tool.split("/", 1)[0]
        if f"{upstream}/*" in e:
            return e[f"{upstream}/*"]
        return e.get("*", "fail_closed")

    @staticmethod
    def parse(raw: Any) -> dict[str, Tier]:
        """Tiers from a JSON object ``{"<pattern>": "<tier>"}``.

        Raises:
            ValueError: not such an object, or an unknown tier.

        """
        if not isinstance(raw, dict):
            raise ValueError("expected a JSON object of tiers by tool pattern")
        out: dict[str, Tier] = {}
        for k, v in raw.items():
            if v not in TIERS:
                raise ValueError(f"`{k}`: unknown tier `{v}` (one of {', '.join(TIERS)})")
            out[str(k)] = v
        return out


# ------------------------------------------------------------------------------- events


class EventSink:
    """Intake events of forwarded calls, sent in batches in the background (module docs).

    ``put`` never blocks: past ``queue_bound`` held events a new one is dropped (counted and
    logged). ``run`` posts batches of up to ``batch_max`` to ``POST /v1/events`` as soon as
    ``batch_max`` are held or ``flush_secs`` after the first; a batch the intake does not take
    (connection error, 503) is retried with backoff and stays queued, a batch it refuses (4xx)
    is dropped and logged.

    Args:
        url: the intake (``http://host:port``).
        token: returns the intake token.
        metrics: counts sent and dropped events.
        batch_max, flush_secs, queue_bound: as the settings ``intake_*``.

    """

    def __init__(
        self,
        url: str,
        token: Callable[[], str | None],
        metrics: GatewayMetrics,
        *,
        batch_max: int = 500,
        flush_secs: float = 1.0,
        queue_bound: int = 10_000,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.metrics = metrics
        self.batch_max = batch_max
        self.flush_secs = flush_secs
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=queue_bound)
        self.dropped = 0
        self.sent = 0
        self._last_drop_log = 0.0

    def put(self, event: dict[str, Any]) -> None:
        """Queues `event` (docs/intake.md#the-event-mandatory-and-optional-fields).

        When the queue is full the event is dropped, counted and logged (every 10 s at most).
        """
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            self.metrics.events_dropped.inc()
            now = time.monotonic()
            if now - self._last_drop_log >= 10:
                self._last_drop_log = now
                log.error(
                    "intake events dropped: the queue holds %d (%d dropped so far)",
                    self.queue.qsize(),
                    self.dropped,
                )

    async def _batch(self) -> list[dict[str, Any]]:
        batch = [await self.queue.get()]
        deadline = time.monotonic() + self.flush_secs
        while len(batch) < self.batch_max:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), left))
            except TimeoutError:
                break
        return batch

    async def run(self) -> None:
        """Sends batches until cancelled.

        A batch the intake does not take is sent again under the shared reconnect policy
        (``svc.common.retry.Reconnect``: full-jitter exponential backoff from 0.5 s up to 30 s).
        """
        reconnect = Reconnect(
            "intake", log, initial_secs=0.5, max_secs=30.0, retry_on=_IntakeUnavailable
        )
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            while True:
                batch = await self._batch()
                async for attempt in reconnect.async_retrying():
                    with attempt:
                        await self._send(client, batch)

    async def _send(self, client: httpx.AsyncClient, batch: list[dict[str, Any]]) -> None:
        """Posts `batch`: sent (202), or refused (4xx: dropped, counted and logged).

        Raises:
            _IntakeUnavailable: the intake did not take it (no connection, a 5xx, 408, 429).

        """
        bearer = self.token()
        headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
        try:
            r = await client.post("/v1/events", json={"events": batch}, headers=headers)
        except httpx.HTTPError as e:
            error = f"{e.__class__.__name__}: {e}"
        else:
            if r.status_code == 202:
                self.sent += len(batch)
                self.metrics.events_sent.inc(len(batch))
                return
            if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                self.dropped += len(batch)
                self.metrics.events_dropped.inc(len(batch))
                log.error(
                    "intake refused %d events (%d): %s", len(batch), r.status_code, r.text[:1024]
                )
                return
            error = f"HTTP {r.status_code}"
        raise _IntakeUnavailable(f"{error}; {len(batch)} events wait ({self.queue.qsize()} queued)")


class _IntakeUnavailable(Exception):
    """The intake did not take a batch (it is sent again)."""


# ------------------------------------------------------------------------------ the logic


@dataclass
class Blocked:
    """Why a tool call was not forwarded (docs/gateway.md#blocked-calls).

    Attributes:
        verdict: ``deny``, ``challenge`` or ``unavailable``.
        text: the explanation for the agent (and the model).
        decision_qid: the decision that blocked it (None for ``unavailable``).
        challenge_qid: the challenge to pass (``challenge``).
        challenge_wait: where to wait for it on this gateway (``challenge``).
        policies: the policies that decided it.

    """

    verdict: Literal["deny", "challenge", "unavailable"]
    text: str
    decision_qid: str | None = None
    challenge_qid: str | None = None
    challenge_wait: str | None = None
    policies: list[str] = field(default_factory=list)

    def result(self) -> types.CallToolResult:
        """The tool error the agent gets (docs/gateway.md#blocked-calls).

        ``isError`` true, the text, and ``_meta`` ``svc/verdict``, ``svc/decision_qid``,
        ``svc/challenge_qid``, ``svc/challenge_wait`` (those that apply).
        """
        meta: dict[str, Any] = {"svc/verdict": self.verdict}
        if self.decision_qid is not None:
            meta["svc/decision_qid"] = self.decision_qid
        if self.challenge_qid is not None:
            meta["svc/challenge_qid"] = self.challenge_qid
        if self.challenge_wait is not None:
            meta["svc/challenge_wait"] = self.challenge_wait
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=self.text)],
            is_error=True,
            _meta=meta,
        )


@dataclass
class DirectCall:
    """A call the fast path forwarded whose stream needs relaying (``svc.gateway.fastpath``).

    Attributes:
        upstream, tool: the call's upstream and tool.
        ident: the caller.
        mapping, resource, outcome: as ``GatewayService.check`` answered them.
        upstream_id: the JSON-RPC id the call was forwarded with.
        messages: the rest of its stream, from the first message not yet handled.
        params: the call's params as the agent sent them (for the retry of an input-required
            round of a 2026-07-28 upstream's).
        stream: holds the upstream's response open; closed once the call is followed to its
            end (``finish_direct``).

    """

    upstream: str
    tool: str
    ident: AgentIdentity
    mapping: ToolMapping | None
    resource: dict[str, str] | None
    outcome: str
    upstream_id: str
    messages: AsyncIterator[dict[str, Any]]
    params: dict[str, Any] | None = None
    stream: contextlib.AsyncExitStack | None = None


#: The 2026-07-28 revision's per-request envelope in ``_meta``: it describes the agent's hop
#: to the gateway (its revision, its client and capabilities, its log opt-in), never the
#: gateway's session to the upstream, which stamps its own (docs/gateway.md#protocol-revisions).
ENVELOPE_KEYS = frozenset(
    {
        types.PROTOCOL_VERSION_META_KEY,
        types.CLIENT_INFO_META_KEY,
        types.CLIENT_CAPABILITIES_META_KEY,
        types.LOG_LEVEL_META_KEY,
    }
)


def without_envelope(params: Any) -> Any:
    """`params` (an MCP request's params model) without the agent's envelope keys in ``_meta``.

    A handshake-era upstream refuses a request carrying the 2026-07-28 envelope, and a
    2026-07-28 upstream must get the gateway's, so the agent's is never forwarded.
    """
    meta = getattr(params, "meta", None)
    if not meta or ENVELOPE_KEYS.isdisjoint(meta):
        return params
    kept = {k: v for k, v in meta.items() if k not in ENVELOPE_KEYS}
    return params.model_copy(update={"meta": kept or None})


#: Who the gateway is to its upstreams (``clientInfo``), and the client capabilities it
#: announces to them: sampling and elicitation, which it relays to the agents
#: (docs/gateway.md#relaying).
GATEWAY_INFO: dict[str, Any] = {"name": "svc-gateway", "version": __version__}
GATEWAY_CAPABILITIES: dict[str, Any] = {"sampling": {}, "elicitation": {"form": {}, "url": {}}}

#: The relayed client capabilities of the agent whose request is being forwarded (None: the
#: gateway's own): a 2026-07-28 upstream gets them in the request's envelope
#: (``UpstreamSession``), so it asks only for what the agent can answer.
AGENT_CAPABILITIES: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "svc_gateway_agent_capabilities", default=None
)


def upstream_session_class() -> Any:
    """The ``mcp`` SDK's ``ClientSession``, its 2026-07-28 envelope naming the agent's capabilities.

    The SDK stamps each request's envelope with the session's capabilities (its ``_stamp``);
    this class wraps that stamp so that, while a request of an agent is forwarded, the
    envelope's ``clientCapabilities`` are the agent's (``AGENT_CAPABILITIES``): a 2026-07-28
    server must not rely on a capability the client did not declare, and must reject a request
    that needs one with ``-32021`` (the revision's per-request capabilities). Were the SDK to
    rename the stamp, the gateway's own capabilities would go, as before.
    """
    from mcp.client import ClientSession

    class UpstreamSession(ClientSession):
        @property
        def _stamp(self) -> Any:
            inner = self.__dict__["_svc_stamp"]

            def stamp(data: dict[str, Any], opts: Any) -> None:
                inner(data, opts)
                caps = AGENT_CAPABILITIES.get()
                meta = (data.get("params") or {}).get("_meta")
                if caps is not None and isinstance(meta, dict):
                    if types.CLIENT_CAPABILITIES_META_KEY in meta:
                        meta[types.CLIENT_CAPABILITIES_META_KEY] = caps

            return stamp

        @_stamp.setter
        def _stamp(self, value: Any) -> None:
            self.__dict__["_svc_stamp"] = value

    return UpstreamSession


#: The most input-required rounds the gateway drives for a handshake-era agent (as the SDK's
#: client: ``DEFAULT_INPUT_REQUIRED_MAX_ROUNDS``).
MAX_INPUT_ROUNDS = 10


def _upstream_level(relay: Relay | None) -> types.LoggingLevel | None:
    """The log level to opt a request to a 2026-07-28 upstream in to, for `relay`'s agent.

    A 2026-07-28 agent's own opt-in (None: none); a handshake-era agent's session level, or
    ``debug`` when it set none (it gets every message, as from a handshake-era upstream).
    """
    if relay is None:
        return None
    level: types.LoggingLevel | None = getattr(relay, "min_level", None)
    if level is None and not getattr(relay, "modern", False):
        return "debug"
    return level


async def _ask_agent(asked: types.InputRequiredResult, relay: Relay) -> dict[str, Any]:
    """The agent's answers to an ``InputRequiredResult``'s requests, asked on its call's stream.

    Each embedded request (``sampling/createMessage``, ``elicitation/create``, ``roots/list``)
    goes to the agent as a request of its own, all at once.

    Returns:
        The answers by the upstream's keys (``inputResponses``).

    Raises:
        mcp.shared.exceptions.MCPError: the agent answered one with an error.

    """
    results: dict[str, Any] = {
        "sampling/createMessage": types.CreateMessageResult,
        "elicitation/create": types.ElicitResult,
        "roots/list": types.ListRootsResult,
    }
    keys = list(asked.input_requests or {})

    async def one(key: str) -> Any:
        request = (asked.input_requests or {})[key]
        result_type = results[request.method]
        if request.method == "sampling/createMessage" and request.params.tools:
            result_type = types.CreateMessageResultWithTools
        return await relay.request(request, result_type)

    answers = await asyncio.gather(*(one(k) for k in keys))
    return dict(zip(keys, answers, strict=True))


def cancel_message(upstream_id: str) -> dict[str, Any]:
    """The ``notifications/cancelled`` that tells an upstream a forwarded call is abandoned."""
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": upstream_id, "reason": "cancelled by the agent"},
    }


def _event_problem(event: dict[str, Any]) -> str | None:
    """Why the intake would refuse `event` (docs/intake.md, the identifiers' limits), or None."""
    limits = [
        ("system", event["system"], 1, 128),
        ("tool", event["tool"], 1, 128),
        ("action_class", event["action_class"], 1, 128),
        ("principal.id", event["principal"]["id"], 1, 256),
        ("resource.type", event["resource"]["type"], 1, 128),
        ("resource.id", event["resource"]["id"], 0, 2048),
    ]
    if "on_behalf_of" in event:
        limits.append(("on_behalf_of.id", event["on_behalf_of"]["id"], 1, 256))
    for name, value, low, high in limits:
        if not low <= len(value) <= high:
            return f"`{name}` is {len(value)} characters (the intake takes {low} to {high})"
        if _CONTROL.search(value):
            return f"`{name}` holds a control character"
    return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class GatewayService:
    """The gateway's service layer (module docs).

    Args:
        settings: the gateway's settings.
        upstreams: the upstreams by name (default ``settings.all_upstreams()``).

    Raises:
        OSError, ValueError: ``upstreams_file`` cannot be read or is malformed.

    """

    def __init__(
        self, settings: GatewaySettings, upstreams: dict[str, Upstream] | None = None
    ) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.upstreams = upstreams if upstreams is not None else settings.all_upstreams()
        self.links = {n: UpstreamLink(n, u, self.metrics) for n, u in self.upstreams.items()}
        self.pdp = PdpClient(
            settings.pdp_url,
            _token_reader(settings.pdp_token_file, "decision point"),
            settings.pdp_timeout_ms / 1000,
        )
        self.apps = TrustedApps()
        self.containments = Containments(self.metrics)
        self.tiers = OutageTiers()
        # The feeds followed (trusted apps, containments, outage tiers): stale past the bound
        # makes /readyz 503 (docs/gateway.md#readiness-and-feeds); svc_gateway_feed_*.
        self.feeds = FeedHealth(
            settings.feed_max_staleness_secs,
            component="svc-gateway",
            registry=self.metrics.registry,
            prefix="svc_gateway",
        )
        self.events = (
            EventSink(
                settings.intake_url,
                _token_reader(settings.intake_token_file, "intake"),
                self.metrics,
                batch_max=settings.intake_batch_max,
                flush_secs=settings.intake_flush_secs,
                queue_bound=settings.intake_queue_bound,
            )
            if settings.intake_url
            else None
        )
        self._allows: OrderedDict[tuple[Any, ...], float] = OrderedDict()
        self._follower: Any = None

    # -- the checks ---------------------------------------------------------------------

    def _requests(
        self, upstream: str, tool: str, args: dict[str, Any], ident: AgentIdentity
    ) -> tuple[list[dict[str, Any]], ToolMapping | None, dict[str, str] | None]:
        """The decision requests of one call: ``call`` on the tool, then the resource's."""
        who = ident.request_fields()
        tool_id = f"{upstream}/{tool}"
        reqs = [{**who, "action": CALL, "resource": {"type": TOOL_TYPE, "id": tool_id}}]
        mapping = self.upstreams[upstream].tools.get(tool)
        resource = None
        if mapping is not None and mapping.resource_arg is not None:
            assert mapping.resource_type is not None
            raw = args.get(mapping.resource_arg)
            if isinstance(raw, bool) or not isinstance(raw, (str, int)) or raw == "":
                raise ValueError(
                    f"the call names no resource: argument `{mapping.resource_arg}` must be a "
                    "non-empty string"
                )
            resource = {"type": mapping.resource_type, "id": str(raw)}
            reqs.append({**who, "action": mapping.action, "resource": resource})
        return reqs, mapping, resource

    def _wait_url(self, base_url: str, qid: str) -> str:
        base = (self.settings.public_url or base_url).rstrip("/")
        return f"{base}/mcp/challenges/{qid}"

    async def check(
        self, upstream: str, tool: str, args: dict[str, Any], ident: AgentIdentity, base_url: str
    ) -> tuple[Blocked | None, str, ToolMapping | None, dict[str, str] | None]:
        """Checks one tool call (docs/gateway.md#checks).

        Args:
            upstream: the upstream's name.
            tool: the tool's name.
            args: the call's arguments.
            ident: the verified caller.
            base_url: this gateway's URL as the agent reached it (for ``svc/challenge_wait``).

        Returns:
            ``(blocked, outcome, mapping, resource)``: ``blocked`` None when the call may be
            forwarded; ``outcome`` ``allowed``, ``outage_fail_open``, ``outage_cached``, or the
            blocking verdict.

        """
        tool_id = f"{upstream}/{tool}"
        try:
            reqs, mapping, resource = self._requests(upstream, tool, args, ident)
        except ValueError as e:
            text = f"Blocked: {e}. Call the tool with the resource it acts on."
            return Blocked("deny", text), "deny", None, None
        started = time.perf_counter()
        try:
            decisions = await self.pdp.evaluate(reqs)
        except PdpUnreachable as e:
            log.warning("decision point unreachable for %s: %s", tool_id, e)
            outcome = self._outage_outcome(tool_id, ident, resource)
            if outcome != "unavailable":
                return None, outcome, mapping, resource
            text = (
                f"Unavailable: the call to `{tool_id}` could not be checked (the decision point "
                "cannot be reached now). Retry the same call after a short wait."
            )
            return Blocked("unavailable", text), "unavailable", mapping, resource
        except PdpRefused as e:
            detail = e.body.get("detail") or e.body.get("title") or f"HTTP {e.status}"
            log.error("decision point refused the check of %s: %s", tool_id, detail)
            text = (
                f"Blocked: the decision point refused to decide `{tool_id}`: {detail}. This is a "
                "configuration problem of the gateway or the policies; retrying will not help."
            )
            return Blocked("deny", text), "deny", mapping, resource
        finally:
            self.metrics.check_seconds.observe(time.perf_counter() - started)
        for d in decisions:
            if d.get("mode") != "monitor" and d.get("verdict") == "deny":
                return self._denied(d, tool_id), "deny", mapping, resource
        for d in decisions:
            if d.get("mode") != "monitor" and d.get("verdict") == "challenge":
                return self._challenged(d, tool_id, base_url), "challenge", mapping, resource
        if self.settings.cached_allow_secs > 0:
            key = self._allow_key(ident, tool_id, resource)
            self._allows[key] = time.monotonic()
            self._allows.move_to_end(key)
            while len(self._allows) > MAX_CACHED_ALLOWS:
                self._allows.popitem(last=False)
        return None, "allowed", mapping, resource

    def _denied(self, d: dict[str, Any], tool_id: str) -> Blocked:
        policies = [str(p) for p in d.get("policies") or []]
        qid = str(d.get("qid", ""))
        text = (
            f"Denied: the call to `{tool_id}` is not allowed (decision {qid}; policies: "
            f"{', '.join(policies) or 'none permits it'}). Stop and report the decision id; "
            "retrying will not change the answer."
        )
        return Blocked("deny", text, decision_qid=qid, policies=policies)

    def _challenged(self, d: dict[str, Any], tool_id: str, base_url: str) -> Blocked:
        policies = [str(p) for p in d.get("policies") or []]
        kinds = [str(k) for k in d.get("challenges") or []]
        qid = str(d.get("qid", ""))
        cqid = d.get("challenge_qid")
        if not isinstance(cqid, str) or not cqid:
            text = (
                f"Challenge: the call to `{tool_id}` needs {', '.join(kinds) or 'a challenge'} "
                f"(decision {qid}), but no challenge could be opened now. Retry the same call "
                "shortly."
            )
            return Blocked("challenge", text, decision_qid=qid, policies=policies)
        wait = self._wait_url(base_url, cqid)
        text = (
            f"Challenge: the call to `{tool_id}` needs {', '.join(kinds) or 'a challenge'} "
            f"(decision {qid}; policies: {', '.join(policies)}). Tell the person, wait for the "
            f"answer at GET {wait}?wait=25 with your token, then retry exactly the same call "
            "once it has passed."
        )
        return Blocked(
            "challenge",
            text,
            decision_qid=qid,
            challenge_qid=cqid,
            challenge_wait=wait,
            policies=policies,
        )

    @staticmethod
    def _allow_key(
        ident: AgentIdentity, tool_id: str, resource: dict[str, str] | None
    ) -> tuple[Any, ...]:
        r = (resource["type"], resource["id"]) if resource else None
        return (*ident.key(), tool_id, r)

    def _outage_outcome(
        self, tool_id: str, ident: AgentIdentity, resource: dict[str, str] | None
    ) -> str:
        """The outcome of a call while the decision point is unreachable.

        docs/gateway.md#outages: ``unavailable`` for a contained principal whatever the tier,
        else as the tool's tier says:
        ``outage_fail_open``, ``outage_cached`` (a recent allow of the same call), or
        ``unavailable``.
        """
        if self.containments.holds(ident):
            return "unavailable"
        tier = self.tiers.tier(tool_id)
        if tier == "fail_open":
            return "outage_fail_open"
        if tier == "cached" and self._recent_allow(ident, tool_id, resource):
            return "outage_cached"
        return "unavailable"

    def _recent_allow(
        self, ident: AgentIdentity, tool_id: str, resource: dict[str, str] | None
    ) -> bool:
        at = self._allows.get(self._allow_key(ident, tool_id, resource))
        return at is not None and time.monotonic() - at <= self.settings.cached_allow_secs

    async def call_tool(
        self,
        upstream: str,
        params: types.CallToolRequestParams,
        ident: AgentIdentity,
        base_url: str,
        relay: Relay | None = None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Checks one ``tools/call`` and forwards it when allowed (docs/gateway.md#checks).

        Args:
            upstream: the upstream's name.
            params: the call as the agent sent it (forwarded unchanged but for ``_meta``'s
                progress token and relay key, docs/gateway.md#relaying).
            ident: the verified caller.
            base_url: this gateway's URL as the agent reached it.
            relay: where the upstream's messages during the call go (None: nowhere).

        Returns:
            The upstream's result, or a tool error (``isError``) with ``_meta`` ``svc/*`` when
            the call is blocked; for a 2026-07-28 agent, a 2026-07-28 upstream's
            ``InputRequiredResult`` (``forward``), whose retry is checked again.

        Raises:
            UpstreamUnavailable: the upstream's session is not open.
            mcp.shared.exceptions.MCPError: the upstream answered with an error (passed on).

        """
        blocked, outcome, mapping, resource = await self.check(
            upstream, params.name, params.arguments or {}, ident, base_url
        )
        if blocked is not None:
            return self.blocked(upstream, params.name, ident, blocked)
        self.forwarding(upstream, outcome)
        result = await self.forward(
            upstream, types.CallToolRequest(params=params), types.CallToolResult, relay
        )
        if isinstance(result, types.InputRequiredResult):
            return result  # a round of the call: its event is the final result's
        self.record(upstream, params.name, ident, mapping, resource, result.is_error, outcome)
        return result  # type: ignore[no-any-return]

    def count_request(self, upstream: str, ident: AgentIdentity, revision: str) -> None:
        """Counts one MCP request of an agent (``svc_gateway_agent_requests_total``).

        Args:
            upstream: the upstream's name.
            ident: the verified caller (its principal's id is the ``agent`` label).
            revision: the protocol revision of the request (``2026-07-28``, or the version the
                agent's session negotiated; ``""`` counts as ``unknown``).

        """
        self.metrics.agent_requests.labels(
            upstream, ident.principal["id"], revision or "unknown"
        ).inc()

    def blocked(
        self, upstream: str, tool: str, ident: AgentIdentity, blocked: Blocked
    ) -> types.CallToolResult:
        """Counts and logs a blocked call; returns the tool error the agent gets."""
        self.metrics.calls.labels(upstream, blocked.verdict).inc()
        log.info(
            "blocked %s/%s for %s: %s %s",
            upstream,
            tool,
            ident.principal["id"],
            blocked.verdict,
            blocked.decision_qid or "",
        )
        return blocked.result()

    def forwarding(self, upstream: str, outcome: str) -> None:
        """Counts a call about to be forwarded (`outcome` as ``check`` answers it)."""
        self.metrics.calls.labels(upstream, "forwarded" if outcome == "allowed" else outcome).inc()

    async def finish_direct(
        self, call: DirectCall, relay: Relay
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Finishes a call the fast path forwarded, relaying its stream (``svc.gateway.fastpath``).

        Args:
            call: the forwarded call, its stream partly read.
            relay: the agent's side of the call.

        Returns:
            The upstream's result; a 2026-07-28 upstream's ``InputRequiredResult`` goes to a
            2026-07-28 agent as it is, and a handshake-era agent is asked on its stream and the
            call goes on (``call_tool_forwarded``).

        Raises:
            UpstreamUnavailable: the stream ended or failed before the result.
            mcp.shared.exceptions.MCPError: the upstream's error answer (passed on).

        """
        from mcp.shared.exceptions import MCPError

        link = self.links[call.upstream]
        try:
            response = await link.relays.follow(call.upstream_id, call.messages, relay, link.send)
        except ConnectionError as e:
            raise UpstreamUnavailable(str(e)) from e
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(UpstreamUnavailable):
                await link.send(cancel_message(call.upstream_id))
            raise
        finally:
            if call.stream is not None:
                with anyio.CancelScope(shield=True):
                    await call.stream.aclose()
        if "error" in response:
            raise MCPError.from_error_data(types.ErrorData.model_validate(response["error"]))
        raw = response.get("result")
        if isinstance(raw, dict) and raw.get("resultType") == "input_required":
            asked = types.InputRequiredResult.model_validate(raw, by_name=False)
            if getattr(relay, "modern", False) or call.params is None:
                return asked
            # A handshake-era agent: asked on its call's stream, then the retry goes upstream.
            params = types.CallToolRequestParams.model_validate(call.params, by_name=False)
            params = params.model_copy(
                update={
                    "input_responses": await _ask_agent(asked, relay),
                    "request_state": asked.request_state,
                }
            )
            went_on: types.CallToolResult | types.InputRequiredResult
            went_on = await self.call_tool_forwarded(call, params, relay)
            return went_on
        result = types.CallToolResult.model_validate(raw)
        self.record(
            call.upstream,
            call.tool,
            call.ident,
            call.mapping,
            call.resource,
            result.is_error,
            call.outcome,
        )
        return result

    async def call_tool_forwarded(
        self, call: DirectCall, params: types.CallToolRequestParams, relay: Relay
    ) -> Any:
        """Goes on with a call the fast path forwarded, through the SDK's session.

        The retry of an input-required round (``finish_direct``): the call was checked when it
        came, so it is forwarded as it goes on (``forward``) and recorded when it ends.
        """
        result = await self.forward(
            call.upstream, types.CallToolRequest(params=params), types.CallToolResult, relay
        )
        if isinstance(result, types.CallToolResult):
            self.record(call.upstream, call.tool, call.ident, call.mapping, call.resource,
                        result.is_error, call.outcome)  # fmt: skip
        return result

    async def forward(
        self, upstream: str, request: Any, result_type: Any, relay: Relay | None = None
    ) -> Any:
        """Sends `request` to the upstream's session and answers its result.

        The agent's 2026-07-28 envelope is taken out of ``_meta`` (``without_envelope``). To a
        2026-07-28 upstream the request goes with the gateway's envelope (its session stamps
        it) and the agent's log opt-in (a handshake-era agent's session level, ``debug`` when it
        set none); there a ``tools/call``, ``prompts/get`` or ``resources/read`` may be answered
        with an ``InputRequiredResult`` (the revision's input-required rounds): a 2026-07-28
        agent gets it as the answer (it retries with the responses), a handshake-era agent is
        asked each embedded request on its call's stream (``Relay.request``) and the gateway
        retries upstream with the answers and the ``requestState``, up to ``MAX_INPUT_ROUNDS``.

        Args:
            upstream: the upstream's name.
            request: an MCP client request (``mcp_types``).
            result_type: its result's model.
            relay: where the upstream's progress, log messages and requests to the client made
                while it runs go (docs/gateway.md#relaying); None: nowhere (requests to the
                client are answered with an error).

        Returns:
            The result (a `result_type`), or an ``InputRequiredResult`` for a 2026-07-28
            agent.

        Raises:
            UpstreamUnavailable: the session is not open.
            mcp.shared.exceptions.MCPError: the upstream's error answer, the agent's refusal of
                an input request, or too many input-required rounds.

        """
        from mcp.shared.exceptions import MCPError
        from pydantic import TypeAdapter

        link = self.links[upstream]
        session = await link.session()
        modern = session.protocol_version in MODERN_PROTOCOL_VERSIONS
        if request.params is not None:
            params = without_envelope(request.params)
            level = _upstream_level(relay) if modern else None
            if level is not None:
                params = params.model_copy(
                    update={"meta": {**(params.meta or {}), types.LOG_LEVEL_META_KEY: level}}
                )
            request = request.model_copy(update={"params": params})
        rounds = modern and request.method in INPUT_REQUIRED_METHODS
        wanted = TypeAdapter(result_type | types.InputRequiredResult) if rounds else result_type
        for _ in range(MAX_INPUT_ROUNDS + 1):
            result = await self._send(link, session, request, wanted, relay)
            if request.method == "tools/list":
                link.note_tools(result)
            if not isinstance(result, types.InputRequiredResult):
                return result
            if relay is None or getattr(relay, "modern", False):
                return result  # a 2026-07-28 agent answers and retries itself
            answers = await _ask_agent(result, relay)
            request = request.model_copy(
                update={
                    "params": request.params.model_copy(
                        update={"input_responses": answers, "request_state": result.request_state}
                    )
                }
            )
        raise MCPError(
            types.INTERNAL_ERROR,
            f"upstream `{upstream}` asked for input more than {MAX_INPUT_ROUNDS} rounds in a row",
        )

    async def _send(
        self, link: UpstreamLink, session: Any, request: Any, result_type: Any, relay: Relay | None
    ) -> Any:
        """One request on `link`'s `session`, relayed to `relay` (``forward``).

        The agent's capabilities go in a 2026-07-28 envelope (``AGENT_CAPABILITIES``).
        """
        caps = AGENT_CAPABILITIES.set(getattr(relay, "capabilities", None))
        try:
            return await self._send_relayed(link, session, request, result_type, relay)
        finally:
            AGENT_CAPABILITIES.reset(caps)

    async def _send_relayed(
        self, link: UpstreamLink, session: Any, request: Any, result_type: Any, relay: Relay | None
    ) -> Any:
        timeout = self.settings.upstream_timeout_secs
        if request.method == "tools/list":
            # The SDK's session keeps what a listing says of each tool (a 2026-07-28 tool's
            # ``x-mcp-header`` arguments, whose ``Mcp-Param-*`` headers it sends on each call):
            # the agents' listings keep it current.
            return await asyncio.wait_for(session.list_tools(params=request.params), timeout)
        if relay is None or request.params is None:
            return await session.send_request(
                request, result_type, request_read_timeout_seconds=timeout
            )

        async def progress(done: float, total: float | None, message: str | None) -> None:
            await relay.progress(done, total, message)

        with link.relays.open(relay) as tag:
            params = request.params
            tagged = params.model_copy(update={"meta": {**(params.meta or {}), **tag}})
            return await session.send_request(
                request.model_copy(update={"params": tagged}),
                result_type,
                request_read_timeout_seconds=timeout,
                progress_callback=progress,
            )

    def record(
        self,
        upstream: str,
        tool: str,
        ident: AgentIdentity,
        mapping: ToolMapping | None,
        resource: dict[str, str] | None,
        failed: bool,
        outcome: str,
    ) -> None:
        """Queues the intake event of a forwarded call (docs/gateway.md#events).

        Args:
            upstream: the upstream's name.
            tool: the tool's name.
            ident: the caller.
            mapping: the tool's mapping, as ``check`` answers it.
            resource: the resource the call names, as ``check`` answers it.
            failed: the result was a tool error (``isError``).
            outcome: as ``check`` answers it (``allowed`` or an outage's).

        """
        if self.events is None:
            return
        event: dict[str, Any] = {
            "at": _now(),
            "system": upstream,
            "principal": dict(ident.principal),
            "action": mapping.action if mapping and mapping.resource_arg else CALL,
            "resource": resource or {"type": TOOL_TYPE, "id": f"{upstream}/{tool}"},
            "outcome": "failure" if failed else "success",
            "tool": f"{upstream}/{tool}"[:128],
            "action_class": mapping.event_class if mapping else CALL,
            "attributes": {"gateway_check": outcome},
        }
        if ident.on_behalf_of is not None:
            event["on_behalf_of"] = dict(ident.on_behalf_of)
        problem = _event_problem(event)
        if problem is not None:
            # One event the intake would refuse would take its whole batch down with it.
            log.error("intake event of %s/%s not sent: %s", upstream, tool, problem)
            self.events.dropped += 1
            self.metrics.events_dropped.inc()
            return
        self.events.put(event)

    # -- challenge waits ----------------------------------------------------------------

    async def wait_challenge(
        self, ident: AgentIdentity, challenge_qid: str, wait_secs: int
    ) -> tuple[int, dict[str, Any]]:
        """Waits for a challenge as the caller (docs/gateway.md#challenge-waits).

        Args:
            ident: the verified caller: its principal and on_behalf_of are the wait's.
            challenge_qid: the challenge.
            wait_secs: 0 to 25.

        Returns:
            ``(200, {outcome, expires_at, grant_expires_at, retry})``, or ``(status, problem
            body)`` for 404 (not the caller's challenge, or unknown), 400 and 503.

        """
        req = {
            "challenge_qid": challenge_qid,
            **{
                k: v
                for k, v in ident.request_fields().items()
                if k in ("principal", "on_behalf_of")
            },
            "wait_secs": max(0, min(MAX_WAIT_SECS, wait_secs)),
        }
        try:
            status, body = await self.pdp.wait_challenge(req)
        except PdpUnreachable as e:
            return 503, {"detail": f"the decision point cannot be reached now: {e}"}
        if status != 200:
            return status, body
        return 200, {
            "outcome": body.get("outcome"),
            "expires_at": body.get("expires_at"),
            "grant_expires_at": body.get("grant_expires_at"),
            "retry": bool(body.get("retry")),
        }

    # -- background ---------------------------------------------------------------------

    async def run(self) -> None:
        """Runs the background tasks until cancelled.

        The upstream sessions, the trusted apps, the containments file, the outage tiers and
        the intake events.
        """
        async with asyncio.TaskGroup() as tg:
            for link in self.links.values():
                tg.create_task(link.run(), name=f"upstream-{link.name}")
            tg.create_task(self._poll_trust(), name="trusted-apps")
            tg.create_task(self._poll_tiers(), name="outage-tiers")
            if self.settings.challenge_url is None:
                tg.create_task(self._poll_containments_file(), name="containments")
            if self.events is not None:
                tg.create_task(self.events.run(), name="intake-events")

    def start_follower(self) -> None:
        """Starts following the challenge service's containment feed (a thread), when set."""
        url = self.settings.challenge_url
        if url is None:
            return
        from svc.pdp.containment_follower import ContainmentFollower

        self._follower = ContainmentFollower(
            self.containments,  # type: ignore[arg-type]  # the engine's three list methods
            url,
            _token_reader(self.settings.challenge_token_file, "challenge service"),
            feeds=self.feeds,
        ).start()

    def stop_follower(self) -> None:
        """Stops the containment follower."""
        if self._follower is not None:
            self._follower.stop()
            self._follower = None

    async def _poll_trust(self) -> None:
        """Reads the trusted apps every ``trust_refresh_secs`` (the context service or a file).

        A read that fails keeps the last list and is tried again under the shared reconnect
        policy (``svc.common.retry.Reconnect``: from 0.2 s up to ``trust_refresh_secs``).
        """
        s = self.settings
        token = _token_reader(s.context_token_file, "context service")
        reconnect = Reconnect(
            "trusted apps (the last list stays)",
            feed_log,
            initial_secs=min(0.2, s.trust_refresh_secs),
            max_secs=s.trust_refresh_secs,
            retry_on=(httpx.HTTPError, OSError, ValueError),
        )
        last_mtime: float | None = None
        followed = s.context_url is not None or s.trusted_apps_file is not None
        if followed:
            self.feeds.started(TRUSTED_APPS)
        async with httpx.AsyncClient(timeout=5) as client:

            async def read() -> None:
                nonlocal last_mtime
                try:
                    if s.context_url is not None:
                        bearer = token()
                        r = await client.get(
                            s.context_url.rstrip("/") + "/v1/directory/trusted-apps",
                            headers={"authorization": f"Bearer {bearer}"} if bearer else {},
                        )
                        r.raise_for_status()
                        self.apps.replace(parse_trusted_apps(r.json()))
                    elif s.trusted_apps_file is not None:
                        mtime = os.stat(s.trusted_apps_file).st_mtime_ns
                        if mtime != last_mtime:
                            text = Path(s.trusted_apps_file).read_text(encoding="utf-8")
                            self.apps.replace(parse_trusted_apps(json.loads(text)))
                            last_mtime = mtime
                    else:
                        self.apps.replace([])
                except (httpx.HTTPError, OSError, ValueError) as e:
                    self.feeds.failed(
                        TRUSTED_APPS,
                        _feed_error(e),
                        "the trusted apps list "
                        + (
                            "(GET /v1/directory/trusted-apps)"
                            if s.context_url is not None
                            else f"({s.trusted_apps_file})"
                        ),
                    )
                    raise
                if followed:
                    self.feeds.synced(TRUSTED_APPS)
                await asyncio.sleep(s.trust_refresh_secs)

            await reconnect.forever_async(read)

    async def _poll_tiers(self) -> None:
        """Reads the outage tiers every ``fallback_refresh_secs`` (the policy service or a file).

        A read that fails keeps the last tiers and is tried again under the shared reconnect
        policy (``svc.common.retry.Reconnect``: from 0.2 s up to ``fallback_refresh_secs``).
        """
        s = self.settings
        reconnect = Reconnect(
            "outage tiers (the last ones stay)",
            feed_log,
            initial_secs=min(0.2, s.fallback_refresh_secs),
            max_secs=s.fallback_refresh_secs,
        )
        last_mtime: float | None = None
        followed = s.policy_url is not None or s.fallback_file is not None
        if followed:
            self.feeds.started(OUTAGE_TIERS)

        async def read() -> None:
            nonlocal last_mtime
            try:
                if s.policy_url is not None:
                    self.tiers.replace(await asyncio.to_thread(self._fetch_tiers))
                elif s.fallback_file is not None:
                    mtime = os.stat(s.fallback_file).st_mtime_ns
                    if mtime != last_mtime:
                        text = Path(s.fallback_file).read_text(encoding="utf-8")
                        self.tiers.replace(OutageTiers.parse(json.loads(text)))
                        last_mtime = mtime
                else:
                    self.tiers.replace({})
            except Exception as e:  # what the reconnect policy retries: reported, then retried
                self.feeds.failed(
                    OUTAGE_TIERS,
                    _feed_error(e),
                    "the outage tiers "
                    + (
                        "(GetOutageFallback)"
                        if s.policy_url is not None
                        else f"({s.fallback_file})"
                    ),
                )
                raise
            if followed:
                self.feeds.synced(OUTAGE_TIERS)
            await asyncio.sleep(s.fallback_refresh_secs)

        await reconnect.forever_async(read)

    def _fetch_tiers(self) -> dict[str, Tier]:
        """``GetOutageFallback`` with no tool: every entry (docs/policy.md)."""
        import grpc

        from svc.common.install import grpc_target as target
        from svc.policy.v1 import policy_pb2 as ppb
        from svc.policy.v1 import policy_pb2_grpc as ppb_grpc

        assert self.settings.policy_url is not None
        bearer = _token_reader(self.settings.policy_token_file, "policy service")()
        metadata = [("authorization", f"Bearer {bearer}")] if bearer else []
        names = {
            ppb.OUTAGE_TIER_FAIL_CLOSED: "fail_closed",
            ppb.OUTAGE_TIER_CACHED: "cached",
            ppb.OUTAGE_TIER_FAIL_OPEN: "fail_open",
        }
        with grpc.insecure_channel(target(self.settings.policy_url)) as channel:
            stub = ppb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
            resp = stub.GetOutageFallback(
                ppb.GetOutageFallbackRequest(), metadata=metadata, timeout=5
            )
        return {f.tool: names.get(f.tier, "fail_closed") for f in resp.fallbacks}  # type: ignore[misc]

    async def _poll_containments_file(self) -> None:
        path = self.settings.containments_file
        if path is None:
            self.containments.set_containments([])
            return
        self.feeds.started(CONTAINMENTS)
        last_mtime: float | None = None
        while True:
            try:
                mtime = os.stat(path).st_mtime_ns
                if mtime != last_mtime:
                    self.containments.load_file(path)
                    last_mtime = mtime
            except (OSError, ValueError) as e:
                self.feeds.failed(CONTAINMENTS, _feed_error(e), f"the containments file {path}")
            else:
                self.feeds.synced(CONTAINMENTS)
            await asyncio.sleep(1.0)

    async def aclose(self) -> None:
        """Closes the decision point's connections and stops the follower."""
        self.stop_follower()
        await self.pdp.aclose()
