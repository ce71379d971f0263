"""The component registry: every part `svc up`, `svc topology` and the chart run, in order.

Each component declares its ``svc.common.component.Registration`` beside its own code
(``svc/<component>/component.py``); this module only lists them, in the order they start
(each after what it depends on), and checks the list once at import: unique names, unique
ports under ``svc up`` and under ``svc topology``, every dependency registered and earlier.
Adding a component is its package, its registration, and one line here
(docs/architecture.md#the-component-registry).
"""

from __future__ import annotations

from collections.abc import Iterable

from svc.challenge.component import REGISTRATION as CHALLENGE
from svc.common.component import Registration
from svc.connectors.component import REGISTRATION as CONNECTORS
from svc.context.component import REGISTRATION as CONTEXT
from svc.demo.component import CONTAINMENTS as DEMO_CONTAINMENTS
from svc.demo.component import DIRECTORY as DEMO_DIRECTORY
from svc.demo.component import HEARTBEAT_RECEIVER as DEMO_HEARTBEAT_RECEIVER
from svc.demo.component import MONTH as DEMO_MONTH
from svc.demo.component import REGISTRATIONS as DEMO
from svc.demo.component import SOURCES_REGISTRATION as DEMO_SOURCES
from svc.demo.component import TOOLS as DEMO_TOOLS
from svc.gateway.component import REGISTRATION as GATEWAY
from svc.history.component import REGISTRATION as HISTORY
from svc.intake.component import REGISTRATION as INTAKE
from svc.pdp.component import REGISTRATION as PDP
from svc.policy.component import REGISTRATION as POLICY
from svc.portal.component import REGISTRATION as PORTAL
from svc.reasoner.component import REGISTRATION as REASONER
from svc.reporter.component import REGISTRATION as REPORTER

__all__ = [
    "COMPONENTS",
    "TOPOLOGY_INFRA_PORTS",
    "RegistryError",
    "audiences_of",
    "by_name",
    "check",
    "components",
    "up_port_count",
]

#: Every registration, in start order.
COMPONENTS: tuple[Registration, ...] = (
    POLICY,
    CONTEXT,
    DEMO_DIRECTORY,
    DEMO_SOURCES,
    CONNECTORS,
    *DEMO,
    CHALLENGE,
    DEMO_CONTAINMENTS,
    PDP,
    INTAKE,
    HISTORY,
    DEMO_MONTH,
    REASONER,
    DEMO_TOOLS,
    GATEWAY,
    PORTAL,
    DEMO_HEARTBEAT_RECEIVER,
    REPORTER,
)

#: ``svc topology``'s ports besides the registrations' (offsets from its base port).
TOPOLOGY_INFRA_PORTS = {"postgres": 7, "kafka": 8, "kafka-controller": 9}


class RegistryError(Exception):
    """The registry breaks one of its rules (module docs); the message names each break."""


def check(registrations: Iterable[Registration]) -> None:
    """Checks `registrations` as a registry (module docs).

    Raises:
        RegistryError: a name or a port is taken twice, or a dependency is missing or later.

    """
    problems: list[str] = []
    seen: set[str] = set()
    up_ports: dict[int, str] = {}
    topo_ports: dict[int, str] = {v: k for k, v in TOPOLOGY_INFRA_PORTS.items()}
    for r in registrations:
        if r.name in seen:
            problems.append(f"`{r.name}` is registered twice")
        for dep in r.depends_on:
            if dep not in seen:
                problems.append(f"`{r.name}` depends on `{dep}`, which is not registered before it")
        seen.add(r.name)
        if r.up_port is not None:
            if r.up_port in up_ports:
                problems.append(
                    f"`{r.name}` and `{up_ports[r.up_port]}` share svc up's port +{r.up_port}"
                )
            up_ports[r.up_port] = r.name
        for process, offset in r.topology_ports.items():
            if offset in topo_ports:
                problems.append(
                    f"`{process}` and `{topo_ports[offset]}` share the topology's port +{offset}"
                )
            topo_ports[offset] = process
        if r.start is not None and r.banner is not None and r.up_port is None:
            problems.append(f"`{r.name}` has banner lines but no port under svc up")
    if problems:
        raise RegistryError("; ".join(problems))


check(COMPONENTS)


def components(*, demo: bool = True) -> tuple[Registration, ...]:
    """The registrations in start order; without the demo parts when `demo` is false."""
    return tuple(r for r in COMPONENTS if demo or not r.demo)


def by_name(name: str) -> Registration:
    """The registration of component `name`.

    Raises:
        KeyError: nothing is registered under `name`.

    """
    for r in COMPONENTS:
        if r.name == name:
            return r
    raise KeyError(name)


def audiences_of(role: str) -> list[str]:
    """The audiences a token of `role` carries: those of every component admitting it."""
    return [r.audience for r in COMPONENTS if r.audience and role in r.callers]


def up_port_count() -> int:
    """How many consecutive ports ``svc up`` takes, from its ``--port``."""
    return max(r.up_port for r in COMPONENTS if r.up_port is not None) + 1
