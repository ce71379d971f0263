"""RFC 9457 problem details, as every svc HTTP service answers errors.

``Problem`` is raised by a service layer and answered by its app (``problem_response``);
``http_exception_problem`` answers Starlette's own routing errors (404, 405) in the same shape;
``validation_problem`` answers FastAPI's request validation errors (its default is a 422 whose
body echoes the input) as a 400 problem naming each bad field briefly;
``install_problem_handlers`` makes a FastAPI app answer all three.
A problem's ``type`` is ``urn:svc:problem:<slug>``; ``errors`` names every bad item of a batch
(docs/architecture.md#identifiers-and-errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

__all__ = [
    "PROBLEM_JSON",
    "FieldError",
    "Problem",
    "http_exception_problem",
    "install_problem_handlers",
    "problem_response",
    "validation_problem",
]

#: The media type of a problem document (RFC 9457 section 3).
PROBLEM_JSON = "application/problem+json"


@dataclass(frozen=True)
class FieldError:
    """One problem with one event (an item of ``errors[]``, docs/intake.md#answers-and-errors).

    ``index`` is the event's position in the batch (``None`` for the request as a whole);
    ``field`` the field's path (``principal.id``, ``attributes.tags[2]``).
    """

    index: int | None
    field: str
    message: str

    def as_json(self) -> dict[str, Any]:
        """``{"index", "field", "message"}``."""
        return {"index": self.index, "field": self.field, "message": self.message}


@dataclass(eq=False)
class Problem(Exception):
    """An RFC 9457 problem (docs/intake.md), raised by the service and answered by the app.

    ``type`` is ``urn:svc:problem:<slug>``; ``errors`` lists every bad event of a batch;
    ``headers`` go on the response (``Retry-After``, ``WWW-Authenticate``).
    """

    status: int
    slug: str
    title: str
    detail: str
    errors: list[FieldError] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        """``<status> <slug>: <detail>``."""
        return f"{self.status} {self.slug}: {self.detail}"

    def body(self) -> dict[str, Any]:
        """The ``application/problem+json`` body."""
        out: dict[str, Any] = {
            "type": f"urn:svc:problem:{self.slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.errors:
            out["errors"] = [e.as_json() for e in self.errors]
        return out


def problem_response(p: Problem) -> JSONResponse:
    """A ``Problem`` as an ``application/problem+json`` answer with its headers."""
    return JSONResponse(p.body(), status_code=p.status, headers=p.headers, media_type=PROBLEM_JSON)


def http_exception_problem(exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own HTTP errors (unknown route 404, wrong method 405, ...) as RFC 9457.

    Used as the ``StarletteHTTPException`` handler of every Python service's app, so routing
    errors answer in the same ``urn:svc:problem:<slug>`` shape as the services' own
    (docs/architecture.md#identifiers-and-errors);
    the exception's headers (``Allow`` on a 405) are kept.
    """
    slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
    title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
    p = Problem(exc.status_code, slug, title, str(exc.detail).lower().rstrip("."))
    if exc.headers:
        p.headers.update(exc.headers)
    return problem_response(p)


#: The most bad fields one validation problem lists, and the most characters of each part.
MAX_FIELD_ERRORS = 20
_MAX_PART_CHARS = 128


def _short(text: str) -> str:
    cut = text[:_MAX_PART_CHARS].encode("ascii", "backslashreplace").decode("ascii")
    cut = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in cut)
    return cut if len(text) <= _MAX_PART_CHARS else cut + "..."


def validation_problem(exc: RequestValidationError) -> Problem:
    """FastAPI's refusal of a request's parameters or body as a 400 problem (RFC 9457).

    Each error becomes one ``errors[]`` item: ``field`` is its location without the
    ``body``/``query``/``path``/``header`` part (``resources.0.id``), ``message`` pydantic's
    message; both at most 128 characters, escaped to printable ASCII, and at most
    ``MAX_FIELD_ERRORS`` items. The input itself is never echoed (FastAPI's default 422 body
    carries it whole).

    Args:
        exc: the validation error FastAPI raised.

    Returns:
        A 400 ``invalid-request`` problem whose detail names the first bad field.

    """
    errors = []
    for err in exc.errors()[:MAX_FIELD_ERRORS]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        where = err.get("loc", ("",))[0] if err.get("loc") else ""
        msg = str(err.get("msg", "invalid")).rstrip(".")
        field = ".".join(loc) or str(where)
        errors.append(FieldError(None, _short(field), _short(msg[:1].lower() + msg[1:])))
    if not errors:
        errors.append(FieldError(None, "", "the request is not valid"))
    first = errors[0]
    more = len(exc.errors()) - 1
    detail = f"`{first.field}`: {first.message}" if first.field else first.message
    if more > 0:
        detail += f" (and {more} more)"
    return Problem(400, "invalid-request", "Invalid request", detail, errors)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app serves at the request's path (RFC 9110 section 10.2.1).

    Starlette's 405 names only the first route matching the path; a path with a GET route and
    a POST route (two FastAPI routes) answers with both here.
    """
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_problem_handlers(app: FastAPI) -> None:
    """Makes `app` answer a raised ``Problem`` and Starlette's HTTP errors as RFC 9457.

    Args:
        app: a FastAPI app; a ``Problem`` raised by a route or a dependency is answered with
            ``problem_response``, a ``StarletteHTTPException`` (unknown route, wrong method:
            ``Allow`` names the methods of every route at the path) with
            ``http_exception_problem``, a ``RequestValidationError`` (a parameter or
            body FastAPI refused) with ``validation_problem``'s 400.

    """

    async def on_problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 405:
            allowed = _allowed_methods(request)
            if allowed:
                exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
        return http_exception_problem(exc)

    async def on_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(validation_problem(exc))

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
