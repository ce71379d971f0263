r"""What every svc HTTP app puts in front of its routes: token first, bounded bodies, sane JSON.

docs/api.md, "Limits of the Python services"; docs/architecture.md#identifiers-and-errors.

``harden(app, ...)`` installs ``Guarded`` in front of a FastAPI app, one line per app. For every
HTTP request but the probes (``PROBE_PATHS``) and the API description (``/openapi.json``), in
this order, before the app reads a byte of the body:

1. **The token.** The first guard whose path prefix matches checks the ``Authorization``
   header (``bearer_guard``: the component's ``svc.common.auth.Verifier``; ``static_guard``: a
   shared secret such as the SCIM token). A request with no token or a bad one gets its 401
   (or 403) problem whatever its body or path, so an unauthenticated caller cannot make the
   service read, parse or route anything. An app's own ``authenticate`` check over the request
   head (a session cookie, an app's token on some paths) runs before the guards.
2. **The size.** A declared ``Content-Length`` over the app's limit gets a 413 problem at once;
   a body sent without one is counted while it arrives and refused past the limit.
3. **The JSON.** A JSON body (``application/json``, ``application/*+json``, or no content type
   with a body starting with ``{`` or ``[``) is read (within the limit) and checked with
   ``parse_json``: strict UTF-8, JSON, nested at most ``max_json_depth`` deep, and no lone
   surrogate (``"\ud800"``) anywhere, keys included. A body that fails gets a 400 problem
   ``invalid-json`` with a short, fixed detail (never the input); one that passes is handed to
   the app unchanged. Whatever a route accepts can therefore always be written back out as
   UTF-8 JSON: no stored value can make a later read fail.
4. **The rest.** An exception no handler answered becomes a 500 problem ``internal-error``
   whose detail names no internals (the exception is logged with the request's method and
   path); the aim is that junk never gets there.

``parse_json`` is the same check for code that reads a body itself (SCIM, the Connect JSON
codec of ``svc.common.connect``). ``validation_problem`` (used by
``svc.common.problems.install_problem_handlers``) answers FastAPI's request validation errors
as a 400 problem naming each bad field briefly, with no input echoed. ``bounded`` shortens any
caller-supplied text for an error detail or a log line. On the SCIM API's paths
(``scim_prefix``) every refusal is a SCIM ``Error`` document (``scim_error_response``).
``harden`` also installs ``svc.common.logbounds`` (every log field of the process bounded).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic_core import from_json
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from svc.common.auth import (
    MISSING_TOKEN,
    AuthConfigError,
    AuthError,
    Verifier,
    remember_verified,
)
from svc.common.logbounds import install_log_bounds
from svc.common.problems import Problem, problem_response
from svc.web import PROBLEM_RESPONSE, PROBLEM_SCHEMA

__all__ = [
    "DEFAULT_MAX_JSON_DEPTH",
    "OPEN_PATHS",
    "PROBE_MAX_BODY_BYTES",
    "PROBE_PATHS",
    "SCIM_ERROR_SCHEMA",
    "Authenticate",
    "Guard",
    "Guarded",
    "JsonRejected",
    "bearer_guard",
    "bounded",
    "harden",
    "parse_json",
    "scim_error_response",
    "static_guard",
]

log = logging.getLogger("svc.common.limits")

#: The probe routes of ``svc.common.health``: never behind a token (docs/auth.md).
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/version", "/metrics"})
#: Paths served to anyone: the probes and the API description.
OPEN_PATHS = PROBE_PATHS | {"/openapi.json"}
#: The deepest nesting of arrays and objects a JSON body may have (the decision point's
#: ``--max-entity-depth`` default is the same 64).
DEFAULT_MAX_JSON_DEPTH = 64
#: The body limit of an app serving only the probes (they read no body).
PROBE_MAX_BODY_BYTES = 64 * 1024
#: The most characters of caller-supplied text an error detail or log field carries.
MAX_ECHO_CHARS = 64

#: A guard checks a request's ``Authorization`` header (``""`` when absent) and returns the
#: problem to answer, or None to let the request through.
Guard = Callable[[str], Awaitable[Problem | None]]
#: An app's own credential check over the whole request head (its ASGI scope: path, headers,
#: cookies), for credentials a ``Guard`` cannot see (a session cookie) or paths it cares
#: about; returns the problem to answer, or None to let the request on to the guards.
Authenticate = Callable[[Scope], Awaitable[Problem | None]]

#: Digits as ``0``, ``e``/``E`` as ``e``, ``+`` kept, anything else a space: a number overflows
#: a float only with an exponent of 3 digits or more or 309 digits in a row, found in the
#: translated text with C substring searches (a false alarm, in a string, costs the exact check).
_NUMBER_SHAPE = bytes(
    ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE" else b if b == 43 else 32
    for b in range(256)
)
_BIG_NUMBER_SIGNS = (b"e000", b"e+000", b"0" * 309)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = (
    r"the JSON holds a lone surrogate (an unpaired \ud800-\udfff escape): text must be valid "
    "Unicode"
)
_JSON_TYPE = re.compile(r"^application/(?:[\w.+-]+\+)?json\s*(?:;.*)?$", re.IGNORECASE)


class JsonRejected(ValueError):
    """A body ``parse_json`` refuses; ``str(e)`` is a short detail naming no input."""


def bounded(text: object, limit: int = MAX_ECHO_CHARS) -> str:
    r"""``text`` as at most ``limit`` printable ASCII characters, for an error detail or a log.

    Non-ASCII and control characters are escaped (``\x..``, ``\u....``), and a longer text is
    cut with ``...(N chars)`` saying how long it was.

    Args:
        text: any value; ``str()`` of it is taken.
        limit: the most characters kept before escaping (at least 8).

    Returns:
        The shortened text.

    """
    s = text if isinstance(text, str) else str(text)
    cut = s[:limit].encode("ascii", "backslashreplace").decode("ascii")
    cut = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in cut)
    return cut if len(s) <= limit else f"{cut}...({len(s)} chars)"


def _deeper_than(value: Any, max_depth: int) -> bool:
    """Whether arrays and objects nest more than ``max_depth`` deep in ``value``.

    A walk of the parsed containers one level at a time (scalars skipped), in plain loops:
    measured about five times faster than a stack of generator expressions and than scanning
    the text's brackets outside strings (``benches/bench_limits.py``).
    """
    level = [value]
    depth = 1
    while level:
        if depth > max_depth:
            return True
        below: list[Any] = []
        for container in level:
            for child in container.values() if type(container) is dict else container:
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
        level = below
        depth += 1
    return False


def _has_infinity(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return True
    return False


def parse_json(data: bytes | str, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    r"""Parses a JSON body that can always be served back (module docs, step 3).

    Parsed by pydantic-core's JSON parser (jiter, Rust; about twice as fast as ``json.loads``,
    ``benches/bench_limits.py``), which refuses lone surrogates and ``NaN``/``Infinity``
    (RFC 8259 section 6) itself; a number too large for a float (``1e400``), which Python
    would read as infinity and write back as ``Infinity``, is refused here.

    Args:
        data: the body; bytes must be UTF-8 (RFC 8259 section 8.1), a str is taken as is.
        max_depth: the deepest nesting of arrays and objects allowed (1: one object of
            scalars; at most 200, jiter's own bound).

    Returns:
        The parsed value, equal to what ``json.loads`` gives for it.

    Raises:
        JsonRejected: not UTF-8, not JSON, nested deeper than ``max_depth``, holding a lone
            surrogate (an escaped ``\ud800``-``\udfff`` without its pair) or a number out of a
            float's range; the message is short and names no input (a position at most).

    """
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            raise JsonRejected(_LONE_SURROGATE) from None
    else:
        raw = bytes(data)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonRejected(f"the body is not UTF-8 (byte {e.start})") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raise JsonRejected("the body starts with a byte order mark (RFC 8259 section 8.1)")
    try:
        value = from_json(raw, allow_inf_nan=False)
    except ValueError as e:
        why = str(e)
        if "surrogate" in why or ("hex escape" in why and _SURROGATE_ESCAPE.search(raw)):
            raise JsonRejected(_LONE_SURROGATE) from None
        if "recursion limit" in why:
            raise JsonRejected(f"the JSON is nested deeper than {max_depth} levels") from None
        raise JsonRejected(f"the body is not JSON: {bounded(why, 120)}") from None
    if (
        isinstance(value, dict | list)
        and raw.count(b"[") + raw.count(b"{") > max_depth
        and _deeper_than(value, max_depth)
    ):
        raise JsonRejected(f"the JSON is nested deeper than {max_depth} levels")
    shape = raw.translate(_NUMBER_SHAPE)
    if any(sign in shape for sign in _BIG_NUMBER_SIGNS) and _has_infinity(value):
        raise JsonRejected("the JSON holds a number out of a float's range (RFC 8259 section 6)")
    return value


def _problem_401(detail: str, realm: str, sent: bool) -> Problem:
    challenge = f'Bearer realm="{realm}"' + (', error="invalid_token"' if sent else "")
    return Problem(
        401,
        "unauthenticated",
        "Authentication required",
        detail,
        headers={"WWW-Authenticate": challenge},
    )


def bearer_guard(verifier: Verifier) -> Guard:
    """A guard admitting the callers ``verifier`` accepts (docs/auth.md).

    Runs ``Verifier.verify`` in a worker thread (a JWKS reload may fetch). The route's own
    check (``svc.common.auth.bearer_dependency`` or a role check) still runs after it; this
    one only makes sure nothing is read or parsed for a caller without a valid token.

    Args:
        verifier: the component's verifier.

    Returns:
        The guard: None for a verified caller; a 401 ``unauthenticated`` problem (with
        ``WWW-Authenticate: Bearer``) for no token or one that does not verify, 403
        ``caller-not-allowed`` for a caller not listed, 503 ``auth-unavailable`` when the
        issuer's keys cannot be loaded.

    """
    realm = verifier.settings.auth_audience

    async def guard(header: str) -> Problem | None:
        scheme, _, token = header.strip().partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthError(401, MISSING_TOKEN, missing=True)
            caller = await anyio.to_thread.run_sync(verifier.verify, token.strip())
            remember_verified(verifier, token.strip(), caller)
        except AuthError as e:
            if e.status == 403:
                return Problem(403, "caller-not-allowed", "The caller is not allowed", e.detail)
            challenge = e.www_authenticate(realm)
            return Problem(
                401,
                "unauthenticated",
                "Authentication required",
                e.detail,
                headers={"WWW-Authenticate": challenge} if challenge else {},
            )
        except AuthConfigError as e:
            log.error("cannot verify bearer tokens: %s", e)
            return Problem(
                503,
                "auth-unavailable",
                "Authentication unavailable",
                "the issuer's keys cannot be loaded",
            )
        return None

    return guard


def static_guard(secret: Callable[[], str | None], realm: str, setting: str) -> Guard:
    """A guard admitting only ``Authorization: Bearer <secret()>`` (a shared token, RFC 6750).

    Args:
        secret: the expected token, read at every request; None refuses everyone.
        realm: the ``WWW-Authenticate`` realm.
        setting: the setting holding the token, named in the refusal.

    Returns:
        The guard (a 401 ``unauthenticated`` problem for any other header).

    """
    import hmac

    async def guard(header: str) -> Problem | None:
        expected = secret()
        scheme, _, sent = header.strip().partition(" ")
        if (
            expected
            and scheme.lower() == "bearer"
            and hmac.compare_digest(sent.strip().encode("utf-8", "replace"), expected.encode())
        ):
            return None
        if not expected:
            detail = f"no token is configured ({setting}); every request is refused"
        elif not sent.strip():
            detail = MISSING_TOKEN
        else:
            detail = f"the bearer token is not the one configured ({setting})"
        return _problem_401(detail, realm, sent=bool(sent.strip()))

    return guard


#: The schema URN of a SCIM error document (RFC 7644 section 3.12).
SCIM_ERROR_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:Error"
#: SCIM's media type (RFC 7644 section 8.1).
SCIM_JSON = "application/scim+json"


def scim_error_response(p: Problem) -> JSONResponse:
    """``p`` as a SCIM ``Error`` document (RFC 7644 section 3.12), for the SCIM API's paths.

    Args:
        p: the refusal (its status, detail and headers, ``WWW-Authenticate`` included, kept).

    Returns:
        An ``application/scim+json`` answer ``{"schemas": [SCIM_ERROR_SCHEMA], "status":
        "<status as a string>", "detail": ...}``, with ``scimType`` ``invalidSyntax`` for a
        body that is not acceptable JSON (400 ``invalid-json``).

    """
    body: dict[str, Any] = {
        "schemas": [SCIM_ERROR_SCHEMA],
        "status": str(p.status),
        "detail": p.detail or p.title,
    }
    if p.status == 400 and p.slug == "invalid-json":
        body["scimType"] = "invalidSyntax"
    return JSONResponse(body, status_code=p.status, headers=p.headers, media_type=SCIM_JSON)


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return bytes(v).decode("latin-1")
    return None


class Guarded:
    """ASGI middleware: the token first, bounded bodies, checked JSON, no internals (module docs).

    Args:
        app: the ASGI app behind (a FastAPI app's inner stack).
        max_body_bytes: the largest request body, in bytes (at least 1).
        setting: the setting holding the limit (``SVC_CONTEXT_MAX_BODY_BYTES``), named in
            the 413 detail.
        guards: ``(path prefix, Guard)`` pairs, the first matching prefix checks the request;
            a path no prefix matches has no token check here.
        open_paths: paths served without a guard (default ``OPEN_PATHS``); ``open_prefixes``
            the same for whole subtrees.
        max_json_depth: the deepest JSON nesting a body may have.
        check_json: whether JSON bodies are checked (step 3).
        authenticate: the app's own credential check, run before the guards on every path
            not open (``Authenticate``).
        scim_prefix: a path prefix (``/scim/v2``) whose refusals are SCIM ``Error`` documents
            (``scim_error_response``) rather than problems, as the rest of SCIM answers.

    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        setting: str,
        guards: Sequence[tuple[str, Guard]] = (),
        open_paths: Iterable[str] = OPEN_PATHS,
        open_prefixes: Sequence[str] = (),
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        check_json: bool = True,
        authenticate: Authenticate | None = None,
        scim_prefix: str | None = None,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.scim_prefix = scim_prefix
        self.max_body_bytes = max_body_bytes
        self.setting = setting
        self.guards = list(guards)
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = tuple(open_prefixes)
        self.max_json_depth = max_json_depth
        self.check_json = check_json

    def _too_large(self) -> Problem:
        return Problem(
            413,
            "payload-too-large",
            "Payload too large",
            f"the request body is larger than {self.max_body_bytes} bytes ({self.setting})",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Checks the request (module docs), then passes it on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path not in self.open_paths and not path.startswith(self.open_prefixes):
            if self.authenticate is not None:
                refused = await self.authenticate(scope)
                if refused is not None:
                    await self._answer(scope, receive, send, refused)
                    return
            for prefix, guard in self.guards:
                if path.startswith(prefix):
                    refused = await guard(_header(scope, b"authorization") or "")
                    if refused is not None:
                        await self._answer(scope, receive, send, refused)
                        return
                    break
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await self._answer(
                    scope, receive, send, _bad_request("Content-Length is not a number")
                )
                return
            if declared > self.max_body_bytes:
                await self._answer(scope, receive, send, self._too_large())
                return
        if self.check_json and scope.get("method") in ("POST", "PUT", "PATCH", "DELETE"):
            ctype = _header(scope, b"content-type")
            encoded = (_header(scope, b"content-encoding") or "identity").lower() != "identity"
            if not encoded and (ctype is None or _JSON_TYPE.match(ctype.strip())):
                await self._checked(scope, receive, send, json_type=ctype is not None)
                return
        await self._streamed(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, p: Problem) -> None:
        path: str = scope.get("path", "")
        if self.scim_prefix and path.startswith(self.scim_prefix):
            await scim_error_response(p)(scope, receive, send)
            return
        await problem_response(p)(scope, receive, send)

    async def _checked(self, scope: Scope, receive: Receive, send: Send, json_type: bool) -> None:
        """Reads the body whole (within the limit), checks its JSON, replays it to the app."""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            seen += len(body)
            if seen > self.max_body_bytes:
                await self._answer(scope, receive, send, self._too_large())
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        data = b"".join(chunks)
        stripped = data.lstrip()
        if data and (json_type or stripped[:1] in (b"{", b"[")):
            try:
                parse_json(data, self.max_json_depth)
            except JsonRejected as e:
                await self._answer(
                    scope, receive, send, Problem(400, "invalid-json", "Invalid JSON", str(e))
                )
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        await self._run(scope, replay, send)

    async def _streamed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Passes the body on as it arrives, refusing it once past the limit.

        Past the limit the 413 problem is sent at once (when the app has not started its
        answer), the app is told the client left (``http.disconnect``, so it stops reading
        whatever it catches), and whatever it answers after that is dropped.
        """
        seen = 0
        refused = False
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        async def counted() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    if not started:
                        await self._answer(scope, receive, send, self._too_large())
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        await self._run(scope, counted, sending, lambda: refused)

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        refused: Callable[[], bool] = lambda: False,
    ) -> None:
        """The app, with any exception that escapes it a 500 problem (when nothing was sent)."""
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if refused():  # the body was refused; the app failed reading it: answered already
                return
            log.exception(
                "unexpected error serving %s %s", scope.get("method"), bounded(scope.get("path"))
            )
            if started:
                raise
            await self._answer(
                scope,
                receive,
                send,
                Problem(
                    500,
                    "internal-error",
                    "Internal error",
                    "the service failed to answer this request; the component's log has the error",
                ),
            )


def _document_problems(app: FastAPI) -> None:
    """Makes ``app.openapi()`` document problems for every operation (``harden``'s docs)."""
    previous = app.openapi

    def openapi() -> dict[str, Any]:
        doc = previous()
        doc.setdefault("components", {}).setdefault("schemas", {}).setdefault(
            "Problem", PROBLEM_SCHEMA
        )
        for item in doc.get("paths", {}).values():
            for op in item.values():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                op["responses"].pop("422", None)
                op["responses"].setdefault("4XX", PROBLEM_RESPONSE)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _bad_request(detail: str) -> Problem:
    return Problem(400, "invalid-request", "Invalid request", detail)


def harden(
    app: FastAPI,
    *,
    max_body_bytes: int,
    setting: str,
    guards: Sequence[tuple[str, Guard]] = (),
    verifier: Verifier | None = None,
    open_prefixes: Sequence[str] = (),
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    check_json: bool = True,
    authenticate: Authenticate | None = None,
    scim_prefix: str | None = None,
) -> None:
    """Installs ``Guarded`` in front of ``app``'s routes: one line per app (module docs).

    Call it once, before the app serves; it goes inside the app's other middlewares (request
    ids, HEAD, sessions), whenever they are added, so its refusals carry their headers too.

    Args:
        app: a FastAPI app, before it serves.
        max_body_bytes: the largest request body in bytes.
        setting: the setting holding it, named in the 413 detail.
        guards: ``(path prefix, Guard)`` pairs, first match wins (SCIM's token on ``/scim/``).
        verifier: the component's caller verifier; when given, ``bearer_guard(verifier)``
            guards every path no earlier guard matched (prefix ``/``).
        open_prefixes: path prefixes served without a token (a login page, static files).
        max_json_depth: the deepest JSON nesting allowed.
        check_json: whether JSON bodies are checked before the app sees them.
        authenticate: the app's own credential check over the request head, run first on
            every path not open (a session cookie, a token a route checked itself before):
            a request it refuses is answered before any body is read.
        scim_prefix: the SCIM API's path prefix (``/scim/v2``): its refusals are SCIM
            ``Error`` documents (``scim_error_response``).

    It also bounds every log field of the process (``svc.common.logbounds``): what a caller
    sends reaches log lines only cut to a bounded size; and it makes the app's OpenAPI document
    say how it answers errors: every operation's ``4XX`` is an RFC 9457 problem
    (``svc.web.PROBLEM_RESPONSE``), FastAPI's ``422`` (never answered) is gone.

    """
    install_log_bounds()
    _document_problems(app)
    all_guards = list(guards)
    if verifier is not None:
        all_guards.append(("/", bearer_guard(verifier)))
    # Innermost of the app's middlewares: request ids, HEAD and sessions still wrap every
    # answer, refusals included; nothing past it reads a body before the checks.
    app.user_middleware.append(
        Middleware(
            Guarded,
            max_body_bytes=max_body_bytes,
            setting=setting,
            guards=all_guards,
            open_prefixes=tuple(open_prefixes),
            max_json_depth=max_json_depth,
            check_json=check_json,
            authenticate=authenticate,
            scim_prefix=scim_prefix,
        )
    )
