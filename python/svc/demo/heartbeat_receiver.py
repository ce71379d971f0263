"""A local stand-in for the vendor's corp portal: prints each heartbeat it would have received.

For ``svc up`` (docs/reporter.md): the reporter sends its heartbeat here instead of to the
vendor, so the demo shows exactly what would leave the install. ``create_app(out)`` serves
``POST /v1/heartbeat``: the body is checked against the heartbeat's schema
(``svc.reporter.service.SCHEMA``), handed to ``out`` (default: printed as one JSON line on
standard output) and answered 202; a body the schema refuses is answered 400 with the first
problem and not passed on. ``received`` keeps the bodies taken.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from svc.reporter.service import SCHEMA

__all__ = ["create_app"]


def _print(body: dict[str, Any]) -> None:
    sys.stdout.write("heartbeat " + json.dumps(body, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def create_app(out: Callable[[dict[str, Any]], None] = _print) -> FastAPI:
    """The receiver (module docs).

    Args:
        out: called with each heartbeat taken.

    Returns:
        A FastAPI app; its ``state.received`` lists the bodies taken.

    """
    app = FastAPI(title="heartbeat receiver (demo)", openapi_url=None, docs_url=None)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    received: list[dict[str, Any]] = []
    app.state.received = received

    @app.post("/v1/heartbeat")
    async def heartbeat(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"detail": "the body is not JSON"}, status_code=400)
        error = next(iter(validator.iter_errors(body)), None)
        if error is not None:
            return JSONResponse({"detail": error.message}, status_code=400)
        received.append(body)
        out(body)
        return JSONResponse({}, status_code=202)

    return app
