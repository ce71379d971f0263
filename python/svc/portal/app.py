"""The portal's HTTP face (FastAPI): it only translates (docs/portal.md).

* ``PUT``/``GET``/``DELETE /api/v1/agents/{agent_id}`` and ``GET /api/v1/agents``: the agents
  API for trusted apps, under the app's own token (``svc.portal.apptokens``);
* ``POST /graphql``: the GraphQL API (``svc.portal.gql``) for a signed-in person, every
  request carrying the session's CSRF token; ``GET /graphql`` serves the GraphiQL IDE in dev
  only;
* ``/mcp``: the MCP endpoint (``svc.portal.mcp``) for a person's token or an agent acting for
  a person;
* ``GET /auth/login``, ``GET /auth/callback``, ``POST /auth/logout`` and ``GET /api/v1/me``:
  people's OpenID Connect sign-in, session and CSRF token (``svc.portal.sessions``), when an
  ``oidc_issuer`` is set;
* ``/healthz``, ``/readyz``, ``/version``, ``/metrics`` (``svc.common.health``), no token.

Errors are RFC 9457 problem documents (``svc.common.problems``). A body larger than
``max_body_bytes`` is refused with 413 before it is read whole.

``serve`` runs the app in the calling thread (uvicorn with httptools, ``svc.common.connect
.serve_asgi``); ``PortalServer`` in a thread of its own (tests, ``svc up``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from authlib.integrations.starlette_client import OAuth, OAuthError
from fastapi import Body, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter
from starlette.exceptions import WebSocketException
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import Scope
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL

from svc import __version__, web
from svc.common.auth_settings import is_loopback
from svc.common.connect import ThreadedServer, serve_asgi
from svc.common.health import Readiness, probe_router
from svc.common.intake_client import IntakeSender
from svc.common.limits import harden
from svc.common.problems import FieldError, Problem, install_problem_handlers, problem_response
from svc.portal.apptokens import AppTokenError, AppTokenVerifier, TrustedAppsUnavailable
from svc.portal.clients import (
    ChallengeClient,
    ContextClient,
    HistoryClient,
    PdpClient,
    PolicyClient,
    token_reader,
)
from svc.portal.gql import Context, make_schema
from svc.portal.live import live_handler
from svc.portal.mcp import McpEndpoint, make_mcp_server
from svc.portal.service import PortalService
from svc.portal.sessions import COOKIE, LOGIN_COOKIE, Session, SessionStore, load_session_key
from svc.portal.settings import PortalSettings, read_token_file
from svc.portal.webapp import WEB_DIR, PersistedOperations, PersistedRouter, install_web

__all__ = ["PortalServer", "build_service", "create_app", "serve"]

log = logging.getLogger("svc.portal")
COMPONENT = "svc-portal"


#: The agents API's JSON body, any shape: the service layer names what is wrong with it.
_BODY = Body()


def build_service(settings: PortalSettings) -> PortalService:
    """The service layer over HTTP clients of the services `settings` name."""
    t = settings.call_timeout_secs
    return PortalService(
        settings,
        PdpClient(settings.pdp_url, token_reader(settings.pdp_token_file, "decision point"), t),
        ContextClient(
            settings.context_url, token_reader(settings.context_token_file, "context service"), t
        ),
        challenge=ChallengeClient(
            settings.challenge_url,
            token_reader(settings.challenge_token_file, "challenge service"),
            t,
        )
        if settings.challenge_url
        else None,
        policy=PolicyClient(
            settings.policy_url, token_reader(settings.policy_token_file, "policy service"), t
        )
        if settings.policy_url
        else None,
        history=HistoryClient(
            settings.history_url, token_reader(settings.history_token_file, "history"), t
        )
        if settings.history_url
        else None,
    )


def create_app(settings: PortalSettings, service: PortalService) -> FastAPI:
    """The portal's app (module docs).

    Args:
        settings: the portal's settings.
        service: the service layer (its clients already made).

    Returns:
        A FastAPI app whose lifespan runs the MCP session manager and the intake events'
        sending thread (``svc.portal.mcp``); it closes nothing of ``service``.

    """
    verifier = AppTokenVerifier(
        service.context.trusted_apps,
        refresh_secs=settings.trust_refresh_secs,
        ca_file=settings.jwks_ca_file,
        jwks_refresh_secs=settings.jwks_refresh_secs,
        leeway_secs=settings.leeway_secs,
    )
    sink = (
        IntakeSender(
            settings.intake_url,
            token_reader(settings.intake_token_file, "intake"),
            what="MCP calls",
        )
        if settings.intake_url
        else None
    )
    mcp = McpEndpoint(settings, verifier.apps, verifier.refresh, make_mcp_server(service, sink))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if sink is not None:
            sink.start()
        async with mcp.manager.run():
            try:
                yield
            finally:
                if sink is not None:
                    await anyio.to_thread.run_sync(sink.close)

    app = FastAPI(
        lifespan=lifespan,
        title=COMPONENT,
        version=__version__,
        description="The portal: the agents API for trusted apps (docs/portal.md).",
        docs_url="/docs" if settings.dev else None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.dev else None,
    )
    web.install(app)
    install_problem_handlers(app)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(None, ".".join(str(p) for p in e.get("loc", ())), str(e.get("msg", "")))
            for e in exc.errors()
        ]
        detail = "; ".join(f"`{e.field}`: {e.message}" for e in errors) or "invalid request"
        return problem_response(Problem(400, "invalid-request", "Invalid request", detail, errors))

    # Credentials first (``credentials_first``), then bodies bounded and JSON checked (UTF-8,
    # depth, no lone surrogate), no internals in a 500 (svc.common.limits); the routes check the
    # credentials again as they use them.
    harden(
        app,
        max_body_bytes=settings.max_body_bytes,
        setting=settings.env_name("max_body_bytes"),
        authenticate=lambda scope: credentials_first(scope),
    )

    registry = CollectorRegistry(auto_describe=True)
    agent_calls = Counter(
        "svc_portal_agent_calls",
        "Agents API calls by method and status",
        ["method", "status"],
        registry=registry,
    )

    def readiness() -> Readiness:
        reasons = []
        try:
            verifier.refresh()
        except TrustedAppsUnavailable:
            reasons.append("the context service does not answer (trusted apps)")
        if not service.pdp.ping():
            reasons.append("the decision point is not ready")
        return Readiness(reasons, {"trusted_apps": verifier.apps.names()})

    sessions = SessionStore(
        load_session_key(settings.session_key_file), settings.session_secs, settings.max_sessions
    )
    app.state.sessions = sessions
    app.state.public_origin = _origin(settings.public_url)
    if settings.oidc_issuer:
        install_sign_in(app, settings, sessions)

    app.router.routes.append(Route("/mcp", endpoint=mcp, methods=["GET", "POST", "DELETE"]))

    web_dir = Path(settings.web_dir) if settings.web_dir else WEB_DIR
    operations = PersistedOperations.load(web_dir, settings.allow_any_query or settings.dev)
    schema = make_schema(settings, operations)

    def graphql_guard(request: HTTPConnection) -> Session:
        if request.scope["type"] == "websocket":
            # Browsers send no custom header on a websocket: its Origin must be the portal's
            # (cross-site websocket hijacking), and the session cookie signed in.
            origin = request.headers.get("origin")
            if origin is None or origin.lower() != request.app.state.public_origin:
                raise WebSocketException(code=4403, reason="origin not allowed")
            store: SessionStore = request.app.state.sessions
            session = store.get(request.cookies.get(COOKIE))
            if session is None:
                raise WebSocketException(code=4401, reason="sign in first")
            return session
        assert isinstance(request, Request)
        if request.method == "GET" and not settings.dev:
            raise Problem(
                405,
                "method-not-allowed",
                "Method not allowed",
                "GraphQL takes POST (the IDE is served with SVC_PORTAL_DEV only)",
                headers={"Allow": "POST"},
            )
        return changing(request) if request.method != "GET" else signed_in(request)

    def graphql_context(session: Session = Depends(graphql_guard)) -> Context:  # noqa: B008
        return Context(session, service)

    graphql_router = PersistedRouter(
        operations,
        schema,
        path="/graphql",
        graphql_ide="graphiql" if settings.dev else None,
        allow_queries_via_get=False,
        context_getter=graphql_context,
        subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL,),
        max_subscriptions_per_connection=settings.max_subscriptions,
        allowed_origins=[_origin(settings.public_url)],
        dependencies=[Depends(graphql_guard)],
        include_in_schema=False,
    )
    # On the websocket too: only the app's persisted operations, and no longer than the
    # session that opened it (svc.portal.live).
    graphql_router.graphql_transport_ws_handler_class = live_handler(operations, sessions)
    app.include_router(graphql_router)

    app.include_router(
        probe_router(
            COMPONENT,
            __version__,
            readiness,
            registry,
            ready_description="Ready when the context service and the decision point answer.",
        )
    )

    bearer = HTTPBearer(auto_error=False, description="The trusted app's own token")
    run = anyio.to_thread.run_sync

    bearer_dep = Depends(bearer)

    async def app_caller(credentials: HTTPAuthorizationCredentials | None) -> str:
        """The name of the trusted app whose own token the request carries.

        Raises:
            Problem: 401 ``unauthenticated`` without a token or with one the trusted apps'
                keys do not verify; 503 when the trusted apps cannot be read.

        """
        try:
            if credentials is None or not credentials.credentials.strip():
                raise AppTokenError(
                    "no bearer token: send `Authorization: Bearer <the app's own token>`",
                    missing=True,
                )
            trusted = await run(verifier.verify, credentials.credentials.strip())
        except AppTokenError as e:
            raise Problem(
                401,
                "unauthenticated",
                "Authentication required",
                e.detail,
                headers={"WWW-Authenticate": e.www_authenticate(COMPONENT)},
            ) from None
        except TrustedAppsUnavailable:
            raise Problem(
                503,
                "service-unavailable",
                "Service unavailable",
                "the trusted apps cannot be read now; try again shortly",
                headers={"Retry-After": "1"},
            ) from None
        return trusted.name

    async def calling_app(
        request: Request, credentials: HTTPAuthorizationCredentials | None = bearer_dep
    ) -> str:
        """The calling trusted app (``app_caller``), as ``credentials_first`` verified it."""
        name = request.scope.get(_APP_CALLER)
        return name if isinstance(name, str) else await app_caller(credentials)

    async def credentials_first(scope: Scope) -> Problem | None:
        """The credentials of the agents API, GraphQL and MCP, before any body is read.

        ``/api/v1/agents``: a trusted app's own token (the app put in the scope for
        ``calling_app``); ``/graphql``: a live session cookie; ``/mcp``: a person's or an
        agent's JWT (``McpEndpoint.caller``). Anything else (the web app's files, sign-in and
        sign-out, ``/api/v1/me``, the probes) is left to its route.

        Returns:
            The refusal to answer (401, or 503 when the trusted apps cannot be read), or None.

        """
        path: str = scope.get("path", "")
        try:
            if path == "/api/v1/agents" or path.startswith("/api/v1/agents/"):
                scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
                creds = (
                    HTTPAuthorizationCredentials(scheme=scheme, credentials=token)
                    if scheme.lower() == "bearer"
                    else None
                )
                scope[_APP_CALLER] = await app_caller(creds)
            elif path == "/graphql" or path.startswith("/graphql/"):
                signed_in(Request(scope))
            elif path == "/mcp" or path.startswith("/mcp/"):
                await mcp.caller(scope)
        except Problem as p:
            return p
        return None

    caller_dep = Depends(calling_app)

    def counted(method: str, fn: Callable[[], Any]) -> Any:
        try:
            out = fn()
        except Problem as p:
            agent_calls.labels(method, str(p.status)).inc()
            raise
        agent_calls.labels(method, "2xx").inc()
        return out

    @app.put("/api/v1/agents/{agent_id}", tags=["agents"])
    async def put_agent(
        agent_id: str,
        response: Response,
        caller: str = caller_dep,
        body: Any = _BODY,
    ) -> Any:
        """Registers or changes one of the calling app's agents (201 when new, else 200)."""
        record, created = await run(
            counted, "PUT", lambda: service.put_agent(caller, agent_id, body)
        )
        response.status_code = 201 if created else 200
        return record

    @app.get("/api/v1/agents", tags=["agents"])
    async def list_agents(caller: str = caller_dep) -> Any:
        """The calling app's registered agents, by id."""
        agents = await run(counted, "GET", lambda: service.list_agents(caller))
        return {"app": caller, "agents": agents}

    @app.get("/api/v1/agents/{agent_id}", tags=["agents"])
    async def get_agent(agent_id: str, caller: str = caller_dep) -> Any:
        """One of the calling app's agents, with its registrations and changes."""
        return await run(counted, "GET", lambda: service.agent(caller, agent_id))

    @app.delete("/api/v1/agents/{agent_id}", status_code=204, tags=["agents"])
    async def retire_agent(agent_id: str, caller: str = caller_dep) -> Response:
        """Retires one of the calling app's agents: every decision point then denies it."""
        await run(counted, "DELETE", lambda: service.retire_agent(caller, agent_id))
        return Response(status_code=204)

    install_web(app, web_dir)  # last: its catch-all GET serves the app's own routes
    return app


#: The ASGI scope key of the trusted app ``credentials_first`` verified.
_APP_CALLER = "svc.portal.app_caller"


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return bytes(v).decode("latin-1")
    return None


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL (RFC 6454), lowercased."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def signed_in(request: Request) -> Session:
    """The request's live session (the ``svc_portal_session`` cookie).

    Raises:
        Problem: 401 ``unauthenticated`` without a live session (none, tampered, expired,
            signed out).

    """
    store: SessionStore = request.app.state.sessions
    session = store.get(request.cookies.get(COOKIE))
    if session is None:
        raise Problem(401, "unauthenticated", "Sign-in required", "sign in first: GET /auth/login")
    return session


def changing(request: Request) -> Session:
    """The session of a state-changing request, its CSRF token and origin checked.

    Raises:
        Problem: 401 as ``signed_in``; 403 ``csrf-refused`` when ``X-CSRF-Token`` is missing
            or wrong, or an ``Origin`` header names another origin than the portal's.

    """
    session = signed_in(request)
    public: str = request.app.state.public_origin
    origin = request.headers.get("origin")
    if origin is not None and origin.lower() != public:
        raise Problem(
            403,
            "csrf-refused",
            "Cross-site request refused",
            f"origin `{origin[:200]}` is not the portal's",
        )
    if not session.csrf_ok(request.headers.get("x-csrf-token")):
        raise Problem(
            403,
            "csrf-refused",
            "Cross-site request refused",
            "missing or wrong X-CSRF-Token header (GET /api/v1/me gives the token)",
        )
    return session


def install_sign_in(app: FastAPI, settings: PortalSettings, sessions: SessionStore) -> None:
    """Adds OpenID Connect sign-in and sign-out to `app` (``svc.portal.sessions``).

    Args:
        app: the portal's app, before it serves.
        settings: ``oidc_*`` (the provider), ``public_url`` (the redirect URI
            ``<public_url>/auth/callback``; ``https://`` makes the cookies ``Secure``),
            ``session_secs``.
        sessions: where sessions are opened and revoked.

    Raises:
        ValueError: ``oidc_issuer`` is unset.
        OSError: the client secret file cannot be read.

    """
    if not settings.oidc_issuer:
        raise ValueError("sign-in needs oidc_issuer")
    secret: str | None = None
    if settings.oidc_client_secret_file:
        secret = read_token_file(settings.oidc_client_secret_file)
    oauth = OAuth()
    oauth.register(
        name="idp",
        client_id=settings.oidc_client_id,
        client_secret=secret,
        server_metadata_url=settings.oidc_issuer.rstrip("/") + "/.well-known/openid-configuration",
        client_kwargs={
            "scope": "openid profile email",
            "code_challenge_method": "S256",
            "token_endpoint_auth_method": "client_secret_basic" if secret else "none",
        },
    )
    secure = settings.public_url.startswith("https://")
    # The flow's state, nonce and code verifier only, for ten minutes.
    app.add_middleware(
        SessionMiddleware,
        secret_key=sessions.derived_key("svc-portal-login"),
        session_cookie=LOGIN_COOKIE,
        max_age=600,
        same_site="lax",
        https_only=secure,
    )
    callback = settings.public_url.rstrip("/") + "/auth/callback"
    claim = settings.oidc_username_claim

    @app.get("/auth/login", include_in_schema=False)
    async def login(request: Request, next: str = "/") -> Response:
        """Sends the person to the provider; ``next`` is where to come back to (local)."""
        request.session.clear()
        request.session["next"] = next if _local(next) else "/"
        try:
            out: Response = await oauth.idp.authorize_redirect(request, callback)
        except Exception as e:
            log.error("sign-in: the identity provider does not answer: %s", e)
            raise Problem(
                503,
                "service-unavailable",
                "Service unavailable",
                "the identity provider does not answer",
            ) from None
        return out

    @app.get("/auth/callback", include_in_schema=False)
    async def auth_callback(request: Request) -> Response:
        """The provider's redirect: checks the code's exchange and opens a session."""
        try:
            token = await oauth.idp.authorize_access_token(request)
        except OAuthError as e:
            log.warning("sign-in refused: %s", e)
            raise Problem(
                403, "sign-in-refused", "Sign-in refused", f"sign-in failed: {e.error}"
            ) from None
        claims = token.get("userinfo") or {}
        user = claims.get(claim)
        if not isinstance(user, str) or not user or len(user) > 512:
            raise Problem(
                403,
                "sign-in-refused",
                "Sign-in refused",
                f"the identity provider sent no `{claim}` claim",
            )
        target = request.session.get("next", "/")
        request.session.clear()
        old = sessions.get(request.cookies.get(COOKIE))
        if old is not None:
            sessions.revoke(old.sid)  # a new session for each sign-in (session fixation)
        _, cookie = sessions.create(user)
        log.info("%s signed in to the portal", user)
        out = RedirectResponse(target if _local(target) else "/", status_code=303)
        out.set_cookie(
            COOKIE,
            cookie,
            max_age=settings.session_secs,
            path="/",
            secure=secure,
            httponly=True,
            samesite="lax",
        )
        return out

    @app.post("/auth/logout", status_code=204, include_in_schema=False)
    def logout(request: Request) -> Response:
        """Signs out: the session is revoked server-side and the cookie dropped."""
        session = changing(request)
        sessions.revoke(session.sid)
        log.info("%s signed out of the portal", session.user)
        out = Response(status_code=204)
        out.delete_cookie(COOKIE, path="/", secure=secure, httponly=True, samesite="lax")
        return out

    @app.get("/api/v1/me", tags=["session"])
    def me(request: Request) -> dict[str, Any]:
        """The signed-in person: ``{user, csrf, expires_at}`` (``csrf`` for ``X-CSRF-Token``)."""
        session = signed_in(request)
        return {
            "user": session.user,
            "csrf": session.csrf,
            "expires_at": datetime.fromtimestamp(session.expires_at, UTC).isoformat(),
        }


def _local(target: object) -> bool:
    """Whether a redirect target is a path of this site (no scheme, no host, no ``//``)."""
    return (
        isinstance(target, str)
        and target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and len(target) <= 2000
    )


def serve(
    settings: PortalSettings,
    *,
    service: PortalService | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs the portal on ``settings.host:port`` in this thread until stopped.

    Args:
        settings: the portal's settings.
        service: the service layer (default: ``build_service(settings)``, closed at the end).
        ready: called with the bound port once the socket listens.
        stop: ends the server when set; without it SIGINT/SIGTERM do (main thread only).

    Raises:
        ValueError: ``settings.host`` is not a loopback address while ``public_url`` is plain
            ``http://`` (a session cookie would cross the network unprotected).
        OSError: the port cannot be bound.

    """
    if not is_loopback(settings.host) and not settings.public_url.startswith("https://"):
        raise ValueError(
            f"{COMPONENT}: refusing to listen on {settings.host} with a plain http:// "
            "SVC_PORTAL_PUBLIC_URL: sessions would cross the network unprotected. Serve it "
            "behind https and set SVC_PORTAL_PUBLIC_URL=https://..., or bind to 127.0.0.1"
        )
    own = service is None
    svc = service or build_service(settings)
    try:
        serve_asgi(
            create_app(settings, svc),
            settings.host,
            settings.port,
            COMPONENT,
            ready=ready,
            stop=stop,
            http1=True,
        )
    finally:
        if own:
            svc.close()


class PortalServer(ThreadedServer):
    """The portal in a thread of its own: ``start()`` returns once it listens.

    ``start``, ``stop``, ``url`` are ``svc.common.connect.ThreadedServer``'s.

    Args:
        settings: the portal's settings (``port=0`` picks a free port).
        service: the service layer (default: ``build_service(settings)``).

    """

    def __init__(self, settings: PortalSettings, service: PortalService | None = None) -> None:
        super().__init__(settings.host, COMPONENT)
        self.settings = settings
        self.service = service

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve(self.settings, service=self.service, ready=ready, stop=stop)
