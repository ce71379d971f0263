"""The intake's HTTP API (svc-intake, docs/intake.md): FastAPI, served by uvicorn on port 8080.

Routes (docs/intake.md):

* ``POST /v1/events``: ``{"events": [...]}``, 1 to 1,000 events
  (docs/intake.md#the-event-mandatory-and-optional-fields);
* ``POST /v1/events/cloud-audit-trail``: a CloudTrail file ``{"Records": [...]}``
  (docs/intake.md#the-cloud-audit-log-file);
* ``GET /healthz``, ``/readyz``, ``/version``, ``/metrics``
  (docs/architecture.md#what-every-component-serves);
* ``GET /openapi.json``: the OpenAPI document of the routes above, bodies included.

Every GET route answers HEAD too, and every answer carries ``X-Request-ID`` (``svc.web``).

The two POST routes need ``Authorization: Bearer <intake token>`` (compared in
constant time; docs/intake.md#routes): 401 without it, 403 with another token. Their bodies may be
gzip (or deflate) compressed (``Content-Encoding``, or a body that starts with the gzip magic bytes,
as CloudTrail's ``.json.gz`` objects do); the size limit holds for the body as sent and after
decompression, which streams with a cap, so a small "gzip bomb" is refused early.

Answers: 202 once the broker committed the batch; 400/413/415 problem details (RFC 9457,
docs/intake.md#answers-and-errors); 503 with ``Retry-After`` when the broker cannot take the batch.
The work that blocks (validation, the Kafka transaction) runs in a worker thread, never on the event
loop.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from svc import __version__, web
from svc.common.health import Readiness, probe_router
from svc.common.limits import harden
from svc.common.problems import Problem, install_problem_handlers, problem_response
from svc.intake.metrics import CONTENT_TYPE, IntakeMetrics
from svc.intake.models import EVENT_BATCH, MAX_EVENTS
from svc.intake.producer import TransactionalPool
from svc.intake.service import IntakeService
from svc.intake.settings import IntakeSettings

__all__ = ["create_app", "inflate", "openapi_components", "serve"]

log = logging.getLogger("svc.intake")

GZIP_MAGIC = b"\x1f\x8b"
_JSON_TYPES = ("application/json", "application/gzip", "application/x-gzip")
_CHUNK = 64 * 1024


def _too_large(limit: int, what: str) -> Problem:
    return Problem(
        413,
        "payload-too-large",
        "Payload too large",
        f"the body {what} is larger than {limit} bytes (split the batch)",
    )


def inflate(data: bytes, limit: int) -> bytes:
    """Decompresses gzip (one or more members) or zlib data, refusing more than ``limit`` bytes.

    Decompression is bounded as it goes (``max_length``), so a "gzip bomb" costs at most
    ``limit`` bytes of memory before it is refused.

    Raises:
        Problem: 413 past ``limit``; 400 ``malformed-body`` for data that is not gzip/zlib or
            is cut short.

    """
    out = bytearray()
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
            buf = rest
            while True:
                out += d.decompress(buf, limit + 1 - len(out))
                if len(out) > limit:
                    raise _too_large(limit, "decompressed")
                if d.unconsumed_tail:
                    buf = d.unconsumed_tail
                    continue
                break
            if not d.eof:
                raise Problem(
                    400,
                    "malformed-body",
                    "The body cannot be decompressed",
                    "gzip data is cut short",
                )
            rest = d.unused_data.lstrip(b"\x00")
    except zlib.error as e:
        raise Problem(
            400, "malformed-body", "The body cannot be decompressed", f"not gzip data: {e}"
        ) from None
    return bytes(out)


async def _read_body(request: Request, limit: int) -> tuple[bytes, bool]:
    """Reads the body up to ``limit`` bytes; returns it and whether to decompress it.

    Raises:
        Problem: 413 (declared or streamed past ``limit``), 415 (a content type or encoding
            the intake does not take).

    """
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype and not (
        ctype in _JSON_TYPES or ctype.endswith("+json") or ctype == "application/octet-stream"
    ):
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            f"`Content-Type: {ctype}`; send application/json (optionally gzip-compressed)",
        )
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
        raise Problem(
            415,
            "unsupported-content-encoding",
            "Unsupported content encoding",
            f"`Content-Encoding: {encoding}`; the intake takes gzip, deflate or none",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, "as sent")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, "as sent")
        chunks.append(chunk)
    body = b"".join(chunks)
    compressed = encoding in ("gzip", "x-gzip", "deflate") or body[:2] == GZIP_MAGIC
    return body, compressed


#: The bearer scheme of the two POST routes, as an OpenAPI security scheme.
_SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "the intake token (`SVC_INTAKE_TOKEN`; docs/intake.md, Routes)",
}

#: The bearer token of the two POST routes as FastAPI reads it (RFC 6750 section 2.1); never
#: refuses by itself, so the route answers a missing or wrong token as docs/intake.md says.
_BEARER = HTTPBearer(
    auto_error=False, scheme_name="intakeToken", description=str(_SECURITY_SCHEME["description"])
)
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]

_STRING = {"type": "string"}

#: What the intake reads of a CloudTrail record (docs/intake.md, "The cloud audit log file");
#: records carry more, which is allowed and ignored.
_CLOUD_RECORD: dict[str, Any] = {
    "type": "object",
    "description": "One CloudTrail record; the fields the intake maps, others are ignored.",
    "additionalProperties": True,
    "required": ["eventTime", "eventSource", "eventName"],
    "properties": {
        "eventTime": {"type": "string", "format": "date-time"},
        "eventSource": _STRING,
        "eventName": _STRING,
        "eventID": _STRING,
        "eventType": _STRING,
        "eventCategory": _STRING,
        "awsRegion": _STRING,
        "recipientAccountId": _STRING,
        "sourceIPAddress": _STRING,
        "userAgent": _STRING,
        "errorCode": _STRING,
        "errorMessage": _STRING,
        "readOnly": {"type": "boolean"},
        "userIdentity": {
            "type": "object",
            "additionalProperties": True,
            "properties": {
                "type": _STRING,
                "arn": _STRING,
                "principalId": _STRING,
                "accountId": _STRING,
                "userName": _STRING,
                "invokedBy": _STRING,
                "sessionContext": {
                    "type": "object",
                    "properties": {
                        "sessionIssuer": {
                            "type": "object",
                            "properties": {"type": _STRING, "arn": _STRING, "userName": _STRING},
                        },
                        "attributes": {
                            "type": "object",
                            "properties": {"mfaAuthenticated": _STRING},
                        },
                    },
                },
            },
        },
        "resources": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": True,
                "properties": {"type": _STRING, "ARN": _STRING, "ARNPrefix": _STRING},
            },
        },
    },
}

_CLOUD_FILE: dict[str, Any] = {
    "type": "object",
    "description": "A CloudTrail log file as the trail writes it (also accepted: a digest "
    "file, answered with `skipped_file: digest`).",
    "required": ["Records"],
    "additionalProperties": True,
    "properties": {
        "Records": {
            "type": "array",
            "maxItems": MAX_EVENTS,
            "items": {"$ref": "#/components/schemas/CloudTrailRecord"},
        }
    },
}

_ACCEPTED: dict[str, Any] = {
    "type": "object",
    "required": ["accepted"],
    "properties": {
        "accepted": {"type": "integer", "minimum": 0},
        "skipped": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"index": {"type": "integer"}, "reason": _STRING},
            },
        },
        "skipped_file": _STRING,
    },
}


def _post_docs(body_schema: str, description: str) -> dict[str, Any]:
    """``openapi_extra`` of a POST route: its JSON body and answers (docs/intake.md).

    The bearer scheme comes from the route's ``HTTPBearer`` dependency.
    """
    problem = web.PROBLEM_RESPONSE
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{body_schema}"}}
            },
        },
        "responses": {
            "202": {
                "description": "the broker committed the whole batch",
                "content": {"application/json": {"schema": _ACCEPTED}},
            },
            "400": problem,
            "401": problem,
            "403": problem,
            "413": problem,
            "415": problem,
            "503": problem,
        },
    }


def openapi_components() -> dict[str, Any]:
    """The schemas and the security scheme the intake's OpenAPI routes refer to.

    Returns:
        ``{"schemas": {...}, "securitySchemes": {...}}``: ``EventBatch`` and the event's parts
        (from the pydantic types that validate them, so the document cannot drift from the
        checks), ``CloudTrailFile``, ``CloudTrailRecord``; ``intakeToken`` (HTTP bearer).

    """
    batch = EVENT_BATCH.json_schema(ref_template="#/components/schemas/{model}")
    schemas = {**batch.pop("$defs"), "EventBatch": batch}
    schemas["CloudTrailFile"] = _CLOUD_FILE
    schemas["CloudTrailRecord"] = _CLOUD_RECORD
    return {"schemas": schemas, "securitySchemes": {"intakeToken": _SECURITY_SCHEME}}


def create_app(settings: IntakeSettings | None = None) -> FastAPI:
    """The intake app (docs/intake.md) for ``settings`` (default: from the environment).

    The app's lifespan starts the transactional producers (they keep trying while the broker
    is away; ``/readyz`` says when they are ready) and closes them.

    Raises:
        pydantic.ValidationError: the settings from the environment are not valid (for
            example no intake token outside dev mode).

    """
    settings = settings or IntakeSettings()
    metrics = IntakeMetrics()
    pool = TransactionalPool(
        settings.bootstrap,
        settings.topic,
        size=settings.producers,
        transactional_id_prefix=settings.transactional_id_prefix(),
        broker_timeout=settings.broker_timeout_secs,
        transaction_timeout_ms=settings.transaction_timeout_ms,
        extra_config=settings.kafka_config,
        metrics=metrics,
    )
    service = IntakeService(settings, pool, metrics)
    token_digest = hashlib.sha256(settings.token_bytes).digest()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        pool.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(pool.close)

    app = FastAPI(
        title="svc-intake",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        responses={"4XX": web.PROBLEM_RESPONSE},
    )
    web.install(app)

    async def token_first(header: str) -> Problem | None:
        """The intake token on every path but the probes, before any body is read or routed."""
        scheme, _, token = header.strip().partition(" ")
        try:
            authenticate(
                HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)
                if scheme.lower() == "bearer"
                else None
            )
        except Problem as p:
            return p
        return None

    # The intake token first on every path (an unknown one too: 401 before 404), bodies bounded
    # before they are read, no internals in a 500; the routes parse (gzip, NDJSON) themselves
    # (docs/intake.md#routes).
    harden(
        app,
        max_body_bytes=settings.max_body_bytes,
        setting=settings.env_name("max_body_bytes"),
        guards=[("/", token_first)],
        check_json=False,
    )
    app.state.settings = settings
    app.state.service = service
    app.state.pool = pool
    app.state.metrics = metrics

    def authenticate(credentials: HTTPAuthorizationCredentials | None) -> None:
        """Checks ``Authorization: Bearer <intake token>`` (docs/intake.md#routes) in constant time.

        Args:
            credentials: what FastAPI's ``HTTPBearer`` read of the header (None: no bearer
                token).

        Raises:
            Problem: 401 without a bearer token, 403 with a wrong one.

        """
        token = credentials.credentials.strip() if credentials is not None else ""
        if not token:
            raise Problem(
                401,
                "unauthenticated",
                "Authentication required",
                "send `Authorization: Bearer <intake token>`",
                headers={"WWW-Authenticate": 'Bearer realm="svc-intake"'},
            )
        # Digests first: equal lengths, so the comparison's time says nothing about the token.
        if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), token_digest):
            raise Problem(403, "forbidden", "Forbidden", "the bearer token is not the intake token")

    async def ingest(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None,
        route: str,
        work: Callable[[bytes], dict[str, Any]],
    ) -> Response:
        started = time.perf_counter()
        try:
            authenticate(credentials)
            body, compressed = await _read_body(request, settings.max_body_bytes)

            def run() -> dict[str, Any]:
                data = inflate(body, settings.max_body_bytes) if compressed else body
                return work(data)

            answer = await anyio.to_thread.run_sync(run)
            response: Response = JSONResponse(answer, status_code=202)
        except Problem as p:
            response = problem_response(p)
        except Exception:
            log.exception("intake: %s failed (request %s)", route, web.request_id())
            response = problem_response(
                Problem(500, "internal-error", "Internal error", "the intake failed; see its log")
            )
        metrics.requests.labels(route, str(response.status_code)).inc()
        metrics.duration.labels(route).observe(time.perf_counter() - started)
        return response

    # The handlers read the body themselves (size limits, gzip, nesting limit before decoding),
    # so its schema is given to OpenAPI here rather than as a parameter FastAPI would parse.
    @app.post(
        "/v1/events",
        status_code=202,
        openapi_extra=_post_docs("EventBatch", "1 to 1,000 events; gzip allowed"),
    )
    async def post_events(request: Request, credentials: _Credentials) -> Response:
        """``{"events": [...]}``: 1 to 1,000 events (docs/intake.md#routes)."""
        return await ingest(request, credentials, "events", service.ingest_events)

    @app.post(
        "/v1/events/cloud-audit-trail",
        status_code=202,
        openapi_extra=_post_docs("CloudTrailFile", "a CloudTrail log file; gzip allowed"),
    )
    async def post_cloud_file(request: Request, credentials: _Credentials) -> Response:
        """A cloud audit log file ``{"Records": [...]}`` (docs/intake.md#routes)."""
        return await ingest(request, credentials, "cloud", service.ingest_cloud_file)

    def readiness() -> Readiness:
        metrics.ready.set(1 if pool.ready else 0)
        if not pool.ready:
            return Readiness((pool.not_ready_reason,))
        broker = "available" if pool.available else "unavailable"
        return Readiness(details={"broker": broker, "topic": settings.topic})

    app.include_router(
        probe_router(
            "svc-intake",
            __version__,
            readiness,
            metrics.registry,
            refresh=lambda: metrics.ready.set(1 if pool.ready else 0),
            ready_description="Ready once a transactional producer is initialised and the "
            "topic exists.",
            metrics_content_type=CONTENT_TYPE,
        )
    )

    install_problem_handlers(app)
    web.add_components(app, openapi_components())
    return app


def serve(settings: IntakeSettings, access_log: bool = False) -> None:
    """Runs the intake under uvicorn on ``settings.host:settings.port`` until SIGINT/SIGTERM.

    Args:
        settings: the intake's settings.
        access_log: log one line per request.

    """
    import gc

    import uvicorn

    # A 1,000-event batch makes some 20,000 short-lived containers; with the default thresholds
    # the cyclic collector runs many times per batch for nothing (nothing here makes cycles).
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        access_log=access_log,
        log_level="info",
        server_header=False,
    )
