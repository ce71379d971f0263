"""The context service's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is served on ``port + 4`` with a SQLite database ``<data_dir>/context.db``
(migrated first) and the SCIM token kept in ``<data_dir>/scim.token``; under ``svc topology`` it
is ``svc context serve`` on its PostgreSQL database, the SCIM token in the secrets directory
(docs/context.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import SecretStr

from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import persistent_token, serve_http
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings

__all__ = ["REGISTRATION", "SCIM_TOKEN"]

#: ``UpRuntime.shared`` key: the SCIM token (the identity provider's bearer token).
SCIM_TOKEN = "context.scim_token"


@contextmanager
def _start(rt: UpRuntime) -> Iterator[ContextService]:
    """The context service in this process until the block ends (module docs).

    Yields:
        The service layer (the demo's provisioning reads its counts; the demo token issuer
        trusts its apps through it).

    Raises:
        PortTaken, OSError: the port cannot be bound, or the app did not start.
        AuthConfigError: the issuer's keys cannot be loaded.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or migrated.

    """
    from svc.context.app import create_app

    scim_token = persistent_token(rt.data_dir / "scim.token")
    rt.shared[SCIM_TOKEN] = scim_token
    settings = ContextSettings(
        host=rt.host,
        port=rt.port("context"),
        database_url=f"sqlite:///{(rt.data_dir / 'context.db').resolve()}",
        scim_token=SecretStr(scim_token),
    )
    service = ContextService(settings)
    try:
        app = create_app(service, settings, ContextAuthSettings(**rt.auth("context")))
        with serve_http(app, settings.host, settings.port, "context service"):
            yield service
    finally:
        service.close()


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc context serve`` on its PostgreSQL database, the SCIM token from the secrets."""
    port = t.port("context")
    argv = svc_command(
        "context", "serve", "--port", str(port), "--database-url", t.database_url("context")
    )
    env = t.auth_env("context")
    try:
        env["SVC_CONTEXT_SCIM_TOKEN"] = t.secret("scim.token")
    except FileNotFoundError:
        pass
    return [Process("context", argv, port, env)]


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  context service {rt.url('context')}   SCIM 2.0 at /scim/v2 (bearer token in "
        f"{rt.data_dir / 'scim.token'}), /v1/principals, /v1/resources, /v1/directory/people"
    ]


REGISTRATION = Registration(
    name="context",
    title="context service",
    settings=(ContextSettings, ContextAuthSettings),
    audience="svc-context",
    callers=(
        Role.OPERATOR,
        Role.PDP,
        Role.CHALLENGE,
        Role.GATEWAY,
        Role.CONNECTORS,
        Role.REASONER,
        Role.PORTAL,
        Role.POLICY,
    ),
    up_port=4,
    topology_ports={"context": 4},
    phase="starting the context service",
    start=_start,
    processes=_processes,
    banner=_banner,
)
