"""The connectors' registration: how ``svc up`` and ``svc topology`` run them.

Under ``svc up`` they run on ``port + 10`` against the sources a demo part hands them
(``SOURCES``: the demo company's Drive and Jira fakes on loopback), writing to the context
service with ``<data_dir>/connectors.token``, their cursors in ``<data_dir>/connectors/``;
``svc up`` goes on once their first full sync is done (``/readyz``), so the demo's documents and
work items are there when it is ready. Under ``svc topology`` they are ``svc connectors serve``
reading the same fakes' settings from ``<state>/connectors.env`` (docs/connectors.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import serve_threaded
from svc.connectors.settings import ConnectorsSettings

if TYPE_CHECKING:
    from svc.connectors.app import ConnectorsServer

__all__ = ["REGISTRATION", "SOURCES", "TOPOLOGY_ENV"]

#: ``UpRuntime.shared`` key: a function taking ``ConnectorsSettings`` fields and returning the
#: settings that read the install's sources (the demo's fakes under ``svc up``).
SOURCES = "connectors.sources"

#: The file, in ``svc topology``'s state directory, holding the connectors' source settings
#: (``SVC_CONNECTORS_*`` lines, written by the demo's sources process before they start).
TOPOLOGY_ENV = "connectors.env"


@contextmanager
def _start(rt: UpRuntime) -> Iterator[ConnectorsServer]:
    """The connectors in this process until the block ends, ready after their first sync.

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use), or the first sync
            did not end within ``START_TIMEOUT`` (the message says what was missing).

    """
    from svc.connectors.app import ConnectorsServer

    state = rt.data_dir / "connectors"
    state.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "host": rt.host,
        "port": rt.port("connectors"),
        "context_url": rt.url("context"),
        "context_token_file": str(rt.token_file(Role.CONNECTORS)),
        "state_path": str(state / "state.db"),
    }
    sources = rt.shared.get(SOURCES)
    settings = sources(**fields) if sources is not None else ConnectorsSettings(**fields)
    server = ConnectorsServer(settings)
    with serve_threaded(server, settings.host, settings.port, "connectors", rt.url("connectors")):
        yield server


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc connectors serve`` with the sources of ``<state>/connectors.env``."""
    env = {
        "SVC_CONNECTORS_CONTEXT_URL": t.url("context"),
        "SVC_CONNECTORS_CONTEXT_TOKEN_FILE": str(t.token_file(Role.CONNECTORS)),
        "SVC_CONNECTORS_STATE_PATH": str(t.state / "connectors" / "state.db"),
    }
    path = t.state / TOPOLOGY_ENV
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            name, _, value = line.partition("=")
            if name.startswith("SVC_CONNECTORS_"):
                env[name] = value
    port = t.port("connectors")
    return [
        Process("connectors", svc_command("connectors", "serve", "--port", str(port)), port, env)
    ]


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  connectors      {rt.url('connectors')}   Google Drive files and Jira issues into the "
        "context service (here the demo company's, from local fakes)"
    ]


REGISTRATION = Registration(
    name="connectors",
    title="connectors",
    settings=(ConnectorsSettings,),
    up_port=10,
    topology_ports={"connectors": 13},
    depends_on=("context",),
    phase="starting the connectors and their first sync",
    start=_start,
    processes=_processes,
    banner=_banner,
)
