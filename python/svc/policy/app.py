"""The policy service's one port: gRPC ``svc.policy.v1.PolicyService`` and the health routes.

One ASGI app (``create_app``): requests under ``/svc.policy.v1.PolicyService/`` go to the
connectrpc app (``svc.policy.transport``), everything else to a small FastAPI app with
``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` (docs/architecture.md#what-every-
component-serves). Hypercorn serves both on one socket: HTTP/1.1, and HTTP/2 with prior
knowledge (h2c, what gRPC clients speak), with the response trailers gRPC needs
(docs/dependencies.md says why these libraries).

``serve`` runs it in the calling thread until a signal or ``stop`` event; ``PolicyServer``
runs it in a thread of its own (tests, ``svc up``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from prometheus_client import generate_latest
from sqlalchemy import text
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from svc import __version__, web
from svc.common.problems import Problem, http_exception_problem, problem_response
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.transport import SERVICE_NAME, PolicyConnectApp, PolicyMetrics

__all__ = ["PolicyServer", "create_app", "health_app", "serve"]

log = logging.getLogger("svc.policy")

#: ``Content-Type`` of the Prometheus text format.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def health_app(service: PolicyService, metrics: PolicyMetrics) -> FastAPI:
    """The four routes every component serves, without a caller token.

    ``/healthz``: 200 while the process runs. ``/readyz``: 200 ``{"ready": true,
    "policy_version", "migration"}`` when the database answers, else a 503 problem.
    ``/version``: ``{"component": "svc-policy", "version"}``. ``/metrics``: Prometheus text.
    """
    app = FastAPI(title="svc-policy", version=__version__, docs_url=None, redoc_url=None)
    web.install(app)
    app.add_exception_handler(Problem, lambda _r, e: problem_response(e))
    app.add_exception_handler(
        StarletteHTTPException,
        lambda _r, e: http_exception_problem(e),
    )

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        def probe() -> int:
            with service.db.connect() as conn:
                conn.execute(text("SELECT 1"))
            return service.active_version()

        try:
            version = await anyio.to_thread.run_sync(probe)
        except Exception as e:
            log.error("readiness: the database does not answer: %s", e)
            raise Problem(
                503, "not-ready", "Not ready", "the policy database does not answer"
            ) from None
        metrics.active_version.set(version)
        return JSONResponse(
            {"ready": True, "policy_version": version, "migration": service.revision}
        )

    @app.get("/version")
    def version() -> dict[str, str]:
        return {"component": "svc-policy", "version": __version__}

    @app.get("/metrics")
    def metrics_route() -> Response:
        return Response(generate_latest(metrics.registry), media_type=METRICS_CONTENT_TYPE)

    return app


def create_app(service: PolicyService) -> Callable[[Scope, Receive, Send], Any]:
    """The service's ASGI app: gRPC methods to connectrpc, every other path to the health app.

    Args:
        service: the service layer.

    Returns:
        An ASGI 3 callable; lifespan events go to the health app.

    """
    metrics = PolicyMetrics()
    metrics.active_version.set(service.active_version())
    grpc_app = PolicyConnectApp(
        service, metrics, max_message_bytes=service.settings.max_bundle_bytes + 1024 * 1024
    )
    http_app = health_app(service, metrics)
    prefix = f"/{SERVICE_NAME}/"

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefix):
            await grpc_app(scope, receive, send)
        else:
            await http_app(scope, receive, send)

    return app


def _config(fd: int) -> Config:
    cfg = Config()
    cfg.bind = [f"fd://{fd}"]
    cfg.graceful_timeout = 1.0  # WatchActive streams never end on their own
    # Hypercorn closes a connection after 1,000 requests by default, and on HTTP/2 its GOAWAY
    # fails the call in flight (grpcio reports UNAVAILABLE): gRPC clients keep one connection
    # for everything, so there is no per-connection request limit here.
    cfg.keep_alive_max_requests = 2**62
    # Idle HTTP/2 connections (no stream open) close after this; clients reconnect on use.
    cfg.keep_alive_timeout = 75.0
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("svc.policy.http")
    return cfg


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def serve(
    settings: PolicySettings,
    *,
    service: PolicyService | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs the service on ``settings.host:port`` in this thread until stopped.

    Args:
        settings: the service's settings.
        service: the service layer (default: one made from ``settings``, which migrates).
        ready: called with the bound port once the socket listens.
        stop: ends the server when set; without it SIGINT/SIGTERM do (main thread only).

    Raises:
        OSError: the port cannot be bound.

    """
    service = service or PolicyService(settings)
    app = create_app(service)
    sock = _listen(settings.host, settings.port)
    port = int(sock.getsockname()[1])
    # Hypercorn takes the descriptor over (its socket closes it at shutdown).
    cfg = _config(sock.detach())
    log.info("svc-policy listening on %s:%d", settings.host, port)
    if ready is not None:
        ready(port)

    async def main() -> None:
        trigger = None
        if stop is not None:
            loop = asyncio.get_running_loop()
            done = asyncio.Event()
            threading.Thread(
                target=lambda: (stop.wait(), loop.call_soon_threadsafe(done.set)),
                name="svc-policy-stop",
                daemon=True,
            ).start()
            trigger = done.wait
        await hypercorn_serve(app, cfg, shutdown_trigger=trigger)  # type: ignore[arg-type]

    asyncio.run(main())


class PolicyServer:
    """The service in a thread of its own: ``start()`` returns once it listens.

    Args:
        settings: the service's settings (``port=0`` picks a free port).
        service: the service layer (default: made from ``settings``).

    """

    def __init__(self, settings: PolicySettings, service: PolicyService | None = None) -> None:
        self.settings = settings
        self.service = service or PolicyService(settings)
        self.port = 0
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="svc-policy", daemon=True)

    def _run(self) -> None:
        try:
            serve(self.settings, service=self.service, ready=self._ready, stop=self._stop)
        except BaseException as e:
            self._error = e
            self._listening.set()

    def _ready(self, port: int) -> None:
        self.port = port
        self._listening.set()

    def start(self) -> PolicyServer:
        """Starts serving; returns once the socket listens.

        Raises:
            OSError: the port cannot be bound (or any error that stopped the server).

        """
        self._thread.start()
        self._listening.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.settings.host}:{self.port}"

    @property
    def target(self) -> str:
        """``host:port``, a gRPC channel's target."""
        return f"{self.settings.host}:{self.port}"

    def stop(self) -> None:
        """Stops the server (open streams end) and waits for its thread."""
        self._stop.set()
        self._thread.join()
