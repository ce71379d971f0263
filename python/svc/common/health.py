"""The probes of every svc HTTP component: ``/healthz``, ``/readyz``, ``/version``, ``/metrics``.

docs/architecture.md#what-every-component-serves lists them; ``probe_router`` gives a FastAPI
component all four from what differs between components:

* ``GET /healthz``: ``{"status": "ok"}`` while the process answers (liveness);
* ``GET /readyz``: 200 ``{"ready": true, ...details}`` when the component's readiness check
  gives no reason, else 503 ``urn:svc:problem:not-ready`` (RFC 9457,
  ``application/problem+json``) whose ``detail`` is the reasons joined by ``; `` and which
  carries the same details;
* ``GET /version``: ``{"component": "svc-<name>", "version": "<release>"}``
  (docs/architecture.md#versioning);
* ``GET /metrics``: the component's Prometheus registry in the text exposition format
  (https://prometheus.io/docs/instrumenting/exposition_formats/), after the component's
  refresh hook has set its gauges.

None of them takes a token (docs/auth.md). ``Readiness`` is what a readiness check returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from svc import web
from svc.common.problems import PROBLEM_JSON, Problem

__all__ = ["Readiness", "probe_router"]


@dataclass(frozen=True)
class Readiness:
    """What a component's readiness check found.

    Attributes:
        reasons: why the component is not ready, each a sentence naming what is missing or
            failing; empty when it is ready.
        details: more members for ``/readyz``'s body, ready or not (``{"topic": ...}``).

    """

    reasons: Sequence[str] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """Whether no reason holds."""
        return not self.reasons


def probe_router(
    component: str,
    release: str,
    readiness: Callable[[], Readiness],
    registry: CollectorRegistry,
    *,
    refresh: Callable[[], None] | None = None,
    ready_description: str = "Ready when the component can serve.",
    metrics_content_type: str = CONTENT_TYPE_LATEST,
) -> APIRouter:
    """The probe routes of one component (module docs).

    Args:
        component: the component's name for ``/version`` (``svc-intake``).
        release: its release (``svc.__version__``).
        readiness: the readiness check, called by every ``/readyz`` in a worker thread (it may
            block, query a store, or raise ``Problem``, which the app answers as RFC 9457).
        registry: the Prometheus registry ``/metrics`` renders.
        refresh: called before each ``/metrics`` rendering (in a worker thread) to set gauges
            from the component's state.
        ready_description: the ``/readyz`` route's description in the OpenAPI document.
        metrics_content_type: ``/metrics``' ``Content-Type``.

    Returns:
        A router to ``include_router`` into the component's app.

    """
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @router.get(
        "/readyz",
        description=ready_description,
        responses={
            200: {"content": {"application/json": {"schema": {"type": "object"}}}},
            503: web.PROBLEM_RESPONSE,
        },
    )
    def readyz() -> Response:
        r = readiness()
        if r.ready:
            return JSONResponse({"ready": True, **r.details})
        p = Problem(503, "not-ready", "Not ready", "; ".join(r.reasons))
        return JSONResponse({**p.body(), **r.details}, status_code=503, media_type=PROBLEM_JSON)

    @router.get("/version")
    async def version() -> dict[str, str]:
        """The release (docs/architecture.md#versioning)."""
        return {"component": component, "version": release}

    @router.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {metrics_content_type: {"schema": {"type": "string"}}}}},
    )
    def metrics() -> Response:
        """Prometheus text format."""
        if refresh is not None:
            refresh()
        return Response(generate_latest(registry), media_type=metrics_content_type)

    return router
