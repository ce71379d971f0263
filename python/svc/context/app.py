"""The context service's HTTP layer (FastAPI): it only translates (docs/context.md#http-routes).

* ``/scim/v2/...``: SCIM 2.0 (``svc.context.scim.ScimApp``, mounted), with the identity
  provider's bearer token;
* ``/v1/...``: the principals snapshot and its watch, resources, work items, service accounts,
  risk scores, the directory, trusted apps and investigations, behind the caller check of
  docs/auth.md (``SVC_CONTEXT_AUTH*``, audience ``svc-context``);
* ``/healthz``, ``/readyz``, ``/version``, ``/metrics`` (``svc.common.health``), no token.

Errors of the ``/v1`` routes are RFC 9457 problem documents (``svc.common.problems``); SCIM
errors are SCIM ``Error`` documents (RFC 7644 section 3.12).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Body, Depends, FastAPI, Query, Response
from prometheus_client import CollectorRegistry, Gauge

from svc import __version__
from svc.common.auth import Verifier, author_of, bearer_dependency, current_caller
from svc.common.health import Readiness, probe_router
from svc.common.limits import harden, static_guard
from svc.common.problems import Problem, install_problem_handlers
from svc.context.scim import ScimApp
from svc.context.service import ContextService, Feed, Ref
from svc.context.settings import ContextAuthSettings, ContextSettings

__all__ = ["Watcher", "create_app"]

# The query parameters of the watch and the change feeds.
After = Annotated[int, Query(ge=0, le=2**63 - 1, description="the version (cursor) to read after")]
Wait = Annotated[
    float,
    Query(ge=0, le=300, description="seconds to wait for a change (long poll); 0: answer now"),
]
Limit = Annotated[int | None, Query(ge=1, le=100_000, description="most changes")]


class Watcher:
    """Wakes the long-polling watches of one event loop when the service commits a change.

    ``ContextService`` calls ``changed`` from the writing thread; each waiting watch holds the
    event current when it last read the feed, so a change between its read and its wait still
    wakes it.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attaches the watcher to the loop its watches run on."""
        self._loop = loop
        self._event = asyncio.Event()

    def _bump(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def changed(self) -> None:
        """Wakes every waiting watch (thread-safe)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._bump)

    def current(self) -> asyncio.Event:
        """The event the next change sets."""
        return self._event


def create_app(
    service: ContextService,
    settings: ContextSettings,
    auth: ContextAuthSettings,
) -> FastAPI:
    """The context service's app.

    Args:
        service: the service layer (its database already migrated).
        settings: the component's settings (SCIM token, limits, waits).
        auth: who may call the ``/v1`` routes (docs/auth.md); with auth off they are open,
            which the caller may allow on a loopback bind only (``AuthSettings.check_bind``).

    Returns:
        A FastAPI app; it starts nothing itself and closes nothing of ``service``.

    Raises:
        AuthConfigError: auth is on and the issuer's JWKS cannot be loaded.

    """
    watcher = Watcher()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        watcher.bind(asyncio.get_running_loop())
        service.add_listener(watcher.changed)
        try:
            yield
        finally:
            service.remove_listener(watcher.changed)

    guard: list[Any] = []
    verifier: Verifier | None = None
    if auth.enabled:
        verifier = Verifier(auth)
        verifier.source.keys()  # fail at start, not on the first request
        guard = [Depends(bearer_dependency(verifier))]

    app = FastAPI(
        title="svc-context",
        version=__version__,
        description="People, groups, service accounts, resources and work items (docs/context.md).",
        lifespan=lifespan,
    )
    install_problem_handlers(app)

    def token() -> str | None:
        return settings.scim_token.get_secret_value() if settings.scim_token else None

    # The token first, then bounded bodies and checked JSON, on every route but the probes
    # (SCIM's discovery document is public, RFC 7644 section 4); SCIM refusals in its own shape.
    harden(
        app,
        max_body_bytes=settings.max_body_bytes,
        setting=settings.env_name("max_body_bytes"),
        guards=[("/scim/", static_guard(token, "scim", settings.env_name("scim_token")))],
        verifier=verifier,
        open_prefixes=["/scim/v2/ServiceProviderConfig"],
        scim_prefix="/scim/v2",  # its refusals are SCIM Error documents (RFC 7644 section 3.12)
    )

    registry = CollectorRegistry(auto_describe=True)
    rows = Gauge("svc_context_rows", "Rows per kind", ["kind"], registry=registry)
    versions = Gauge(
        "svc_context_feed_version", "Latest change per feed", ["feed"], registry=registry
    )

    def refresh() -> None:
        for kind, n in service.counts().items():
            rows.labels(kind).set(n)
        for feed, version in service.feed_versions().items():
            versions.labels(feed).set(version)

    def readiness() -> Readiness:
        try:
            service.ping()
        except Exception as e:  # any driver error means the database is not reachable
            return Readiness([f"the database is unreachable: {type(e).__name__}"])
        return Readiness((), {"schema": service.revision})

    app.include_router(
        probe_router(
            "svc-context",
            __version__,
            readiness,
            registry,
            refresh=refresh,
            ready_description="Ready when the database answers.",
        )
    )

    # scim2-server's ASGI application types its scope as a dict, Starlette as a mapping.
    scim: Any = ScimApp(service, token, settings.scim_max_results)
    app.mount("/scim", scim)

    run = anyio.to_thread.run_sync

    async def watch(feed: Feed, after: int, wait_secs: float, limit: int | None) -> dict[str, Any]:
        wait = min(wait_secs, settings.max_wait_secs)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            event = watcher.current()
            changes, version, more = await run(service.changes_after, feed, after, limit)
            remaining = deadline - loop.time()
            if changes or remaining <= 0:
                return {
                    "version": version,
                    "changes": [c.as_json() for c in changes],
                    "more": more,
                }
            try:
                await asyncio.wait_for(event.wait(), min(remaining, settings.poll_secs))
            except TimeoutError:
                pass

    @app.get(
        "/v1/principals",
        dependencies=guard,
        tags=["principals"],
        response_class=Response,
        responses={200: {"content": {"application/json": {}}}},
    )
    async def principals() -> Response:
        """The snapshot: every principal record and the ``principals_version`` it is at.

        Written by the service layer as compact JSON in one pass
        (``ContextService.principals_snapshot_json``), not through FastAPI's encoder.
        """
        body = await run(service.principals_snapshot_json)
        return Response(body, media_type="application/json")

    @app.get("/v1/principals/watch", dependencies=guard, tags=["principals"])
    async def principals_watch(after: After, wait_secs: Wait = 0, limit: Limit = None) -> Any:
        """The changes after ``after``, oldest first; waits up to ``wait_secs`` for one."""
        out = await watch("principals", after, wait_secs, limit)
        return {"principals_version": out.pop("version"), **out}

    @app.get("/v1/feeds", dependencies=guard, tags=["principals"])
    async def feeds() -> Any:
        """Each feed's current version: ``{"principals", "resources", "work_items"}``.

        A decision point starts the resource and work-item feeds here (docs/context.md).
        """
        return await run(service.feed_versions)

    # -- resources ---------------------------------------------------------------

    @app.post("/v1/resources", dependencies=guard, tags=["resources"])
    async def put_resources(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Stores ``{"resources": [...]}``, all or nothing."""
        return await run(service.put_resources, _member(body, "resources"))

    @app.get("/v1/resources", dependencies=guard, tags=["resources"])
    async def list_resources(
        type: Annotated[str, Query(description="the resources' Cedar entity type")],
        after: Annotated[str, Query(description="the previous page's `next`")] = "",
        limit: Annotated[int, Query(description="most resources on the page")] = 500,
    ) -> Any:
        """The resources of ``type`` in ascending id order, a page at a time.

        ``{"resources", "next", "version"}``; ``next`` is ``""`` on the last page.
        """
        return await run(service.list_resources, type, after, limit)

    @app.post("/v1/resources/get", dependencies=guard, tags=["resources"])
    async def get_resources(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Reads ``{"resources": [ref]}`` by id."""
        return await run(service.get_resources, _member(body, "resources"))

    @app.post("/v1/resources/delete", dependencies=guard, tags=["resources"])
    async def delete_resources(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Deletes ``{"resources": [ref]}``."""
        return await run(service.delete_resources, _member(body, "resources"))

    @app.get("/v1/resources/changes", dependencies=guard, tags=["resources"])
    async def resource_changes(after: After, wait_secs: Wait = 0, limit: Limit = None) -> Any:
        """The resources' change feed after the cursor ``after``."""
        return await watch("resources", after, wait_secs, limit)

    # -- work items ------------------------------------------------------------------

    @app.post("/v1/work-items", dependencies=guard, tags=["work items"])
    async def put_work_items(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Stores ``{"work_items": [...]}``, all or nothing."""
        return await run(service.put_work_items, _member(body, "work_items"))

    @app.post("/v1/work-items/get", dependencies=guard, tags=["work items"])
    async def get_work_items(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Reads ``{"ids": [...]}``."""
        return await run(service.get_work_items, _member(body, "ids"))

    @app.post("/v1/work-items/delete", dependencies=guard, tags=["work items"])
    async def delete_work_items(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Deletes ``{"ids": [...]}``."""
        return await run(service.delete_work_items, _member(body, "ids"))

    @app.get("/v1/work-items/changes", dependencies=guard, tags=["work items"])
    async def work_item_changes(after: After, wait_secs: Wait = 0, limit: Limit = None) -> Any:
        """The work items' change feed after the cursor ``after``."""
        return await watch("work_items", after, wait_secs, limit)

    # -- service accounts -------------------------------------------------------------

    @app.post("/v1/service-accounts", dependencies=guard, tags=["service accounts"])
    async def put_service_accounts(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Registers ``{"service_accounts": [...], "author"?}``, all or nothing."""
        author = body.pop("author", "")
        if not isinstance(author, str):
            raise Problem(400, "invalid-request", "Invalid request", "`author` is not a string")
        items = _member(body, "service_accounts")
        return await run(service.put_service_accounts, items, author_of(author))

    @app.get("/v1/service-accounts", dependencies=guard, tags=["service accounts"])
    async def list_service_accounts(
        app_name: Annotated[
            str | None, Query(alias="app", max_length=128, description="one app's agents")
        ] = None,
    ) -> Any:
        """Every registered service account (of one app: ids starting with ``<app>.``)."""
        return {"service_accounts": await run(service.service_accounts, app_name)}

    @app.get("/v1/service-accounts/{sa_id}/changes", dependencies=guard, tags=["service accounts"])
    async def service_account_changes(
        sa_id: str, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
    ) -> Any:
        """A service account's registrations, changes and retirements, newest first."""
        return {"changes": await run(service.service_account_changes, sa_id, limit)}

    @app.get("/v1/service-accounts/{sa_id}", dependencies=guard, tags=["service accounts"])
    async def get_service_account(sa_id: str) -> Any:
        """One service account."""
        return await run(service.service_account, sa_id)

    @app.delete(
        "/v1/service-accounts/{sa_id}",
        dependencies=guard,
        status_code=204,
        tags=["service accounts"],
    )
    async def delete_service_account(
        sa_id: str,
        author: Annotated[str, Query(max_length=512, description="who retires it")] = "",
    ) -> None:
        """Unregisters a service account (recorded as retired by the caller)."""
        await run(service.delete_service_account, sa_id, author_of(author))

    # -- risk --------------------------------------------------------------------------------

    @app.post("/v1/risk", dependencies=guard, tags=["risk"])
    async def put_risk(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Records the reasoner's ``{"scores": [...]}``, all or nothing."""
        return await run(service.put_risk_scores, _member(body, "scores"))

    @app.get("/v1/risk", dependencies=guard, tags=["risk"])
    async def list_risk(
        min_score: Annotated[int, Query(ge=0, le=100, description="only scores of at least")] = 0,
        limit: Annotated[int | None, Query(ge=1, le=1_000_000, description="most scores")] = None,
    ) -> Any:
        """The scores with their factors, highest first: ``{"scores": [...]}``."""
        return {"scores": await run(service.risk_scores, min_score, limit)}

    @app.get(
        "/v1/risk-history/{principal_type}/{principal_id:path}",
        dependencies=guard,
        tags=["risk"],
    )
    async def get_risk_history(
        principal_type: str,
        principal_id: str,
        days: Annotated[int, Query(ge=1, le=3660, description="UTC days, today included")] = 30,
    ) -> Any:
        """One principal's score per UTC day, oldest first (docs/context.md#risk-scores)."""
        return await run(service.risk_history, Ref(type=principal_type, id=principal_id), days)

    @app.get("/v1/risk/{principal_type}/{principal_id:path}", dependencies=guard, tags=["risk"])
    async def get_risk(principal_type: str, principal_id: str) -> Any:
        """One principal's score with its factors (404 when it has none)."""
        return await run(service.risk_score, Ref(type=principal_type, id=principal_id))

    # -- directory ---------------------------------------------------------------------------

    @app.get("/v1/directory/people", dependencies=guard, tags=["directory"])
    async def people(include_removed: bool = False) -> Any:
        """The people (removed ones with ``include_removed=true``)."""
        return {"people": await run(service.people, include_removed)}

    @app.get("/v1/directory/people/{user_name}", dependencies=guard, tags=["directory"])
    async def person(user_name: str) -> Any:
        """One person."""
        return await run(service.person, user_name)

    @app.get("/v1/directory/groups", dependencies=guard, tags=["directory"])
    async def groups() -> Any:
        """The groups."""
        return {"groups": await run(service.groups)}

    @app.get("/v1/directory/groups/{name}", dependencies=guard, tags=["directory"])
    async def group(name: str) -> Any:
        """One group."""
        return await run(service.group, name)

    @app.get("/v1/directory/service-accounts", dependencies=guard, tags=["directory"])
    async def directory_service_accounts() -> Any:
        """The service accounts."""
        return {"service_accounts": await run(service.service_accounts)}

    @app.get("/v1/directory/trusted-apps", dependencies=guard, tags=["directory"])
    async def trusted_apps() -> Any:
        """The trusted apps."""
        return {"trusted_apps": await run(service.trusted_apps)}

    @app.post("/v1/directory/trusted-apps", dependencies=guard, tags=["directory"])
    async def put_trusted_app(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Trusts an app ``{name, iss, jwks_url, aud}``."""
        return await run(service.put_trusted_app, body)

    @app.delete(
        "/v1/directory/trusted-apps/{name}", dependencies=guard, status_code=204, tags=["directory"]
    )
    async def delete_trusted_app(name: str) -> None:
        """Stops trusting an app."""
        await run(service.delete_trusted_app, name)

    # -- investigations ---------------------------------------------------------------------

    @app.post("/v1/investigations", dependencies=guard, status_code=201, tags=["investigations"])
    async def open_investigation(body: Annotated[dict[str, Any], Body()]) -> Any:
        """Records an investigation.

        ``{principal, reason, opened_by, kind?, evidence?, summary?, summary_by?}``.
        """
        return await run(service.open_investigation, _by(body, "opened_by"))

    @app.get("/v1/investigations", dependencies=guard, tags=["investigations"])
    async def list_investigations(
        status: Annotated[str | None, Query(pattern="^(open|closed)$")] = None,
        principal_type: str | None = None,
        principal_id: str | None = None,
        kind: Annotated[str | None, Query(pattern="^(manual|contain|would_contain|score)$")] = None,
    ) -> Any:
        """Investigations, newest first (of one status, of one principal, of one kind)."""
        ref = Ref(type=principal_type, id=principal_id) if principal_type and principal_id else None
        return {"investigations": await run(service.investigations, status, ref, kind)}

    @app.post("/v1/investigations/{inv_id}/close", dependencies=guard, tags=["investigations"])
    async def close_investigation(inv_id: str, body: Annotated[dict[str, Any], Body()]) -> Any:
        """Closes an investigation ``{closed_by, resolution}``."""
        return await run(service.close_investigation, inv_id, _by(body, "closed_by"))

    return app


def _by(body: dict[str, Any], field: str) -> dict[str, Any]:
    """`body` with `field` (who opens or closes) set to the verified caller (docs/auth.md).

    With auth off (a loopback bind) the request's own value stands.
    """
    caller = current_caller()
    return body if caller is None else {**body, field: caller.author}


def _member(body: dict[str, Any], name: str) -> Any:
    """``body[name]``, or a 400 problem naming the missing member or the unknown ones."""
    unknown = sorted(set(body) - {name})
    if name not in body or unknown:
        detail = (
            f"unknown member{'s' if len(unknown) > 1 else ''} "
            + ", ".join(f"`{u}`" for u in unknown)
            if unknown
            else f"`{name}` is required"
        )
        raise Problem(400, "invalid-request", "Invalid request", detail)
    return body[name]
