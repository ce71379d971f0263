"""The reporter's registration: how ``svc up`` and ``svc topology`` run it.

It reads every other registered component's ``/version``, ``/readyz`` and ``/metrics`` and
sends the fixed-schema heartbeat once a minute (docs/reporter.md). Under ``svc up`` on
``port + 11``, sending to the receiver a demo part hands it (``PORTAL_URL``: a local receiver
that writes what the vendor would get to ``<data_dir>/heartbeats.jsonl``); its install id in
``<data_dir>/install-id``. Under ``svc topology`` it is ``svc reporter serve`` watching every
process, sending nowhere unless ``SVC_REPORTER_PORTAL_URL`` is set.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from svc.common.component import Process, Registration, TopologyRuntime, UpRuntime, svc_command
from svc.common.inprocess import serve_threaded
from svc.reporter.settings import ReporterSettings

if TYPE_CHECKING:
    from svc.reporter.app import ReporterServer

__all__ = ["PORTAL_URL", "REGISTRATION", "WATCHED"]

#: ``UpRuntime.shared`` key: where heartbeats go under ``svc up`` (the demo's receiver).
PORTAL_URL = "reporter.portal_url"

#: The components the reporter watches: those that serve the four probes over HTTP.
WATCHED = (
    "pdp",
    "intake",
    "history",
    "policy",
    "context",
    "challenge",
    "gateway",
    "connectors",
    "reasoner",
    "portal",
)


@contextmanager
def _start(rt: UpRuntime) -> Iterator[ReporterServer]:
    """The reporter in this process until the block ends (ready once it listens).

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use).

    """
    from svc.reporter.app import ReporterServer

    settings = ReporterSettings(
        host=rt.host,
        port=rt.port("reporter"),
        portal_url=rt.shared.get(PORTAL_URL),
        install_id_file=str(rt.data_dir / "install-id"),
        components={name: rt.url(name) for name in WATCHED if name in rt.running},
    )
    server = ReporterServer(settings)
    with serve_threaded(server, settings.host, settings.port, "reporter"):
        yield server


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc reporter serve`` watching both decision points and every other component."""
    # The reasoner runs in the topology only over a ClickHouse server (svc.reasoner.component).
    clickhouse = t.history_dsn.startswith(("http://", "https://"))
    names = [n for n in WATCHED if n != "pdp" and (n != "reasoner" or clickhouse)]
    components = {n: t.url(n) for n in names} | {n: t.url(n) for n in ("pdp-1", "pdp-2")}
    env = {
        "SVC_REPORTER_COMPONENTS": json.dumps(components),
        "SVC_REPORTER_INSTALL_ID_FILE": str(t.state / "install-id"),
    }
    port = t.port("reporter")
    return [Process("reporter", svc_command("reporter", "serve", "--port", str(port)), port, env)]


def _banner(rt: UpRuntime) -> list[str]:
    where = (
        f"the vendor would get it: {rt.data_dir / 'heartbeats.jsonl'}"
        if rt.shared.get(PORTAL_URL)
        else "off (no portal URL)"
    )
    return [f"  reporter        {rt.url('reporter')}   a health heartbeat each minute; {where}"]


REGISTRATION = Registration(
    name="reporter",
    title="reporter",
    settings=(ReporterSettings,),
    up_port=11,
    topology_ports={"reporter": 14},
    phase="starting the reporter",
    start=_start,
    processes=_processes,
    banner=_banner,
)
