"""The reasoner's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it runs on ``port + 12`` over ``svc up``'s own history client (chDB allows one
engine per process), reading principals and writing scores and investigations at the context
service, containing through the challenge service and reading the mode for automated
containments from the policy service, with ``<data_dir>/reasoner.token``; its first cycle runs
at start, and ``svc up`` goes on once it ended (docs/reasoner.md). One process by construction,
so no lease. Its ``POST /v1/cycles`` admits the operator's token (audience ``svc-reasoner``):
``svc reasoner cycle --data-dir`` asks it for a cycle, since only this process may open the
history's chDB directory. Under ``svc topology`` it
is ``svc reasoner serve`` with a PostgreSQL advisory-lock lease; with chDB, whose directory only
the history process opens, it reads the history only from a ClickHouse server, so the topology
runs it when ``--history-dsn`` names one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import serve_http, wait_ready
from svc.reasoner.settings import ReasonerAuthSettings, ReasonerSettings

__all__ = ["REGISTRATION"]


@contextmanager
def _start(rt: UpRuntime) -> Iterator[object]:
    """The reasoner in this process until the block ends: its app served, its loop running.

    Raises:
        PortTaken, OSError: the port cannot be bound, or the app did not start.

    """
    from svc.reasoner.app import create_app
    from svc.reasoner.service import from_settings

    token = rt.token_file(Role.REASONER)
    settings = ReasonerSettings(
        host=rt.host,
        port=rt.port("reasoner"),
        context_url=rt.url("context"),
        context_token_file=token,
        challenge_url=rt.url("challenge"),
        challenge_token_file=token,
        policy_url=rt.url("policy"),
        policy_token_file=token,
    )
    service = from_settings(settings, history=rt.history)
    app = create_app(settings, service, ReasonerAuthSettings(**rt.auth("reasoner")))
    with serve_http(app, settings.host, settings.port, "reasoner"):
        # Ready once the first cycle ended, so every decision after svc up's banner sees the
        # reasoner's scores (the demo's answers do not depend on when they are asked).
        wait_ready(rt.url("reasoner"), "reasoner")
        yield service


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc reasoner serve`` on a ClickHouse server's history, none with chDB (module docs)."""
    if not t.history_dsn.startswith(("http://", "https://")):
        return []
    token = str(t.token_file(Role.REASONER))
    env = t.auth_env("reasoner")
    env |= {
        "SVC_REASONER_HISTORY_DSN": t.history_dsn,
        "SVC_REASONER_CONTEXT_URL": t.url("context"),
        "SVC_REASONER_CONTEXT_TOKEN_FILE": token,
        "SVC_REASONER_CHALLENGE_URL": t.url("challenge"),
        "SVC_REASONER_CHALLENGE_TOKEN_FILE": token,
        "SVC_REASONER_POLICY_URL": t.url("policy"),
        "SVC_REASONER_POLICY_TOKEN_FILE": token,
        "SVC_REASONER_LEASE_URL": t.database_url("context"),
    }
    port = t.port("reasoner")
    return [Process("reasoner", svc_command("reasoner", "serve", "--port", str(port)), port, env)]


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  reasoner        {rt.url('reasoner')}   risk per person and agent from 30 days of "
        "history every 15 minutes; scores and factors at the context service's /v1/risk"
    ]


REGISTRATION = Registration(
    name="reasoner",
    title="reasoner",
    settings=(ReasonerSettings, ReasonerAuthSettings),
    audience="svc-reasoner",
    callers=(Role.OPERATOR,),
    up_port=12,
    topology_ports={"reasoner": 15},
    depends_on=("context", "challenge", "policy", "history"),
    phase="starting the reasoner and its first cycle",
    start=_start,
    processes=_processes,
    banner=_banner,
)
