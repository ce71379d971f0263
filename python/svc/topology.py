"""``svc topology start|stop|status``: the production topology on one machine, one process each.

Where ``svc up`` runs every component in one process on the embedded defaults
(docs/architecture.md#embedded-defaults-and-production-parts), this runs each component as its
own process on 127.0.0.1 with the production parts, the way a cluster runs them
(docs/dev.md#the-production-topology-on-one-machine): PostgreSQL (``scripts/dev-postgres.sh``,
a cluster in ``<state>/postgres``, or ``--postgres-url``) with one database per relational
store, Kafka in KRaft mode (``scripts/dev-kafka.sh``, a broker in ``<state>/kafka``, or
``--kafka``) with both topics, then every process of the component registry (``svc.registry``;
each registration's ``processes``) in its start order: the policy, context and challenge
services, the demo's agent-token issuer (its apps trusted on the context service), two
decision-point replicas ``pdp-1`` and ``pdp-2`` (durable decision logs), the intake, the
history loader with its routes (``svc topology history``), the demo company's tools server
and the MCP gateway in front of it.

Ports, from the base port ``B`` (default 18080): decision points ``B`` and ``B + 6``, intake
``B + 1``, history ``B + 2``, policy ``B + 3``, context ``B + 4``, challenge ``B + 5``,
PostgreSQL ``B + 7``, Kafka ``B + 8`` (its controller ``B + 9``), the MCP gateway ``B + 10``,
the agent-token issuer ``B + 11`` (HTTPS), the tools server ``B + 12`` (each registration's
``topology_ports``).

The history store: a ClickHouse server over ``http://`` when ``--history-dsn`` names one; by
default chDB on a file path (``chdb://<state>/history``), which only the history process opens
(docs/history.md#engines-and-dsns). Debian's ``clickhouse-server`` (18.16) predates the
``DateTime64`` type the history schema uses (ClickHouse 20.1), and no PyPI package ships a
server binary, so this machine runs the chDB path.

Callers (docs/auth.md): every component checks bearer tokens of a local issuer
(``svc.common.auth.LocalIssuer``, its key in ``<state>/secrets/issuer``). ``start`` writes to
``<state>/secrets`` (a 0700 directory, files mode 0600) a token per role of
``svc.common.component.Role`` that some component admits: ``operator.token`` (``sub``
``svc-topology``, for every component that admits the operator: what a person or a test calls
with), and ``<role>.token`` (``sub`` ``svc-topology-<role>``) for the others, each with the
audience of every component admitting that role; besides, the intake's shared token and the
SCIM token.

``start`` is idempotent: it starts, in order, each process that is not running and waits for
its ``/readyz``, then runs its registration's ``after_ready`` (the policy service publishes the
first bundle: ``--bundle``, else the demo company's, written to ``<state>/bundle``). After a
``kill -9`` of any process, ``start`` again brings back just that one. ``stop`` stops every
process (SIGTERM, then SIGKILL after a grace period), newest first; ``status`` lists each with
its pid, port and readiness.

Each process's output goes to ``<state>/logs/<name>.log``; its pid and start time to
``<state>/run/<name>.pid`` (checked against ``/proc`` before any signal, so a reused pid is
never signalled). This needs a source checkout (the ``scripts/`` it runs) unless
``--postgres-url`` and ``--kafka`` name running servers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from svc import registry
from svc.common.auth import LocalIssuer, write_secret
from svc.common.component import Process, Registration, Role
from svc.common.install import default_data_dir
from svc.common.topics import DECISIONS_TOPIC, EVENTS_TOPIC

__all__ = [
    "CALLERS",
    "Component",
    "Config",
    "Topology",
    "TopologyError",
]

log = logging.getLogger("svc.topology")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

#: ``sub`` of the operator token (``<state>/secrets/operator.token``).
OPERATOR = "svc-topology"

#: One process of the topology (``svc.common.component.Process``).
Component = Process


def subject(role: str) -> str:
    """The token subject of `role` under ``svc topology`` (module docs)."""
    return OPERATOR if role == Role.OPERATOR else f"svc-topology-{role}"


#: Who may call each component that checks callers (docs/auth.md's callers table, for this
#: topology): component name -> token subject -> its role.
CALLERS: dict[str, dict[str, str]] = {
    r.name: {subject(role): role for role in r.callers if role != Role.DEMO}
    for r in registry.components(demo=False)
    if r.audience
}

#: Lifetime of the tokens ``start`` writes, in seconds (a week; ``start`` writes new ones).
TOKEN_LIFETIME_SECS = 7 * 24 * 3600

#: Longest wait, in seconds, for one process's ``/readyz``.
READY_TIMEOUT = 180.0

#: Seconds ``stop`` waits after SIGTERM before SIGKILL.
STOP_GRACE = 30.0

#: The relational databases, one per service.
DATABASES = {"policy": "svc_policy", "context": "svc_context", "challenge": "svc_challenge"}


class TopologyError(Exception):
    """A part did not start or a setting is wrong; the message says which and why."""


@dataclass
class Config:
    """The topology's settings, kept in ``<state>/topology.json`` by the first ``start``.

    Attributes:
        state_dir: where state, secrets, logs and data live.
        base_port: the first port (module docs; 1024 to 32000, below Linux's ephemeral range).
        bundle: the bundle directory published on the first start (None: the demo company's).
        postgres_url: a running PostgreSQL's admin URL (a role that may CREATE DATABASE,
            ``postgresql://...``); None starts ``scripts/dev-postgres.sh``'s in the state dir.
        kafka: a running Kafka's bootstrap servers (``host:port``); None starts
            ``scripts/dev-kafka.sh``'s in the state dir.
        history_dsn: the history store (``http://user:pw@host:8123/db`` or ``chdb:///dir``);
            None: ``chdb://<state>/history``.

    """

    state_dir: Path
    base_port: int = 18080
    bundle: Path | None = None
    postgres_url: str | None = None
    kafka: str | None = None
    history_dsn: str | None = None

    def save(self) -> None:
        """Writes ``<state>/topology.json``."""
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        (self.state_dir / "topology.json").write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> Config:
        """The settings saved in `state_dir`.

        Raises:
            TopologyError: nothing was started there.

        """
        path = state_dir / "topology.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TopologyError(f"no topology in {state_dir} (svc topology start first)") from None
        data["state_dir"] = Path(data["state_dir"])
        if data.get("bundle"):
            data["bundle"] = Path(data["bundle"])
        return cls(**data)


def _alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _start_time(pid: int) -> str:
    """The start time of `pid` (field 22 of ``/proc/<pid>/stat``, clock ticks), or ``""``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class Topology:
    """The topology in one state directory: ``start``, ``stop``, ``status``, ``pid``.

    It is the ``svc.common.component.TopologyRuntime`` the registrations' processes are
    made with.

    Args:
        config: the settings (``Config.load`` for one already started).

    """

    def __init__(self, config: Config) -> None:
        self.config = config
        s = config.state_dir.resolve()
        self.state = s
        self.secrets = s / "secrets"
        self.logs = s / "logs"
        self.run_dir = s / "run"
        b = config.base_port
        self.ports = {
            name: b + offset
            for r in registry.components()
            for name, offset in r.topology_ports.items()
        }
        self.ports["postgres"] = b + registry.TOPOLOGY_INFRA_PORTS["postgres"]
        self.ports["kafka"] = b + registry.TOPOLOGY_INFRA_PORTS["kafka"]
        self._tls = {
            name: r.ready_tls_ca
            for r in registry.components()
            for name in r.topology_ports
            if r.ready_tls_ca is not None
        }
        self.urls = {
            n: f"{'https' if n in self._tls else 'http'}://127.0.0.1:{p}"
            for n, p in self.ports.items()
            if n != "postgres"
        }
        #: The development agent-token issuer's directory: its app keys, ``ca.pem`` (what the
        #: gateway trusts for the apps' JWKS) and ``apps.json`` (the trusted-app records).
        self.agent_issuer_dir = s / "agent-issuer"
        self.jwks_ca_file = self.agent_issuer_dir / "ca.pem"
        self.gateway_upstreams_file = s / "gateway-upstreams.json"
        self.kafka = config.kafka or f"127.0.0.1:{self.ports['kafka']}"
        self.kafka_url = f"kafka://{self.kafka}"
        self.history_dsn = config.history_dsn or f"chdb://{s / 'history'}"

    # -- the runtime the registrations read (svc.common.component.TopologyRuntime)

    @property
    def bundle(self) -> Path:
        """The bundle published first: ``--bundle``, else ``<state>/bundle`` (the demo's)."""
        return self.config.bundle or self.state / "bundle"

    def port(self, name: str) -> int:
        """The port of process `name`."""
        return self.ports[name]

    def url(self, name: str) -> str:
        """The base URL of process `name`."""
        return self.urls[name]

    def subject(self, role: str) -> str:
        """The token subject of `role` (``svc-topology``, ``svc-topology-<role>``)."""
        return subject(role)

    def token_file(self, role: str) -> Path:
        """``<state>/secrets/<role>.token``."""
        return self.secrets / f"{role}.token"

    # -- the parts run by scripts

    def _pg_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SVC_PG_DATA": str(self.state / "postgres"),
            "SVC_PG_PORT": str(self.ports["postgres"]),
        }

    def _kafka_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SVC_KAFKA_DIR": str(self.state / "kafka"),
            "SVC_KAFKA_PORT": str(self.ports["kafka"]),
            "SVC_KAFKA_CONTROLLER_PORT": str(self.ports["kafka"] + 1),
            "SVC_KAFKA_URL": f"kafka://{self.kafka}",
        }

    def _script(self, name: str, verb: str, env: dict[str, str]) -> str:
        """Runs ``scripts/<name> <verb>``; its standard output.

        Raises:
            TopologyError: it failed (with the tail of its standard error).

        """
        try:
            r = subprocess.run(
                [str(SCRIPTS / name), verb],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TopologyError(f"scripts/{name} {verb}: {e}") from None
        if r.returncode != 0:
            raise TopologyError(f"scripts/{name} {verb} exited {r.returncode}:\n{r.stderr[-3000:]}")
        return r.stdout.strip()

    def _postgres_admin_url(self) -> str:
        """The PostgreSQL admin URL: ``--postgres-url``, or our cluster's superuser socket."""
        if self.config.postgres_url:
            return self.config.postgres_url
        return (
            f"postgresql://postgres@/postgres?host={self.state / 'postgres' / 'run'}"
            f"&port={self.ports['postgres']}"
        )

    def database_url(self, service: str) -> str:
        """The SQLAlchemy URL of `service`'s database (``policy``, ``context``, ``challenge``)."""
        from sqlalchemy.engine import make_url

        if self.config.postgres_url:
            url = make_url(self.config.postgres_url)
        else:
            url = make_url(f"postgresql://svc:svc@127.0.0.1:{self.ports['postgres']}/x")
        return url.set(
            drivername="postgresql+psycopg", database=DATABASES[service]
        ).render_as_string(hide_password=False)

    def _start_postgres(self) -> None:
        """Starts our PostgreSQL (unless ``--postgres-url``) and creates the databases."""
        import psycopg

        if not self.config.postgres_url:
            # The server runs as the postgres user when we are root: it must reach its directory.
            os.chmod(self.state, 0o711)
            self._script("dev-postgres.sh", "start", self._pg_env())
        with psycopg.connect(self._postgres_admin_url(), autocommit=True) as conn:
            owner = "svc" if not self.config.postgres_url else "CURRENT_USER"
            for db in DATABASES.values():
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                if exists.fetchone() is None:
                    conn.execute(f'CREATE DATABASE "{db}" OWNER {owner}')

    def _start_kafka(self) -> None:
        """Starts our Kafka (unless ``--kafka``) and creates both topics."""
        if not self.config.kafka:
            self._script("dev-kafka.sh", "start", self._kafka_env())
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": self.kafka})
        futures = admin.create_topics([NewTopic(t, 3, 1) for t in (DECISIONS_TOPIC, EVENTS_TOPIC)])
        for f in futures.values():
            try:
                f.result(60)
            except KafkaException as e:
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise TopologyError(f"creating the topics: {e}") from None

    def postgres_pid(self) -> int | None:
        """The pid of our PostgreSQL's postmaster, or None (not running, or external)."""
        try:
            pid = int((self.state / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def kafka_pid(self) -> int | None:
        """The pid of our Kafka broker, or None (not running, or external)."""
        try:
            pid = int((self.state / "kafka" / "kafka.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    # -- secrets

    def _issuer(self) -> LocalIssuer:
        return LocalIssuer(self.secrets / "issuer")

    def _write_secrets(self) -> None:
        """Writes the tokens and keys of the module docs (0600 files in a 0700 directory)."""
        import secrets as pysecrets

        self.secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.secrets, 0o700)
        issuer = self._issuer()
        roles = {role for r in registry.components(demo=False) for role in r.callers}
        for role in sorted(roles - {Role.DEMO}):
            audience = registry.audiences_of(role)
            write_secret(
                self.token_file(role), issuer.mint(subject(role), audience, TOKEN_LIFETIME_SECS)
            )
        for name in ("intake.token", "scim.token"):
            if not (self.secrets / name).exists():
                write_secret(self.secrets / name, pysecrets.token_urlsafe(32))
        key = self.secrets / "policy-signing.key"
        if not key.exists():
            from svc.policy import signing

            signing.generate_keypair(key)

    def secret(self, name: str) -> str:
        """The content of ``<state>/secrets/<name>`` (a token), stripped."""
        return (self.secrets / name).read_text(encoding="utf-8").strip()

    # -- the processes

    def auth_env(self, component: str) -> dict[str, str]:
        """``SVC_<COMPONENT>_AUTH_*``: the local issuer's tokens, the roles of ``CALLERS``."""
        p = f"SVC_{component.upper()}_AUTH"
        return {
            f"{p}": "jwt",
            f"{p}_ISSUER": self._issuer().issuer,
            f"{p}_JWKS": f"file://{self.secrets / 'issuer' / 'jwks.json'}",
            f"{p}_ROLES": json.dumps(CALLERS[component], separators=(",", ":")),
        }

    def _parts(self) -> list[tuple[Registration, list[Process]]]:
        """Each registration run as processes, with its processes, in start order."""
        return [(r, r.processes(self)) for r in registry.components() if r.processes is not None]

    def components(self) -> list[Process]:
        """Every process ``start`` runs (after PostgreSQL and Kafka), in start order."""
        return [p for _, processes in self._parts() for p in processes]

    def _pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The pid of process `name` (a ``Component`` name, ``postgres`` or ``kafka``), or None.

        None when it does not run: a pid file whose process is gone or was reused gives None.
        """
        if name == "postgres":
            return self.postgres_pid()
        if name == "kafka":
            return self.kafka_pid()
        try:
            pid_text, started = self._pidfile(name).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) and _start_time(pid) == started else None

    def _spawn(self, c: Process) -> int:
        """Starts `c` in a session of its own, output to its log; writes its pid file."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **c.env}
        with (self.logs / f"{c.name}.log").open("ab") as out:
            proc = subprocess.Popen(
                c.argv,
                env=env,
                cwd=self.state,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pidfile(c.name).write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
        return proc.pid

    def ready(self, name: str) -> bool:
        """Whether `name`'s ``/readyz`` answers 200 now.

        Over HTTPS with its own CA where its registration says so (``ready_tls_ca``).
        """
        try:
            ca = self._tls.get(name)
            if ca is not None:
                context = ssl.create_default_context(cafile=str(ca(self)))
                return httpx.get(f"{self.urls[name]}/readyz", timeout=5, verify=context).is_success
            return httpx.get(f"http://127.0.0.1:{self.ports[name]}/readyz", timeout=5).is_success
        except (httpx.HTTPError, OSError):
            return False

    def _wait_ready(self, c: Process, timeout: float = READY_TIMEOUT) -> None:
        """Waits for `c`'s ``/readyz``.

        Raises:
            TopologyError: the process ended, or it was not ready within `timeout` seconds
                (the message holds its log's tail).

        """
        deadline = time.monotonic() + timeout
        while not self.ready(c.name):
            if self.pid(c.name) is None or time.monotonic() > deadline:
                why = "exited" if self.pid(c.name) is None else f"not ready in {timeout:g} s"
                raise TopologyError(f"{c.name} {why}; log tail:\n{self.log_tail(c.name)}")
            time.sleep(0.2)

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last `lines` lines of ``<state>/logs/<name>.log``."""
        try:
            text = (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- the commands

    def start(self, progress: Any = lambda _: None) -> list[str]:
        """Starts every part that is not running, in order, each ready before the next.

        Args:
            progress: called with a short phrase per step.

        Returns:
            The names of the processes started (empty when all ran).

        Raises:
            TopologyError: a part did not start (its log's tail in the message), or a
                registration's ``after_ready`` failed.

        """
        self.state.mkdir(parents=True, exist_ok=True)
        self.config.save()
        started = []
        progress("PostgreSQL")
        if not self.config.postgres_url and self.postgres_pid() is None:
            started.append("postgres")
        self._start_postgres()
        progress("Kafka")
        if not self.config.kafka and self.kafka_pid() is None:
            started.append("kafka")
        self._start_kafka()
        self._write_secrets()
        if self.config.bundle is None and not self.bundle.exists():
            from svc.demo.company import generate, write_bundle

            write_bundle(generate(), self.bundle, entities=False)
        for r, processes in self._parts():
            for c in processes:
                if self.pid(c.name) is None:
                    progress(f"starting {c.name}")
                    self._spawn(c)
                    started.append(c.name)
                self._wait_ready(c)
            if r.after_ready is not None:
                try:
                    r.after_ready(self)
                except TopologyError:
                    raise
                except Exception as e:
                    raise TopologyError(f"{r.name}: {e}") from e
        return started

    def stop(self, names: Sequence[str] = ()) -> list[str]:
        """Stops the named processes (default: all, newest first, then Kafka and PostgreSQL).

        SIGTERM to the process group, then SIGKILL after ``STOP_GRACE`` seconds.

        Returns:
            The names of the processes that were running.

        """
        order = [c.name for c in reversed(self.components())]
        stopped = []
        for name in names or order:
            if name in ("postgres", "kafka"):
                continue
            pid = self.pid(name)
            if pid is None:
                continue
            stopped.append(name)
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if not names or "kafka" in names:
            if not self.config.kafka and self.kafka_pid() is not None:
                stopped.append("kafka")
                self._script("dev-kafka.sh", "stop", self._kafka_env())
        if not names or "postgres" in names:
            if not self.config.postgres_url and self.postgres_pid() is not None:
                stopped.append("postgres")
                self._script("dev-postgres.sh", "stop", self._pg_env())
        return stopped

    def status(self) -> list[dict[str, Any]]:
        """Each part: ``{"name", "pid" (None when down), "port", "ready"}``."""
        rows = []
        for name in ["postgres", "kafka", *(c.name for c in self.components())]:
            pid = self.pid(name)
            port = self.ports[name]
            ready = pid is not None and (name in ("postgres", "kafka") or self.ready(name))
            rows.append({"name": name, "pid": pid, "port": port, "ready": ready})
        return rows


def iter_status_lines(rows: list[dict[str, Any]]) -> Iterator[str]:
    """``status`` as text lines: name, pid (``-`` when down), port, ready or not."""
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        pid = r["pid"] if r["pid"] is not None else "-"
        state = "ready" if r["ready"] else ("up" if r["pid"] else "down")
        yield f"{r['name']:<{width}} {pid!s:>8}  127.0.0.1:{r['port']:<6} {state}"


# -- the command line (``svc topology``)

app = typer.Typer(
    name="topology",
    help="The production topology on this machine: each component its own process on "
    "PostgreSQL and Kafka (docs/dev.md).",
    no_args_is_help=True,
)


def _default_state_dir() -> Path:
    """``$SVC_TOPOLOGY_DIR``, else ``<svc up's data dir>-topology``."""
    env = os.environ.get("SVC_TOPOLOGY_DIR")
    if env:
        return Path(env).expanduser()
    d = default_data_dir()
    return d.with_name(d.name + "-topology")


StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where the topology keeps everything ($SVC_TOPOLOGY_DIR).",
        file_okay=False,
    ),
]


def _topology(state_dir: Path | None) -> Topology:
    """The topology started in `state_dir` (default ``_default_state_dir``), or exit 2."""
    try:
        return Topology(Config.load(state_dir or _default_state_dir()))
    except TopologyError as e:
        typer.echo(f"svc topology: {e}", err=True)
        raise typer.Exit(2) from None


@app.command("start")
def start_command(
    state_dir: StateOpt = None,
    base_port: Annotated[
        int, typer.Option(min=1024, max=32000, help="First port (svc.topology lists each).")
    ] = 18080,
    bundle: Annotated[
        Path | None,
        typer.Option(
            exists=True, file_okay=False, help="Bundle published first (default: the demo's)."
        ),
    ] = None,
    postgres_url: Annotated[
        str | None,
        typer.Option(
            help="A running PostgreSQL's admin URL (default: start one in the state dir)."
        ),
    ] = None,
    kafka: Annotated[
        str | None,
        typer.Option(help="A running Kafka's host:port (default: start one in the state dir)."),
    ] = None,
    history_dsn: Annotated[
        str | None,
        typer.Option(help="http://user:pw@host:8123/db for a ClickHouse server (default: chDB)."),
    ] = None,
) -> None:
    """Start every part not running (the settings of the first start are kept)."""
    d = (state_dir or _default_state_dir()).resolve()
    try:
        config = Config.load(d)
    except TopologyError:
        config = Config(d, base_port, bundle, postgres_url, kafka, history_dsn)
    t = Topology(config)
    try:
        started = t.start(progress=lambda s: typer.echo(f"svc topology: {s}", err=True))
    except TopologyError as e:
        typer.echo(f"svc topology: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"started {', '.join(started) or 'nothing (all running)'}; state in {d}")
    for line in iter_status_lines(t.status()):
        typer.echo(line)


@app.command("stop")
def stop_command(
    names: Annotated[list[str] | None, typer.Argument(help="Only these (default: all).")] = None,
    state_dir: StateOpt = None,
) -> None:
    """Stop every process (or the named ones)."""
    stopped = _topology(state_dir).stop(names or ())
    typer.echo(f"stopped {', '.join(stopped) or 'nothing (none running)'}")


@app.command("status")
def status_command(state_dir: StateOpt = None) -> None:
    """List each process: pid, port, ready. Exits 1 when one is down or not ready."""
    rows = _topology(state_dir).status()
    for line in iter_status_lines(rows):
        typer.echo(line)
    if not all(r["ready"] for r in rows):
        raise typer.Exit(1)


@app.command("history", hidden=True)
def history_command(
    dsn: Annotated[str, typer.Option("--dsn", help="The history store.")],
    kafka: Annotated[str, typer.Option("--kafka", help="The broker, kafka://host:port.")],
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the history routes.")] = 8080,
) -> None:
    """The history process (loader and routes) that ``start`` runs.

    See ``svc.history.component.serve_history``.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from svc.history.component import serve_history

    serve_history(dsn, kafka, host, port)
