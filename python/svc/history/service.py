"""The history loader's HTTP face: health, metrics, and reads of the history (DESIGN 1, SPEC 2).

Every component serves ``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` on its port
(SPEC 1). The loader's port also answers read-only queries of the history store, the same
``svc.history.queries`` the reasoner and the portal use, so operators and the README's examples
can see what was loaded (under ``svc up`` the embedded chDB belongs to that process, so this is
the way in from outside):

* ``GET /v1/history/decisions?principal=Type::id`` (or ``resource=Type::id``, or ``qid=``),
  ``since``/``until`` (RFC 3339; default the last 24 hours), ``monitor_only``,
  ``include_on_behalf_of``, ``limit`` (1..10,000, default 100);
* ``GET /v1/history/events?principal=...`` (or ``resource=...``), same range and limit;
* ``GET /v1/history/counts?principal=...``: ``verdict_counts``;
* ``GET /v1/history/totals``: rows in ``decisions``, ``events`` and ``rejected``.

Bad parameters get RFC 9457 problem details naming the parameter (DESIGN 7).

The ``/v1/history/*`` routes take only the callers its settings list (docs/auth.md: the portal,
the reasoner, the policy service's dry runs; ``svc up``'s local caller): a bearer JWT checked by
``svc.common.auth``, 401 without a valid one, 403 for a caller not listed. The four probes
take no token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from svc import __version__
from svc.common.auth import AuthSettings, Verifier, bearer_dependency
from svc.history import queries
from svc.history.loader import Loader
from svc.intake.app import http_exception_problem, problem_response
from svc.intake.models import Problem

__all__ = ["create_app", "totals"]

_MAX_LIMIT = 10_000


def totals(client: Client) -> dict[str, int]:
    """Rows in the history tables, copies dropped (``FINAL``).

    Returns:
        ``{"decisions": n, "events": n, "rejected": n}``.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    row = client.query(
        "SELECT (SELECT count() FROM decisions FINAL), (SELECT count() FROM events FINAL), "
        "(SELECT count() FROM rejected FINAL)"
    ).result_rows[0]
    return {"decisions": int(row[0]), "events": int(row[1]), "rejected": int(row[2])}


def _bad(param: str, detail: str) -> Problem:
    return Problem(400, "invalid-parameter", f"Invalid parameter `{param}`", detail)


def _time(request: Request, name: str, default: datetime) -> datetime:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise _bad(name, f"`{raw}` is not an RFC 3339 time") from None
    if t.tzinfo is None:
        raise _bad(name, f"`{raw}` has no UTC offset (RFC 3339 requires one)")
    return t.astimezone(UTC)


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise _bad(name, f"`{raw}` is not true or false")
    return raw in ("true", "1")


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", "100")
    try:
        n = int(raw)
    except ValueError:
        raise _bad("limit", f"`{raw}` is not an integer") from None
    if not 1 <= n <= _MAX_LIMIT:
        raise _bad("limit", f"{n} is outside 1..{_MAX_LIMIT}")
    return n


def _range(request: Request, now: datetime) -> tuple[datetime, datetime]:
    until = _time(request, "until", now + timedelta(minutes=5))
    since = _time(request, "since", until - timedelta(days=1))
    if since >= until:
        raise _bad("since", "`since` must be before `until`")
    return since, until


def _ref(request: Request, name: str) -> tuple[str, str] | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        return queries.parse_ref(raw)
    except ValueError as e:
        raise _bad(name, str(e)) from None


def create_app(
    client: Client,
    loader: Loader | None = None,
    *,
    auth: AuthSettings,
    ready: Callable[[], bool] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> FastAPI:
    """The history component's app.

    Args:
        client: the history store (``svc.history.connect``).
        loader: the running loader whose counters ``/metrics`` reports (None: queries only).
        auth: who may read (``HistoryAuthSettings``, docs/auth.md); with auth off the reads
            are open, which the caller may allow on a loopback bind only
            (``AuthSettings.check_bind``).
        ready: whether the component can serve (``/readyz``); default: always once started.
        now: the clock (tests).

    Returns:
        A FastAPI app; it starts and stops nothing itself.

    Raises:
        AuthConfigError: auth is on and the issuer's JWKS cannot be loaded.

    """
    guard = []
    if auth.enabled:
        verifier = Verifier(auth)
        verifier.source.keys()  # fail at start, not on the first request
        guard = [Depends(bearer_dependency(verifier))]
    registry = CollectorRegistry(auto_describe=True)
    gauges = {
        name: Gauge(f"svc_history_loader_{name}", help_, registry=registry)
        for name, help_ in (
            ("batches", "Batches stored and committed"),
            ("records", "Broker records stored (valid and rejected)"),
            ("rejected", "Records routed to the rejected table"),
            ("commit_failures", "Offset commits that failed (records are re-read)"),
            ("store_failures", "INSERT attempts that failed and were retried"),
            ("retention_runs", "Retention passes completed"),
        )
    }
    lock = threading.Lock()

    app = FastAPI(
        title="svc-history", version=__version__, docs_url=None, redoc_url=None, openapi_url=None
    )

    @app.exception_handler(Problem)
    async def on_problem(_: Request, p: Problem) -> Response:
        return problem_response(p)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return http_exception_problem(exc)

    def run(fn: Callable[[], Any]) -> Any:
        try:
            with lock:
                return fn()
        except ClickHouseError as e:
            raise Problem(503, "history-unavailable", "History unavailable", str(e)[:1024]) from e

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> Response:
        """Ready when the store answers (and ``ready()`` says so)."""
        if ready is not None and not ready():
            return problem_response(
                Problem(503, "not-ready", "Not ready", "the loader is not running")
            )
        t = run(lambda: totals(client))
        return JSONResponse({"ready": True, **t})

    @app.get("/version")
    def version() -> dict[str, str]:
        """The release (SPEC 9)."""
        return {"component": "svc-history", "version": __version__}

    @app.get("/metrics")
    def metrics() -> Response:
        """Prometheus text format: the loader's counters."""
        if loader is not None:
            for name, g in gauges.items():
                g.set(getattr(loader.stats, name))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/history/totals", dependencies=guard)
    def get_totals() -> dict[str, int]:
        """Rows in decisions, events and rejected."""
        return dict(run(lambda: totals(client)))

    @app.get("/v1/history/decisions", dependencies=guard)
    def decisions(request: Request) -> Any:
        """Decisions of a principal or a resource, or one by ``qid`` (module docs)."""
        qid = request.query_params.get("qid")
        if qid is not None:
            found = run(lambda: queries.decision_by_qid(client, qid))
            if found is None:
                raise Problem(404, "not-found", "Not found", f"no decision with qid `{qid}`")
            return found
        principal, resource = _ref(request, "principal"), _ref(request, "resource")
        since, until = _range(request, now())
        limit = _limit(request)
        if principal is not None:
            monitor_only = _flag(request, "monitor_only")
            obo = _flag(request, "include_on_behalf_of")
            return run(
                lambda: queries.decisions_of_principal(
                    client,
                    principal,
                    since,
                    until,
                    monitor_only=monitor_only,
                    include_on_behalf_of=obo,
                    limit=limit,
                )
            )
        if resource is not None:
            return run(
                lambda: queries.decisions_of_resource(client, resource, since, until, limit=limit)
            )
        raise _bad("principal", "give `principal`, `resource` or `qid`")

    @app.get("/v1/history/events", dependencies=guard)
    def events(request: Request) -> Any:
        """Events of a principal or a resource (module docs)."""
        principal, resource = _ref(request, "principal"), _ref(request, "resource")
        since, until = _range(request, now())
        limit = _limit(request)
        if principal is not None:
            obo = _flag(request, "include_on_behalf_of")
            return run(
                lambda: queries.events_of_principal(
                    client, principal, since, until, include_on_behalf_of=obo, limit=limit
                )
            )
        if resource is not None:
            return run(
                lambda: queries.events_of_resource(client, resource, since, until, limit=limit)
            )
        raise _bad("principal", "give `principal` or `resource`")

    @app.get("/v1/history/counts", dependencies=guard)
    def counts(request: Request) -> Any:
        """``verdict_counts`` of a principal over the range."""
        principal = _ref(request, "principal")
        if principal is None:
            raise _bad("principal", "`principal` is required")
        since, until = _range(request, now())
        return run(lambda: queries.verdict_counts(client, principal, since, until))

    return app
