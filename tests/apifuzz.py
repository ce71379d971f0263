"""Serving a Python service's app for real (uvicorn on 127.0.0.1) to fuzz it over HTTP.

The schemathesis tests of the intake (tests/test_intake.py) and of the history routes
(tests/test_history.py) run against the app served by uvicorn, as `svc up` serves it, so the
requests go through a real HTTP server (parsing, HEAD, headers) and the app's lifespan.

`FUZZ_EXAMPLES` (env `SVC_API_FUZZ_EXAMPLES`, default 100) bounds the generated examples per
operation and phase; `SVC_API_FUZZ_EXAMPLES=500` for a longer run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from svc.common.net import tcp_listener

FUZZ_EXAMPLES = int(os.environ.get("SVC_API_FUZZ_EXAMPLES", "100"))

FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)


def load(document: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """A schemathesis schema of an OpenAPI document, with every built-in check enabled.

    `headers` go with every request (the intake's bearer token). 413 is counted as a refusal
    of schema-violating data too: it is how the services refuse too many items (RFC 9110
    section 15.5.14), which the schema's `maxItems` says. `positive_data_acceptance` (data
    that fits the schema gets a 2xx) is off: the intake's rules reach past what JSON Schema
    says (an event's time against the server's clock, `count` only with `access`, an IP
    address), so such data gets a 400 that is right.
    """
    config = SchemathesisConfig.from_dict(
        {
            "headers": headers or {},
            "checks": {
                "negative_data_rejection": {
                    "expected-statuses": ["400", "401", "403", "404", "405", "413", "415"]
                },
                "positive_data_acceptance": {"enabled": False},
            },
        }
    )
    return schemathesis.openapi.from_dict(document, config=config)


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Runs `app` under uvicorn on a free port of 127.0.0.1; yields its base URL; stops it."""
    sock = tcp_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, server_header=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
