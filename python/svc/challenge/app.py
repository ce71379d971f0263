"""The challenge service's one port: gRPC ``svc.challenge.v1.ChallengeService`` and the probes.

One ASGI app (``create_app``): requests under ``/svc.challenge.v1.ChallengeService/`` go to the
connectrpc app (``svc.challenge.transport``), everything else to a small FastAPI app with
``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` (``svc.common.health.probe_router``,
docs/architecture.md#what-every-component-serves), and the challenge page (``svc.challenge.page``)
when an OpenID Connect provider is set. Hypercorn serves both on one socket, HTTP/1.1
and h2c, as for the policy service (``svc.policy.app``; docs/dependencies.md says why).

``serve`` runs it in the calling thread until a signal or ``stop`` event, with the outbox worker
(``svc.challenge.notify``) beside it when a webhook is set; ``ChallengeServer`` runs both in a
thread of their own (tests, ``svc up``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from prometheus_client import Gauge
from sqlalchemy import func, text
from sqlmodel import Session, col, select
from starlette.types import Receive, Scope, Send

from svc import __version__, web
from svc.challenge.models import ChallengeRow
from svc.challenge.notify import OutboxWorker
from svc.challenge.page import install_page
from svc.challenge.pdp_client import token_file_reader
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.challenge.transport import SERVICE_NAME, ChallengeConnectApp, ChallengeMetrics
from svc.common.connect import (
    METRICS_CONTENT_TYPE,
    ThreadedServer,
    one_port,
    serve_asgi,
    verifier_of,
)
from svc.common.health import Readiness, probe_router
from svc.common.intake_client import IntakeSender
from svc.common.limits import harden
from svc.common.problems import install_problem_handlers

__all__ = ["ChallengeServer", "create_app", "health_app", "serve"]

log = logging.getLogger("svc.challenge")

#: The largest request message and HTTP body, in bytes.
MAX_MESSAGE_BYTES = 1024 * 1024
#: The paths of the challenge page (``svc.challenge.page``), served without a bearer token.
PAGE_PREFIXES = ("/challenge/", "/keys", "/auth/", "/page/")


def health_app(service: ChallengeService, metrics: ChallengeMetrics) -> FastAPI:
    """The four probes every component serves (``svc.common.health.probe_router``), no token.

    ``/readyz``: 200 ``{"ready": true, "migration"}`` when the database answers, else a 503
    problem. ``/version``: ``{"component": "svc-challenge", "version"}``. ``/metrics``:
    Prometheus text.

    Args:
        service: the service layer (its database answers ``/readyz``).
        metrics: the service's metrics (``/metrics`` renders their registry).

    Returns:
        The FastAPI app of the probes, answering errors as RFC 9457 problems.

    """
    app = FastAPI(title="svc-challenge", version=__version__, docs_url=None, redoc_url=None)
    web.install(app)
    install_problem_handlers(app)

    def readiness() -> Readiness:
        try:
            with service.db.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as e:
            log.error("readiness: the database does not answer: %s", e)
            return Readiness(("the challenge database does not answer",))
        return Readiness((), {"migration": service.revision})

    # Read at each scrape: challenges waiting for an answer (the reporter's open_challenges,
    # docs/reporter.md).
    open_now = Gauge(
        "svc_challenge_open", "Challenges pending and not expired", registry=metrics.registry
    )

    def refresh() -> None:
        try:
            with Session(service.db) as s:
                n = s.exec(
                    select(func.count())
                    .select_from(ChallengeRow)
                    .where(
                        ChallengeRow.state == "pending",
                        col(ChallengeRow.expires_at) > service.clock(),
                    )
                ).one()
        except Exception as e:  # the metrics still render; the gauge keeps its last value
            log.warning("metrics: counting open challenges failed: %s", e)
            return
        open_now.set(n)

    app.include_router(
        probe_router(
            ChallengeSettings.component,
            __version__,
            readiness,
            metrics.registry,
            refresh=refresh,
            ready_description="Ready when the challenge database answers.",
            metrics_content_type=METRICS_CONTENT_TYPE,
        )
    )
    return app


def create_app(
    service: ChallengeService, auth: ChallengeAuthSettings | None = None
) -> Callable[[Scope, Receive, Send], Any]:
    """The service's ASGI app: gRPC methods to connectrpc, every other path to the probes.

    With ``oidc_issuer`` set, the probes' app also serves the challenge page
    (``svc.challenge.page.install_page``, docs/challenges.md#the-page).

    Args:
        service: the service layer.
        auth: who may call the gRPC methods (docs/auth.md); None or auth off admits everyone
            (``serve`` allows that on loopback binds only). The probes never take a token.

    Returns:
        An ASGI 3 callable; lifespan events go to the health app.

    Raises:
        AuthConfigError: auth is on and the issuer's keys cannot be loaded.

    """
    verifier = verifier_of(auth)
    metrics = ChallengeMetrics()
    grpc_app = ChallengeConnectApp(
        service, metrics, max_message_bytes=MAX_MESSAGE_BYTES, verifier=verifier
    )
    http_app = health_app(service, metrics)
    page = bool(service.settings.oidc_issuer)
    if page:
        install_page(http_app, service)
    # The token first on every path but the probes and the page (its people sign in), bodies
    # bounded as the gRPC messages are, JSON checked (docs/challenges.md#limits).
    harden(
        http_app,
        max_body_bytes=MAX_MESSAGE_BYTES,
        setting="the challenge service's message limit",
        verifier=verifier,
        open_prefixes=PAGE_PREFIXES if page else (),
    )
    return one_port(grpc_app, http_app, SERVICE_NAME)


def serve(
    settings: ChallengeSettings,
    *,
    auth: ChallengeAuthSettings | None = None,
    service: ChallengeService | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    outbox: bool = True,
) -> None:
    """Runs the service on ``settings.host:port`` in this thread until stopped.

    Args:
        settings: the service's settings.
        auth: who may call (docs/auth.md); default ``ChallengeAuthSettings()``
            (``SVC_CHALLENGE_AUTH*``, off without an issuer).
        service: the service layer (default: one made from ``settings``, which migrates).
        ready: called with the bound port once the socket listens.
        stop: ends the server when set; without it SIGINT/SIGTERM do (main thread only).
        outbox: run the outbox worker beside the server when ``settings.webhook_url`` is set.

    Raises:
        AuthConfigError: auth is off and ``settings.host`` is not a loopback address, or the
            issuer's keys cannot be loaded (nothing is served).
        OSError: the port cannot be bound.

    """
    auth = auth if auth is not None else ChallengeAuthSettings()
    auth.check_bind(settings.host)
    service = service or ChallengeService(settings)
    app = create_app(service, auth)
    worker = OutboxWorker(service).start() if outbox and settings.webhook_url else None
    # How challenges end, as audit events at the intake (unless the caller's service has its
    # own hook already).
    sender = None
    if settings.intake_url and service.audit is None:
        sender = IntakeSender(
            settings.intake_url,
            token_file_reader(settings.intake_token_file),
            what="challenge outcomes",
        ).start()
        service.audit = sender.put
    try:
        serve_asgi(app, settings.host, settings.port, "svc-challenge", ready=ready, stop=stop)
    finally:
        if worker is not None:
            worker.stop()
        if sender is not None:
            service.audit = None
            sender.close()


class ChallengeServer(ThreadedServer):
    """The service in a thread of its own: ``start()`` returns once it listens.

    ``start``, ``stop``, ``url`` and ``target`` are ``svc.common.connect.ThreadedServer``'s.

    Args:
        settings: the service's settings (``port=0`` picks a free port).
        service: the service layer (default: made from ``settings``).
        auth: who may call (as ``serve``'s).
        outbox: run the outbox worker too (as ``serve``'s).

    """

    def __init__(
        self,
        settings: ChallengeSettings,
        service: ChallengeService | None = None,
        auth: ChallengeAuthSettings | None = None,
        outbox: bool = True,
    ) -> None:
        super().__init__(settings.host, "svc-challenge")
        self.settings = settings
        self.auth = auth
        self.outbox = outbox
        self.service = service or ChallengeService(settings)

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve(
            self.settings,
            auth=self.auth,
            service=self.service,
            ready=ready,
            stop=stop,
            outbox=self.outbox,
        )
