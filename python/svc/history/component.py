"""The history's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` the history store (chDB in ``<data_dir>/history``) and its loader are opened
by ``svc up`` itself before any component, since the policy service's dry runs read the same
client; this registration serves the query routes on ``port + 2`` over them. Under ``svc
topology`` it is one process with the loader and the routes (``serve_history``), over chDB on a
file path or a ClickHouse server (docs/history.md#engines-and-dsns).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from svc.common.auth_settings import HistoryAuthSettings
from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import serve_http
from svc.history.loader import LoaderSettings

__all__ = ["REGISTRATION", "serve_history"]

log = logging.getLogger("svc.history")


@contextmanager
def _start(rt: UpRuntime) -> Iterator[None]:
    """The history routes over ``svc up``'s store and loader until the block ends.

    ``/readyz`` is the loader thread's health (docs/history.md).

    Raises:
        PortTaken, OSError: the port cannot be bound, or the app did not start.
        AuthConfigError: the issuer's keys cannot be loaded.

    """
    from svc.history.service import create_app

    app = create_app(
        rt.history,
        rt.loader,
        auth=HistoryAuthSettings(**rt.auth("history")),
        ready=rt.shared[HISTORY_RUNNING],
    )
    with serve_http(app, rt.host, rt.port("history"), "history"):
        yield


#: ``UpRuntime.shared`` key: returns whether ``svc up``'s loader thread runs.
HISTORY_RUNNING = "history.running"


def serve_history(dsn: str, kafka_url: str, host: str, port: int) -> None:
    """The history process: the loader and the history routes (``svc topology history``).

    Applies the schema (idempotent; creating the DSN's database), runs ``svc.history.Loader``
    in a thread and serves ``svc.history.service.create_app`` (``/readyz`` is the loader's
    health, docs/history.md) under uvicorn until SIGTERM or SIGINT; then the loader stores and
    commits what it read and stops. Bearer-token settings: ``SVC_HISTORY_AUTH_*``.

    Args:
        dsn: the history store (docs/history.md#engines-and-dsns).
        kafka_url: the broker (``kafka://host:port``).
        host: the address to bind.
        port: the port.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the store or its schema failed.
        svc.common.auth.AuthConfigError: the auth settings are incomplete.

    """
    import uvicorn

    from svc import history
    from svc.common.topics import bootstrap_servers
    from svc.history.service import create_app

    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    # The loader's own batch bounds (docs/history.md#loader), as `svc history load` and the chart
    # use them: one INSERT a second per kind, not five, is what the store is built for.
    loader = history.Loader(client, bootstrap_servers(kafka_url))
    failed: list[BaseException] = []

    def load() -> None:
        try:
            loader.run()
        except BaseException as e:
            failed.append(e)
            log.exception("the history loader stopped on an error")

    thread = threading.Thread(target=load, name="svc-history-loader", daemon=True)
    thread.start()
    auth = HistoryAuthSettings()
    app = create_app(client, loader, auth=auth, ready=thread.is_alive)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        loader.stop()
        thread.join(timeout=60)


def _processes(t: TopologyRuntime) -> list[Process]:
    """The loader and the routes in one process (``svc topology history``)."""
    port = t.port("history")
    argv = svc_command(
        "topology", "history", "--dsn", t.history_dsn, "--kafka", t.kafka_url, "--port", str(port)
    )
    return [Process("history", argv, port, t.auth_env("history"))]


def _banner(rt: UpRuntime) -> list[str]:
    return [f"  history         {rt.url('history')}   GET /v1/history/decisions?principal=Type::id"]


REGISTRATION = Registration(
    name="history",
    title="history",
    settings=(LoaderSettings, HistoryAuthSettings),
    audience="svc-history",
    callers=(Role.OPERATOR, Role.PORTAL),
    up_port=2,
    topology_ports={"history": 2},
    phase="starting the intake and the history routes",
    start=_start,
    processes=_processes,
    banner=_banner,
)
