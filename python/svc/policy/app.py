"""The policy service's one port: gRPC ``svc.policy.v1.PolicyService`` and the health routes.

One ASGI app (``create_app``): requests under ``/svc.policy.v1.PolicyService/`` go to the
connectrpc app (``svc.policy.transport``), everything else to a small FastAPI app with
``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` (``svc.common.health.probe_router``,
docs/architecture.md#what-every-component-serves). gRPC calls take a bearer token when
``PolicyAuthSettings`` turn auth on (docs/auth.md); without it ``serve`` binds loopback only.
Hypercorn serves both on one socket: HTTP/1.1, and HTTP/2 with prior knowledge (h2c, what gRPC
clients speak), with the response trailers gRPC needs (docs/dependencies.md says why these
libraries).

``serve`` runs it in the calling thread until a signal or ``stop`` event; ``PolicyServer``
runs it in a thread of its own (tests, ``svc up``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from sqlalchemy import text
from starlette.types import Receive, Scope, Send

from svc import __version__, web
from svc.common.auth import PolicyAuthSettings
from svc.common.connect import (
    METRICS_CONTENT_TYPE,
    ThreadedServer,
    one_port,
    serve_asgi,
    verifier_of,
)
from svc.common.health import Readiness, probe_router
from svc.common.limits import harden
from svc.common.problems import install_problem_handlers
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.transport import SERVICE_NAME, PolicyConnectApp, PolicyMetrics

__all__ = ["PolicyServer", "create_app", "health_app", "serve"]

log = logging.getLogger("svc.policy")


def health_app(service: PolicyService, metrics: PolicyMetrics) -> FastAPI:
    """The four probes every component serves (``svc.common.health.probe_router``), no token.

    ``/healthz``: 200 while the process runs. ``/readyz``: 200 ``{"ready": true,
    "policy_version", "migration"}`` when the database answers, else a 503 problem.
    ``/version``: ``{"component": "svc-policy", "version"}``. ``/metrics``: Prometheus text.

    Args:
        service: the service layer (its database answers ``/readyz``).
        metrics: the service's metrics (``/metrics`` renders their registry).

    Returns:
        The FastAPI app of the probes, answering errors as RFC 9457 problems.

    """
    app = FastAPI(title="svc-policy", version=__version__, docs_url=None, redoc_url=None)
    web.install(app)
    install_problem_handlers(app)

    def readiness() -> Readiness:
        try:
            with service.db.connect() as conn:
                conn.execute(text("SELECT 1"))
            version = service.active_version()
        except Exception as e:
            log.error("readiness: the database does not answer: %s", e)
            return Readiness(("the policy database does not answer",))
        metrics.active_version.set(version)
        return Readiness((), {"policy_version": version, "migration": service.revision})

    app.include_router(
        probe_router(
            PolicySettings.component,
            __version__,
            readiness,
            metrics.registry,
            ready_description="Ready when the policy database answers.",
            metrics_content_type=METRICS_CONTENT_TYPE,
        )
    )
    return app


def create_app(
    service: PolicyService, auth: PolicyAuthSettings | None = None
) -> Callable[[Scope, Receive, Send], Any]:
    """The service's ASGI app: gRPC methods to connectrpc, every other path to the probes.

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
    metrics = PolicyMetrics()
    metrics.active_version.set(service.active_version())
    max_bytes = service.settings.max_bundle_bytes + 1024 * 1024
    grpc_app = PolicyConnectApp(service, metrics, max_message_bytes=max_bytes, verifier=verifier)
    http_app = health_app(service, metrics)
    # The token first on every path but the probes, bodies bounded as messages are
    # (docs/policy.md#limits).
    harden(
        http_app,
        max_body_bytes=max_bytes,
        setting=f"{service.settings.env_name('max_bundle_bytes')} + 1 MiB",
        verifier=verifier,
    )
    return one_port(grpc_app, http_app, SERVICE_NAME)


def serve(
    settings: PolicySettings,
    *,
    auth: PolicyAuthSettings | None = None,
    service: PolicyService | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs the service on ``settings.host:port`` in this thread until stopped.

    Args:
        settings: the service's settings.
        auth: who may call (docs/auth.md); default ``PolicyAuthSettings()`` (``SVC_POLICY_AUTH*``,
            off without an issuer).
        service: the service layer (default: one made from ``settings``, which migrates).
        ready: called with the bound port once the socket listens.
        stop: ends the server when set; without it SIGINT/SIGTERM do (main thread only).

    Raises:
        AuthConfigError: auth is off and ``settings.host`` is not a loopback address, or the
            issuer's keys cannot be loaded (nothing is served).
        OSError: the port cannot be bound.

    """
    auth = auth if auth is not None else PolicyAuthSettings()
    auth.check_bind(settings.host)
    service = service or PolicyService(settings)
    app = create_app(service, auth)
    serve_asgi(app, settings.host, settings.port, "svc-policy", ready=ready, stop=stop)


class PolicyServer(ThreadedServer):
    """The service in a thread of its own: ``start()`` returns once it listens.

    ``start``, ``stop``, ``url`` and ``target`` are ``svc.common.connect.ThreadedServer``'s.

    Args:
        settings: the service's settings (``port=0`` picks a free port).
        service: the service layer (default: made from ``settings``).
        auth: who may call (as ``serve``'s).

    """

    def __init__(
        self,
        settings: PolicySettings,
        service: PolicyService | None = None,
        auth: PolicyAuthSettings | None = None,
    ) -> None:
        super().__init__(settings.host, "svc-policy")
        self.settings = settings
        self.auth = auth
        self.service = service or PolicyService(settings)

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve(self.settings, auth=self.auth, service=self.service, ready=ready, stop=stop)
