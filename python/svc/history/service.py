"""The history loader's HTTP face: health, metrics, and reads of the history (docs/history.md).

Every component serves ``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` on its port
(docs/architecture.md#what-every-component-serves). The loader's port also answers read-only
queries of the history store, the same
``svc.history.queries`` the reasoner and the portal use, so operators and the README's examples
can see what was loaded (under ``svc up`` the embedded chDB belongs to that process, so this is
the way in from outside):

* ``GET /v1/history/decisions?principal=Type::id`` (or ``resource=Type::id``, or ``qid=``),
  ``since``/``until`` (RFC 3339; default the last 24 hours), ``monitor_only``,
  ``include_on_behalf_of``, ``limit`` (1..10,000, default 100);
* ``GET /v1/history/decisions/search``: one page of a decision search (``principal`` or
  ``resource`` or neither, ``action``, ``verdict``, ``policy``, ``mode``, ``since``/``until``,
  ``after_at``/``after_qid`` from the previous page's ``end``, ``limit``, default 50):
  ``{"decisions", "more", "end", "scanned"}`` (``svc.history.queries.search_decisions``);
* ``GET /v1/history/events?principal=...`` (or ``resource=...``), same range and limit;
* ``GET /v1/history/counts?principal=...``: ``verdict_counts``;
* ``GET /v1/history/totals``: rows in ``decisions``, ``events`` and ``rejected``;
* ``GET /v1/history/stats``: decisions by verdict and events per ``bucket`` (``hour`` or
  ``day``) over ``since``/``until``, and the ``top`` most denied principals and resources
  (``svc.history.queries.decision_stats``);
* ``GET /openapi.json``: the OpenAPI document of these routes and their parameters.

Bad parameters get RFC 9457 problem details naming the parameter
(docs/architecture.md#identifiers-and-errors), 400
``invalid-parameter``: a value that is not UTF-8 once percent-decoded, a principal, resource or
``qid`` holding a control character or a lone surrogate (``svc.identifiers``), a time that is
not RFC 3339 with an offset or lies outside the years 1900 to 2299 the store holds, a limit
out of range. 503 ``history-unavailable`` is kept for a
store that does not answer; its error goes to the log, never into the answer. Every GET route
answers HEAD too, and every answer carries ``X-Request-ID`` (``svc.web``). docs/history.md,
"HTTP routes", is the reference.

``/readyz`` answers 503 (``urn:svc:problem:not-ready``, with the reasons) while the loader is not
running, is failing or is behind (``Loader.health``), and ``/metrics`` exports the same health
as gauges (docs/history.md, "Readiness and metrics").

The ``/v1/history/*`` routes take only the callers its settings list (docs/auth.md: the portal,
the reasoner, the policy service's dry runs; ``svc up``'s local caller): a bearer JWT checked by
``svc.common.auth``, 401 without a valid one, 403 for a caller not listed. The token is checked
before the parameters. The four probes take no token.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import unquote_to_bytes

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Gauge
from pydantic import AwareDatetime, BeforeValidator

from svc import __version__, web
from svc.common.auth import AuthSettings, Verifier, bearer_dependency
from svc.common.health import Readiness, probe_router
from svc.common.limits import PROBE_MAX_BODY_BYTES, harden
from svc.common.problems import (
    FieldError,
    Problem,
    install_problem_handlers,
    problem_response,
)
from svc.history import queries
from svc.history.loader import Loader
from svc.identifiers import identifier_problem

__all__ = ["create_app", "totals"]

log = logging.getLogger("svc.history")

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


def _bad(param: str, detail: str, errors: list[FieldError] | None = None) -> Problem:
    """The 400 naming a query parameter (``errors``: one entry per bad parameter)."""
    return Problem(
        400,
        "invalid-parameter",
        f"Invalid parameter `{param}`",
        detail,
        errors if errors is not None else [FieldError(None, param, detail)],
    )


def _utf8_query(request: Request) -> None:
    """Refuses a query whose names or values are not UTF-8 once percent-decoded.

    Starlette decodes them replacing what is not UTF-8 with U+FFFD, which would search for
    text the caller never sent; the raw query string is checked first (RFC 3986 section 2.5:
    percent-encoded octets of text are UTF-8).

    Raises:
        Problem: 400 naming the parameter.

    """
    for part in request.scope.get("query_string", b"").split(b"&"):
        name, _, value = part.replace(b"+", b" ").partition(b"=")
        for raw in (name, value):
            try:
                unquote_to_bytes(raw).decode("utf-8")
            except UnicodeDecodeError as e:
                param = unquote_to_bytes(name).decode("utf-8", "replace")
                raise _bad(
                    param,
                    f"not UTF-8 once percent-decoded ({e.reason} at byte {e.start}); "
                    "percent-encode the UTF-8 of the text",
                ) from None


#: The times the store can hold (ClickHouse ``DateTime64``: 1900-01-01 to 2299-12-31).
_EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
_LATEST = datetime(2300, 1, 1, tzinfo=UTC)


def _not_a_number(raw: object) -> object:
    """Refuses a bare number, which pydantic would read as a Unix time (RFC 3339 only)."""
    if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*", raw):
        raise ValueError(f"`{raw}` is not an RFC 3339 time")
    return raw


def _time(t: datetime | None, name: str, default: datetime) -> datetime:
    """`t` (validated by pydantic as an ``AwareDatetime``) in UTC, within the store's range.

    Raises:
        Problem: 400 naming `name` when `t` lies outside the years 1900 to 2299.

    """
    if t is None:
        return default
    raw = t.isoformat()
    try:
        t = t.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
        t = _LATEST if t.year > 2000 else _EARLIEST - timedelta(days=1)
    if not _EARLIEST <= t < _LATEST:
        raise _bad(name, f"`{raw}` is outside the history's time range (years 1900 to 2299)")
    return t


def _range(
    since: datetime | None, until: datetime | None, now: datetime
) -> tuple[datetime, datetime]:
    end = _time(until, "until", now + timedelta(minutes=5))
    start = _time(since, "since", max(end - timedelta(days=1), _EARLIEST))
    if start >= end:
        raise _bad("since", "`since` must be before `until`")
    return start, end


def _ref(raw: str | None, name: str) -> tuple[str, str] | None:
    """``Type::id`` of a parameter, both parts checked as identifiers (``svc.identifiers``)."""
    if raw is None:
        return None
    try:
        rtype, rid = queries.parse_ref(raw)
    except ValueError as e:
        raise _bad(name, str(e)) from None
    for part, text in (("type", rtype), ("id", rid)):
        why = identifier_problem(text)
        if why is not None:
            raise _bad(name, f"the {part} {why}")
    return rtype, rid


def _validation_problem(exc: RequestValidationError) -> Problem:
    """FastAPI's refusal of a parameter (a limit that is no integer...) as a 400 naming it."""
    errors = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("query", "path", "header")]
        msg = str(err.get("msg", "invalid"))
        errors.append(FieldError(None, ".".join(loc), (msg[:1].lower() + msg[1:]).rstrip(".")))
    if not errors:
        errors.append(FieldError(None, "", "the request is not valid"))
    first = errors[0]
    return _bad(first.field, f"{first.field}: {first.message}", errors)


# The query parameters, as the routes declare them (and OpenAPI describes them).
_REF_DOC = (
    '`Type::id`, such as `Human::alice`; a quoted id (`Human::"a b"`) is read as a JSON '
    "string. No control characters (docs/history.md)"
)
# The pattern is for the document (clients, fuzzers); `_ref` checks the value itself, so the
# answer names what is wrong.
_REF_PATTERN = {"pattern": r"^[^\x00-\x1f\x7f-\x9f:]+::[^\x00-\x1f\x7f-\x9f]*$"}
_Ref = Annotated[str | None, Query(description=_REF_DOC, json_schema_extra=_REF_PATTERN)]
_RequiredRef = Annotated[str, Query(description=_REF_DOC, json_schema_extra=_REF_PATTERN)]
_Time = Annotated[
    AwareDatetime | None,
    BeforeValidator(_not_a_number),
    Query(
        description="RFC 3339 with an offset; `until` defaults to now + 5 minutes, `since` to "
        "24 hours before `until`",
    ),
]
_Limit = Annotated[int, Query(ge=1, le=_MAX_LIMIT, description="rows at most")]
_Flag = Annotated[bool, Query(description="`true` or `false` (also `1`/`0`)")]
_Qid = Annotated[str | None, Query(description="one decision by its id")]
_Text = Annotated[str | None, Query(max_length=512, description="a value to match exactly")]
_AfterAt = Annotated[
    int | None,
    Query(ge=0, le=10_413_792_000_000, description="a page's `end.at` (Unix ms), with `after_qid`"),
]

_ROWS = {
    "description": "rows, oldest first",
    "content": {"application/json": {"schema": {"type": "array", "items": {"type": "object"}}}},
}


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
        loader: the running loader whose counters and health ``/metrics`` reports and whose
            health ``/readyz`` requires (None: queries only).
        auth: who may read (``HistoryAuthSettings``, docs/auth.md); with auth off the reads
            are open, which the caller may allow on a loopback bind only
            (``AuthSettings.check_bind``).
        ready: whether the loader runs (``/readyz``); default: always once started.
        now: the clock (tests).

    Returns:
        A FastAPI app; it starts and stops nothing itself.

    Raises:
        AuthConfigError: auth is on and the issuer's JWKS cannot be loaded.

    """
    guard = []
    verifier: Verifier | None = None
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
            ("split_inserts", "INSERTs split (too many day partitions, or a refused record)"),
            ("refused", "Records the store refused for good, moved to the rejected table"),
            ("retention_runs", "Retention passes completed"),
            ("settle_runs", "Passes that settled the hourly rollups"),
            ("hours_settled", "Hours of the hourly rollups marked settled"),
        )
    }
    health_gauges = {
        name: Gauge(f"svc_history_loader_{name}", help_, registry=registry)
        for name, help_ in (
            ("ready", "1 when the loader is neither failing nor behind, else 0"),
            ("consecutive_failures", "INSERTs failed in a row (0 after one succeeds)"),
            ("last_success_timestamp_seconds", "Unix time an INSERT last succeeded (0: never)"),
            (
                "oldest_unstored_age_seconds",
                "Seconds since the oldest record read but not stored reached the broker",
            ),
            ("lag_records", "Records on the loader's partitions not stored yet"),
        )
    }
    lock = threading.Lock()

    app = FastAPI(
        title="svc-history",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        dependencies=[Depends(_utf8_query)],
        responses={"4XX": web.PROBLEM_RESPONSE},
    )
    web.install(app)
    web.add_components(app, {})
    # The token first on every path but the probes; GET routes only, so bodies are small.
    harden(
        app,
        max_body_bytes=PROBE_MAX_BODY_BYTES,
        setting="the history routes' limit",
        verifier=verifier,
    )

    install_problem_handlers(app)

    @app.exception_handler(RequestValidationError)
    async def invalid_parameter(_: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(_validation_problem(exc))

    def run(fn: Callable[[], Any]) -> Any:
        try:
            with lock:
                return fn()
        except ClickHouseError as e:
            # The driver's text stays in the log: it may name internals, and it is no help to
            # the caller, who can only retry.
            log.error("history store query failed (request %s): %s", web.request_id(), e)
            raise Problem(
                503,
                "history-unavailable",
                "History unavailable",
                "the history store did not answer the query; retry later "
                f"(the component's log has the error, request {web.request_id()})",
            ) from e

    unavailable: dict[int | str, dict[str, Any]] = {503: web.PROBLEM_RESPONSE}

    def readiness() -> Readiness:
        if ready is not None and not ready():
            return Readiness(("the loader is not running",))
        health = loader.health() if loader is not None else None
        if health is not None and not health.ready:
            return Readiness(health.reasons, {"loader": health.as_json()})
        details: dict[str, Any] = dict(run(lambda: totals(client)))
        if health is not None:
            details["loader"] = health.as_json()
        return Readiness((), details)

    def refresh() -> None:
        if loader is None:
            return
        for name, g in gauges.items():
            g.set(getattr(loader.stats, name))
        h = loader.health()
        health_gauges["ready"].set(1 if h.ready else 0)
        health_gauges["consecutive_failures"].set(h.consecutive_failures)
        health_gauges["last_success_timestamp_seconds"].set(
            0 if h.last_success is None else h.last_success.timestamp()
        )
        health_gauges["oldest_unstored_age_seconds"].set(h.oldest_unstored_age or 0)
        health_gauges["lag_records"].set(h.lag or 0)

    app.include_router(
        probe_router(
            "svc-history",
            __version__,
            readiness,
            registry,
            refresh=refresh,
            ready_description="Ready when the loader runs, is neither failing nor behind, and "
            "the store answers.",
        )
    )

    @app.get("/v1/history/totals", responses=unavailable, dependencies=guard)
    def get_totals() -> dict[str, int]:
        """Rows in decisions, events and rejected."""
        return dict(run(lambda: totals(client)))

    @app.get(
        "/v1/history/decisions",
        dependencies=guard,
        responses={
            200: {
                "description": "rows, oldest first; one decision for `qid`",
                "content": {
                    "application/json": {
                        "schema": {
                            "anyOf": [
                                {"type": "array", "items": {"type": "object"}},
                                {"type": "object"},
                            ]
                        }
                    }
                },
            },
            **unavailable,
        },
    )
    def decisions(
        principal: _Ref = None,
        resource: _Ref = None,
        qid: _Qid = None,
        since: _Time = None,
        until: _Time = None,
        monitor_only: _Flag = False,
        include_on_behalf_of: _Flag = False,
        limit: _Limit = 100,
    ) -> Any:
        """Decisions of a principal or a resource, or one by ``qid`` (module docs)."""
        if qid is not None:
            why = identifier_problem(qid)
            if why is not None:
                raise _bad("qid", f"the qid {why}")
            found = run(lambda: queries.decision_by_qid(client, qid))
            if found is None:
                raise Problem(404, "not-found", "Not found", f"no decision with qid `{qid}`")
            return found
        p, r = _ref(principal, "principal"), _ref(resource, "resource")
        start, end = _range(since, until, now())
        if p is not None:
            return run(
                lambda: queries.decisions_of_principal(
                    client,
                    p,
                    start,
                    end,
                    monitor_only=monitor_only,
                    include_on_behalf_of=include_on_behalf_of,
                    limit=limit,
                )
            )
        if r is not None:
            return run(lambda: queries.decisions_of_resource(client, r, start, end, limit=limit))
        raise _bad("principal", "give `principal`, `resource` or `qid`")

    @app.get("/v1/history/decisions/search", responses=unavailable, dependencies=guard)
    def search(
        principal: _Ref = None,
        resource: _Ref = None,
        action: _Text = None,
        verdict: _Text = None,
        policy: _Text = None,
        mode: _Text = None,
        since: _Time = None,
        until: _Time = None,
        after_at: _AfterAt = None,
        after_qid: _Text = None,
        limit: _Limit = 50,
    ) -> dict[str, Any]:
        """One page of a decision search (``queries.search_decisions``; docs/history.md)."""
        p, r = _ref(principal, "principal"), _ref(resource, "resource")
        if p is not None and r is not None:
            raise _bad("resource", "give `principal` or `resource`, not both")
        for name, value in (
            ("action", action),
            ("verdict", verdict),
            ("policy", policy),
            ("mode", mode),
            ("after_qid", after_qid),
        ):
            why = None if value is None else identifier_problem(value)
            if why is not None:
                raise _bad(name, f"the value {why}")
        if (after_at is None) != (after_qid is None):
            raise _bad("after_at", "give both `after_at` and `after_qid`, or neither")
        start, end = _range(since, until, now())
        after = None if after_at is None or after_qid is None else (after_at, after_qid)
        page = run(
            lambda: queries.search_decisions(
                client,
                start,
                end,
                principal=p,
                resource=r,
                action=action,
                verdict=verdict,
                policy=policy,
                mode=mode,
                after=after,
                limit=limit,
            )
        )
        return {
            "decisions": page.decisions,
            "more": page.more,
            "end": None if page.end is None else {"at": page.end[0], "qid": page.end[1]},
            "scanned": page.scanned,
        }

    @app.get("/v1/history/events", responses={200: _ROWS, **unavailable}, dependencies=guard)
    def events(
        principal: _Ref = None,
        resource: _Ref = None,
        since: _Time = None,
        until: _Time = None,
        include_on_behalf_of: _Flag = False,
        limit: _Limit = 100,
    ) -> Any:
        """Events of a principal or a resource (module docs)."""
        p, r = _ref(principal, "principal"), _ref(resource, "resource")
        start, end = _range(since, until, now())
        if p is not None:
            return run(
                lambda: queries.events_of_principal(
                    client,
                    p,
                    start,
                    end,
                    include_on_behalf_of=include_on_behalf_of,
                    limit=limit,
                )
            )
        if r is not None:
            return run(lambda: queries.events_of_resource(client, r, start, end, limit=limit))
        raise _bad("principal", "give `principal` or `resource`")

    @app.get("/v1/history/counts", responses=unavailable, dependencies=guard)
    def counts(principal: _RequiredRef, since: _Time = None, until: _Time = None) -> Any:
        """``verdict_counts`` of a principal over the range."""
        p = _ref(principal, "principal")
        if p is None:  # FastAPI refuses a missing one first
            raise _bad("principal", "`principal` is required")
        start, end = _range(since, until, now())
        return run(lambda: queries.verdict_counts(client, p, start, end))

    @app.get("/v1/history/stats", responses=unavailable, dependencies=guard)
    def stats(
        since: _Time = None,
        until: _Time = None,
        bucket: Annotated[
            Literal["hour", "day"], Query(description="bucket width, UTC hours or days")
        ] = "hour",
        top: Annotated[
            int,
            Query(ge=0, le=100, description="most denied principals and resources (0: none)"),
        ] = 5,
    ) -> Any:
        """``decision_stats`` over the range: per-bucket counts and the most denied."""
        start, end = _range(since, until, now())
        return run(lambda: queries.decision_stats(client, start, end, bucket, top))

    return app
