"""The demo's parts as registrations (``svc.common.component``): never an install's own.

``svc up`` (and ``svc topology``) run, beside the components, what the demo company needs
(docs/demo.md):

* ``demo-directory``: writes the demo company into the context service the first time (people
  and groups over SCIM, tickets and customers, agents, risk scores; ``svc.demo.directory``);
* ``demo-sources``: the demo company's Google Drive and Jira fakes on loopback
  (``svc.demo.sources``), which the connectors read, so its folders, documents and work items
  come into the context service through the connector path (docs/connectors.md#the-local-fakes);
* ``agent-issuer``: the development issuer of agent tokens (``svc.demo.token_issuer``: the keys
  of the apps trusted for the demo agents, JWKS over HTTPS with its own CA), whose apps are
  trusted in the context service on every start;
* ``idp``: the development OpenID Connect provider of the challenge page
  (``svc.challenge.dev_idp``: anyone signs in as any user name);
* ``demo-containments``: contains the demo company's contained people through the challenge
  service when its database is created (a later ``Lift`` stays lifted);
* ``demo-month``: a month of the demo company's history, backfilled into a history that holds
  no decision yet (``svc.demo.backfill``), with an insider moving data out and an agent acting
  beyond its people in its last days, for the reasoner's first cycle;
* ``heartbeat-receiver``: where the reporter's heartbeats go under ``svc up``, a local receiver
  that appends each to ``<data_dir>/heartbeats.jsonl`` (what the vendor would get;
  docs/reporter.md);
* ``tools``: the demo company's tools server (``svc.demo.tools_server``), the gateway's
  upstream: a stdio child of the gateway under ``svc up``, a process over Streamable HTTP under
  ``svc topology``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svc.challenge.component import CREATED
from svc.common.component import Process, Registration, Role, TopologyRuntime, UpRuntime
from svc.common.inprocess import serve_threaded
from svc.connectors.component import SOURCES
from svc.context.component import SCIM_TOKEN
from svc.gateway.component import JWKS_CA_FILE, UPSTREAMS
from svc.reporter.component import PORTAL_URL

if TYPE_CHECKING:
    from svc.gateway.settings import Upstream

__all__ = ["REGISTRATIONS", "demo_upstreams"]

log = logging.getLogger("svc.demo")

#: The agent-token issuer's directory, in ``svc up``'s data directory and the topology's state.
ISSUER_DIR = "token-issuer"


@contextmanager
def _provision_directory(rt: UpRuntime) -> Iterator[None]:
    """Writes the demo company into the context service when it holds nobody yet.

    As a real install would (``svc.demo.directory.provision_context``).

    Raises:
        svc.demo.directory.ProvisionError: the service refused a request.

    """
    if rt.demo and rt.running["context"].counts()["people"] == 0:
        from svc.demo.directory import provision_context

        rt.progress("provisioning the demo company through the context service")
        done = provision_context(
            rt.url("context"),
            rt.demo_company,
            scim_token=rt.shared[SCIM_TOKEN],
            token=rt.token(Role.OPERATOR, "context", 600),
            connected=True,
        )
        log.info("provisioned the demo company through the context service: %s", done)
    yield


@contextmanager
def _sources(rt: UpRuntime) -> Iterator[Any]:
    """The demo company's Drive and Jira fakes until the end; the connectors read them.

    Raises:
        OSError: a port cannot be bound, or a credential file cannot be written.

    """
    if not rt.demo:
        yield None
        return
    from svc.demo.sources import DemoSources

    sources = DemoSources(rt.demo_company, rt.data_dir / "demo-sources", rt.host).start()
    try:
        rt.shared[SOURCES] = sources.connector_settings
        yield sources
    finally:
        sources.stop()


@contextmanager
def _heartbeat_receiver(rt: UpRuntime) -> Iterator[Any]:
    """The local receiver of the reporter's heartbeats until the end (module docs)."""
    from svc.demo.sources import HeartbeatReceiverServer

    path = rt.data_dir / "heartbeats.jsonl"
    lock = threading.Lock()

    def keep(body: dict[str, Any]) -> None:
        with lock, path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(body, separators=(",", ":")) + "\n")

    receiver = HeartbeatReceiverServer(keep, rt.host).start()
    try:
        rt.shared[PORTAL_URL] = receiver.url
        yield receiver
    finally:
        receiver.stop()


@contextmanager
def _backfill_history(rt: UpRuntime) -> Iterator[None]:
    """Stores the demo company's month of history the first time (``svc.demo.backfill``).

    Routine traffic with two stories ending yesterday (an insider moving data out, an agent
    acting beyond its people), so the reasoner's first cycle has a baseline to score against
    and something to flag (docs/demo.md). Only into a history holding no decision yet.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: an INSERT failed.

    """
    if rt.demo and not rt.history.command("SELECT count() FROM decisions"):
        from svc.demo.backfill import backfill

        rt.progress("backfilling the demo company's month of history")
        month = backfill(rt.history, rt.demo_company)
        log.info("backfilled the demo company's month: %s", month)
    yield


@contextmanager
def _provision_containments(rt: UpRuntime) -> Iterator[None]:
    """Contains the demo company's contained people through the challenge service, once.

    ``Contain`` as the reasoner or the portal would (``svc.demo.directory``), only when this
    start created the challenge service's database.

    Raises:
        svc.demo.directory.ProvisionError: the service refused a call.

    """
    if rt.demo and rt.shared.get(CREATED):
        from svc.demo.directory import provision_containments

        rt.progress("containing the demo company's contained person")
        n = provision_containments(
            rt.url("challenge"),
            rt.demo_company,
            token=rt.token(Role.OPERATOR, "challenge", 600),
        )
        log.info("contained %d people of the demo company through the challenge service", n)
    yield


@contextmanager
def _agent_issuer(rt: UpRuntime) -> Iterator[Any]:
    """The demo's agent-token issuer on its port (HTTPS) until the end; its apps trusted.

    Its keys stay in ``<data_dir>/token-issuer`` across restarts. The apps are trusted as an
    admin would trust the apps that run the demo agents (an upsert: a new port replaces the
    URLs; docs/architecture.md#trusted-app-issuers).

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use), or the keys or
            certificates cannot be written.

    """
    from svc.demo.token_issuer import DevTokenIssuer

    port = rt.port("agent-issuer")
    issuer = DevTokenIssuer(rt.data_dir / ISSUER_DIR, rt.host, port)
    with serve_threaded(issuer, rt.host, port, "demo token issuer"):
        for record in issuer.trusted_apps():
            rt.running["context"].put_trusted_app(record)
        rt.shared[JWKS_CA_FILE] = str(issuer.ca_file)
        yield issuer


@contextmanager
def _identity_provider(rt: UpRuntime) -> Iterator[Any]:
    """The demo's OpenID Connect provider until the end.

    For the demo only: its form signs anybody in as any user name; a real install points the
    challenge service's ``oidc_issuer`` at its own provider (docs/challenges.md#sign-in).

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use).

    """
    from svc.challenge.dev_idp import DevIdentityProvider

    port = rt.port("idp")
    idp = DevIdentityProvider(rt.host, port)
    with serve_threaded(idp, rt.host, port, "demo identity provider"):
        yield idp


def demo_upstreams() -> dict[str, Upstream]:
    """The gateway's upstream under ``svc up``: the demo company's tools server over stdio.

    ``demo``: ``python -m svc.demo.tools_server`` with this interpreter (``svc`` importable
    from where this module was loaded), each tool mapped to the argument naming the document
    or ticket it reads or writes (``svc.demo.tools_server.TOOLS``, docs/demo.md#the-tools).
    """
    import svc
    from svc.demo.tools_server import NAME, TOOLS
    from svc.gateway.settings import ToolMapping, Upstream

    package_root = Path(svc.__file__).resolve().parent.parent
    return {
        NAME: Upstream(
            command=[sys.executable, "-m", "svc.demo.tools_server"],
            env={"PYTHONPATH": str(package_root)},
            tools={
                name: ToolMapping(
                    resource_arg=t.argument, resource_type=t.type, read_only=t.read_only
                )
                for name, t in TOOLS.items()
            },
        )
    }


@contextmanager
def _tools(rt: UpRuntime) -> Iterator[None]:
    """Hands the gateway its upstream: the tools server as a stdio child of the gateway."""
    rt.shared[UPSTREAMS] = demo_upstreams()
    yield


def _issuer_processes(t: TopologyRuntime) -> list[Process]:
    port = t.port("agent-issuer")
    argv = [
        sys.executable,
        "-m",
        "svc.demo.token_issuer",
        "--directory",
        str(t.agent_issuer_dir),
        "--port",
        str(port),
    ]
    return [Process("agent-issuer", argv, port)]


def _trust_agent_apps(t: TopologyRuntime) -> None:
    """Trusts the agent-token issuer's apps and writes the gateway's upstreams.

    Run once the issuer is ready, before the gateway starts: the apps go to the context
    service (``POST /v1/directory/trusted-apps``, upserts, docs/context.md), and the upstreams
    (the tools server's own process over Streamable HTTP) to ``gateway_upstreams_file``.

    Raises:
        RuntimeError: the context service refused a record.

    """
    import httpx

    from svc.demo.token_issuer import DevTokenIssuer

    apps = DevTokenIssuer.from_directory(t.agent_issuer_dir).trusted_apps()
    headers = {"authorization": f"Bearer {t.secret(f'{Role.OPERATOR}.token')}"}
    for app in apps:
        r = httpx.post(
            f"{t.url('context')}/v1/directory/trusted-apps", json=app, headers=headers, timeout=30
        )
        if not r.is_success:
            raise RuntimeError(f"the context service refused trusted app {app}: {r.text}")
    upstreams = {
        name: {
            **u.model_dump(mode="json", exclude_none=True, exclude={"command", "env"}),
            "url": f"{t.url('tools')}/mcp",
        }
        for name, u in demo_upstreams().items()
    }
    t.gateway_upstreams_file.write_text(json.dumps(upstreams, indent=2))


def _tools_processes(t: TopologyRuntime) -> list[Process]:
    port = t.port("tools")
    argv = [sys.executable, "-m", "svc.demo.tools_server", "--http", "--port", str(port)]
    return [Process("tools", argv, port)]


def _issuer_banner(rt: UpRuntime) -> list[str]:
    d = rt.data_dir / ISSUER_DIR
    return [
        f"  agent tokens    {rt.url('agent-issuer')}   the demo apps' keys (CA "
        f"{d / 'ca.pem'}); svc demo token --agent ID --for PERSON"
    ]


DIRECTORY = Registration(
    name="demo-directory",
    title="demo company's directory",
    depends_on=("context",),
    start=_provision_directory,
    chart=False,
    demo=True,
)

SOURCES_REGISTRATION = Registration(
    name="demo-sources",
    title="demo company's sources",
    depends_on=("demo-directory",),
    start=_sources,
    chart=False,
    demo=True,
)

HEARTBEAT_RECEIVER = Registration(
    name="heartbeat-receiver",
    title="demo heartbeat receiver",
    start=_heartbeat_receiver,
    chart=False,
    demo=True,
)

REGISTRATIONS = (
    Registration(
        name="agent-issuer",
        title="demo token issuer",
        up_port=8,
        topology_ports={"agent-issuer": 11},
        depends_on=("context",),
        phase="starting the demo token issuer",
        start=_agent_issuer,
        processes=_issuer_processes,
        after_ready=_trust_agent_apps,
        ready_tls_ca=lambda t: t.jwks_ca_file,
        banner=_issuer_banner,
        chart=False,
        demo=True,
    ),
    Registration(
        name="idp",
        title="demo identity provider",
        up_port=6,
        phase="starting the demo identity provider",
        start=_identity_provider,
        chart=False,
        demo=True,
    ),
)

#: Registered after the history and before the reasoner (``svc.registry``).
MONTH = Registration(
    name="demo-month",
    title="demo company's month of history",
    depends_on=("history",),
    start=_backfill_history,
    chart=False,
    demo=True,
)

#: Registered after the challenge service and before the gateway (``svc.registry``).
CONTAINMENTS = Registration(
    name="demo-containments",
    title="demo company's containments",
    depends_on=("challenge",),
    start=_provision_containments,
    chart=False,
    demo=True,
)

TOOLS = Registration(
    name="tools",
    title="demo tools server",
    topology_ports={"tools": 12},
    start=_tools,
    processes=_tools_processes,
    chart=False,
    demo=True,
)
