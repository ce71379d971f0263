"""The intake's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is served on ``port + 1`` over the embedded topic log, its shared token
kept in ``<data_dir>/intake.token``; ready once its transactional producers are. Under ``svc
topology`` it is ``svc intake`` on Kafka (docs/intake.md). The intake takes its own token, not
the install's caller tokens (docs/auth.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import SecretStr

from svc.common.component import Process, Registration, TopologyRuntime, UpRuntime, svc_command
from svc.common.inprocess import START_TIMEOUT, persistent_token, serve_http
from svc.intake.settings import IntakeSettings

__all__ = ["REGISTRATION", "TOKEN_FILE"]

#: The intake's shared token, in ``svc up``'s data directory and ``svc topology``'s secrets.
TOKEN_FILE = "intake.token"


@contextmanager
def _start(rt: UpRuntime) -> Iterator[None]:
    """The intake in this process until the block ends.

    Ready once its producers are (``TransactionalPool.wait_ready``).

    Raises:
        PortTaken, OSError: the port cannot be bound, the app did not start, or the producers
            were not ready in ``START_TIMEOUT`` seconds (the message says why).

    """
    from svc.intake.app import create_app
    from svc.intake.producer import TransactionalPool

    settings = IntakeSettings(
        host=rt.host,
        port=rt.port("intake"),
        kafka_url=rt.broker_url,
        token=SecretStr(persistent_token(rt.data_dir / TOKEN_FILE)),
    )
    app = create_app(settings)
    with serve_http(app, settings.host, settings.port, "intake"):
        rt.progress("waiting for the intake's producers")
        pool: TransactionalPool = app.state.pool
        if not pool.wait_ready(START_TIMEOUT):
            raise OSError(f"the intake did not get ready: {pool.not_ready_reason}")
        yield


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc intake`` on Kafka, its token from the secrets, one transactional id."""
    env = {
        "SVC_KAFKA_URL": t.kafka_url,
        "SVC_INTAKE_TOKEN_FILE": str(t.secrets / TOKEN_FILE),
        "SVC_INTAKE_TRANSACTIONAL_ID": "svc-topology-intake",
    }
    port = t.port("intake")
    return [Process("intake", svc_command("intake", "--port", str(port)), port, env)]


def _banner(rt: UpRuntime) -> list[str]:
    return [
        f"  intake          {rt.url('intake')}   POST /v1/events (bearer token in "
        f"{rt.data_dir / TOKEN_FILE})"
    ]


REGISTRATION = Registration(
    name="intake",
    title="intake",
    settings=(IntakeSettings,),
    up_port=1,
    topology_ports={"intake": 1},
    phase="starting the intake and the history routes",
    start=_start,
    processes=_processes,
    banner=_banner,
)
