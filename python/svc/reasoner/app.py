"""The reasoner's HTTP face and its loop (docs/reasoner.md#running-it).

``create_app(settings, service, auth)`` serves the probes (``/healthz``, ``/readyz``,
``/version``, ``/metrics``; no token) and ``POST /v1/cycles`` (run a cycle now and answer its
result; a bearer token of the operator, audience ``svc-reasoner``, when ``auth`` is on), and
runs the loop in its lifespan: a cycle at start, then one every ``cycle_secs``, each only while
this process holds the one-replica lease. Serving the app under uvicorn in a thread therefore
runs the whole component.

``POST /v1/cycles`` is how ``svc reasoner cycle --data-dir`` reaches ``svc up``'s reasoner,
which owns the history's chDB directory (one process may open it): body ``{}`` or
``{"at": RFC 3339}``; 200 with the cycle's JSON (docs/reasoner.md#commands); 409 problem
``cycle-running`` while a cycle runs, ``no-lease`` while another reasoner holds the lease; 503
``dependency-unavailable`` naming the dependency when the cycle failed (nothing half-done was
written); 400 for a bad body. With auth off the route is served on a loopback bind only (404
beyond it), so a reasoner without callers, as the chart runs it, serves the probes only.

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
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from svc import __version__
from svc.common.auth import Verifier, bearer_dependency
from svc.common.auth_settings import is_loopback
from svc.common.health import Readiness, probe_router
from svc.common.limits import PROBE_MAX_BODY_BYTES, harden
from svc.common.problems import Problem, install_problem_handlers
from svc.reasoner.clients import Unavailable
from svc.reasoner.service import CycleResult, ReasonerService
from svc.reasoner.settings import ReasonerAuthSettings, ReasonerSettings

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
        """Runs one cycle when the lease is held (the loop's step).

        Returns:
            ``ok``, ``failed``, ``no-lease``, or ``busy`` when a cycle asked through
            ``POST /v1/cycles`` is running.

        """
        try:
            outcome, _, _ = self.run(None, raise_errors=False)
        except RuntimeError:
            return "busy"
        return outcome

    def run(
        self, at: datetime | None, *, raise_errors: bool = True
    ) -> tuple[str, CycleResult | None, Exception | None]:
        """Runs one cycle as if the time were `at` (default now), when the lease is held.

        The status, the metrics and the log see it as any cycle of the loop.

        Args:
            at: the cycle's time (aware), or None for now.
            raise_errors: raise a failure (after recording it) instead of returning it.

        Returns:
            ``(outcome, result, error)``: ``("ok", result, None)``, ``("no-lease", None, None)``
            or ``("failed", None, error)`` (the last only with ``raise_errors`` off).

        Raises:
            Unavailable: a dependency failed (``raise_errors``).
            RuntimeError: a cycle of this process is running (never recorded as a failure).

        """
        st = self.service.status
        st.lease_held = self.service.lease.acquire()
        if not st.lease_held:
            log.info("reasoner: another reasoner holds the lease (%s)", self.service.lease.describe)
            if callable(self._on_cycle):
                self._on_cycle("no-lease", 0.0)
            return "no-lease", None, None
        t0 = time.perf_counter()
        result: CycleResult | None = None
        error: Exception | None = None
        try:
            result = self.service.run_cycle(at)
        except RuntimeError as e:
            if "already running" in str(e):
                raise
            error = e
        except Unavailable as e:
            error = e
        except Exception as e:  # a bug must not end the loop: logged, retried next cycle
            error = e
        if error is not None:
            st.cycles["failed"] += 1
            if isinstance(error, Unavailable):
                st.last_error = str(error)
                log.warning("reasoner cycle failed, retried next cycle: %s", error)
            else:
                st.last_error = f"{type(error).__name__}: {error}"
                log.error("reasoner cycle failed", exc_info=error)
            outcome = "failed"
        else:
            assert result is not None
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
        if error is not None and raise_errors:
            raise error
        return outcome, result, error

    def _run(self) -> None:
        interval = self.service.settings.cycle_secs
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = self.once()
            # Without the lease, ask again soon (at most every 5 s) rather than a cycle later.
            wait = interval if outcome != "no-lease" else min(interval, 5.0)
            self._stop.wait(max(0.0, wait - (time.monotonic() - started)))


def create_app(
    settings: ReasonerSettings,
    service: ReasonerService,
    auth: ReasonerAuthSettings | None = None,
) -> FastAPI:
    """The reasoner's app: probes and metrics, ``POST /v1/cycles``, and the loop in its lifespan.

    Args:
        settings: the component's settings.
        service: the service layer (its clients made by the caller).
        auth: who may call ``POST /v1/cycles`` (docs/auth.md); None or auth off: the route is
            open on a loopback bind (``settings.host``) and answers 404 beyond it.

    Returns:
        The FastAPI app; its lifespan starts the loop and stops it (freeing the lease).

    Raises:
        AuthConfigError: auth is on and the issuer's JWKS cannot be loaded.

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
    # The probes take no token (docs/architecture.md#what-every-component-serves); errors are
    # problems, bodies bounded and checked (docs/api.md, "Limits of the Python services"):
    # ``POST /v1/cycles`` takes at most ``{"at": ...}``.
    guard: list[Any] = []
    verifier: Verifier | None = None
    if auth is not None and auth.enabled:
        verifier = Verifier(auth)
        verifier.source.keys()  # fail at start, not on the first request
        guard = [Depends(bearer_dependency(verifier))]
    install_problem_handlers(app)
    harden(
        app,
        max_body_bytes=PROBE_MAX_BODY_BYTES,
        setting="the probes' body limit",
        verifier=verifier,
    )
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

    # Served with auth on, or on a loopback bind (anyone on this machine may ask); never open
    # beyond it (the chart's reasoner, whose callers are none, serves the probes only).
    serve_cycles = verifier is not None or is_loopback(settings.host)

    @app.post(
        "/v1/cycles",
        dependencies=guard,
        include_in_schema=serve_cycles,
        summary="Run a cycle now",
        description="Runs one cycle now (or as if the time were `at`) and answers its result, "
        "the JSON `svc reasoner cycle` prints (docs/reasoner.md#commands). 409 while a cycle "
        "runs or another reasoner holds the lease; 503 when a dependency failed (nothing "
        "half-done was written).",
    )
    async def run_cycle(request: Request) -> dict[str, Any]:
        if not serve_cycles:
            raise Problem(
                404,
                "not-found",
                "Not found",
                "POST /v1/cycles is served with auth on (SVC_REASONER_AUTH) or on a loopback "
                "bind only",
            )
        at = _cycle_time(await request.body())
        try:
            outcome, result, _ = await anyio.to_thread.run_sync(loop.run, at)
        except RuntimeError as e:
            raise Problem(
                409, "cycle-running", "A cycle is running", f"{e}: ask again once it ended"
            ) from None
        except Unavailable as e:
            raise Problem(
                503,
                "dependency-unavailable",
                "The cycle failed",
                f"{e}; nothing half-done was written, the next cycle tries again",
            ) from None
        except Exception as e:
            raise Problem(
                500, "cycle-failed", "The cycle failed", f"{type(e).__name__}: {e}"
            ) from None
        if outcome == "no-lease" or result is None:
            raise Problem(
                409,
                "no-lease",
                "Another reasoner holds the lease",
                f"this reasoner does not hold the lease ({service.lease.describe}); "
                "the one that does runs the cycles",
            )
        return result.as_json()

    app.state.loop = loop
    return app


def _cycle_time(body: bytes) -> datetime | None:
    """The ``at`` of a ``POST /v1/cycles`` body (``{}`` or ``{"at": RFC 3339}``), or None.

    Raises:
        Problem: 400 naming what is wrong (not a JSON object, an unknown member, a time
            without an offset).

    """
    import json

    if not body.strip():
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        raise Problem(400, "invalid-request", "Invalid request", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise Problem(400, "invalid-request", "Invalid request", "the body is not a JSON object")
    unknown = sorted(set(doc) - {"at"})
    if unknown:
        raise Problem(
            400,
            "invalid-request",
            "Invalid request",
            "unknown member"
            + ("s " if len(unknown) > 1 else " ")
            + ", ".join(f"`{k[:64]}`" for k in unknown)
            + "; expected `at`",
        )
    text = doc.get("at")
    if text is None:
        return None
    when = None
    if isinstance(text, str):
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            when = None
    if when is None or when.tzinfo is None:
        raise Problem(
            400,
            "invalid-request",
            "Invalid request",
            f"`at`: {json.dumps(text)[:100]} is not an RFC 3339 time with an offset",
        )
    return when
