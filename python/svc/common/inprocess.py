"""Running a component inside another process: ports, HTTP apps in threads, periodic work.

``svc up`` runs every component in one process
(docs/architecture.md#embedded-defaults-and-production-parts); each component's registration
(``svc.common.component``) starts its part with these pieces, as a context manager that
returns once the part is ready and stops it when its block ends:

* ``bind`` / ``check_ports``: a port taken or not allowed is ``PortTaken``, naming the port and
  the component;
* ``serve_http``: a FastAPI (ASGI) app under uvicorn on an asyncio loop in a thread of its own,
  ready once uvicorn's startup (lifespan, then listener) finished, never a sleep loop;
* ``wait_ready``: asks a component's ``/readyz`` until it answers 200, for a part that offers no
  event to wait on;
* ``every``: runs work every so many seconds in a daemon thread until the block ends.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import uvicorn
from fastapi import FastAPI

from svc.common.net import tcp_listener

__all__ = [
    "HTTP_STOP_TIMEOUT",
    "START_TIMEOUT",
    "PortTaken",
    "bind",
    "check_ports",
    "every",
    "persistent_token",
    "reraise_port",
    "serve_http",
    "serve_threaded",
    "wait_ready",
]

#: Longest wait, in seconds, for an HTTP app to listen (and for a part's own readiness).
START_TIMEOUT = 60.0

#: Longest wait, in seconds, for an HTTP app to finish its requests and stop.
HTTP_STOP_TIMEOUT = 30.0


class PortTaken(Exception):
    """A port a component needs is in use or not allowed; the message names it and what to do.

    Attributes:
        host, port: the address.
        name: the component that needs it (``history``, ``decision point``).
        why: ``in use`` or ``not allowed``.
        hint: what to do besides stopping whatever holds it; ``svc up`` names its ``--port``
            and the range it takes (``with_hint``).

    """

    def __init__(
        self, host: str, port: int, name: str, why: str, hint: str = "start it on another port"
    ) -> None:
        self.host, self.port, self.name, self.why, self.hint = host, port, name, why, hint
        super().__init__(str(self))

    def __str__(self) -> str:
        return (
            f"port {self.port} on {self.host} (the {self.name}) is {self.why}; "
            f"stop whatever holds it or {self.hint}"
        )

    def with_hint(self, hint: str) -> PortTaken:
        """The same refusal suggesting `hint` instead."""
        return PortTaken(self.host, self.port, self.name, self.why, hint)


def bind(host: str, port: int, name: str) -> socket.socket:
    """A TCP socket bound to (`host`, `port`) (``svc.common.net.tcp_listener``), not listening.

    Args:
        host: the address.
        port: the port.
        name: the component, named in the error (``history``, ``decision point``).

    Raises:
        PortTaken: the port is in use or not allowed (the message names it and `name`).
        OSError: another bind error (an address not on this machine, for example).

    """
    try:
        return tcp_listener(host, port)
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            why = "in use" if e.errno == errno.EADDRINUSE else "not allowed"
            raise PortTaken(host, port, name, why) from None
        raise


def check_ports(host: str, ports: Mapping[str, int]) -> None:
    """Binds each port for a moment to see that it is free.

    Args:
        host: the address the components will bind.
        ports: component name -> port.

    Raises:
        PortTaken: a port is in use (the message names it and the component).
        OSError: another bind error.

    """
    for name, port in ports.items():
        bind(host, port, name).close()


def reraise_port(e: OSError, host: str, port: int, name: str) -> None:
    """Turns a bind failure of a server that binds its own port into ``PortTaken``.

    For parts that bind inside their own ``start`` (hypercorn servers, the demo's issuers):
    when `e` is ``EADDRINUSE`` or ``EACCES`` the port is bound again here, which raises
    ``PortTaken`` naming it and `name`; otherwise nothing happens and the caller re-raises `e`.

    Raises:
        PortTaken: the port is in use or not allowed.

    """
    if e.errno in (errno.EADDRINUSE, errno.EACCES):
        bind(host, port, name).close()


class _Threaded(Protocol):
    """A server that runs in a thread of its own: ``start()`` returns once it listens."""

    def start(self) -> Any: ...

    def stop(self) -> Any: ...


S = TypeVar("S", bound=_Threaded)


@contextmanager
def serve_threaded(
    server: S, host: str, port: int, name: str, ready_url: str | None = None
) -> Iterator[S]:
    """Runs `server` (``start``, then ``stop`` at the block's end), ready before it yields.

    For parts that bind their own port in a thread of their own
    (``svc.common.connect.ThreadedServer`` and the demo's issuers).

    Args:
        server: the server, not started.
        host: the address it binds (named when the port is taken).
        port: the port it binds.
        name: the part, in errors.
        ready_url: its base URL when readiness is its ``/readyz`` (``wait_ready``); None:
            ready once it listens.

    Yields:
        `server`, started.

    Raises:
        PortTaken: the port is in use or not allowed.
        OSError: it did not start, or was not ready within ``START_TIMEOUT``.

    """
    try:
        server.start()
    except OSError as e:
        reraise_port(e, host, port, name)
        raise
    try:
        if ready_url is not None:
            wait_ready(ready_url, name)
        yield server
    finally:
        server.stop()


@contextmanager
def every(interval: float, work: Callable[[], None], name: str) -> Iterator[None]:
    """Runs `work` every `interval` seconds in a daemon thread `name` while the block runs.

    The thread waits on a stop event between runs, so the block's end stops it at once (after
    a run under way). `work` logs its own errors; an exception it lets out ends the thread.
    """
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            work()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def persistent_token(path: Path) -> str:
    """The random token kept in `path`: created once (mode 0600), then read on every start.

    For the shared secrets ``svc up`` keeps in its data directory (the intake token, the SCIM
    token; docs/auth.md).

    Raises:
        OSError: the file cannot be read or created.

    """
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token


class _Uvicorn(uvicorn.Server):
    """A uvicorn server that sets `settled` once its startup (lifespan, then listener) is done."""

    def __init__(self, config: uvicorn.Config, settled: threading.Event) -> None:
        super().__init__(config)
        self.settled = settled

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Runs uvicorn's startup, then sets `settled` (a failed startup raises SystemExit)."""
        await super().startup(sockets=sockets)
        self.settled.set()


@contextmanager
def serve_http(app: FastAPI, host: str, port: int, name: str) -> Iterator[None]:
    """Serves `app` under uvicorn, on an asyncio loop in its own thread ``svc-up-<name>``.

    The port is bound here (a port taken since ``check_ports`` fails here, in the caller's
    thread). Ready once uvicorn's startup finished: its ``startup`` sets an event this waits on;
    the thread's end sets it too, so a failed startup is reported at once. At the end uvicorn
    finishes the requests under way and stops (``should_exit``), and the thread is joined.

    Args:
        app: the ASGI app (its lifespan runs the component's background work).
        host: the address to bind.
        port: the port.
        name: the component, in errors and the thread's name.

    Raises:
        PortTaken: the port is in use.
        OSError: the server did not start (its lifespan failed, or it took over
            ``START_TIMEOUT`` seconds).

    """
    sock = bind(host, port, name)
    settled = threading.Event()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    server = _Uvicorn(config, settled)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as e:  # SystemExit from a failed startup; reported below
            failure.append(e)
        finally:
            settled.set()

    thread = threading.Thread(target=serve, name=f"svc-up-{name}", daemon=True)
    thread.start()
    try:
        if not settled.wait(START_TIMEOUT):
            raise OSError(f"the {name} did not start in {START_TIMEOUT:g} s")
        if not server.started:
            why = repr(failure[0]) if failure else "it stopped while starting"
            raise OSError(f"the {name} did not start: {why}")
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=HTTP_STOP_TIMEOUT)
        sock.close()


def wait_ready(url: str, name: str, timeout: float = START_TIMEOUT) -> None:
    """Asks ``<url>/readyz`` every 50 ms until it answers 200.

    For a part that offers no event to wait on (the gateway: every upstream connected, its
    feeds loaded; docs/gateway.md#routes).

    Args:
        url: the component's base URL (``http://127.0.0.1:8087``).
        name: the component, in the error.
        timeout: seconds to wait at most.

    Raises:
        OSError: not ready within `timeout` (the message holds the last answer or error).

    """
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:
        while True:
            try:
                r = client.get(f"{url}/readyz")
                if r.status_code == 200:
                    return
                why = r.text
            except httpx.TransportError as e:
                why = str(e)
            if time.monotonic() > deadline:
                raise OSError(f"the {name} was not ready in {timeout:.0f} s: {why}")
            time.sleep(0.05)
