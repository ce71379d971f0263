"""The portal's web app: its static files and its persisted GraphQL operations (docs/portal.md).

The web app (``web/portal/``, a TypeScript single-page app) is built by ``make web`` (part of
``make build``) into a directory the Python package carries (``python/svc/portal/static/``,
ignored by git, put in the wheel by maturin's ``include``). The build writes, beside
``index.html`` and ``assets/``, ``persisted-operations.json``: every GraphQL operation of the
app, by the SHA-256 of its text (graphql-codegen's persisted documents).

* **Static files and the SPA fallback** (``install_web``): ``GET /assets/...`` serves the
  build's hashed files (cached for a year, immutable); any other ``GET`` of a path that is not
  the portal's API (``/api/``, ``/auth/``, ``/graphql``, ``/mcp``, the probes) answers
  ``index.html`` (not cached), so the app's own routes (``/decisions/<qid>``) load on a reload.
  Without a build, those paths answer ``503 web-app-not-built`` naming the command.
* **Persisted operations** (``PersistedOperations``, ``PersistedRouter``): in an install the
  portal runs only the app's own operations. A request names one by hash, as Apollo's
  automatic persisted queries do (``{"extensions": {"persistedQuery": {"version": 1,
  "sha256Hash": "<hex>"}}}``) or as ``{"documentId": "<hex>"}``; the portal puts the
  operation's text in. A request carrying its own ``query`` text is refused (``400
  persisted-query-required``) unless the text is one of the manifest's, or
  ``allow_any_query`` (or ``dev``) is set. The same rule holds on the subscriptions' websocket
  (``PersistedOnly``, a schema extension, checks every operation's text).
"""

from __future__ import annotations

import json
import logging
import mimetypes
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.fastapi import GraphQLRouter
from strawberry.http import GraphQLRequestData

from svc.common.problems import Problem

__all__ = [
    "MANIFEST",
    "WEB_DIR",
    "PersistedOnly",
    "PersistedOperations",
    "PersistedRouter",
    "install_web",
]

log = logging.getLogger("svc.portal.web")

#: Where ``make web`` builds the app (the package's own directory, so the wheel carries it).
WEB_DIR = Path(__file__).resolve().parent / "static"
#: The build's manifest of persisted operations: ``{"<sha256 hex>": "<operation text>"}``.
MANIFEST = "persisted-operations.json"
#: Path prefixes that are the portal's API, never the app's routes.
API_PREFIXES = ("/api/", "/auth/", "/graphql", "/mcp", "/healthz", "/readyz", "/version")
API_PATHS = ("/metrics", "/docs", "/openapi.json")


@dataclass(frozen=True)
class PersistedOperations:
    """The web app's GraphQL operations by hash, and whether other operations may run.

    Attributes:
        by_hash: SHA-256 hex (lowercase) of an operation's text -> the text.
        allow_any: other operations (a request's own ``query`` text) may run too
            (``allow_any_query`` or ``dev``).

    """

    by_hash: dict[str, str]
    allow_any: bool
    texts: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "texts", frozenset(self.by_hash.values()))

    @classmethod
    def load(cls, web_dir: Path, allow_any: bool) -> PersistedOperations:
        """The manifest of the build in `web_dir` (none: no operation is known).

        Raises:
            ValueError: the manifest is not a JSON object of hex hashes to strings.

        """
        path = web_dir / MANIFEST
        if not path.is_file():
            if not allow_any:
                log.warning("no %s: the portal runs no GraphQL operation (make web)", path)
            return cls({}, allow_any)
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            raise ValueError(f"{path}: not an object of operation hashes to their text")
        return cls({k.lower(): v for k, v in raw.items()}, allow_any)

    def resolve(self, data: GraphQLRequestData) -> GraphQLRequestData:
        """The request with its operation's text put in from its hash (module docs).

        Raises:
            Problem: 400 ``persisted-query-not-found`` for a hash the build does not know;
                400 ``persisted-query-required`` for a text of its own when only the app's
                operations run.

        """
        digest = _requested_hash(data)
        if digest is not None:
            text = self.by_hash.get(digest.lower())
            if text is None:
                raise Problem(
                    400,
                    "persisted-query-not-found",
                    "Unknown operation",
                    f"no operation `{digest[:80]}` in this portal's web app (reload the page: "
                    "the portal may have been upgraded)",
                )
            data.query = text
            return data
        if data.query is not None and not self.allows(data.query):
            raise Problem(
                400,
                "persisted-query-required",
                "Only the web app's operations run here",
                "this portal runs only its web app's persisted operations (send "
                "`extensions.persistedQuery.sha256Hash`); SVC_PORTAL_ALLOW_ANY_QUERY lets "
                "others run in development",
            )
        return data

    def allows(self, text: str) -> bool:
        """Whether the operation `text` may run."""
        return self.allow_any or text in self.texts


def _requested_hash(data: GraphQLRequestData) -> str | None:
    ext = data.extensions or {}
    pq = ext.get("persistedQuery")
    if isinstance(pq, dict) and isinstance(pq.get("sha256Hash"), str):
        return str(pq["sha256Hash"])
    doc_id = ext.get("documentId")
    return doc_id if isinstance(doc_id, str) else None


class PersistedRouter(GraphQLRouter[Any, Any]):
    """strawberry's FastAPI router that resolves persisted operations (module docs).

    Args:
        operations: the manifest and the rule.
        *args, **kwargs: ``GraphQLRouter``'s.

    """

    def __init__(self, operations: PersistedOperations, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.operations = operations

    async def parse_http_body(self, request: Any) -> Any:
        """The request's operation, its text taken from the manifest by hash."""
        if request.method == "POST":
            raw = await request.get_body()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            if isinstance(body, dict) and isinstance(body.get("documentId"), str):
                # `documentId` at the top level (the GraphQL over HTTP draft's form): moved
                # into the extensions, where `resolve` reads it.
                ext = body.get("extensions") if isinstance(body.get("extensions"), dict) else {}
                return self.operations.resolve(
                    GraphQLRequestData(
                        query=None,
                        variables=body.get("variables")
                        if isinstance(body.get("variables"), dict)
                        else None,
                        operation_name=body.get("operationName"),
                        extensions={**(ext or {}), "documentId": body["documentId"]},
                    )
                )
        data = await super().parse_http_body(request)
        if isinstance(data, list):
            return [self.operations.resolve(d) for d in data]
        return self.operations.resolve(data)


class PersistedOnly(SchemaExtension):
    """Refuses an operation whose text is not the web app's (the websocket's guard too)."""

    operations: PersistedOperations | None = None

    def on_operation(self) -> Iterator[None]:
        """Before parsing: the operation's text must be allowed (``PersistedOperations``)."""
        ops = self.operations
        query = self.execution_context.query
        if ops is not None and query is not None and not ops.allows(query):
            raise GraphQLError(
                "only the web app's persisted operations run on this portal",
                extensions={"code": "PERSISTED_QUERY_REQUIRED"},
            )
        yield


def persisted_only(operations: PersistedOperations) -> type[PersistedOnly]:
    """A ``PersistedOnly`` extension class bound to `operations` (one is made per operation)."""
    return type("PersistedOnlyBound", (PersistedOnly,), {"operations": operations})


def _is_api(path: str) -> bool:
    return path.startswith(API_PREFIXES) or path in API_PATHS


def install_web(app: FastAPI, web_dir: Path) -> None:
    """Serves the built app from `web_dir` with the SPA fallback (module docs).

    Call it after every other route is added: its catch-all ``GET`` comes last.

    Args:
        app: the portal's app.
        web_dir: the build (``index.html``, ``assets/``).

    """
    root = web_dir.resolve()

    def not_built() -> Problem:
        return Problem(
            503,
            "web-app-not-built",
            "The web app is not built",
            f"no {root / 'index.html'}: build it with `make web` (Node 22, "
            "scripts/dev-node.sh); the API at /graphql serves meanwhile",
        )

    @app.get("/{path:path}", include_in_schema=False)
    def web(path: str, request: Request) -> Response:
        """A file of the build, or ``index.html`` for the app's own routes."""
        full = "/" + path
        if _is_api(full):
            raise Problem(404, "not-found", "Not found", f"no route `{full[:200]}`")
        index = root / "index.html"
        if path:
            target = (root / path).resolve()
            if target.is_relative_to(root) and target.is_file() and target.name != MANIFEST:
                immutable = target.is_relative_to(root / "assets")
                media = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                return FileResponse(
                    target,
                    media_type=media,
                    headers={
                        "Cache-Control": "public, max-age=31536000, immutable"
                        if immutable
                        else "no-cache"
                    },
                )
            if full.startswith("/assets/"):
                raise Problem(404, "not-found", "Not found", f"no file `{full[:200]}`")
        if not index.is_file():
            raise not_built()
        return FileResponse(
            index,
            media_type="text/html",
            headers={
                "Cache-Control": "no-cache",
                "Content-Security-Policy": CSP,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "same-origin",
                "X-Frame-Options": "DENY",
            },
        )


#: The page's content security policy: the app's own scripts, styles and connections only.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; "
    "form-action 'self'"
)
