"""The portal's HTTP face (FastAPI): it only translates (docs/portal.md).

* ``PUT``/``GET``/``DELETE /api/v1/agents/{agent_id}`` and ``GET /api/v1/agents``: the agents
  API for trusted apps, under the app's own token (``svc.portal.apptokens``);
* ``/healthz``, ``/readyz``, ``/version``, ``/metrics`` (``svc.common.health``), no token.

Errors are RFC 9457 problem documents (``svc.common.problems``). A body larger than
``max_body_bytes`` is refused with 413 before it is read whole.

``serve`` runs the app in the calling thread (uvicorn with httptools, ``svc.common.connect
.serve_asgi``); ``PortalServer`` in a thread of its own (tests, ``svc up``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from fastapi import Body, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from svc import __version__, web
from svc.common.auth_settings import is_loopback
from svc.common.connect import ThreadedServer, serve_asgi
from svc.common.health import Readiness, probe_router
from svc.common.problems import FieldError, Problem, install_problem_handlers, problem_response
from svc.portal.apptokens import AppTokenError, AppTokenVerifier, TrustedAppsUnavailable
from svc.portal.clients import ContextClient, PdpClient, token_reader
from svc.portal.service import PortalService
from svc.portal.settings import PortalSettings

__all__ = ["PortalServer", "build_service", "create_app", "serve"]

log = logging.getLogger("svc.portal")
COMPONENT = "svc-portal"


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets a 413 problem, unread.

    A declared ``Content-Length`` over the limit is refused at once; a body sent without one
    (chunked) is counted as it arrives and refused once past the limit.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _problem(self) -> Problem:
        return Problem(
            413,
            "payload-too-large",
            "Payload too large",
            f"the request body is larger than {self.limit} bytes (SVC_PORTAL_MAX_BODY_BYTES)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await problem_response(self._problem())(scope, receive, send)
                    return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if not started:
                await problem_response(self._problem())(scope, receive, send)


#: The agents API's JSON body, any shape: the service layer names what is wrong with it.
_BODY = Body()


class _TooLarge(Exception):
    """A body went past the limit while it was read."""


def build_service(settings: PortalSettings) -> PortalService:
    """The service layer over HTTP clients of the services `settings` name."""
    t = settings.call_timeout_secs
    return PortalService(
        settings,
        PdpClient(settings.pdp_url, token_reader(settings.pdp_token_file, "decision point"), t),
        ContextClient(
            settings.context_url, token_reader(settings.context_token_file, "context service"), t
        ),
    )


def create_app(settings: PortalSettings, service: PortalService) -> FastAPI:
    """The portal's app (module docs).

    Args:
        settings: the portal's settings.
        service: the service layer (its clients already made).

    Returns:
        A FastAPI app; it starts nothing itself and closes nothing of ``service``.

    """
    verifier = AppTokenVerifier(
        service.context.trusted_apps,
        refresh_secs=settings.trust_refresh_secs,
        ca_file=settings.jwks_ca_file,
        jwks_refresh_secs=settings.jwks_refresh_secs,
        leeway_secs=settings.leeway_secs,
    )
    app = FastAPI(
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

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

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

    async def calling_app(credentials: HTTPAuthorizationCredentials | None = bearer_dep) -> str:
        """The name of the trusted app whose own token the request carries (401 otherwise)."""
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

    return app


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
