"""Stopping a threaded hypercorn server never hangs (``svc.common.connect.serve_asgi``).

Hypercorn cancels the connections still open after its ``graceful_timeout`` and waits for the
cancelled tasks to end; a request that swallows its cancellation would keep the server thread
(and whoever stops it: a test's teardown, ``svc up``) waiting for good. ``serve_asgi`` with
``stop`` leaves such a server's loop after ``STOP_BOUND_SECS`` (lowered here) and its thread
ends. A well-behaved server stops as before, its app's lifespan shut down.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import httpx
import pytest

from svc.common import connect

# The request left behind is collected with its coroutine still suspended: Python reports it.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _app(entered: threading.Event, lifespan: list[str]) -> Any:
    """An ASGI app whose every HTTP request waits for good, swallowing each cancellation."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                lifespan.append(message["type"])
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        entered.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the misbehaviour: the request will not end

    return app


def _serve(app: Any, stop: threading.Event) -> tuple[threading.Thread, int]:
    ports: list[int] = []
    listening = threading.Event()

    def ready(port: int) -> None:
        ports.append(port)
        listening.set()

    thread = threading.Thread(
        target=connect.serve_asgi,
        args=(app, "127.0.0.1", 0, "svc-stop-test"),
        kwargs={"ready": ready, "stop": stop},
        daemon=True,
    )
    thread.start()
    assert listening.wait(30), "the server did not listen"
    return thread, ports[0]


def test_a_request_that_will_not_end_does_not_hang_the_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connect, "STOP_BOUND_SECS", 0.5)
    entered = threading.Event()
    lifespan: list[str] = []
    stop = threading.Event()
    thread, port = _serve(_app(entered, lifespan), stop)

    def request() -> None:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        except httpx.HTTPError:
            pass  # the connection is dropped or times out: either way it got no answer

    client = threading.Thread(target=request, daemon=True)
    client.start()
    assert entered.wait(30), "the request did not reach the app"
    stop.set()
    thread.join(60)  # a guard: the bound is 1.5 s here; without it the join never returns
    assert not thread.is_alive(), "the stop hung"
    assert lifespan[0] == "lifespan.startup"
    gc.collect()


def test_a_well_behaved_server_stops_with_its_lifespan_shut_down() -> None:
    lifespan: list[str] = []
    stop = threading.Event()
    thread, _ = _serve(_app(threading.Event(), lifespan), stop)
    stop.set()
    thread.join(60)
    assert not thread.is_alive()
    assert lifespan == ["lifespan.startup", "lifespan.shutdown"]
