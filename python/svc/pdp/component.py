"""The decision point's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is the Rust listener on ``svc up``'s own port, following the policy service
(the active bundle, verified with ``<data_dir>/policy-signing.pub``), the context service
(principals, resources and work items) and the challenge service (containments, ``Resolve``),
its decision log shipped to the embedded topic log through a spool in ``<data_dir>/pdp-spool``;
ready once the principals snapshot and the containment list are loaded. Under ``svc topology``
two replicas, ``pdp-1`` and ``pdp-2``, follow the same three services with durable decision
logs (docs/history.md, "Durability of the decision log").
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from svc.common.auth_settings import PdpAuthSettings
from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import START_TIMEOUT
from svc.pdp.settings import PdpSettings

__all__ = ["FETCH_TIMEOUT_MS", "REGISTRATION"]

#: How long a check of ``svc up``'s decision point waits for a resource fetched from its
#: context service, in milliseconds (``svc pdp --context-fetch-timeout-ms``, default 200). On a
#: busy laptop a fetch in the same process may take longer than the default, and a check decided
#: without its resource would make the demo's answers depend on the load.
FETCH_TIMEOUT_MS = 2_000


def _start(rt: UpRuntime) -> AbstractContextManager[Any]:
    """The decision point in this process (``svc.pdp.server.serve_bundle``).

    It follows the policy, context and challenge services; entering it returns once it is
    ready.

    Raises:
        OSError: the port, the spool or the public key cannot be opened, or the principals or
            the containment list did not load in ``START_TIMEOUT`` seconds.
        AuthConfigError: the issuer's JWKS cannot be loaded.

    """
    from svc.pdp.server import StandaloneOptions, serve_bundle

    o = rt.options
    options = StandaloneOptions(
        host=rt.host,
        port=rt.port("pdp"),
        mode=o.mode,
        policy=rt.running["policy"].target,
        public_key=rt.data_dir / "policy-signing.pub",
        context=rt.url("context"),
        context_fetch_timeout_ms=FETCH_TIMEOUT_MS,
        challenge=rt.url("challenge"),
        kafka_url=rt.broker_url,
        spool_dir=rt.data_dir / "pdp-spool",
        auth=PdpAuthSettings(**rt.auth("pdp")),
        log_commit_ms=o.log_commit_ms,
        log_durability=o.log_durability,
        log_fsync=o.log_fsync,
    )
    return serve_bundle(
        None,
        options,
        token=rt.token(Role.PDP, "policy", 3600),
        context_token=rt.token(Role.PDP, "context", 3600),
        context_wait_secs=START_TIMEOUT,
        challenge_token=rt.token(Role.PDP, "challenge", 3600),
    )


def _processes(t: TopologyRuntime) -> list[Process]:
    """``pdp-1`` and ``pdp-2``: ``svc pdp`` following the three services, durable logs."""
    token = str(t.token_file(Role.PDP))
    out = []
    for name in ("pdp-1", "pdp-2"):
        argv = svc_command(
            "pdp",
            "--port",
            str(t.port(name)),
            "--public-url",
            t.url(name),
            "--policy",
            t.url("policy"),
            "--public-key",
            str(t.secrets / "policy-signing.key.pub"),
            "--policy-token-file",
            token,
            "--context",
            t.url("context"),
            "--context-token-file",
            token,
            "--challenge",
            t.url("challenge"),
            "--challenge-token-file",
            token,
            "--kafka",
            t.kafka_url,
            "--spool-dir",
            str(t.state / name / "spool"),
            "--log-durability",
            "durable",
        )
        out.append(Process(name, argv, t.port(name), t.auth_env("pdp")))
    return out


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  decision point  {rt.url('pdp')}   gRPC svc.authz.v1.Authorizer + HTTP "
        "(/v1/access/evaluation, /v1/access/plan, AuthZEN /access/v1/evaluation)"
    ]


REGISTRATION = Registration(
    name="pdp",
    title="decision point",
    settings=(PdpSettings, PdpAuthSettings),
    audience="svc-pdp",
    callers=(Role.OPERATOR, Role.DEMO, Role.CHALLENGE, Role.GATEWAY, Role.PORTAL),
    up_port=0,
    topology_ports={"pdp-1": 0, "pdp-2": 6},
    depends_on=("policy", "context", "challenge"),
    phase="starting the decision point",
    start=_start,
    processes=_processes,
    banner=_banner,
)
