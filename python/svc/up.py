"""``svc up``: every component on one machine, in one process, with the embedded defaults.

One process on 127.0.0.1 (docs/architecture.md#embedded-defaults-and-production-parts) runs
every part of the component registry (``svc.registry``; docs/architecture.md#the-component-registry)
in its start order, each on its port from ``--port`` (8080): the decision point on ``port``,
the intake on ``port + 1``, the history's routes on ``port + 2``, the policy service on
``port + 3``, the context service on ``port + 4``, the challenge service and its page on
``port + 5``, the demo's OpenID Connect provider on ``port + 6``, the MCP gateway on
``port + 7`` and the demo's agent-token issuer on ``port + 8`` (each registration says how it
starts, with what settings, and its lines of the banner).

The embedded defaults stand in for the real parts, opened here before any component: the
topic log of ``svc.broker`` (``local://<data_dir>/broker.db``) instead of Kafka, chDB in
``<data_dir>/history`` instead of a ClickHouse server, with its loader (the policy service's
dry runs and the history's routes read the same client), SQLite files for the relational
stores, and a local token issuer (``svc.common.auth.LocalIssuer``, an ES256 key in
``<data_dir>/issuer/``) instead of the cluster's. The records are the same as in production.

The data directory keeps everything across restarts: the topic log (records not loaded yet are
loaded after a restart), the history, the decision-log spool, the intake and SCIM tokens, the
local issuer's key, the services' databases, and the bundle directory first published.

Callers (docs/auth.md): each start writes a caller token for the person at this machine to
``<data_dir>/caller.token`` (mode 0600, ``sub`` ``svc-local``, the audience of every component
that admits the operator, valid 24 hours and renewed every 12 hours while ``svc up`` runs).
Each other role of ``svc.common.component.Role`` calls as ``svc-up-<role>`` (the demo traffic
as ``svc-demo``) with tokens minted per call or kept in ``<data_dir>/<role>.token``; each API
admits the roles its registration lists.

On the first start (nothing published yet) the bundle directory is published as version 1:
``--bundle``'s, else ``<data_dir>/bundle``, the demo company's (``svc.demo``), written when
missing. With the demo company, the demo parts (``svc.demo.component``) provision its
directory and containments and run its issuers and tools.

Refusals happen before anything starts: a port in use, or another ``svc up`` on the same data
directory (an exclusive ``flock`` on ``<data_dir>/svc-up.lock``).

``Stack`` is the supervisor: the data directory's lock, the topic log, the history store and
its loader, the caller token, then each registration's ``start``, entered in that order on one
``ExitStack``. Each returns once its part is ready, so ``stop``, or a failure half-way through
the start, stops what started in reverse order.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clickhouse_connect.driver.client import Client
from rich.console import Console
from rich.status import Status

from svc import history, registry
from svc.broker import LOCAL_SCHEME, LocalLog
from svc.common.auth import AuthConfigError, LocalIssuer, write_secret
from svc.common.component import Role
from svc.common.inprocess import PortTaken, check_ports, every
from svc.common.install import default_data_dir
from svc.common.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from svc.history.component import HISTORY_RUNNING
from svc.history.loader import Loader
from svc.history.service import totals
from svc.pdp.log_settings import LOG_COMMIT_MS, LOG_DURABILITY, LOG_FSYNC, Durability
from svc.policy.service import PolicyError

if TYPE_CHECKING:
    from svc.challenge.app import ChallengeServer
    from svc.context.service import ContextService
    from svc.demo.company import Company
    from svc.demo.token_issuer import DevTokenIssuer
    from svc.gateway.app import GatewayServer
    from svc.policy.app import PolicyServer

__all__ = [
    "DataDirBusy",
    "PortTaken",
    "Stack",
    "UpOptions",
    "check_ports",
    "default_data_dir",
]

log = logging.getLogger("svc.up")

#: How often the topic log drops records past its retention (seconds).
TRIM_INTERVAL = 3600.0

#: ``sub`` of the caller token ``svc up`` writes to ``<data_dir>/caller.token``.
LOCAL_CALLER = "svc-local"

#: ``sub`` of the demo traffic's token (``svc demo``, ``svc up --demo``).
DEMO_CALLER = "svc-demo"

#: Lifetime of a caller token (a working day and then some), in seconds; ``svc up`` writes a
#: new one every half of it.
CALLER_TOKEN_LIFETIME_SECS = 24 * 3600

#: Longest wait, in seconds, for the history loader to store what it read and stop.
LOADER_STOP_TIMEOUT = 60.0

#: The gateway's port is ``port + GATEWAY_OFFSET``.
GATEWAY_OFFSET = registry.by_name("gateway").up_port or 0

#: The development agent-token issuer's port (HTTPS) is ``port + TOKEN_ISSUER_OFFSET``.
TOKEN_ISSUER_OFFSET = registry.by_name("agent-issuer").up_port or 0

#: How many consecutive ports ``svc up`` takes, from ``port``.
PORT_COUNT = registry.up_port_count()


def subject(role: str) -> str:
    """The token subject of `role` under ``svc up`` (module docs)."""
    if role == Role.OPERATOR:
        return LOCAL_CALLER
    if role == Role.DEMO:
        return DEMO_CALLER
    return f"svc-up-{role}"


class DataDirBusy(Exception):
    """Another ``svc up`` holds the data directory."""


@dataclass
class UpOptions:
    """Settings of ``svc up``.

    Attributes:
        data_dir: where everything is kept (``default_data_dir()``).
        host: address every component binds (127.0.0.1).
        port: the decision point's port; every other part's is an offset from it (module
            docs; ``PORT_COUNT`` consecutive ports).
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


def _write_caller_token(issuer: LocalIssuer, path: Path, sub: str, audience: list[str]) -> None:
    """Writes a new token of `issuer` for `sub` and `audience` to `path` (mode 0600).

    Valid ``CALLER_TOKEN_LIFETIME_SECS``; see ``Stack``.
    """
    token = issuer.mint(sub, audience, CALLER_TOKEN_LIFETIME_SECS)
    write_secret(path, token)


@contextmanager
def _caller_tokens(
    issuer: LocalIssuer, path: Path, sub: str, audience: list[str]
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

    with every(CALLER_TOKEN_LIFETIME_SECS / 2, renew, f"svc-up-token-{sub}"):
        yield


# -- the embedded parts
#
# Each is a context manager: it opens its part, returns once that part is ready, and closes it
# when the block ends, also when it fails half-way through its own start.


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

        with every(TRIM_INTERVAL, trim, "svc-up-trim"):
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


# -- the supervisor


class Stack:
    """Every part of ``svc up`` in this process (module docs); ``start`` then ``stop``.

    It is the ``svc.common.component.UpRuntime`` the registrations start on.

    Args:
        options: the settings.
        progress: called with a short phrase as each step starts (the progress line).

    Attributes after ``start``: ``urls``, ``bundle_dir``, ``intake_token``, ``issuer`` (the
    local token issuer), ``caller_token_path``, ``history`` (the chDB client), ``loader``,
    ``log`` (the topic log), ``running`` (what each registration's ``start`` yielded) and the
    shortcuts ``policy``, ``context``, ``challenge``, ``gateway``, ``token_issuer``.

    """

    def __init__(
        self, options: UpOptions, progress: Callable[[str], None] = lambda _: None
    ) -> None:
        self.options = options
        self.progress = progress
        d = options.data_dir
        self.host = options.host
        self.data_dir = d
        self.broker_url = f"{LOCAL_SCHEME}{(d / 'broker.db').resolve()}"
        self.urls = Urls(
            pdp=self.url("pdp"),
            intake=self.url("intake"),
            history=self.url("history"),
            policy=self.url("policy"),
            context=self.url("context"),
            challenge=self.url("challenge"),
            page=f"http://localhost:{self.port('challenge')}",
            idp=self.url("idp"),
            gateway=self.url("gateway"),
            token_issuer=self.url("agent-issuer"),
        )
        self.bundle_dir = options.bundle or d / "bundle"
        self.issuer: LocalIssuer | None = None
        self.caller_token_path = d / "caller.token"
        self.history: Client | None = None
        self.loader: Loader | None = None
        self.log: LocalLog | None = None
        self.demo = False
        self.shared: dict[str, Any] = {}
        self.running: dict[str, Any] = {}
        self._token_files: dict[str, Path] = {}
        self._exit = ExitStack()
        self._stored = _Stored()

    # -- the runtime the registrations start on (svc.common.component.UpRuntime)

    def port(self, name: str) -> int:
        """The port of component `name` (``--port`` plus its registration's offset)."""
        offset = registry.by_name(name).up_port
        if offset is None:
            raise KeyError(f"{name} has no port under svc up")
        return self.options.port + offset

    def url(self, name: str) -> str:
        """``http://<host>:<port>`` of `name`; ``https`` for the demo's agent-token issuer."""
        scheme = "https" if name == "agent-issuer" else "http"
        return f"{scheme}://{self.options.host}:{self.port(name)}"

    def subject(self, role: str) -> str:
        """The token subject of `role` (``svc-local``, ``svc-demo``, ``svc-up-<role>``)."""
        return subject(role)

    def token(self, role: str, component: str, lifetime_secs: int) -> Callable[[], str]:
        """A function minting a token of `role` for `component`'s audience at each call."""
        audience = registry.by_name(component).audience
        assert audience is not None, component

        def mint() -> str:
            assert self.issuer is not None
            return self.issuer.mint(subject(role), audience, lifetime_secs)

        return mint

    def token_file(self, role: str) -> Path:
        """``<data_dir>/<role>.token``, written now and renewed while ``svc up`` runs."""
        path = self._token_files.get(role)
        if path is None:
            assert self.issuer is not None
            path = self.data_dir / f"{role}.token"
            self.enter(
                _caller_tokens(self.issuer, path, subject(role), registry.audiences_of(role))
            )
            self._token_files[role] = path
        return path

    def auth(self, component: str) -> dict[str, Any]:
        """The local issuer and the roles `component` admits, by subject (docs/auth.md)."""
        assert self.issuer is not None
        return {
            "auth": "jwt",
            "auth_issuer": self.issuer.issuer,
            "auth_jwks": self.issuer.jwks_url,
            "auth_roles": {subject(r): r for r in registry.by_name(component).callers},
        }

    def enter(self, cm: AbstractContextManager[Any]) -> Any:
        """Enters `cm` on the exit stack (stopped, newest first, by ``stop``)."""
        return self._exit.enter_context(cm)

    @functools.cached_property
    def demo_company(self) -> Company:
        """The demo company (``svc.demo.company.generate()``, deterministic), built once."""
        from svc.demo import company

        return company.generate()

    # -- shortcuts to what started

    @property
    def intake_token(self) -> str:
        """The intake's shared token (``<data_dir>/intake.token``)."""
        from svc.common.inprocess import persistent_token

        return persistent_token(self.data_dir / "intake.token")

    @property
    def policy(self) -> PolicyServer | None:
        """The policy service's server, once started."""
        return self.running.get("policy")

    @property
    def context(self) -> ContextService | None:
        """The context service's service layer, once started."""
        return self.running.get("context")

    @property
    def challenge(self) -> ChallengeServer | None:
        """The challenge service's server, once started."""
        return self.running.get("challenge")

    @property
    def gateway(self) -> GatewayServer | None:
        """The gateway's server, once started."""
        return self.running.get("gateway")

    @property
    def token_issuer(self) -> DevTokenIssuer | None:
        """The demo's agent-token issuer, once started."""
        return self.running.get("agent-issuer")

    # -- start

    def start(self) -> None:
        """Starts every part in order; on failure stops what started and re-raises.

        Each part is entered on one ``ExitStack`` once it is ready, so ``stop`` (and a failure
        half-way) stops them newest first.

        Raises:
            PortTaken: a port is in use (nothing started, or a port taken while starting); the
                message names ``--port`` and the range ``svc up`` takes.
            DataDirBusy: another ``svc up`` holds the data directory (nothing started).
            BundleError: the bundle does not load.
            svc.policy.service.PolicyError: the policy service refuses the bundle.
            OSError: a listener or a file could not be opened, or a component did not start.
            AuthConfigError: the local issuer's JWKS could not be loaded.

        """
        try:
            self._start()
        except PortTaken as e:
            self.stop()
            hint = f"start on other ports with --port N (svc up uses N to N+{PORT_COUNT - 1})"
            raise e.with_hint(hint) from None
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        o = self.options
        d = o.data_dir
        parts = registry.components()

        self.progress("checking the data directory and ports")
        self.enter(_data_dir_lock(d))
        check_ports(
            o.host,
            {
                r.title: self.port(r.name)
                for r in sorted(parts, key=lambda r: r.up_port or 0)
                if r.start is not None and r.up_port is not None
            },
        )

        self.progress("opening the topic log")
        self.log = self.enter(_topic_log(d / "broker.db", o.log_retention_ms))

        self.progress("opening the history store (chDB) and applying its schema")
        store = self.enter(
            _history_store(d / "history", self.broker_url, o.retention_days, self._stored)
        )
        self.history, self.loader = store.client, store.loader
        self.shared[HISTORY_RUNNING] = store.running

        if o.bundle is None and not self.bundle_dir.exists():
            self.progress("writing the demo company's bundle")
            _write_demo_bundle(self.demo_company, self.bundle_dir)
        self.demo = o.bundle is None and _is_demo_bundle(self.bundle_dir)

        self.progress("starting the local token issuer")
        self.issuer = LocalIssuer(d / "issuer")
        self.enter(
            _caller_tokens(
                self.issuer,
                self.caller_token_path,
                LOCAL_CALLER,
                registry.audiences_of(Role.OPERATOR),
            )
        )

        shown = ""
        for r in parts:
            if r.start is None:
                continue
            if r.phase and r.phase != shown:
                self.progress(r.phase)
                shown = r.phase
            self.running[r.name] = self.enter(r.start(self))

    def write_caller_token(self) -> None:
        """Writes a new caller token to ``caller_token_path`` (mode 0600).

        The token: ``sub`` ``LOCAL_CALLER``, the audience of every component that admits the
        operator, valid ``CALLER_TOKEN_LIFETIME_SECS``; ``start`` writes one and renews it
        every half of that.

        Raises:
            OSError: the file cannot be written.

        """
        assert self.issuer is not None
        _write_caller_token(
            self.issuer,
            self.caller_token_path,
            LOCAL_CALLER,
            registry.audiences_of(Role.OPERATOR),
        )

    def demo_token(self) -> str:
        """A token for the demo traffic (``DEMO_CALLER``, audience ``svc-pdp``, valid an hour)."""
        return self.token(Role.DEMO, "pdp", 3600)()

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
        """Stops every part that started, newest first (the reverse of ``start``). Idempotent.

        The loader stores what it read (the rest is loaded on the next start) before the topic
        log closes, and the data directory's lock goes last.
        """
        try:
            self._exit.close()
        finally:
            self.loader = None
            self.log = None
            self.running.clear()
            self._token_files.clear()


# -- the command


def _banner(stack: Stack, seconds: float) -> str:
    o = stack.options
    d = o.data_dir
    active = stack.policy.service.active_version() if stack.policy is not None else 0
    lines = [f"svc up: ready in {seconds:.1f} s; data in {d}"]
    for r in sorted(registry.components(), key=lambda r: r.up_port or 0):
        if r.banner is not None and r.name in stack.running:
            lines += r.banner(stack)
    return "\n".join(
        [
            *lines,
            f"  caller token    {stack.caller_token_path} (Authorization: Bearer, for the "
            "decision point, the history, the reasoner, and the policy, context and challenge "
            "services)",
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
