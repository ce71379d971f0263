"""HTTP pieces the Python services (intake, history) share: request ids, HEAD, problem schemas.

``install(app)`` puts two ASGI middlewares in front of a FastAPI app:

* **X-Request-ID** (asgi-correlation-id's ``CorrelationIdMiddleware``): a caller's id is kept
  when it is 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``; anything else (too long, spaces,
  control characters, non-ASCII) is replaced, as is a missing one, by a fresh UUIDv7. The id
  goes back on every response, errors included, and ``request_id()`` gives it to log lines
  while the request runs. The same rule holds on both services (docs/intake.md, "Request ids";
  docs/history.md, "HTTP routes").
* **HEAD** (``HeadAsGet``): a HEAD request is answered as the GET of the same URL without its
  body, headers included (RFC 9110 section 9.3.2). FastAPI registers GET routes for GET only.

``PROBLEM_RESPONSE`` describes an RFC 9457 problem (``application/problem+json``) for the
routes' OpenAPI ``responses``, so a client or a fuzzer knows what an error looks like;
``add_components`` puts its schema, and the schemas of bodies a route reads itself, into the
app's OpenAPI document.
"""

from __future__ import annotations

import re
from typing import Any

import uuid_utils
from asgi_correlation_id import CorrelationIdMiddleware, correlation_id
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "PROBLEM_RESPONSE",
    "PROBLEM_SCHEMA",
    "REQUEST_ID_HEADER",
    "REQUEST_ID_MAX_CHARS",
    "HeadAsGet",
    "add_components",
    "install",
    "new_request_id",
    "request_id",
    "valid_request_id",
]

REQUEST_ID_HEADER = "X-Request-ID"
#: The longest caller's request id kept; a longer one is replaced by a fresh id.
REQUEST_ID_MAX_CHARS = 128
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{REQUEST_ID_MAX_CHARS}}}")

#: The body of an RFC 9457 problem as the services write it (``svc.intake.models.Problem``).
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "`urn:svc:problem:<slug>`"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "every bad item: its index (null for the request), field, message",
            "items": {
                "type": "object",
                "required": ["index", "field", "message"],
                "properties": {
                    "index": {"type": ["integer", "null"]},
                    "field": {"type": "string"},
                    "message": {"type": "string"},
                },
            },
        },
    },
}

#: An OpenAPI response object for ``responses={...}``: problem details (RFC 9457). It refers to
#: ``#/components/schemas/Problem``, which ``add_components`` puts in the document.
PROBLEM_RESPONSE: dict[str, Any] = {
    "description": "Problem details (RFC 9457)",
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}


def valid_request_id(value: str) -> bool:
    """Whether a caller's ``X-Request-ID`` is kept: 1 to 128 of ``A-Z a-z 0-9 . _ : -``."""
    return _REQUEST_ID.fullmatch(value) is not None


def new_request_id() -> str:
    """A fresh request id: a UUIDv7 (time ordered, 36 characters), as the decision ids are."""
    return str(uuid_utils.uuid7())


def request_id() -> str | None:
    """The id of the request being served in this context (task or worker thread), or None."""
    return correlation_id.get()


class HeadAsGet:
    """ASGI middleware: HEAD is answered as GET of the same URL, without the body.

    RFC 9110 section 9.3.2: the same status and header fields as GET (``Content-Length``
    included), no content. A path with no GET route answers HEAD as it answers GET (404, or
    405 with ``Allow``).

    Args:
        app: the ASGI app behind.

    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Passes the request on, as GET when it is a HEAD."""
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_without_body)


def add_components(app: FastAPI, components: dict[str, dict[str, Any]]) -> None:
    """Makes ``app``'s OpenAPI document (``/openapi.json``) carry ``components`` and ``Problem``.

    FastAPI writes ``components`` only for the models its own parameters use; routes that read
    their bodies themselves refer to schemas given here.

    Args:
        app: a FastAPI app.
        components: OpenAPI components by kind (``{"schemas": {...}, "securitySchemes":
            {...}}``), merged into the document FastAPI generates.

    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = FastAPI.openapi(app)
            merged = doc.setdefault("components", {})
            for kind, items in {"schemas": {"Problem": PROBLEM_SCHEMA}, **components}.items():
                merged.setdefault(kind, {}).update(items)
            merged["schemas"].setdefault("Problem", PROBLEM_SCHEMA)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    """Puts the request-id and HEAD middlewares in front of ``app`` (module docs).

    Args:
        app: a FastAPI app, before it serves.

    """
    app.add_middleware(HeadAsGet)
    # Added last, so outermost: HEAD answers and errors carry the id too.
    app.add_middleware(
        CorrelationIdMiddleware,
        header_name=REQUEST_ID_HEADER,
        update_request_header=True,
        generator=new_request_id,
        validator=valid_request_id,
        transformer=None,
    )
