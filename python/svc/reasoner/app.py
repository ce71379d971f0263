"""The reasoner's HTTP face and its loop (docs/reasoner.md#running-it).

``create_app(settings, service)`` serves the probes only (``/healthz``, ``/readyz``,
``/version``, ``/metrics``; no token) and runs the loop in its lifespan: a cycle at start, then
one every ``cycle_secs``, each only while this process holds the one-replica lease. Serving the
app under uvicorn in a thread therefore runs the whole component.

``/readyz`` is 503 while another reasoner holds the lease ("waiting for the lease") and while
the last cycle failed (naming the dependency); 200 once a cycle worked and the lease is held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from svc import __version__
from svc.common.health import Readiness, probe_router
from svc.common.limits import PROBE_MAX_BODY_BYTES, harden
from svc.common.problems import install_problem_handlers
from svc.reasoner.clients import Unavailable
from svc.reasoner.service import ReasonerService
from svc.reasoner.settings import ReasonerSettings

__all__ = ["Loop", "create_app"]

log = logging.getLogger("svc.reasoner")


class Loop:
    """Runs a cycle now and then every ``cycle_secs`` while holding the lease (module docs).

    Args:
        service: the service layer.
        on_cycle: called after each cycle with its outcome (``ok``, ``failed``, ``no-lease``)
            and its duration in seconds.

    """

    def __init__(self, service: ReasonerService, on_cycle: object = None) -> None:
        self.service = service
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_cycle = on_cycle

    def start(self) -> Loop:
        """Starts the loop's thread."""
        self._thread = threading.Thread(target=self._run, name="svc-reasoner-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stops the loop (a running cycle finishes) and frees the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.service.lease.release()

    def once(self) -> str:
        """Runs one cycle when the lease is held; returns ``ok``, ``failed`` or ``no-lease``."""
        st = self.service.status
        st.lease_held = self.service.lease.acquire()
        if not st.lease_held:
            log.info("reasoner: another reasoner holds the lease (%s)", self.service.lease.describe)
            return "no-lease"
        t0 = time.perf_counter()
        try:
            result = self.service.run_cycle()
        except Unavailable as e:
            st.cycles["failed"] += 1
            st.last_error = str(e)
            log.warning("reasoner cycle failed, retried next cycle: %s", e)
            outcome = "failed"
        except Exception as e:  # a bug must not end the loop: logged, retried next cycle
            st.cycles["failed"] += 1
            st.last_error = f"{type(e).__name__}: {e}"
            log.exception("reasoner cycle failed")
            outcome = "failed"
        else:
            st.cycles["ok"] += 1
            st.last_ok = datetime.now(UTC)
            st.last_error = None
            st.last_result = {
                "scored": len(result.scores),
                "published": result.published,
                "contained": len(result.contained),
                "would_contain": len(result.would_contain),
                "investigations": len(result.investigations),
                **{f"seconds_{k}": v for k, v in result.timings.items()},
            }
            outcome = "ok"
        if callable(self._on_cycle):
            self._on_cycle(outcome, time.perf_counter() - t0)
        return outcome

    def _run(self) -> None:
        interval = self.service.settings.cycle_secs
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = self.once()
            # Without the lease, ask again soon (at most every 5 s) rather than a cycle later.
            wait = interval if outcome != "no-lease" else min(interval, 5.0)
            self._stop.wait(max(0.0, wait - (time.monotonic() - started)))


def create_app(settings: ReasonerSettings, service: ReasonerService) -> FastAPI:
    """The reasoner's app: probes and metrics, and the loop in its lifespan.

    Args:
        settings: the component's settings.
        service: the service layer (its clients made by the caller).

    Returns:
        The FastAPI app; its lifespan starts the loop and stops it (freeing the lease).

    """
    registry = CollectorRegistry(auto_describe=True)
    cycles = Counter(
        "svc_reasoner_cycles",
        "Cycles by outcome (ok, failed, no-lease)",
        ["outcome"],
        registry=registry,
    )
    duration = Histogram(
        "svc_reasoner_cycle_seconds",
        "Duration of a cycle",
        buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
        registry=registry,
    )
    lease = Gauge(
        "svc_reasoner_lease_held",
        "1 while this reasoner holds the one-replica lease",
        registry=registry,
    )
    last_ok = Gauge(
        "svc_reasoner_last_success_timestamp_seconds",
        "Unix time the last cycle that worked ended (0 before the first)",
        registry=registry,
    )
    last = Gauge("svc_reasoner_last_cycle", "The last cycle's counts", ["what"], registry=registry)

    def on_cycle(outcome: str, secs: float) -> None:
        cycles.labels(outcome).inc()
        if outcome != "no-lease":
            duration.observe(secs)

    loop = Loop(service, on_cycle)

    def refresh() -> None:
        st = service.status
        lease.set(1 if st.lease_held else 0)
        last_ok.set(st.last_ok.timestamp() if st.last_ok else 0)
        for k, v in st.last_result.items():
            last.labels(k).set(v)

    def readiness() -> Readiness:
        st = service.status
        details = {
            "lease": service.lease.describe,
            "lease_held": st.lease_held,
            "cycles": dict(st.cycles),
            "last_ok": st.last_ok.isoformat() if st.last_ok else None,
        }
        if not st.lease_held:
            return Readiness(
                [f"waiting for the lease ({service.lease.describe}): another reasoner holds it"],
                details,
            )
        if st.last_error is not None:
            return Readiness([f"the last cycle failed: {st.last_error}"], details)
        if st.last_ok is None:
            return Readiness(["the first cycle has not ended yet"], details)
        return Readiness((), details)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(
        title="svc-reasoner",
        version=__version__,
        description="Risk per person and per agent, containment, investigations "
        "(docs/reasoner.md).",
        lifespan=lifespan,
    )
    # Probes only, no token (docs/architecture.md#what-every-component-serves): errors are
    # problems, bodies bounded and checked (docs/api.md, "Limits of the Python services").
    install_problem_handlers(app)
    harden(app, max_body_bytes=PROBE_MAX_BODY_BYTES, setting="the probes' body limit")
    app.include_router(
        probe_router(
            "svc-reasoner",
            __version__,
            readiness,
            registry,
            refresh=refresh,
            ready_description="Ready when this reasoner holds the lease and its last cycle worked.",
        )
    )
    app.state.loop = loop
    return app
