"""The portal's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is served on ``port + 9``: people sign in at the demo identity provider
(OpenID Connect, client ``svc-up-portal`` with a secret kept in the data directory), trusted
apps register their agents at ``/api/v1/agents`` (the demo's apps' JWK Sets trusted through the
demo token issuer's CA), and every operation is checked with the decision point. It calls the
decision point, the history, the policy, context and challenge services with
``<data_dir>/portal.token`` and the intake with the intake token (docs/portal.md). Under ``svc
topology`` it is ``svc portal serve`` with the same callees, without sign-in (no identity
provider runs there; its agents API and ``/mcp`` for agents work).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import persistent_token, serve_threaded
from svc.gateway.component import JWKS_CA_FILE
from svc.portal.settings import PortalSettings

if TYPE_CHECKING:
    from svc.portal.app import PortalServer

__all__ = ["REGISTRATION", "public_url"]


#: A person of the demo company's security team (who administers every portal area) and an
#: auditor (who views them), named in the banner (docs/portal.md#authorization).
DEMO_ADMIN = "diego.larsen"
DEMO_AUDITOR = "zoe.patel"


def public_url(rt: UpRuntime) -> str:
    """The portal's address people open under ``svc up`` (its OpenID Connect redirect base)."""
    return f"http://localhost:{rt.port('portal')}"


@contextmanager
def _start(rt: UpRuntime) -> Iterator[PortalServer]:
    """The portal in this process until the block ends, ready once its ``/readyz`` is.

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use), or it was not
            ready within ``START_TIMEOUT``.

    """
    from svc.portal.app import PortalServer

    d = rt.data_dir
    token = str(rt.token_file(Role.PORTAL))
    secret = d / "portal-oidc-client.secret"
    persistent_token(secret)
    settings = PortalSettings(
        host=rt.host,
        port=rt.port("portal"),
        pdp_url=rt.url("pdp"),
        pdp_token_file=token,
        history_url=rt.url("history"),
        history_token_file=token,
        policy_url=rt.url("policy"),
        policy_token_file=token,
        context_url=rt.url("context"),
        context_token_file=token,
        challenge_url=rt.url("challenge"),
        challenge_token_file=token,
        intake_url=rt.url("intake"),
        intake_token_file=str(d / "intake.token"),
        public_url=public_url(rt),
        oidc_issuer=rt.url("idp"),
        oidc_client_id="svc-up-portal",
        oidc_client_secret_file=str(secret),
        # The demo provider's `sub` is the user name typed in its form.
        oidc_username_claim="sub",
        session_key_file=str(d / "portal-session.key"),
        jwks_ca_file=rt.shared.get(JWKS_CA_FILE),
    )
    server = PortalServer(settings)
    with serve_threaded(server, settings.host, settings.port, "portal", rt.url("portal")):
        yield server


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc portal serve`` calling the topology's services (no sign-in there)."""
    token = str(t.token_file(Role.PORTAL))
    port = t.port("portal")
    env = {
        "SVC_PORTAL_PDP_URL": t.url("pdp-1"),
        "SVC_PORTAL_PDP_TOKEN_FILE": token,
        "SVC_PORTAL_HISTORY_URL": t.url("history"),
        "SVC_PORTAL_HISTORY_TOKEN_FILE": token,
        "SVC_PORTAL_POLICY_URL": t.url("policy"),
        "SVC_PORTAL_POLICY_TOKEN_FILE": token,
        "SVC_PORTAL_CONTEXT_URL": t.url("context"),
        "SVC_PORTAL_CONTEXT_TOKEN_FILE": token,
        "SVC_PORTAL_CHALLENGE_URL": t.url("challenge"),
        "SVC_PORTAL_CHALLENGE_TOKEN_FILE": token,
        "SVC_PORTAL_INTAKE_URL": t.url("intake"),
        "SVC_PORTAL_INTAKE_TOKEN_FILE": str(t.secrets / "intake.token"),
        "SVC_PORTAL_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "SVC_PORTAL_SESSION_KEY_FILE": str(t.secrets / "portal-session.key"),
        "SVC_PORTAL_JWKS_CA_FILE": str(t.jwks_ca_file),
    }
    return [Process("portal", svc_command("portal", "serve", "--port", str(port)), port, env)]


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  portal          {public_url(rt)}   the web app: open it first and sign in (at "
        f"{rt.url('idp')}) as {DEMO_ADMIN}, of the security team, or {DEMO_AUDITOR}, an "
        "auditor; GraphQL at /graphql, MCP at /mcp, agents API at /api/v1/agents"
    ]


REGISTRATION = Registration(
    name="portal",
    title="portal",
    settings=(PortalSettings,),
    up_port=9,
    topology_ports={"portal": 16},
    depends_on=("pdp", "history", "policy", "context", "challenge", "intake"),
    phase="starting the portal",
    start=_start,
    processes=_processes,
    banner=_banner,
)
