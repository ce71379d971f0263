"""``svc up``: every component built so far on one machine, with the embedded defaults.

One process on 127.0.0.1 (docs/architecture.md#embedded-defaults-and-production-parts) runs

* the decision point (``svc.pdp``: the Rust listener, gRPC and HTTP) on ``port`` (8080),
* the intake (``svc.intake``) on ``port + 1``,
* the history loader (``svc.history``) and its query routes on ``port + 2``,
* the policy service (``svc.policy``, gRPC ``svc.policy.v1.PolicyService``) on ``port + 3``,
* the context service (``svc.context``: SCIM 2.0 and the principals, resources and work
  items the decision point follows) on ``port + 4``,
* the challenge service (``svc.challenge``, gRPC ``svc.challenge.v1.ChallengeService``: the
  containment list the decision point follows, challenges, security keys) on ``port + 5``,
  its database a SQLite file ``<data_dir>/challenge.db``, the owners and managers who answer
  challenges read from the context service, and the challenge page people answer on
  (``svc.challenge.page``: sign-in over OpenID Connect, link key ``<data_dir>/challenge-link.key``),
* a development OpenID Connect provider for that page (``svc.challenge.dev_idp``,
  oidc-provider-mock: anyone signs in as any user name; for the demo only, a real install sets
  ``oidc_issuer``) on ``port + 6``,
* the MCP gateway (``svc.gateway``, docs/gateway.md) on ``port + 7``: ``/mcp/demo`` in front of
  the demo company's tools server (``svc.demo.tools_server``, a stdio child process), checking
  every tool call with the decision point, following the challenge service's containments, the
  policy service's outage tiers and the context service's trusted apps, and sending forwarded
  calls to the intake; it calls them as ``svc-up-gateway`` with a token in
  ``<data_dir>/gateway.token``,
* a development issuer of agent tokens (``svc.demo.token_issuer``: the keys of the apps trusted
  for the demo company's agents, JWKS over HTTPS with its own CA ``<data_dir>/token-issuer/ca.pem``,
  for the demo only) on ``port + 8``, its apps trusted in the context service on every start,

the policy service's database a SQLite file ``<data_dir>/policy.db`` and its signing key
``<data_dir>/policy-signing.key`` (public key beside it, ``policy-signing.pub``),

with the embedded defaults in place of the real parts: the topic log of ``svc.broker``
(``local://<data_dir>/broker.db``) instead of Kafka, chDB in ``<data_dir>/history`` instead of
a ClickHouse server. The records are the same as in production: the decision log's shipper,
the intake's transactional producers and the loader run unchanged on top.

The data directory keeps everything across restarts: the topic log (records not loaded yet are
loaded after a restart), the history, the decision-log spool, the intake token, the local token
issuer's key, the policy, context and challenge services' databases, and the bundle directory
first published.

Callers (docs/auth.md): the decision point, the history and the policy service take bearer
tokens of a local issuer (``svc.common.auth.LocalIssuer``, an ES256 key in ``<data_dir>/issuer/``).
Each start writes a fresh caller token for the person at this machine to
``<data_dir>/caller.token`` (mode 0600, ``sub`` ``svc-local``, audience the three components,
valid 24 hours and renewed every 12 hours while ``svc up`` runs); the demo traffic calls as
``svc-demo``, the decision point calls the policy, context and challenge services as
``svc-up-pdp``, the challenge service calls the context service's directory and the decision
point (whether an approver may ``approve``) as ``svc-up-challenge``. The intake keeps its own token.

The decision point follows the policy service (``svc.pdp.follower``): it serves the active
bundle once its signature verifies. On the first start (nothing published yet) the bundle
directory is published as version 1: ``--bundle``'s, else ``<data_dir>/bundle``, the demo
company's (``svc.demo``), written when missing (a data directory of an earlier release keeps
its ``bundle/``). A later start with ``--bundle`` publishes it as the next version when its
files differ from the active bundle's. Later changes are drafts and publishes (``svc policy``).

The decision point also follows the challenge service's containment list
(``svc.pdp.containment_follower``); ``svc up`` is ready once that list is loaded. With the demo
company, its contained person is written with ``Contain`` when ``challenge.db`` is created (a
later ``Lift`` stays lifted across restarts).

Refusals happen before anything starts: a port in use, or another ``svc up`` on the same data
directory (an exclusive ``flock`` on ``<data_dir>/svc-up.lock``).

``Stack`` is the supervisor: one context manager per component (the data directory's lock, the
topic log, the history store and its loader, the caller tokens of the local issuer, the decision
point, the intake, the history routes), entered in that order on one ``ExitStack``. Each returns
once its component is ready, waiting on an event the component sets (uvicorn's startup, the
intake's producer pool), so ``stop``, or a failure half-way through the start, stops what
started in reverse order. Background loops (the topic log's trim, the caller token's renewal)
wait on a stop event between runs.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from clickhouse_connect.driver.client import Client
from fastapi import FastAPI
from pydantic import SecretStr
from rich.console import Console
from rich.status import Status

from svc import history
from svc.broker import LOCAL_SCHEME, LocalLog
from svc.challenge.app import ChallengeServer
from svc.challenge.dev_idp import DevIdentityProvider
from svc.challenge.directory import ContextDirectory
from svc.challenge.pdp_client import ApproverCheck
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.common.auth import (
    AuthConfigError,
    HistoryAuthSettings,
    LocalIssuer,
    PdpAuthSettings,
    PolicyAuthSettings,
    write_secret,
)
from svc.common.net import tcp_listener
from svc.common.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.history.loader import Loader
from svc.history.service import create_app as history_app
from svc.history.service import totals
from svc.intake.producer import TransactionalPool
from svc.intake.settings import IntakeSettings
from svc.pdp.log_settings import LOG_COMMIT_MS, LOG_DURABILITY, LOG_FSYNC, Durability
from svc.pdp.server import StandaloneOptions, serve_bundle
from svc.policy import signing
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyError, PolicyService
from svc.policy.settings import PolicySettings

if TYPE_CHECKING:
    from svc.demo.company import Company
    from svc.demo.token_issuer import DevTokenIssuer
    from svc.gateway.app import GatewayServer
    from svc.gateway.settings import GatewaySettings, Upstream

__all__ = [
    "DataDirBusy",
    "PortTaken",
    "Stack",
    "UpOptions",
    "default_data_dir",
]

log = logging.getLogger("svc.up")

#: How often the topic log drops records past its retention (seconds).
TRIM_INTERVAL = 3600.0

#: ``sub`` of the caller token ``svc up`` writes to ``<data_dir>/caller.token``.
LOCAL_CALLER = "svc-local"

#: ``sub`` of the demo traffic's token (``svc demo``, ``svc up --demo``).
DEMO_CALLER = "svc-demo"

#: ``sub`` of the token the decision point sends to the policy service (``WatchActive``).
PDP_CALLER = "svc-up-pdp"

#: The audiences of the caller token: every component that checks callers.
CALLER_AUDIENCE = ["svc-pdp", "svc-history", "svc-policy", "svc-context", "svc-challenge"]

#: ``sub`` of the token the challenge service sends to the context service's directory and to
#: the decision point (the approver check).
CHALLENGE_CALLER = "svc-up-challenge"

#: ``sub`` of the token the gateway sends to the decision point and to the policy, context and
#: challenge services (its checks, outage tiers, trusted apps and containments).
GATEWAY_CALLER = "svc-up-gateway"

#: The audiences of the gateway's token.
GATEWAY_AUDIENCE = ["svc-pdp", "svc-policy", "svc-context", "svc-challenge"]

#: Lifetime of a caller token (a working day and then some), in seconds; ``svc up`` writes a
#: new one every half of it.
CALLER_TOKEN_LIFETIME_SECS = 24 * 3600

#: How long a check of ``svc up``'s decision point waits for a resource fetched from its
#: context service, in milliseconds (``svc pdp --context-fetch-timeout-ms``, default 200).
SVC_UP_FETCH_TIMEOUT_MS = 2_000

#: The gateway's port is ``port + GATEWAY_OFFSET``.
GATEWAY_OFFSET = 7

#: The development agent-token issuer's port (HTTPS) is ``port + TOKEN_ISSUER_OFFSET``.
TOKEN_ISSUER_OFFSET = 8

#: How many consecutive ports ``svc up`` takes, from ``port``.
PORT_COUNT = TOKEN_ISSUER_OFFSET + 1

#: Longest wait, in seconds, for an HTTP app to listen and for the intake's producers.
START_TIMEOUT = 60.0

#: Longest wait, in seconds, for an HTTP app to finish its requests and stop.
HTTP_STOP_TIMEOUT = 30.0

#: Longest wait, in seconds, for the history loader to store what it read and stop.
LOADER_STOP_TIMEOUT = 60.0


def default_data_dir() -> Path:
    """``$SVC_DATA_DIR``, else ``$XDG_DATA_HOME/svc``, else ``~/.local/share/svc``."""
    env = os.environ.get("SVC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "svc"


class PortTaken(Exception):
    """A port ``svc up`` needs is in use; the message names it and what to do."""


class DataDirBusy(Exception):
    """Another ``svc up`` holds the data directory."""


@dataclass
class UpOptions:
    """Settings of ``svc up``.

    Attributes:
        data_dir: where everything is kept (``default_data_dir()``).
        host: address every component binds (127.0.0.1).
        port: the decision point's port; the intake listens on ``port + 1``, the history on
            ``port + 2``, the policy service on ``port + 3``, the context service on
            ``port + 4``, the challenge service and its page on ``port + 5``, the demo's
            OpenID Connect provider on ``port + 6``, the gateway on ``port + 7`` and the
            demo's agent-token issuer on ``port + 8``.
        bundle: a bundle directory to publish (module docs); None publishes
            ``<data_dir>/bundle`` on the first start, provisioned with the demo company's
            bundle when missing.
        mode: ``enforce`` or ``monitor`` (docs/architecture.md#monitor-and-enforce).
        retention_days: history retention (``analytics.retentionDays``; 0 keeps all;
            docs/history.md#retention).
        log_retention_ms: how long the topic log keeps records (Kafka's ``retention.ms``).
        log_commit_ms: the decision log's group-commit window (ms, 0 to 1000).
        log_durability: ``window`` or ``durable`` (``svc.pdp.log_settings``).
        log_fsync: fsync the decision log after every group commit.

    """

    data_dir: Path = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = 8080
    bundle: Path | None = None
    mode: str = "enforce"
    retention_days: int = 0
    log_retention_ms: int = 7 * 24 * 3600 * 1000
    log_commit_ms: int = LOG_COMMIT_MS
    log_durability: Durability = LOG_DURABILITY
    log_fsync: bool = LOG_FSYNC


@dataclass(frozen=True)
class Urls:
    """Base URLs of the running components."""

    pdp: str
    intake: str
    history: str
    policy: str
    context: str
    challenge: str
    page: str
    idp: str
    gateway: str
    token_issuer: str


def _bind(host: str, port: int, name: str) -> socket.socket:
    """A TCP socket bound to (`host`, `port`) (``svc.common.net.tcp_listener``), not listening.

    Raises:
        PortTaken: the port is in use or not allowed (the message names it and `name`, the
            component).
        OSError: another bind error (an address not on this machine, for example).

    """
    try:
        return tcp_listener(host, port)
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            why = "in use" if e.errno == errno.EADDRINUSE else "not allowed"
            raise PortTaken(
                f"port {port} on {host} (the {name}) is {why}; stop whatever holds it "
                f"or start on other ports with --port N (svc up uses N to N+{PORT_COUNT - 1})"
            ) from None
        raise


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Binds each port for a moment to see that it is free.

    Args:
        host: the address the components will bind.
        ports: component name -> port.

    Raises:
        PortTaken: a port is in use (the message names it and the component).
        OSError: another bind error.

    """
    for name, port in ports.items():
        _bind(host, port, name).close()


def _token(path: Path) -> str:
    """The intake token kept in ``path`` (created once, mode 0600)."""
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token


def _write_caller_token(
    issuer: LocalIssuer,
    path: Path,
    sub: str = LOCAL_CALLER,
    audience: list[str] = CALLER_AUDIENCE,
) -> None:
    """Writes a new token of `issuer` for `sub` and `audience` to `path` (mode 0600).

    Valid ``CALLER_TOKEN_LIFETIME_SECS``; see ``Stack``.
    """
    token = issuer.mint(sub, audience, CALLER_TOKEN_LIFETIME_SECS)
    write_secret(path, token)


# -- the components
#
# Each is a context manager: it starts its part, returns once that part is ready (waiting on an
# event the part sets, never a sleep loop), and stops it when the block ends, also when it fails
# half-way through its own start. ``Stack`` enters them in order on one ``ExitStack``.


@contextmanager
def _every(interval: float, work: Callable[[], None], name: str) -> Iterator[None]:
    """Runs `work` every `interval` seconds in a daemon thread `name` while the block runs.

    The thread waits on a stop event between runs, so the block's end stops it at once (after
    a run under way). `work` logs its own errors; an exception it lets out ends the thread.
    """
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            work()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``<data_dir>/svc-up.lock`` (which names our pid).

    Raises:
        DataDirBusy: another process holds it (the message names its pid).
        OSError: the directory or the lock file cannot be made.

    """
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "svc-up.lock").open("a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            raise DataDirBusy(
                f"another svc up (pid {holder}) is using {data_dir}; stop it first, or pass "
                "--data-dir for a second install"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield  # closing the file releases the lock


@contextmanager
def _topic_log(path: Path, retention_ms: int) -> Iterator[LocalLog]:
    """The embedded topic log (``svc.broker``) with both topics, trimmed now and hourly.

    Args:
        path: the SQLite file (``<data_dir>/broker.db``).
        retention_ms: records older than this are dropped (Kafka's ``retention.ms``).

    Raises:
        sqlite3.Error: the file cannot be opened.

    """
    topic_log = LocalLog.open(path)
    try:
        topic_log.create_topics([DECISIONS_TOPIC, EVENTS_TOPIC])
        topic_log.trim(retention_ms)

        def trim() -> None:
            try:
                removed = topic_log.trim(retention_ms)
            except Exception:
                log.exception("topic log: trim failed")
                return
            if removed:
                log.info("topic log: %d records past retention removed", removed)

        with _every(TRIM_INTERVAL, trim, "svc-up-trim"):
            yield topic_log
    finally:
        topic_log.close()


class _Stored:
    """Counts the batches the history loader stored; wakes whoever waits for the next one.

    The loader calls it after each stored batch (its ``after_store`` hook);
    ``Stack.wait_for_history`` waits on it.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.batches = 0

    def __call__(self, _batch: object) -> None:
        """Called by the loader's thread after each stored batch."""
        with self._changed:
            self.batches += 1
            self._changed.notify_all()

    def wait_past(self, seen: int, timeout: float) -> None:
        """Returns once more than `seen` batches are stored, or after `timeout` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: self.batches > seen, timeout)


@dataclass(frozen=True)
class _History:
    """The running history store: the chDB client, the loader, whether its thread runs."""

    client: Client
    loader: Loader
    running: Callable[[], bool]


@contextmanager
def _history_store(
    directory: Path, broker_url: str, retention_days: int, stored: _Stored
) -> Iterator[_History]:
    """The history store: chDB in `directory`, its schema applied, the loader reading the log.

    The loader runs in its own thread; at the end it is asked to stop, stores and commits what
    it read, and the thread is joined (records it did not read are loaded on the next start).

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: chDB or the schema failed.

    """
    client = history.connect(f"chdb://{directory.resolve()}")
    history.migrate(client)
    loader = Loader(
        client, broker_url, batch_ms=200, retention_days=retention_days, after_store=stored
    )

    def load() -> None:
        try:
            loader.run()
        except Exception:
            log.exception("history loader stopped on an error")

    thread = threading.Thread(target=load, name="svc-history-loader", daemon=True)
    thread.start()
    try:
        yield _History(client, loader, thread.is_alive)
    finally:
        loader.stop()
        thread.join(timeout=LOADER_STOP_TIMEOUT)
        if thread.is_alive():
            log.warning("the history loader did not stop in %g s", LOADER_STOP_TIMEOUT)


def _write_demo_bundle(company: Company, bundle_dir: Path) -> None:
    """Writes the demo company's bundle to `bundle_dir` (through ``<name>.new``, renamed).

    Without ``entities.json``: the decision point takes people, groups and resources from the
    context service, where ``Stack._provision_context`` puts them.
    """
    from svc.demo.company import write_bundle

    tmp = bundle_dir.with_name(bundle_dir.name + ".new")
    tmp.mkdir(parents=True, exist_ok=True)
    write_bundle(company, tmp, entities=False)
    tmp.rename(bundle_dir)


def _is_demo_bundle(bundle_dir: Path) -> bool:
    """Whether `bundle_dir` is the demo bundle of ``_write_demo_bundle``.

    That is: the demo schema, and no ``entities.json`` (its entities come from the context
    service).

    A data directory of an earlier release, or one whose bundle was replaced, is not: the demo
    company is then not provisioned into the directory (its records would not fit the schema).
    """
    from svc.demo.company import SCHEMA

    schema = bundle_dir / "company.cedarschema"
    try:
        return (
            schema.read_text(encoding="utf-8") == SCHEMA
            and not (bundle_dir / "entities.json").exists()
        )
    except OSError:
        return False


@contextmanager
def _caller_tokens(
    issuer: LocalIssuer,
    path: Path,
    sub: str = LOCAL_CALLER,
    audience: list[str] = CALLER_AUDIENCE,
) -> Iterator[None]:
    """Writes a token for `sub` to `path` now and every half of its lifetime while the block runs.

    Raises:
        OSError: the first token cannot be written (a later failure is only logged).

    """
    _write_caller_token(issuer, path, sub, audience)

    def renew() -> None:
        try:
            _write_caller_token(issuer, path, sub, audience)
        except OSError:
            log.exception("could not renew %s", path)

    with _every(CALLER_TOKEN_LIFETIME_SECS / 2, renew, f"svc-up-token-{sub}"):
        yield


class _Uvicorn(uvicorn.Server):
    """A uvicorn server that sets `settled` once its startup (lifespan, then listener) is done."""

    def __init__(self, config: uvicorn.Config, settled: threading.Event) -> None:
        super().__init__(config)
        self.settled = settled

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Runs uvicorn's startup, then sets `settled` (a failed startup raises SystemExit)."""
        await super().startup(sockets=sockets)
        self.settled.set()


@contextmanager
def _serve_http(app: FastAPI, host: str, port: int, name: str) -> Iterator[None]:
    """Serves `app` under uvicorn, on an asyncio loop in its own thread, while the block runs.

    The port is bound here (a port taken since ``check_ports`` fails here, in the caller's
    thread). Ready once uvicorn's startup finished: its ``startup`` sets an event this waits on;
    the thread's end sets it too, so a failed startup is reported at once. At the end uvicorn
    finishes the requests under way and stops (``should_exit``), and the thread is joined.

    Raises:
        PortTaken: the port is in use.
        OSError: the server did not start (its lifespan failed, or it took over
            ``START_TIMEOUT`` seconds).

    """
    sock = _bind(host, port, name)
    settled = threading.Event()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    server = _Uvicorn(config, settled)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as e:  # SystemExit from a failed startup; reported below
            failure.append(e)
        finally:
            settled.set()

    thread = threading.Thread(target=serve, name=f"svc-up-{name}", daemon=True)
    thread.start()
    try:
        if not settled.wait(START_TIMEOUT):
            raise OSError(f"the {name} did not start in {START_TIMEOUT:g} s")
        if not server.started:
            why = repr(failure[0]) if failure else "it stopped while starting"
            raise OSError(f"the {name} did not start: {why}")
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=HTTP_STOP_TIMEOUT)
        sock.close()


@contextmanager
def _intake(settings: IntakeSettings, progress: Callable[[str], None]) -> Iterator[None]:
    """The intake (``svc.intake``), served until the block ends.

    Ready once its transactional producers are (the pool signals it:
    ``TransactionalPool.wait_ready``).

    Raises:
        PortTaken, OSError: as ``_serve_http``; OSError also when the producers are not ready
            in ``START_TIMEOUT`` seconds (the message says why).

    """
    from svc.intake.app import create_app

    app = create_app(settings)
    with _serve_http(app, settings.host, settings.port, "intake"):
        progress("waiting for the intake's producers")
        pool: TransactionalPool = app.state.pool
        if not pool.wait_ready(START_TIMEOUT):
            raise OSError(f"the intake did not get ready: {pool.not_ready_reason}")
        yield


@contextmanager
def _policy_service(
    settings: PolicySettings,
    auth: PolicyAuthSettings,
    bundle_dir: Path,
    republish: bool,
    history: Client | None = None,
) -> Iterator[PolicyServer]:
    """The policy service (``svc.policy``), served in a thread of its own until the block ends.

    Ready once it listens, with a bundle active: when nothing is published yet (or
    `republish` and `bundle_dir`'s files differ from the active bundle's), `bundle_dir` is
    drafted and published (version 1 on a first start). Its public key is written to
    ``<data_dir>/policy-signing.pub`` for the decision point.

    Args:
        settings: the service's settings (SQLite under the data directory, ``port + 3``).
        auth: who may call it.
        bundle_dir: the bundle directory to publish.
        republish: publish `bundle_dir` again when it differs from the active bundle.
        history: the history client dry runs read (this process's chDB engine).

    Raises:
        svc.policy.service.PolicyError: the bundle does not validate (every problem named).
        OSError: the database, the key or the port cannot be opened.
        AuthConfigError: the issuer's keys cannot be loaded.

    """
    service = PolicyService(settings, history=history)
    try:
        files = {
            p.name: p.read_text(encoding="utf-8")
            for p in sorted(bundle_dir.iterdir())
            if p.is_file()
        }
        active = service.get_active()
        if active is None or (republish and active.files != files):
            draft = service.create_draft(files, LOCAL_CALLER, comment=f"svc up: {bundle_dir}")
            service.publish(draft.version, LOCAL_CALLER)
        (settings.data_dir / "policy-signing.pub").write_text(
            signing.public_key_text(service.public_key), encoding="utf-8"
        )
        server = PolicyServer(settings, service, auth=auth).start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        service.close()


@contextmanager
def _context_service(
    settings: ContextSettings, auth: ContextAuthSettings
) -> Iterator[ContextService]:
    """The context service (``svc.context``) on ``settings.port``, until the block ends.

    Its database is migrated first (``ContextService``); the app is served by
    ``_serve_http``.

    Args:
        settings: the service's settings (SQLite under the data directory, ``port + 4``, the
            SCIM token).
        auth: who may call its ``/v1`` routes (docs/auth.md).

    Yields:
        The service layer (the provisioning reads its counts).

    Raises:
        PortTaken, OSError: as ``_serve_http``.
        AuthConfigError: the issuer's keys cannot be loaded.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or migrated.

    """
    from svc.context.app import create_app as context_app

    service = ContextService(settings)
    try:
        with _serve_http(
            context_app(service, settings, auth), settings.host, settings.port, "context service"
        ):
            yield service
    finally:
        service.close()


@contextmanager
def _challenge_service(
    settings: ChallengeSettings,
    auth: ChallengeAuthSettings,
    directory_token: Callable[[], str | None],
    pdp_token: Callable[[], str | None] = lambda: None,
) -> Iterator[ChallengeServer]:
    """The challenge service (``svc.challenge``) on ``settings.port``, until the block ends.

    Its database is migrated first (``ChallengeService``); who answers a challenge (owners,
    managers) is read from the context service at ``settings.context_url`` with
    `directory_token`. Served in a thread of its own (``ChallengeServer``, hypercorn), ready
    once it listens. No webhook: notifications stay in its outbox.

    Args:
        settings: the service's settings (SQLite under the data directory, ``port + 5``).
        auth: who may call it (docs/auth.md, audience ``svc-challenge``).
        directory_token: the bearer token for the context service's directory.
        pdp_token: the bearer token for the decision point at ``settings.pdp_url``, asked
            whether an approver may ``approve`` (docs/challenges.md#who-answers).

    Yields:
        The running server (``server.service`` is the service layer).

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use).
        AuthConfigError: the issuer's keys cannot be loaded.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or migrated.

    """
    assert settings.context_url is not None
    approvers = ApproverCheck(settings.pdp_url, pdp_token) if settings.pdp_url else None
    service = ChallengeService(
        settings,
        directory=ContextDirectory(settings.context_url, directory_token),
        approvers=approvers,
    )
    try:
        try:
            server = ChallengeServer(settings, service, auth=auth).start()
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                _bind(settings.host, settings.port, "challenge service").close()
            raise
        try:
            yield server
        finally:
            server.stop()
    finally:
        service.close()


@contextmanager
def _dev_identity_provider(host: str, port: int) -> Iterator[DevIdentityProvider]:
    """The demo's OpenID Connect provider (``svc.challenge.dev_idp``) on ``port``, until the end.

    For the demo only: its form signs anybody in as any user name. A real install points the
    challenge service's ``oidc_issuer`` at its own provider (docs/challenges.md#sign-in).

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use).

    """
    try:
        idp = DevIdentityProvider(host, port).start()
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            _bind(host, port, "demo identity provider").close()
        raise
    try:
        yield idp
    finally:
        idp.stop()


@contextmanager
def _dev_token_issuer(directory: Path, host: str, port: int) -> Iterator[DevTokenIssuer]:
    """The demo's agent-token issuer (``svc.demo.token_issuer``) on ``port`` (HTTPS), until the end.

    For the demo only: it plays the apps trusted to sign the demo agents' tokens
    (docs/demo.md#agent-tokens); its keys stay in `directory` across restarts.

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use), or the keys or
            certificates cannot be written.

    """
    from svc.demo.token_issuer import DevTokenIssuer

    try:
        issuer = DevTokenIssuer(directory, host, port).start()
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            _bind(host, port, "demo token issuer").close()
        raise
    try:
        yield issuer
    finally:
        issuer.stop()


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
def _gateway(settings: GatewaySettings) -> Iterator[GatewayServer]:
    """The MCP gateway (``svc.gateway``) on ``settings.port``, until the block ends.

    Returns once its ``/readyz`` answers 200 (every upstream connected, the trusted apps, the
    containment list and the outage tiers loaded; docs/gateway.md#routes). The gateway offers
    no event to wait on, so readiness is asked every 50 ms, for at most ``START_TIMEOUT``.

    Raises:
        OSError: the port cannot be bound (``PortTaken`` when it is in use), or the gateway
            was not ready within ``START_TIMEOUT`` (the message says what it lacked).

    """
    from svc.gateway.app import GatewayServer

    server = GatewayServer(settings)
    try:
        server.start()
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            _bind(settings.host, settings.port, "gateway").close()
        raise
    try:
        deadline = time.monotonic() + START_TIMEOUT
        url = f"http://{settings.host}:{settings.port}/readyz"
        with httpx.Client(timeout=5) as client:
            while True:
                try:
                    r = client.get(url)
                    if r.status_code == 200:
                        break
                    why = r.text
                except httpx.TransportError as e:
                    why = str(e)
                if time.monotonic() > deadline:
                    raise OSError(f"the gateway was not ready in {START_TIMEOUT:.0f} s: {why}")
                time.sleep(0.05)
        yield server
    finally:
        server.stop()


def _client_secret(path: Path) -> Path:
    """``path``, holding a random client secret (written once, mode 0600)."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


# -- the supervisor


class Stack:
    """Every component of ``svc up`` in this process (module docs); ``start`` then ``stop``.

    Args:
        options: the settings.
        progress: called with a short phrase as each step starts (the progress line).

    Attributes after ``start``: ``urls``, ``bundle_dir``, ``intake_token``, ``issuer`` (the
    local token issuer), ``caller_token_path``, ``history`` (the chDB client), ``loader``,
    ``log`` (the topic log).

    """

    def __init__(
        self, options: UpOptions, progress: Callable[[str], None] = lambda _: None
    ) -> None:
        self.options = options
        self.progress = progress
        d = options.data_dir
        self.broker_url = f"{LOCAL_SCHEME}{(d / 'broker.db').resolve()}"
        p = options.port
        self.urls = Urls(
            pdp=f"http://{options.host}:{p}",
            intake=f"http://{options.host}:{p + 1}",
            history=f"http://{options.host}:{p + 2}",
            policy=f"http://{options.host}:{p + 3}",
            context=f"http://{options.host}:{p + 4}",
            challenge=f"http://{options.host}:{p + 5}",
            page=f"http://localhost:{p + 5}",
            idp=f"http://{options.host}:{p + 6}",
            gateway=f"http://{options.host}:{p + GATEWAY_OFFSET}",
            token_issuer=f"https://{options.host}:{p + TOKEN_ISSUER_OFFSET}",
        )
        self.bundle_dir = options.bundle or d / "bundle"
        self.intake_token = ""
        self.issuer: LocalIssuer | None = None
        self.caller_token_path = d / "caller.token"
        self.history: Client | None = None
        self.loader: Loader | None = None
        self.log: LocalLog | None = None
        self.policy: PolicyServer | None = None
        self.context: ContextService | None = None
        self.challenge: ChallengeServer | None = None
        self.scim_token = ""
        self.token_issuer: DevTokenIssuer | None = None
        self.gateway: GatewayServer | None = None
        self._exit = ExitStack()
        self._stored = _Stored()

    @functools.cached_property
    def demo_company(self) -> Company:
        """The demo company (``svc.demo.company.generate()``, deterministic), built once."""
        from svc.demo import company

        return company.generate()

    def _provision_containments(self) -> None:
        """Contains the demo company's contained people through the challenge service.

        ``Contain`` as the reasoner or the portal would (``svc.demo.directory``); the decision
        point follows the list (``WatchContainments``). Done once, when ``challenge.db`` is
        created, so a later ``Lift`` stays lifted.

        Raises:
            svc.demo.directory.ProvisionError: the service refused a call.

        """
        from svc.demo.directory import provision_containments

        issuer = self.issuer
        assert issuer is not None
        n = provision_containments(
            self.urls.challenge,
            self.demo_company,
            token=lambda: issuer.mint(LOCAL_CALLER, "svc-challenge", 600),
        )
        log.info("contained %d people of the demo company through the challenge service", n)

    def _provision_context(self) -> None:
        """Writes the demo company into the context service as a real install would.

        People and groups over SCIM, resources and work items through the batch routes, the
        agents through the service-account route, the reasoner's scores through ``/v1/risk``
        (``svc.demo.directory.provision_context``).

        Raises:
            svc.demo.directory.ProvisionError: the service refused a request.

        """
        from svc.demo.directory import provision_context

        issuer = self.issuer
        assert issuer is not None
        done = provision_context(
            self.urls.context,
            self.demo_company,
            scim_token=self.scim_token,
            token=lambda: issuer.mint(LOCAL_CALLER, "svc-context", 600),
        )
        log.info("provisioned the demo company through the context service: %s", done)

    def start(self) -> None:
        """Starts every component in order; on failure stops what started and re-raises.

        Each component is entered on one ``ExitStack`` once it is ready, so ``stop`` (and a
        failure half-way) stops them newest first.

        Raises:
            PortTaken: a port is in use (nothing started, or a port taken while starting).
            DataDirBusy: another ``svc up`` holds the data directory (nothing started).
            BundleError: the bundle does not load.
            svc.policy.service.PolicyError: the policy service refuses the bundle.
            OSError: a listener or a file could not be opened, or a component did not start.
            AuthConfigError: the local issuer's JWKS could not be loaded.

        """
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        o = self.options
        d = o.data_dir
        enter = self._exit.enter_context

        self.progress("checking the data directory and ports")
        enter(_data_dir_lock(d))
        check_ports(
            o.host,
            {
                "decision point": o.port,
                "intake": o.port + 1,
                "history": o.port + 2,
                "policy service": o.port + 3,
                "context service": o.port + 4,
                "challenge service": o.port + 5,
                "demo identity provider": o.port + 6,
                "gateway": o.port + GATEWAY_OFFSET,
                "demo token issuer": o.port + TOKEN_ISSUER_OFFSET,
            },
        )

        self.progress("opening the topic log")
        self.log = enter(_topic_log(d / "broker.db", o.log_retention_ms))

        self.progress("opening the history store (chDB) and applying its schema")
        store = enter(
            _history_store(d / "history", self.broker_url, o.retention_days, self._stored)
        )
        self.history, self.loader = store.client, store.loader

        if o.bundle is None and not self.bundle_dir.exists():
            self.progress("writing the demo company's bundle")
            _write_demo_bundle(self.demo_company, self.bundle_dir)
        self.intake_token = _token(d / "intake.token")

        self.progress("starting the local token issuer")
        self.issuer = LocalIssuer(d / "issuer")
        enter(_caller_tokens(self.issuer, self.caller_token_path))
        common_auth: dict[str, Any] = {
            "auth": "jwt",
            "auth_issuer": self.issuer.issuer,
            "auth_jwks": self.issuer.jwks_url,
        }

        self.progress("starting the policy service")
        policy_settings = PolicySettings(
            host=o.host,
            port=o.port + 3,
            database_url=f"sqlite:///{(d / 'policy.db').resolve()}",
            data_dir=d,
            default_mode=o.mode,
        )
        self.policy = enter(
            _policy_service(
                policy_settings,
                PolicyAuthSettings(
                    **common_auth, auth_callers=[LOCAL_CALLER, PDP_CALLER, GATEWAY_CALLER]
                ),
                self.bundle_dir,
                republish=o.bundle is not None,
                history=self.history,
            )
        )

        self.progress("starting the context service")
        self.scim_token = _token(d / "scim.token")
        context_settings = ContextSettings(
            host=o.host,
            port=o.port + 4,
            database_url=f"sqlite:///{(d / 'context.db').resolve()}",
            scim_token=SecretStr(self.scim_token),
        )
        self.context = enter(
            _context_service(
                context_settings,
                ContextAuthSettings(
                    **common_auth,
                    auth_callers=[LOCAL_CALLER, PDP_CALLER, CHALLENGE_CALLER, GATEWAY_CALLER],
                ),
            )
        )
        if (
            o.bundle is None
            and _is_demo_bundle(self.bundle_dir)
            and self.context.counts()["people"] == 0
        ):
            self.progress("provisioning the demo company through the context service")
            self._provision_context()

        self.progress("starting the demo token issuer")
        self.token_issuer = enter(
            _dev_token_issuer(d / "token-issuer", o.host, o.port + TOKEN_ISSUER_OFFSET)
        )
        # Trusted as an admin would trust the apps that run the demo agents (an upsert: a new
        # port replaces the URLs), docs/architecture.md#trusted-app-issuers.
        for record in self.token_issuer.trusted_apps():
            self.context.put_trusted_app(record)

        self.progress("starting the demo identity provider")
        enter(_dev_identity_provider(o.host, o.port + 6))

        self.progress("starting the challenge service")
        issuer = self.issuer
        challenge_db = d / "challenge.db"
        fresh = not challenge_db.exists()
        challenge_settings = ChallengeSettings(
            host=o.host,
            port=o.port + 5,
            database_url=f"sqlite:///{challenge_db.resolve()}",
            context_url=self.urls.context,
            origins=[self.urls.page],
            page_url=f"{self.urls.page}/challenge",
            link_key_file=str(d / "challenge-link.key"),
            oidc_issuer=self.urls.idp,
            oidc_client_id="svc-up-challenge-page",
            oidc_client_secret_file=str(_client_secret(d / "challenge-oidc-client.secret")),
            # The demo provider's `sub` is the user name typed in its form.
            oidc_username_claim="sub",
            pdp_url=f"http://{o.host}:{o.port}",
        )
        self.challenge = enter(
            _challenge_service(
                challenge_settings,
                ChallengeAuthSettings(
                    **common_auth, auth_callers=[LOCAL_CALLER, PDP_CALLER, GATEWAY_CALLER]
                ),
                lambda: issuer.mint(CHALLENGE_CALLER, "svc-context", 600),
                lambda: issuer.mint(CHALLENGE_CALLER, "svc-pdp", 600),
            )
        )
        if fresh and o.bundle is None and _is_demo_bundle(self.bundle_dir):
            self.progress("containing the demo company's contained person")
            self._provision_containments()

        self.progress("starting the decision point")
        pdp_opts = StandaloneOptions(
            host=o.host,
            port=o.port,
            mode=o.mode,
            policy=self.policy.target,
            public_key=d / "policy-signing.pub",
            context=self.urls.context,
            # A resource a check names is fetched from the context service in this process; on
            # a busy laptop a fetch may take longer than svc pdp's 200 ms default, and a check
            # decided without its resource would make the demo's answers depend on the load.
            context_fetch_timeout_ms=SVC_UP_FETCH_TIMEOUT_MS,
            challenge=self.urls.challenge,
            kafka_url=self.broker_url,
            spool_dir=d / "pdp-spool",
            auth=PdpAuthSettings(
                **common_auth,
                auth_callers=[LOCAL_CALLER, DEMO_CALLER, CHALLENGE_CALLER, GATEWAY_CALLER],
            ),
            log_commit_ms=o.log_commit_ms,
            log_durability=o.log_durability,
            log_fsync=o.log_fsync,
        )
        enter(
            serve_bundle(
                None,
                pdp_opts,
                token=lambda: issuer.mint(PDP_CALLER, "svc-policy", 3600),
                context_token=lambda: issuer.mint(PDP_CALLER, "svc-context", 3600),
                context_wait_secs=START_TIMEOUT,
                challenge_token=lambda: issuer.mint(PDP_CALLER, "svc-challenge", 3600),
            )
        )

        self.progress("starting the intake and the history routes")
        intake = IntakeSettings(
            host=o.host,
            port=o.port + 1,
            kafka_url=self.broker_url,
            token=SecretStr(self.intake_token),
        )
        enter(_intake(intake, self.progress))
        routes = history_app(
            store.client,
            store.loader,
            auth=HistoryAuthSettings(**common_auth, auth_callers=[LOCAL_CALLER]),
            ready=store.running,
        )
        enter(_serve_http(routes, o.host, o.port + 2, "history"))

        self.progress("starting the gateway and the demo's tools server")
        from svc.gateway.settings import GatewaySettings

        gateway_token = d / "gateway.token"
        enter(_caller_tokens(issuer, gateway_token, GATEWAY_CALLER, GATEWAY_AUDIENCE))
        assert self.token_issuer is not None
        self.gateway = enter(
            _gateway(
                GatewaySettings(
                    host=o.host,
                    port=o.port + GATEWAY_OFFSET,
                    upstreams=demo_upstreams(),
                    public_url=self.urls.gateway,
                    pdp_url=self.urls.pdp,
                    pdp_token_file=str(gateway_token),
                    challenge_url=self.urls.challenge,
                    challenge_token_file=str(gateway_token),
                    policy_url=self.urls.policy,
                    policy_token_file=str(gateway_token),
                    context_url=self.urls.context,
                    context_token_file=str(gateway_token),
                    jwks_ca_file=str(self.token_issuer.ca_file),
                    intake_url=self.urls.intake,
                    intake_token_file=str(d / "intake.token"),
                )
            )
        )

    def write_caller_token(self) -> None:
        """Writes a new caller token to ``caller_token_path`` (mode 0600).

        The token: ``sub`` ``LOCAL_CALLER``, audience ``svc-pdp`` and ``svc-history``, valid
        ``CALLER_TOKEN_LIFETIME_SECS``; ``start`` writes one and renews it every half of that.

        Raises:
            OSError: the file cannot be written.

        """
        assert self.issuer is not None
        _write_caller_token(self.issuer, self.caller_token_path)

    def demo_token(self) -> str:
        """A token for the demo traffic (``DEMO_CALLER``, audience ``svc-pdp``, valid an hour)."""
        assert self.issuer is not None
        return self.issuer.mint(DEMO_CALLER, "svc-pdp", 3600)

    # -- running

    def history_totals(self) -> dict[str, int]:
        """Rows in the history's decisions, events and rejected tables."""
        assert self.history is not None
        return totals(self.history)

    def wait_for_history(
        self,
        decisions: int,
        events: int,
        counts: Callable[[], tuple[int, int]] | None = None,
        timeout: float = 120.0,
    ) -> tuple[int, int]:
        """Waits until the history holds at least this many decision and event rows.

        The counts are read again each time the loader stored a batch (it signals each one).

        Args:
            decisions: decision rows to wait for.
            events: event rows to wait for.
            counts: returns the current (decision rows, event rows); default the whole
                history's (``history_totals``).
            timeout: seconds to wait at most.

        Returns:
            The last counts seen (possibly short of the targets after ``timeout``).

        """

        def whole() -> tuple[int, int]:
            t = self.history_totals()
            return t["decisions"], t["events"]

        read = counts or whole
        deadline = time.monotonic() + timeout
        while True:
            seen = self._stored.batches  # before reading: a batch stored meanwhile wakes us
            d, e = read()
            left = deadline - time.monotonic()
            if (d >= decisions and e >= events) or left <= 0:
                return d, e
            self._stored.wait_past(seen, left)

    # -- stop

    def stop(self) -> None:
        """Stops every component that started, newest first. Idempotent.

        The order is the reverse of ``start``: the gateway (and with it the tools server) and
        its token's renewal, the history routes, the intake, the decision point (its shipper's
        last records reach the topic log), the challenge service, the demo identity provider,
        the demo token issuer, the context service, the policy service, the caller-token
        renewal, the loader (it stores what it read; the rest is loaded on the next start), the
        topic log, and the data directory's lock.
        """
        try:
            self._exit.close()
        finally:
            self.loader = None
            self.log = None
            self.policy = None
            self.context = None
            self.challenge = None
            self.gateway = None
            self.token_issuer = None


# -- the command


def _banner(stack: Stack, seconds: float) -> str:
    o = stack.options
    d = o.data_dir
    u = stack.urls
    active = stack.policy.service.active_version() if stack.policy is not None else 0
    return "\n".join(
        [
            f"svc up: ready in {seconds:.1f} s; data in {d}",
            f"  decision point  {u.pdp}   gRPC svc.authz.v1.Authorizer + HTTP "
            "(/v1/access/evaluation, /v1/access/plan, AuthZEN /access/v1/evaluation)",
            f"  intake          {u.intake}   POST /v1/events (bearer token in "
            f"{d / 'intake.token'})",
            f"  history         {u.history}   GET /v1/history/decisions?principal=Type::id",
            f"  policy service  {u.policy}   gRPC svc.policy.v1.PolicyService "
            f"(svc policy active --url {u.policy})",
            f"  context service {u.context}   SCIM 2.0 at /scim/v2 (bearer token in "
            f"{d / 'scim.token'}), /v1/principals, /v1/resources, /v1/directory/people",
            f"  challenges      {u.challenge}   gRPC svc.challenge.v1.ChallengeService "
            "(Contain, Lift, ListContainments: the decision point follows the containments)",
            f"  challenge page  {u.page}/keys   your security keys; notifications link to "
            f"{u.page}/challenge/<qid> (sign in at {u.idp}, the demo identity provider: any "
            "user name, for the demo only)",
            f"  gateway         {u.gateway}   MCP at /mcp/demo (the demo company's documents "
            "and tickets), challenge waits at /mcp/challenges/<qid>",
            f"  agent tokens    {u.token_issuer}   the demo apps' keys (CA "
            f"{d / 'token-issuer' / 'ca.pem'}); svc demo token --agent ID --for PERSON",
            f"  caller token    {stack.caller_token_path} (Authorization: Bearer, for the "
            "decision point, the history, and the policy, context and challenge services)",
            f"  bundle          version {active} active, from {stack.bundle_dir} (change it "
            "with svc policy draft and publish)",
            f"  mode            {o.mode}",
        ]
    )


def run(options: UpOptions, *, demo_checks: int = 0, keep_serving: bool = True) -> int:
    """``svc up`` / ``svc demo``: start, print the URLs, optionally run the demo, serve.

    Progress goes to standard error (one updating line on a terminal, one line per step
    otherwise); the URLs and the demo's summary go to standard output.

    Args:
        options: the settings.
        demo_checks: run the demo company's traffic with this many checks (0: no demo).
        keep_serving: serve until SIGINT/SIGTERM after starting (and after the demo).

    Returns:
        The exit code: 0; 2 when the install could not start (the reason is printed); 130
        when Ctrl-C interrupted the start or the demo.

    """
    import signal

    from svc.pdp import BundleError

    err = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)
    stack = Stack(options)
    t0 = time.monotonic()
    try:
        with _Progress(err, "svc up") as progress:
            stack.progress = progress
            stack.start()
    except (PortTaken, DataDirBusy) as e:
        err.print(f"svc up: {e}")
        return 2
    except BundleError as e:
        err.print(f"svc up: the bundle {stack.bundle_dir} does not load:\n{e}")
        return 2
    except PolicyError as e:
        problems = "".join(f"\n  {v.field}: {v.description}" for v in e.violations)
        err.print(f"svc up: the bundle {stack.bundle_dir} is refused: {e.message}{problems}")
        return 2
    except KeyboardInterrupt:
        err.print("svc up: interrupted while starting; stopped")
        return 130
    except (OSError, AuthConfigError) as e:
        err.print(f"svc up: could not start: {e}")
        return 2

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    # While the demo runs, Ctrl-C (or SIGTERM) interrupts it; while serving, it ends the wait.
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, interrupt) for s in signals}
    code = 0
    try:
        print(_banner(stack, time.monotonic() - t0), flush=True)
        if demo_checks:
            try:
                print(run_demo(stack, demo_checks, err), flush=True)
            except KeyboardInterrupt:
                err.print("demo: interrupted")
                keep_serving, code = False, 130
        if keep_serving:
            stop = threading.Event()
            for s in signals:
                signal.signal(s, lambda *_: stop.set())
            print("Ctrl-C stops (the data directory is kept).", flush=True)
            stop.wait()
    finally:
        err.print("svc up: stopping")
        stack.stop()
        for s, h in previous.items():
            signal.signal(s, h)
        err.print(f"svc up: stopped; data kept in {options.data_dir}")
    return code


def run_demo(stack: Stack, checks: int, err: Console) -> str:
    """Drives the demo company's traffic through the running stack and reads the summary back.

    Args:
        stack: the running stack (serving the demo company's bundle).
        checks: checks to send.
        err: where progress goes (standard error).

    Returns:
        The summary, read from the history (``svc.demo.summary``).

    """
    from svc.demo import summary, traffic

    with _Progress(err, "demo") as progress:
        report = traffic.drive(
            stack.demo_company,
            stack.urls.pdp,
            stack.urls.intake,
            stack.intake_token,
            pdp_token=stack.demo_token(),
            checks=checks,
            progress=progress,
        )
        progress("waiting for the history to load what was sent")
        client = stack.history
        assert client is not None
        start, end = report.window()
        got = stack.wait_for_history(
            report.decisions_sent,
            report.events_sent,
            counts=lambda: summary.history_counts(client, start, end),
        )
    if got < (report.decisions_sent, report.events_sent):
        err.print(
            f"demo: the history holds {got[0]} of {report.decisions_sent} decisions and "
            f"{got[1]} of {report.events_sent} events after waiting; summarising what is there"
        )
    return summary.summarize(client, report)


class _Progress:
    """The progress line: one updating status on a terminal, one printed line per step otherwise.

    Args:
        console: a rich console (standard error).
        prefix: put before each phase (``svc up``).

    Use as a context manager; call it with each phase.

    """

    def __init__(self, console: Console, prefix: str) -> None:
        self.console = console
        self.prefix = prefix
        self._status: Status | None = None

    def __enter__(self) -> _Progress:
        if self.console.is_terminal:
            self._status = self.console.status(f"{self.prefix}: starting", spinner="dots")
            self._status.start()
        return self

    def __call__(self, phase: str) -> None:
        """Shows ``phase``."""
        if self._status is not None:
            self._status.update(f"{self.prefix}: {phase}")
        else:
            self.console.print(f"{self.prefix}: {phase}")

    def __exit__(self, *_: object) -> None:
        if self._status is not None:
            self._status.stop()
