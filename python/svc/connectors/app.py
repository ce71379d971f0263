"""The connectors' HTTP layer: the probes only; the connector loops run in the app's lifespan.

``create_app(settings, service)`` serves ``/healthz``, ``/readyz`` (ready once every configured
connector has reached the head of its source and its last poll did not fail), ``/version`` and
``/metrics`` (``svc_connector_items_total``, ``svc_connector_lag_seconds``,
``svc_connector_errors_total``, ``svc_connector_resyncs_total``; docs/connectors.md#metrics),
none of them behind a token (docs/architecture.md#what-every-component-serves). Serving the
app runs the whole component: the lifespan starts ``ConnectorsService.run`` and stops it (and
closes the service) at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from svc import __version__
from svc.common.connect import ThreadedServer, serve_asgi
from svc.common.health import probe_router
from svc.common.limits import PROBE_MAX_BODY_BYTES, harden
from svc.common.problems import install_problem_handlers
from svc.connectors.service import ConnectorsService
from svc.connectors.settings import ConnectorsSettings

__all__ = ["ConnectorsServer", "create_app", "serve"]


def create_app(settings: ConnectorsSettings, service: ConnectorsService) -> FastAPI:
    """The connectors' app (module docs).

    Args:
        settings: the component's settings.
        service: the connectors; the app's lifespan runs them and closes them at its end.

    Returns:
        A FastAPI app.

    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop), name="svc-connectors")
        try:
            yield
        finally:
            stop.set()
            try:
                await asyncio.wait_for(task, 2)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await service.aclose()

    app = FastAPI(
        title="svc-connectors",
        version=__version__,
        description="Resources and work items from Google Drive and Jira (docs/connectors.md).",
        lifespan=lifespan,
    )
    # Probes only, no token (docs/architecture.md#what-every-component-serves): errors are
    # problems, bodies bounded and checked (docs/api.md, "Limits of the Python services").
    install_problem_handlers(app)
    harden(app, max_body_bytes=PROBE_MAX_BODY_BYTES, setting="the probes' body limit")
    app.include_router(
        probe_router(
            "svc-connectors",
            __version__,
            service.readiness,
            service.metrics.registry,
            refresh=service.refresh_metrics,
            ready_description="Ready once every connector has reached the head of its source.",
        )
    )
    return app


def serve(
    settings: ConnectorsSettings,
    *,
    service: ConnectorsService | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs the connectors and their probes on ``settings.host:port`` in this thread.

    Args:
        settings: the component's settings.
        service: the connectors (default: made from ``settings``).
        ready: called with the bound port once the socket listens.
        stop: ends it when set; without it SIGINT/SIGTERM do (main thread only).

    Raises:
        OSError: the port cannot be bound, or a credential file cannot be read.
        ValueError: a credential file is malformed.

    """
    service = service or ConnectorsService(settings)
    app = create_app(settings, service)
    serve_asgi(
        app, settings.host, settings.port, "svc-connectors", ready=ready, stop=stop, http1=True
    )


class ConnectorsServer(ThreadedServer):
    """The connectors in a thread of its own: ``start()`` returns once the probes listen.

    Args:
        settings: the component's settings (``port=0`` picks a free port).
        service: the connectors (default: made from ``settings`` in the thread).

    """

    def __init__(
        self, settings: ConnectorsSettings, service: ConnectorsService | None = None
    ) -> None:
        super().__init__(settings.host, "svc-connectors")
        self.settings = settings
        self.service = service

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve(self.settings, service=self.service, ready=ready, stop=stop)
