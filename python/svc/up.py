"""``svc up``: every component built so far on one machine, with the embedded defaults.

One process on 127.0.0.1 (docs/architecture.md#embedded-defaults-and-production-parts) runs

* the decision point (``svc.pdp``: the Rust listener, gRPC and HTTP) on ``port`` (8080),
* the intake (``svc.intake``) on ``port + 1``,
* the history loader (``svc.history``) and its query routes on ``port + 2``,

with the embedded defaults in place of the real parts: the topic log of ``svc.broker``
(``local://<data_dir>/broker.db``) instead of Kafka, chDB in ``<data_dir>/history`` instead of
a ClickHouse server. The records are the same as in production: the decision log's shipper,
the intake's transactional producers and the loader run unchanged on top.

The data directory keeps everything across restarts: the topic log (records not loaded yet are
loaded after a restart), the history, the decision-log spool, the intake token, the local token
issuer's key and the policy bundle.

Callers (docs/auth.md): the decision point and the history take bearer tokens of a local issuer
(``svc.common.auth.LocalIssuer``, an ES256 key in ``<data_dir>/issuer/``). Each start writes a
fresh caller token for the person at this machine to ``<data_dir>/caller.token`` (mode 0600,
``sub`` ``svc-local``, audience both components, valid 24 hours and renewed every 12 hours while
``svc up`` runs); the demo traffic calls as ``svc-demo``. The intake keeps its own token.

Without ``--bundle`` the bundle is the demo company's (``svc.demo``), written on the first start
and reloaded whenever its files change.

Refusals happen before anything starts: a port in use, or another ``svc up`` on the same data
directory (an exclusive ``flock`` on ``<data_dir>/svc-up.lock``).
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
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import uvicorn
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr
from rich.console import Console
from rich.status import Status

from svc import history
from svc.broker import LOCAL_SCHEME, LocalLog
from svc.common.auth import (
    AuthConfigError,
    HistoryAuthSettings,
    LocalIssuer,
    PdpAuthSettings,
    write_secret,
)
from svc.common.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from svc.history.loader import Loader
from svc.history.service import create_app as history_app
from svc.history.service import totals
from svc.pdp import Engine, RequestError
from svc.pdp.log_settings import LOG_COMMIT_MS, LOG_DURABILITY, LOG_FSYNC, Durability
from svc.pdp.server import StandaloneOptions, serve_bundle

if TYPE_CHECKING:
    from svc.demo.company import Company

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

#: Lifetime of a caller token (a working day and then some), in seconds; ``svc up`` writes a
#: new one every half of it.
CALLER_TOKEN_LIFETIME_SECS = 24 * 3600


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
        port: the decision point's port; the intake listens on ``port + 1`` and the history on
            ``port + 2``.
        bundle: a bundle directory to serve; None serves ``<data_dir>/bundle``, provisioned
            with the demo company's bundle when missing.
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


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Binds each port for a moment to see that it is free.

    Args:
        host: the address the components will bind.
        ports: component name -> port.

    Raises:
        PortTaken: a port is in use (the message names it and the component).

    """
    for name, port in ports.items():
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    why = "in use" if e.errno == errno.EADDRINUSE else "not allowed"
                    raise PortTaken(
                        f"port {port} on {host} (the {name}) is {why}; stop whatever holds it "
                        "or start on other ports with --port N (svc up uses N, N+1 and N+2)"
                    ) from None
                raise


def _token(path: Path) -> str:
    """The intake token kept in ``path`` (created once, mode 0600)."""
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token


class _Servers:
    """The Python apps (intake, history) under uvicorn on one asyncio loop in one thread."""

    def __init__(self, configs: list[uvicorn.Config]) -> None:
        self.servers = [uvicorn.Server(c) for c in configs]
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="svc-up-http", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            await asyncio.gather(*(s.serve() for s in self.servers))

        try:
            asyncio.run(main())
        except BaseException as e:  # reported to start(); the thread must end
            self.error = e

    def start(self, timeout: float = 60.0) -> None:
        """Starts the servers and waits until all listen.

        Raises:
            OSError: a server did not start (its port, usually).

        """
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not all(s.started for s in self.servers):
            if self.error is not None or not self._thread.is_alive():
                raise OSError(f"an HTTP server did not start: {self.error!r}")
            if time.monotonic() > deadline:
                raise OSError("the HTTP servers did not start in time")
            time.sleep(0.02)

    def stop(self) -> None:
        """Asks every server to finish its requests and stop; waits for them."""
        for s in self.servers:
            s.should_exit = True
        self._thread.join(timeout=30)


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
        )
        self.bundle_dir = options.bundle or d / "bundle"
        self.intake_token = ""
        self.issuer: LocalIssuer | None = None
        self.caller_token_path = d / "caller.token"
        self.history: Client | None = None
        self.loader: Loader | None = None
        self.log: LocalLog | None = None
        self._exit = ExitStack()
        self._lock_file: IO[str] | None = None
        self._loader_thread: threading.Thread | None = None
        self._trim_stop = threading.Event()

    # -- start

    def _lock(self) -> None:
        d = self.options.data_dir
        d.mkdir(parents=True, exist_ok=True)
        f = (d / "svc-up.lock").open("a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise DataDirBusy(
                f"another svc up (pid {holder}) is using {d}; stop it first, or pass "
                "--data-dir for a second install"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock_file = f

    def _provision_bundle(self) -> None:
        if self.options.bundle is not None or self.bundle_dir.exists():
            return
        from svc.demo import company

        tmp = self.bundle_dir.with_name(self.bundle_dir.name + ".new")
        tmp.mkdir(parents=True, exist_ok=True)
        company.write_bundle(self.demo_company, tmp)
        tmp.rename(self.bundle_dir)

    @functools.cached_property
    def demo_company(self) -> Company:
        """The demo company (``svc.demo.company.generate()``, deterministic), built once."""
        from svc.demo import company

        return company.generate()

    def _provision_engine(self, engine: Engine) -> None:
        """Loads the demo company's work items, containments and risk scores (``svc.demo``).

        Until svc-context and svc-challenge exist, these have no other way into the decision
        point; a bundle that is no longer the demo company's (edited by hand) only gets a
        warning.
        """
        from svc.demo import company

        try:
            company.provision(engine, self.demo_company)
        except RequestError as e:
            log.warning("the bundle is not the demo company's; not provisioned: %s", e)

    def start(self) -> None:
        """Starts every component; on failure stops what started and re-raises.

        Raises:
            PortTaken: a port is in use (nothing started).
            DataDirBusy: another ``svc up`` holds the data directory (nothing started).
            BundleError: the bundle does not load.
            OSError: a listener or a file could not be opened.
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
        self.progress("checking the data directory and ports")
        self._lock()
        check_ports(o.host, {"decision point": o.port, "intake": o.port + 1, "history": o.port + 2})

        self.progress("opening the topic log")
        self.log = LocalLog.open(d / "broker.db")
        self.log.create_topics([DECISIONS_TOPIC, EVENTS_TOPIC])
        self.log.trim(o.log_retention_ms)
        threading.Thread(target=self._trim, name="svc-up-trim", daemon=True).start()

        self.progress("opening the history store (chDB) and applying its schema")
        self.history = history.connect(f"chdb://{(d / 'history').resolve()}")
        history.migrate(self.history)
        self.loader = Loader(
            self.history, self.broker_url, batch_ms=200, retention_days=o.retention_days
        )
        self._loader_thread = threading.Thread(
            target=self._load, name="svc-history-loader", daemon=True
        )
        self._loader_thread.start()

        if not self.bundle_dir.exists():
            self.progress("writing the demo company's bundle")
        self._provision_bundle()
        self.intake_token = _token(d / "intake.token")

        self.progress("starting the local token issuer")
        self.issuer = LocalIssuer(d / "issuer")
        self.write_caller_token()
        threading.Thread(target=self._renew, name="svc-up-caller-token", daemon=True).start()
        common_auth: dict[str, Any] = {
            "auth": "jwt",
            "auth_issuer": self.issuer.issuer,
            "auth_jwks": self.issuer.jwks_url,
        }

        self.progress("starting the decision point")
        pdp_opts = StandaloneOptions(
            host=o.host,
            port=o.port,
            mode=o.mode,
            kafka_url=self.broker_url,
            spool_dir=d / "pdp-spool",
            auth=PdpAuthSettings(**common_auth, auth_callers=[LOCAL_CALLER, DEMO_CALLER]),
            log_commit_ms=o.log_commit_ms,
            log_durability=o.log_durability,
            log_fsync=o.log_fsync,
        )
        prepare = self._provision_engine if o.bundle is None else None
        self._exit.enter_context(serve_bundle(self.bundle_dir, pdp_opts, prepare))

        self.progress("starting the intake and the history routes")
        from svc.intake.app import create_app as intake_app
        from svc.intake.settings import IntakeSettings

        settings = IntakeSettings(
            host=o.host,
            port=o.port + 1,
            kafka_url=self.broker_url,
            token=SecretStr(self.intake_token),
        )
        intake = intake_app(settings)
        loader_thread = self._loader_thread
        hist = history_app(
            self.history,
            self.loader,
            auth=HistoryAuthSettings(**common_auth, auth_callers=[LOCAL_CALLER]),
            ready=loader_thread.is_alive,
        )
        common: dict[str, Any] = {
            "host": o.host,
            "log_level": "warning",
            "access_log": False,
            "server_header": False,
        }
        servers = _Servers(
            [
                uvicorn.Config(intake, port=o.port + 1, **common),
                uvicorn.Config(hist, port=o.port + 2, **common),
            ]
        )
        servers.start()
        self._exit.callback(servers.stop)

        self.progress("waiting for the intake's producers")
        pool = intake.state.pool
        deadline = time.monotonic() + 30
        while not pool.ready:
            if time.monotonic() > deadline:
                raise OSError(f"the intake did not get ready: {pool.not_ready_reason}")
            time.sleep(0.05)

    def write_caller_token(self) -> None:
        """Writes a new caller token to ``caller_token_path`` (mode 0600).

        The token: ``sub`` ``LOCAL_CALLER``, audience ``svc-pdp`` and ``svc-history``, valid
        ``CALLER_TOKEN_LIFETIME_SECS``.

        Raises:
            OSError: the file cannot be written.

        """
        assert self.issuer is not None
        token = self.issuer.mint(
            LOCAL_CALLER, ["svc-pdp", "svc-history"], CALLER_TOKEN_LIFETIME_SECS
        )
        write_secret(self.caller_token_path, token)

    def demo_token(self) -> str:
        """A token for the demo traffic (``DEMO_CALLER``, audience ``svc-pdp``, valid an hour)."""
        assert self.issuer is not None
        return self.issuer.mint(DEMO_CALLER, "svc-pdp", 3600)

    def _renew(self) -> None:
        while not self._trim_stop.wait(CALLER_TOKEN_LIFETIME_SECS / 2):
            try:
                self.write_caller_token()
            except OSError:
                log.exception("could not renew %s", self.caller_token_path)

    def _load(self) -> None:
        assert self.loader is not None
        try:
            self.loader.run()
        except Exception:
            log.exception("history loader stopped on an error")

    def _trim(self) -> None:
        while not self._trim_stop.wait(TRIM_INTERVAL):
            if self.log is not None:
                try:
                    removed = self.log.trim(self.options.log_retention_ms)
                except Exception:
                    log.exception("topic log: trim failed")
                    continue
                if removed:
                    log.info("topic log: %d records past retention removed", removed)

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
            d, e = read()
            if (d >= decisions and e >= events) or time.monotonic() > deadline:
                return d, e
            time.sleep(0.2)

    # -- stop

    def stop(self) -> None:
        """Stops every component, newest first; the loader stores what it read. Idempotent.

        The decision point stops before the loader so the shipper's last records are in the
        topic log; records the loader has not read by then are loaded on the next start.
        """
        self._exit.close()
        self._trim_stop.set()
        if self.loader is not None:
            self.loader.stop()
        if self._loader_thread is not None:
            self._loader_thread.join(timeout=60)
            self._loader_thread = None
        self.loader = None
        if self.log is not None:
            self.log.close()
            self.log = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


# -- the command


def _banner(stack: Stack, seconds: float) -> str:
    o = stack.options
    d = o.data_dir
    u = stack.urls
    return "\n".join(
        [
            f"svc up: ready in {seconds:.1f} s; data in {d}",
            f"  decision point  {u.pdp}   gRPC svc.authz.v1.Authorizer + HTTP "
            "(/v1/access/evaluation, /v1/access/plan, AuthZEN /access/v1/evaluation)",
            f"  intake          {u.intake}   POST /v1/events (bearer token in "
            f"{d / 'intake.token'})",
            f"  history         {u.history}   GET /v1/history/decisions?principal=Type::id",
            f"  caller token    {stack.caller_token_path} (Authorization: Bearer, for the "
            "decision point and the history)",
            f"  bundle          {stack.bundle_dir} (reloaded when its files change)",
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
