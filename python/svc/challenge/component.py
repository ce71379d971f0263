"""The challenge service's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is served in a thread of its own on ``port + 5`` with a SQLite database
``<data_dir>/challenge.db``, the owners and managers who answer challenges read from the context
service, approvers checked with the decision point, and the challenge page people answer on:
signed single-use links (key ``<data_dir>/challenge-link.key``) and OpenID Connect sign-in at
the demo identity provider (``svc.challenge.dev_idp``, registered by ``svc.demo.component``). No
chat webhook: notifications stay in its outbox (docs/challenges.md). How challenges end
(rejected, expired, verification failed) is posted to the intake as audit events
(docs/challenges.md#audit-events) with ``<data_dir>/intake.token``. Under ``svc topology`` it
is ``svc challenge serve`` on its PostgreSQL database, posting to the topology's intake.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from svc.challenge.app import ChallengeServer
from svc.challenge.directory import ContextDirectory
from svc.challenge.pdp_client import ApproverCheck
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import serve_threaded

__all__ = ["CREATED", "REGISTRATION"]

#: ``UpRuntime.shared`` key: True when this start created ``challenge.db`` (the demo contains
#: its contained people only then, so a later ``Lift`` stays lifted).
CREATED = "challenge.created"


def _client_secret(path: Path) -> Path:
    """``path``, holding a random OpenID Connect client secret (written once, mode 0600)."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


def page_url(rt: UpRuntime) -> str:
    """The challenge page's base URL under ``svc up`` (``localhost``: WebAuthn needs a name)."""
    return f"http://localhost:{rt.port('challenge')}"


@contextmanager
def _start(rt: UpRuntime) -> Iterator[ChallengeServer]:
    """The challenge service in this process until the block ends (module docs).

    Yields:
        The running server (``server.service`` is the service layer).

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use).
        AuthConfigError: the issuer's keys cannot be loaded.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or migrated.

    """
    d = rt.data_dir
    database = d / "challenge.db"
    rt.shared[CREATED] = not database.exists()
    page = page_url(rt)
    settings = ChallengeSettings(
        host=rt.host,
        port=rt.port("challenge"),
        database_url=f"sqlite:///{database.resolve()}",
        context_url=rt.url("context"),
        origins=[page],
        page_url=f"{page}/challenge",
        link_key_file=str(d / "challenge-link.key"),
        oidc_issuer=rt.url("idp"),
        oidc_client_id="svc-up-challenge-page",
        oidc_client_secret_file=str(_client_secret(d / "challenge-oidc-client.secret")),
        # The demo provider's `sub` is the user name typed in its form.
        oidc_username_claim="sub",
        pdp_url=rt.url("pdp"),
        # How challenges end goes to the intake as audit events (the reasoner's family c).
        intake_url=rt.url("intake"),
        intake_token_file=str(d / "intake.token"),
    )
    service = ChallengeService(
        settings,
        directory=ContextDirectory(rt.url("context"), rt.token(Role.CHALLENGE, "context", 600)),
        approvers=ApproverCheck(rt.url("pdp"), rt.token(Role.CHALLENGE, "pdp", 600)),
    )
    try:
        server = ChallengeServer(
            settings, service, auth=ChallengeAuthSettings(**rt.auth("challenge"))
        )
        with serve_threaded(server, settings.host, settings.port, "challenge service"):
            yield server
    finally:
        service.close()


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc challenge serve`` on its PostgreSQL database.

    It reads the directory and asks ``pdp-1`` about approvers with the challenge service's
    token.
    """
    token = str(t.token_file(Role.CHALLENGE))
    argv = svc_command(
        "challenge",
        "serve",
        "--port",
        str(t.port("challenge")),
        "--database-url",
        t.database_url("challenge"),
        "--context-url",
        t.url("context"),
        "--context-token-file",
        token,
        "--pdp-url",
        t.url("pdp-1"),
        "--pdp-token-file",
        token,
        "--intake-url",
        t.url("intake"),
        "--intake-token-file",
        str(t.secrets / "intake.token"),
    )
    return [Process("challenge", argv, t.port("challenge"), t.auth_env("challenge"))]


def _banner(rt: UpRuntime) -> list[str]:
    page = page_url(rt)
    return [
        f"  challenges      {rt.url('challenge')}   gRPC svc.challenge.v1.ChallengeService "
        "(Contain, Lift, ListContainments: the decision point follows the containments)",
        f"  challenge page  {page}/keys   your security keys; notifications link to "
        f"{page}/challenge/<qid> (sign in at {rt.url('idp')}, the demo identity provider: any "
        "user name, for the demo only)",
    ]


REGISTRATION = Registration(
    name="challenge",
    title="challenge service",
    settings=(ChallengeSettings, ChallengeAuthSettings),
    audience="svc-challenge",
    callers=(Role.OPERATOR, Role.PDP, Role.GATEWAY, Role.REASONER, Role.PORTAL),
    up_port=5,
    topology_ports={"challenge": 5},
    depends_on=("context",),
    phase="starting the challenge service",
    start=_start,
    processes=_processes,
    banner=_banner,
)
