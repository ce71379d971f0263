"""The MCP gateway's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is served on ``port + 7`` in front of the upstreams a demo part hands it
(``UPSTREAMS``: the demo company's tools server over stdio), checking every tool call with the
decision point, following the challenge service's containments, the policy service's outage
tiers and the context service's trusted apps, and posting forwarded calls to the intake; it
calls them with ``<data_dir>/gateway.token``. Under ``svc topology`` it is ``svc gateway`` in
front of the tools server's own process over Streamable HTTP (docs/gateway.md). Ready once its
``/readyz`` answers 200: every upstream connected, the trusted apps, the containment list and
the outage tiers loaded.
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
from svc.common.inprocess import serve_threaded
from svc.gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from svc.gateway.app import GatewayServer

__all__ = ["JWKS_CA_FILE", "REGISTRATION", "UPSTREAMS"]

#: ``UpRuntime.shared`` key: the gateway's upstreams (name -> ``svc.gateway.settings.Upstream``).
UPSTREAMS = "gateway.upstreams"
#: ``UpRuntime.shared`` key: the CA file the gateway trusts for the apps' JWK Sets.
JWKS_CA_FILE = "gateway.jwks_ca_file"


@contextmanager
def _start(rt: UpRuntime) -> Iterator[GatewayServer]:
    """The gateway in this process until the block ends, ready once its ``/readyz`` is.

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use), or the gateway
            was not ready within ``START_TIMEOUT`` (the message says what it lacked).

    """
    from svc.gateway.app import GatewayServer

    token = str(rt.token_file(Role.GATEWAY))
    settings = GatewaySettings(
        host=rt.host,
        port=rt.port("gateway"),
        upstreams=rt.shared.get(UPSTREAMS, {}),
        public_url=rt.url("gateway"),
        pdp_url=rt.url("pdp"),
        pdp_token_file=token,
        challenge_url=rt.url("challenge"),
        challenge_token_file=token,
        policy_url=rt.url("policy"),
        policy_token_file=token,
        context_url=rt.url("context"),
        context_token_file=token,
        jwks_ca_file=rt.shared.get(JWKS_CA_FILE),
        intake_url=rt.url("intake"),
        intake_token_file=str(rt.data_dir / "intake.token"),
    )
    server = GatewayServer(settings)
    with serve_threaded(server, settings.host, settings.port, "gateway", rt.url("gateway")):
        yield server


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc gateway`` in front of the upstreams file, checking at ``pdp-1``."""
    token = str(t.token_file(Role.GATEWAY))
    argv = svc_command(
        "gateway",
        "--port",
        str(t.port("gateway")),
        "--public-url",
        t.url("gateway"),
        "--upstreams-file",
        str(t.gateway_upstreams_file),
        "--pdp-url",
        t.url("pdp-1"),
        "--pdp-token-file",
        token,
        "--challenge-url",
        t.url("challenge"),
        "--challenge-token-file",
        token,
        "--policy-url",
        t.url("policy"),
        "--policy-token-file",
        token,
        "--context-url",
        t.url("context"),
        "--context-token-file",
        token,
        "--jwks-ca-file",
        str(t.jwks_ca_file),
        "--intake-url",
        t.url("intake"),
        "--intake-token-file",
        str(t.secrets / "intake.token"),
    )
    return [Process("gateway", argv, t.port("gateway"))]


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  gateway         {rt.url('gateway')}   MCP at /mcp/demo (the demo company's documents "
        "and tickets), challenge waits at /mcp/challenges/<qid>"
    ]


REGISTRATION = Registration(
    name="gateway",
    title="gateway",
    settings=(GatewaySettings,),
    up_port=7,
    topology_ports={"gateway": 10},
    depends_on=("pdp", "challenge", "policy", "context", "intake"),
    phase="starting the gateway and the demo's tools server",
    start=_start,
    processes=_processes,
    banner=_banner,
)
