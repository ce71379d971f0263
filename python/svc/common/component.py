"""The shape of a component's registration: what ``svc up``, ``svc topology`` and the chart need.

Every component declares, beside its own code (``svc/<component>/component.py``), one
``Registration``: its name, the settings classes that read its environment, the callers
(roles) its API admits, its port under ``svc up`` and its processes under ``svc topology``,
what it depends on, how it starts in this process and as processes, and how readiness is
seen. ``svc.registry`` lists them in start order; ``svc up`` (``svc.up.Stack``), ``svc topology``
(``svc.topology.Topology``), the banner, the port check and the chart's test iterate over it
(docs/architecture.md#the-component-registry).

Two runtimes are handed to the registrations:

* ``UpRuntime``: ``svc up``'s, one process on the embedded defaults. A registration's
  ``start`` is a context manager entered on it: it starts the part, returns once the part is
  ready, and stops it when the block ends (also when it fails half-way through its own start).
* ``TopologyRuntime``: ``svc topology``'s, each component its own process on PostgreSQL and
  Kafka; a registration's ``processes`` gives the command lines.

**Roles.** A caller is named by its role (``Role``): who it is in docs/auth.md's callers
table; ``svc.common.roles`` lists which roles may call each method. ``svc up`` and
``svc topology`` give each role a token subject (``svc-up-<role>``, ``svc-topology-<role>``;
the person at the machine is ``svc-local`` / ``svc-topology``), and the chart a service account
(``<release>-svc-<role>``); each component's settings map those subjects to their roles
(``SVC_<COMPONENT>_AUTH_ROLES``). A role's token carries the audience of every component whose
registration admits it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic_settings import BaseSettings

__all__ = [
    "Process",
    "Registration",
    "Role",
    "TopologyRuntime",
    "UpRuntime",
    "svc_command",
]


def svc_command(*args: str) -> list[str]:
    """``python -m svc ARGS`` with this interpreter: a process of ``svc topology``."""
    return [sys.executable, "-m", "svc", *args]


class Role:
    """The callers of docs/auth.md's table, by role (module docs)."""

    #: The person at the machine, or the admin's command-line tools (``svc policy``, ...).
    OPERATOR = "operator"
    #: ``svc demo``'s traffic (decision point only; ``svc up`` alone).
    DEMO = "demo"
    #: Decision points: follow bundles, principals, resources, containments; resolve challenges.
    PDP = "pdp"
    #: The challenge service: reads the directory, asks whether an approver may ``approve``.
    CHALLENGE = "challenge"
    #: MCP gateways: checks, outage tiers, trusted apps, containments.
    GATEWAY = "gateway"
    #: The connectors: write resources and work items.
    CONNECTORS = "connectors"
    #: The reasoner: reads principals, writes risk scores and investigations, contains, reads
    #: the mode for automated containments.
    REASONER = "reasoner"
    #: The portal: every operation of the admins' front door, as the person it acts for.
    PORTAL = "portal"
    #: The policy service: reads the directory (principals, resources by id) for dry runs.
    POLICY = "policy"
    #: Enforcement points (the apps' own service accounts): the decision point only.
    APP = "app"


@dataclass(frozen=True)
class Process:
    """One process of a component under ``svc topology``.

    Attributes:
        name: the process's name (``pdp-1``, ``intake``), also its log and pid file's.
        argv: its command line.
        port: the port its ``/readyz`` answers on.
        env: environment variables added to ``svc topology``'s own.

    """

    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)


class UpRuntime(Protocol):
    """What ``svc up`` hands a registration's ``start`` (``svc.up.Stack`` implements it).

    Attributes:
        host: the address every component binds (127.0.0.1).
        data_dir: ``svc up``'s data directory (docs/quickstart.md).
        options: ``svc up``'s settings (``svc.up.UpOptions``: mode, bundle, retention, the
            decision log's settings).
        bundle_dir: the bundle directory the policy service publishes first.
        broker_url: the embedded topic log (``local://<data_dir>/broker.db``).
        history: the history store's client (chDB in this process; only one engine per
            process may open it, so every part reads through this one).
        loader: the history loader reading the topic log into it.
        issuer: the local token issuer (``svc.common.auth.LocalIssuer``).
        shared: what parts hand later ones, by key (each key a constant of the module that
            sets it: ``svc.context.component.SCIM_TOKEN``, ``svc.gateway.component.UPSTREAMS``).
        running: what each started registration's ``start`` yielded, by component name.
        demo: whether the demo company is served (no ``--bundle``, and the data directory's
            bundle is the demo's), so the demo parts provision it.

    """

    host: str
    data_dir: Path
    options: Any
    bundle_dir: Path
    broker_url: str
    history: Any
    loader: Any
    issuer: Any
    shared: dict[str, Any]
    running: dict[str, Any]
    demo: bool

    @property
    def demo_company(self) -> Any:
        """The demo company (``svc.demo.company.Company``), built on first use."""
        ...

    def port(self, name: str) -> int:
        """The port of component `name` under ``svc up`` (its registration's offset)."""
        ...

    def url(self, name: str) -> str:
        """``http://<host>:<port>`` of component `name` (``https`` for one served over TLS)."""
        ...

    def subject(self, role: str) -> str:
        """The token subject of `role` under ``svc up`` (``svc-local``, ``svc-up-pdp``)."""
        ...

    def token(self, role: str, component: str, lifetime_secs: int) -> Callable[[], str]:
        """A function minting, at each call, a token of `role` for `component`'s audience."""
        ...

    def token_file(self, role: str) -> Path:
        """``<data_dir>/<role>.token``, for parts that read their token from a file.

        The token of `role` carries every audience it calls; written now and renewed while
        ``svc up`` runs.
        """
        ...

    def auth(self, component: str) -> dict[str, Any]:
        """The ``*AuthSettings`` fields of `component`: the local issuer and its callers."""
        ...

    def progress(self, phase: str) -> None:
        """Shows `phase` on ``svc up``'s progress line."""
        ...

    def enter(self, cm: AbstractContextManager[Any]) -> Any:
        """Enters `cm` on ``svc up``'s exit stack (stopped, newest first, at the end)."""
        ...


class TopologyRuntime(Protocol):
    """What ``svc topology`` hands a registration (``svc.topology.Topology`` implements it).

    Attributes:
        state: the state directory (resolved).
        secrets: ``<state>/secrets`` (tokens and keys, 0600 files in a 0700 directory).
        kafka_url: the broker (``kafka://host:port``).
        history_dsn: the history store (``chdb://<state>/history`` or a ClickHouse server).
        bundle: the bundle directory published first (the demo company's, written there,
            unless ``--bundle`` named one).
        agent_issuer_dir: the demo agent-token issuer's directory (its keys and CA).
        jwks_ca_file: the CA the gateway trusts for apps' JWK Sets (the demo token issuer's).
        gateway_upstreams_file: the gateway's upstreams (JSON), written before it starts.

    """

    state: Path
    secrets: Path
    kafka_url: str
    history_dsn: str
    agent_issuer_dir: Path
    jwks_ca_file: Path
    gateway_upstreams_file: Path

    @property
    def bundle(self) -> Path:
        """The bundle directory published first (module docs)."""
        ...

    def port(self, name: str) -> int:
        """The port of process `name` (``pdp-1``, ``policy``, ``postgres``)."""
        ...

    def url(self, name: str) -> str:
        """``http://127.0.0.1:<port>`` of process `name` (``https`` for one over TLS)."""
        ...

    def database_url(self, service: str) -> str:
        """The SQLAlchemy URL of `service`'s own PostgreSQL database."""
        ...

    def subject(self, role: str) -> str:
        """The token subject of `role` under ``svc topology`` (``svc-topology-pdp``)."""
        ...

    def auth_env(self, component: str) -> dict[str, str]:
        """``SVC_<COMPONENT>_AUTH_*``: the local issuer and the callers `component` admits."""
        ...

    def token_file(self, role: str) -> Path:
        """The file holding `role`'s token (``<state>/secrets/<role>.token``)."""
        ...

    def secret(self, name: str) -> str:
        """The content of ``<state>/secrets/<name>``, stripped."""
        ...


@dataclass(frozen=True)
class Registration:
    """One component (or demo part) as ``svc up``, ``svc topology`` and the chart run it.

    Attributes:
        name: the component's name: ``svc <name>``, ``SVC_<NAME>_*``, the chart's values key.
        title: how people call it, in the banner, the progress line and port errors
            (``decision point``).
        settings: the settings classes that read its environment (the chart's check).
        audience: the audience of the caller tokens its API takes (``svc-pdp``); None when it
            takes none of the install's caller tokens (the intake keeps its own token).
        callers: the roles whose tokens its API admits (``Role``; docs/auth.md).
        up_port: its port under ``svc up`` as an offset from ``svc up``'s ``--port``; None
            when it has no port of its own there.
        topology_ports: its processes' ports under ``svc topology``: process name -> offset
            from the base port.
        depends_on: the components started before it (a check holds the registry to it).
        phase: ``svc up``'s progress phrase as it starts (one shared by consecutive
            registrations is shown once).
        start: starts it in ``svc up``'s process (module docs); None: not run by ``svc up``.
        processes: its processes under ``svc topology``; None: not run there.
        after_ready: run by ``svc topology`` once its processes are ready (publishing the first
            bundle, trusting the demo apps).
        ready_tls_ca: for a process that serves ``/readyz`` over HTTPS: the CA file to trust,
            from the topology.
        banner: its lines of ``svc up``'s banner (in port order), given the runtime.
        chart: whether the chart ``helm/svc`` runs it as a Deployment of its own.
        demo: a demo part (``svc up``'s development issuers and tools), never an install's own.

    """

    name: str
    title: str
    settings: tuple[type[BaseSettings], ...] = ()
    audience: str | None = None
    callers: tuple[str, ...] = ()
    up_port: int | None = None
    topology_ports: Mapping[str, int] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    phase: str = ""
    start: Callable[[UpRuntime], AbstractContextManager[Any]] | None = None
    processes: Callable[[TopologyRuntime], list[Process]] | None = None
    after_ready: Callable[[TopologyRuntime], None] | None = None
    ready_tls_ca: Callable[[TopologyRuntime], Path] | None = None
    banner: Callable[[UpRuntime], list[str]] | None = None
    chart: bool = True
    demo: bool = False
