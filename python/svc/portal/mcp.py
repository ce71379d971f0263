"""The portal's MCP endpoint at ``/mcp`` (docs/portal.md#mcp-endpoint).

Read-only tools over the same service layer as GraphQL (``svc.portal.service``), and policy
drafts (create and validate; never publish or change modes), for a person's own token or an
agent acting for a person, served with the ``mcp`` SDK (``MCPServer`` tools behind its
``StreamableHTTPSessionManager``, which answers the initialize-handshake revisions and the
2026-07-28 single-exchange revision alike, so the SDK's default client connects).

* **Callers** send ``Authorization: Bearer <JWT>``, verified as the MCP gateway verifies agent
  tokens (``svc.gateway.tokens.AgentTokenVerifier``: RS256/ES256, JWKS over https, the trusted
  apps read from the context service): the install's identity provider's token
  (``person_issuer``, audience ``person_audience``) makes the caller that person; a trusted
  app's token exchange result (``act``) makes it the agent acting for the person in ``sub``.
  An agent acting alone is refused: the portal's tools answer for a person.
* **Every call is checked** like a GraphQL field: ``view`` (``administer`` for a draft) on the
  tool's ``PortalArea``, as the person, or as the agent with the person in ``on_behalf_of`` (the
  decision point checks both and the stricter verdict wins). A refusal is a tool error naming the
  decision's qid.
* **Every call is an intake event** (with ``intake_url``): ``system`` ``svc-portal``, the caller
  as ``principal`` (and ``on_behalf_of``), ``action`` the tool's check (``view`` /
  ``administer``), ``resource`` ``PortalArea::"<area>"``, ``tool`` ``portal/<tool>``,
  ``outcome`` ``success`` or ``failure``, ``attributes.decision_qid`` (the check's decision,
  allowed or not), so the decision's explanation lists the event. Events are queued and
  posted in batches by a thread (``svc.common.intake_client.IntakeSender``); past its bound
  new events are dropped and logged, never blocking a call.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Receive, Scope, Send

from svc.common.intake_client import IntakeSender
from svc.common.problems import Problem, problem_response
from svc.gateway.settings import GatewaySettings
from svc.gateway.tokens import AgentIdentity, AgentTokenVerifier, TokenError, TrustedApps
from svc.portal.service import ACTING_AGENT, LAST_CHECK, Denied, PortalService
from svc.portal.settings import PortalSettings

__all__ = ["McpEndpoint", "make_mcp_server"]

log = logging.getLogger("svc.portal.mcp")
T = TypeVar("T")

#: The verified caller of the MCP request being served (set by ``McpEndpoint``).
CALLER: contextvars.ContextVar[AgentIdentity | None] = contextvars.ContextVar(
    "svc_portal_mcp_caller", default=None
)


@dataclass(frozen=True)
class _Tool:
    area: str
    action: str


def make_mcp_server(service: PortalService, sink: IntakeSender | None) -> MCPServer[Any]:
    """The MCP server and its tools (module docs).

    Args:
        service: the service layer the tools call.
        sink: where each call's event goes (None: no events).

    Returns:
        An ``MCPServer`` whose low-level server ``McpEndpoint`` serves.

    """
    server: MCPServer[Any] = MCPServer(
        name="svc-portal",
        instructions=(
            "svc's portal: search and explain access decisions, who can reach what, risk, "
            "containments, challenges and investigations, and policy drafts. Every call is "
            "checked with svc's decision point for the person you act for."
        ),
        # The SDK configures the root logger at this level when none is set yet; the
        # process's own logging (svc up's, the command's) decides what else is shown.
        log_level="WARNING",
    )

    async def call(tool: str, spec: _Tool, fn: Callable[..., T], *args: Any) -> T:
        caller = CALLER.get()
        if caller is None or (caller.on_behalf_of is None and caller.principal["type"] != "Human"):
            raise ToolError("no verified caller")
        person = (
            caller.on_behalf_of["id"] if caller.on_behalf_of is not None else caller.principal["id"]
        )
        agent = caller.principal["id"] if caller.on_behalf_of is not None else None
        outcome, qid = "failure", None

        checked: list[str | None] = [None]

        def run() -> T:
            token = ACTING_AGENT.set(agent)
            LAST_CHECK.set(None)
            try:
                return fn(person, *args)
            finally:
                checked[0] = LAST_CHECK.get()
                ACTING_AGENT.reset(token)

        try:
            out = await anyio.to_thread.run_sync(run)
            outcome, qid = "success", checked[0]
            return out
        except Denied as e:
            qid = e.qid
            extra = f"; pass challenge {e.challenge_qid} first" if e.challenge_qid else ""
            raise ToolError(f"{e.detail}{extra}") from None
        except Problem as p:
            raise ToolError(f"{p.title}: {p.detail}") from None
        finally:
            if sink is not None:
                event: dict[str, Any] = {
                    "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
                    "system": "svc-portal",
                    "principal": dict(caller.principal),
                    "action": spec.action,
                    "resource": {"type": "PortalArea", "id": spec.area},
                    "outcome": outcome,
                    "tool": f"portal/{tool}",
                    "action_class": "read" if spec.action == "view" else "write",
                    "attributes": {"decision_qid": qid} if qid else {},
                }
                if caller.on_behalf_of is not None:
                    event["on_behalf_of"] = dict(caller.on_behalf_of)
                sink.put(event)

    def ref(type_: str | None, id_: str | None) -> dict[str, str] | None:
        return {"type": type_, "id": id_} if type_ and id_ else None

    @server.tool(
        description="Search recorded decisions: one principal's or one resource's (not both), "
        "or, naming neither, those matching another filter (action, verdict, policy)."
    )
    async def search_decisions(
        principal_type: str | None = None,
        principal_id: str | None = None,
        resource_type: str | None = None,
        resource_id: str | None = None,
        action: str | None = None,
        verdict: str | None = None,
        policy: str | None = None,
        since: str | None = None,
        until: str | None = None,
        first: int = 50,
        after: str | None = None,
    ) -> dict[str, Any]:
        """Decisions oldest first; pass `end_cursor` as `after` for the next page."""

        def run(person: str) -> dict[str, Any]:
            return service.decisions(
                person,
                principal=ref(principal_type, principal_id),
                resource=ref(resource_type, resource_id),
                action=action,
                verdict=verdict,
                policy=policy,
                since=_time(since, "since"),
                until=_time(until, "until"),
                first=first,
                after=after,
            )

        return _jsonable(await call("search_decisions", _Tool("decisions", "view"), run))

    @server.tool(
        description="Explain a decision: its policies' text, the attributes and entities they "
        "read (each path with its value and `as_of`: recorded with the decision, or the "
        "directory's current value), the person's own policies when an agent acted for one, and "
        "its challenge."
    )
    async def explain_decision(qid: str) -> dict[str, Any]:
        """The decision, the policies that decided with their text and reads, its challenge."""
        out = await call("explain_decision", _Tool("decisions", "view"), service.explain, qid)
        if out is None:
            raise ToolError(f"no decision `{qid}`")
        ch = out["challenge"]
        out["challenge"] = (
            None if ch is None else {"qid": ch.qid, "state": int(ch.state), "approver": ch.approver}
        )
        return _jsonable(out)

    @server.tool(description="Which principals of a type may take an action on a resource.")
    async def who_can(
        action: str, resource_type: str, resource_id: str, principal_type: str = "Human"
    ) -> dict[str, Any]:
        """The decision point's AuthZEN subject search."""
        return await call(
            "who_can",
            _Tool("policies", "view"),
            service.who_can,
            action,
            {"type": resource_type, "id": resource_id},
            principal_type,
            50,
        )

    @server.tool(description="The reasoner's risk scores, highest first, and open investigations.")
    async def risk(
        principal_type: str | None = None, principal_id: str | None = None
    ) -> dict[str, Any]:
        """Risk scores (of one principal when named)."""
        scores = await call("risk", _Tool("directory", "view"), service.risk_scores)
        if principal_type and principal_id:
            scores = [
                s for s in scores if s["principal"] == {"type": principal_type, "id": principal_id}
            ]
        return {"scores": scores}

    @server.tool(description="Every contained principal.")
    async def containments() -> dict[str, Any]:
        """Who is contained, why, by whom, since when."""
        rows = await call("containments", _Tool("containments", "view"), service.containments)
        return {
            "containments": [
                {
                    "principal": {"type": m.principal.type, "id": m.principal.id},
                    "reason": m.reason,
                    "author": m.author,
                }
                for m in rows
            ]
        }

    @server.tool(description="The challenges the person answers or approves, newest first.")
    async def challenges(first: int = 50) -> dict[str, Any]:
        """The person's own challenges."""

        def run(person: str) -> list[Any]:
            return service.challenges(person, mine=True, first=first)

        rows = await call("challenges", _Tool("challenges", "view"), run)
        return {
            "challenges": [
                {
                    "qid": m.qid,
                    "state": int(m.state),
                    "principal": {"type": m.principal.type, "id": m.principal.id},
                    "action": m.action,
                    "resource": {"type": m.resource.type, "id": m.resource.id},
                    "kinds": list(m.kinds),
                    "approver": m.approver,
                }
                for m in rows
            ]
        }

    @server.tool(description="Investigations, newest first (of one status: open or closed).")
    async def investigations(status: str | None = None) -> dict[str, Any]:
        """Investigations of principals."""
        rows = await call(
            "investigations", _Tool("investigations", "view"), service.investigations, status
        )
        return {"investigations": rows}

    @server.tool(
        description="Validate policy files and store them as a draft (never published); a "
        "refused draft lists every problem by file, line and column."
    )
    async def create_draft(files: dict[str, str], comment: str = "") -> dict[str, Any]:
        """``files``: name to Cedar text (``*.cedar``, ``*.cedarschema``)."""
        pairs = sorted(files.items())
        bundle, problems = await call(
            "create_draft", _Tool("policies", "administer"), service.create_draft, pairs, comment
        )
        if bundle is None:
            return {"stored": False, "problems": problems}
        return {
            "stored": True,
            "version": int(bundle.version),
            "policies": list(bundle.policies),
            "warnings": list(bundle.warnings),
        }

    @server.tool(
        description="Decide the recorded checks of a time range again under a bundle version "
        "(a draft, usually) and count what would change (never publishes)."
    )
    async def dry_run(
        version: int, since: str, until: str | None = None, sample: int = 20
    ) -> dict[str, Any]:
        """The policy service's dry run: counts of changed decisions and a sample of them."""
        start = _time(since, "since")
        assert start is not None

        def run(person: str) -> Any:
            return service.dry_run(person, version, start, _time(until, "until"), sample)

        m = await call("dry_run", _Tool("policies", "view"), run)
        return {
            "version": int(m.version),
            "decisions": int(m.decisions),
            "unchanged": int(m.unchanged),
            "allow_to_deny": int(m.allow_to_deny),
            "deny_to_allow": int(m.deny_to_allow),
            "to_challenge": int(m.to_challenge),
            "from_challenge": int(m.from_challenge),
            "errors": int(m.errors),
            "truncated": bool(m.truncated),
            "sample": [
                {
                    "qid": c.qid,
                    "principal": c.principal,
                    "action": c.action,
                    "resource": c.resource,
                    "recorded": c.recorded,
                    "draft": c.draft,
                }
                for c in m.sample
            ],
        }

    return server


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ToolError(f"`{name}` is not an RFC 3339 time") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    """A value as plain JSON (datetimes as RFC 3339 text)."""
    out: dict[str, Any] = json.loads(json.dumps(value, default=lambda v: v.isoformat()))
    return out


#: The ASGI scope key of the caller ``McpEndpoint.caller`` verified.
_CALLER_KEY = "svc.portal.mcp_caller"


class McpEndpoint:
    """The ASGI app of ``/mcp``: the caller's token checked, then the SDK's transport.

    Args:
        settings: the portal's settings (``person_*``, ``jwks_*``, ``public_url``).
        apps: the trusted apps in force (shared with the agents API's verifier).
        refresh_apps: reads the trusted apps again when they are due (the agents API's
            ``AppTokenVerifier.refresh``); called before each verification.
        server: the MCP server (``make_mcp_server``).

    """

    def __init__(
        self,
        settings: PortalSettings,
        apps: TrustedApps,
        refresh_apps: Callable[[], None],
        server: MCPServer[Any],
    ) -> None:
        self.refresh_apps = refresh_apps
        gw = GatewaySettings(
            person_issuer=settings.person_issuer,
            person_jwks_url=settings.person_jwks_url,
            person_audience=settings.person_audience,
            jwks_ca_file=settings.jwks_ca_file,
            jwks_refresh_secs=settings.jwks_refresh_secs,
            leeway_secs=settings.leeway_secs,
        )
        self.verifier = AgentTokenVerifier(gw, apps)
        public = urlsplit(settings.public_url)
        self.manager = StreamableHTTPSessionManager(
            app=server._lowlevel_server,
            stateless=True,
            json_response=True,
            security_settings=TransportSecuritySettings(
                allowed_hosts=[public.netloc, "127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=[
                    f"{public.scheme}://{public.netloc}",
                    "http://127.0.0.1:*",
                    "http://localhost:*",
                ],
            ),
        )

    def _verify(self, token: str) -> AgentIdentity:
        try:
            self.refresh_apps()
        except Exception as e:  # the apps in force stay; a person's token still verifies
            log.warning("the trusted apps cannot be read now: %s", e)
        return self.verifier.verify(token)

    async def caller(self, scope: Scope) -> AgentIdentity:
        """The verified caller of a request; kept in ``scope`` so it is verified once.

        Raises:
            Problem: 401 ``unauthenticated`` without a bearer token, with one that does not
                verify, or with an agent acting alone.

        """
        known = scope.get(_CALLER_KEY)
        if isinstance(known, AgentIdentity):
            return known
        headers = dict(scope.get("headers", []))
        raw = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = raw.partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise TokenError(
                    "no bearer token: send `Authorization: Bearer <JWT>`", missing=True
                )
            ident = await anyio.to_thread.run_sync(self._verify, token.strip())
            if ident.principal["type"] != "Human" and ident.on_behalf_of is None:
                raise TokenError(
                    "an agent acting alone cannot use the portal's tools: they answer for a "
                    "person (a token exchange result naming the person in `sub`)"
                )
        except TokenError as e:
            challenge = (
                'Bearer realm="svc-portal"'
                if e.missing
                else 'Bearer realm="svc-portal", error="invalid_token"'
            )
            raise Problem(
                401,
                "unauthenticated",
                "Authentication required",
                e.detail,
                headers={"WWW-Authenticate": challenge},
            ) from None
        scope[_CALLER_KEY] = ident
        return ident

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Verifies the bearer token (``caller``), then hands the request to the SDK's transport."""
        try:
            ident = await self.caller(scope)
        except Problem as p:
            await problem_response(p)(scope, receive, send)
            return
        reset = CALLER.set(ident)
        try:
            await self.manager.handle_request(scope, receive, send)
        finally:
            CALLER.reset(reset)
