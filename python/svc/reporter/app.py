"""The reporter's HTTP layer: the probes only; the heartbeat loop runs in the app's lifespan.

``create_app(settings, reporter)`` serves ``/healthz``, ``/readyz`` (always ready once started;
its body says whether heartbeats are sent and how many wait), ``/version`` and ``/metrics``
(``svc_reporter_heartbeats_total{outcome}``, ``svc_reporter_backlog``), without tokens
(docs/architecture.md#what-every-component-serves).
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
from svc.common.health import Readiness, probe_router
from svc.common.limits import PROBE_MAX_BODY_BYTES, harden
from svc.common.problems import install_problem_handlers
from svc.reporter.service import Reporter
from svc.reporter.settings import ReporterSettings

__all__ = ["ReporterServer", "create_app", "serve"]


def create_app(settings: ReporterSettings, reporter: Reporter) -> FastAPI:
    """The reporter's app (module docs); its lifespan runs ``reporter.run``."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(reporter.run(stop), name="svc-reporter")
        try:
            yield
        finally:
            stop.set()
            try:
                await asyncio.wait_for(task, settings.timeout_secs * 2)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await reporter.aclose()

    def readiness() -> Readiness:
        return Readiness(
            (), {"sending": bool(settings.portal_url), "backlog": len(reporter.backlog)}
        )

    app = FastAPI(
        title="svc-reporter",
        version=__version__,
        description="The heartbeat to the vendor's corp portal (docs/reporter.md).",
        lifespan=lifespan,
    )
    # Probes only, no token (docs/architecture.md#what-every-component-serves): errors are
    # problems, bodies bounded and checked (docs/api.md, "Limits of the Python services").
    install_problem_handlers(app)
    harden(app, max_body_bytes=PROBE_MAX_BODY_BYTES, setting="the probes' body limit")
    app.include_router(
        probe_router(
            "svc-reporter",
            __version__,
            readiness,
            reporter.registry,
            refresh=lambda: reporter.pending.set(len(reporter.backlog)),
            ready_description="Ready once started.",
        )
    )
    return app


def serve(
    settings: ReporterSettings,
    *,
    reporter: Reporter | None = None,
    ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Runs the reporter and its probes on ``settings.host:port`` in this thread.

    Raises:
        OSError: the port cannot be bound, or the install id file cannot be read or written.
        ValueError: the install id is not a UUID.

    """
    reporter = reporter or Reporter(settings)
    serve_asgi(
        create_app(settings, reporter),
        settings.host,
        settings.port,
        "svc-reporter",
        ready=ready,
        stop=stop,
        http1=True,
    )


class ReporterServer(ThreadedServer):
    """The reporter in a thread of its own: ``start()`` returns once the probes listen."""

    def __init__(self, settings: ReporterSettings, reporter: Reporter | None = None) -> None:
        super().__init__(settings.host, "svc-reporter")
        self.settings = settings
        self.reporter = reporter

    def _serve(self, ready: Callable[[int], None], stop: threading.Event) -> None:
        serve(self.settings, reporter=self.reporter, ready=ready, stop=stop)
