"""``svc topology start|stop|status``: the production topology on one machine, one process each.

Where ``svc up`` runs every component in one process on the embedded defaults
(docs/architecture.md#embedded-defaults-and-production-parts), this runs each component as its
own process on 127.0.0.1 with the production parts, the way a cluster runs them
(docs/dev.md#the-production-topology-on-one-machine):

* PostgreSQL (``scripts/dev-postgres.sh``, a cluster in ``<state>/postgres``, or
  ``--postgres-url``) with one database per relational store: ``svc_policy``, ``svc_context``,
  ``svc_challenge``;
* Kafka in KRaft mode (``scripts/dev-kafka.sh``, a broker in ``<state>/kafka``, or
  ``--kafka``) with both topics, ``svc.decisions.v1`` and ``svc.events.v1``;
* the policy service (``svc policy``), the context service (``svc context serve``) and the
  challenge service (``svc challenge serve``), each on its own database;
* two decision-point replicas (``svc pdp --policy --context --challenge --kafka``), following
  the three services, their decision logs durable (a check is answered once its record is on
  disk: docs/history.md, "Durability of the decision log");
* the intake (``svc intake``) and the history loader with its query routes
  (``svc topology history``: ``svc.history.Loader`` and ``svc.history.service``) in its own
  process;
* a development issuer of agent tokens (``python -m svc.demo.token_issuer``: the demo apps'
  keys, their JWK Sets over HTTPS with a CA of its own; an install trusts the apps that run its
  agents instead), whose apps ``start`` trusts on the context service;
* the demo company's tools server (``python -m svc.demo.tools_server --http``) and the MCP
  gateway (``svc gateway``, docs/gateway.md) in front of it over Streamable HTTP, checking at
  ``pdp-1``, following the challenge service's containments and the policy
  service's outage fallback, reading the trusted apps from the context service, and posting
  its events to the intake.

Ports, from the base port ``B`` (default 18080): decision points ``B`` and ``B + 6``, intake
``B + 1``, history ``B + 2``, policy ``B + 3``, context ``B + 4``, challenge ``B + 5``,
PostgreSQL ``B + 7``, Kafka ``B + 8`` (its controller ``B + 9``), the MCP gateway ``B + 10``,
the agent-token issuer ``B + 11`` (HTTPS), the tools server ``B + 12``.

The history store: a ClickHouse server over ``http://`` when ``--history-dsn`` names one; by
default chDB on a file path (``chdb://<state>/history``), which only the history process opens
(docs/history.md#engines-and-dsns). Debian's ``clickhouse-server`` (18.16) predates the
``DateTime64`` type the history schema uses (ClickHouse 20.1), and no PyPI package ships a
server binary, so this machine runs the chDB path.

Callers (docs/auth.md): every component checks bearer tokens of a local issuer
(``svc.common.auth.LocalIssuer``, its key in ``<state>/secrets/issuer``). ``start`` writes each
caller's token, the intake's shared token and the SCIM token to ``<state>/secrets`` (a 0700
directory, files mode 0600): ``operator.token`` (``sub`` ``svc-topology``, for every
component: what a person or a test calls with), ``pdp.token`` (the decision points' calls to
the policy, context and challenge services), ``challenge.token`` (the challenge service's
calls to the context service and the decision point), ``gateway.token`` (the gateway's calls to
the decision point and the policy, context and challenge services), ``intake.token``,
``scim.token``.

``start`` is idempotent: it starts, in order, each part that is not running and waits for its
``/readyz``; on the first start it publishes a bundle through the policy service (``--bundle``,
else the demo company's). After a ``kill -9`` of any process, ``start`` again brings back just
that one. ``stop`` stops every process (SIGTERM, then SIGKILL after a grace period), newest
first; ``status`` lists each with its pid, port and readiness.

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
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from svc.common.auth import LocalIssuer, write_secret
from svc.common.topics import DECISIONS_TOPIC, EVENTS_TOPIC

__all__ = [
    "CALLERS",
    "Component",
    "Config",
    "Topology",
    "TopologyError",
    "serve_history",
]

log = logging.getLogger("svc.topology")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

#: ``sub`` of the operator token (``<state>/secrets/operator.token``).
OPERATOR = "svc-topology"
#: ``sub`` of the decision points' token.
PDP_CALLER = "svc-topology-pdp"
#: ``sub`` of the challenge service's token.
CHALLENGE_CALLER = "svc-topology-challenge"
#: ``sub`` of the MCP gateway's token.
GATEWAY_CALLER = "svc-topology-gateway"

#: Who may call each component (the callers table of docs/auth.md, for this topology).
CALLERS: dict[str, list[str]] = {
    "policy": [OPERATOR, PDP_CALLER, GATEWAY_CALLER],
    "context": [OPERATOR, PDP_CALLER, CHALLENGE_CALLER, GATEWAY_CALLER],
    "challenge": [OPERATOR, PDP_CALLER, GATEWAY_CALLER],
    "pdp": [OPERATOR, CHALLENGE_CALLER, GATEWAY_CALLER],
    "history": [OPERATOR],
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


@dataclass
class Component:
    """One process of the topology.

    Attributes:
        name: its name (``pdp-1``, ``intake``, ...), also its log and pid file's.
        argv: the command line.
        port: the port its ``/readyz`` answers on.
        env: environment variables added to this process's.

    """

    name: str
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)


def _py(*args: str) -> list[str]:
    """``python -m svc ARGS`` with this interpreter."""
    return [sys.executable, "-m", "svc", *args]


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
            "pdp-1": b,
            "intake": b + 1,
            "history": b + 2,
            "policy": b + 3,
            "context": b + 4,
            "challenge": b + 5,
            "pdp-2": b + 6,
            "postgres": b + 7,
            "kafka": b + 8,
            "gateway": b + 10,
            "agent-issuer": b + 11,
            "tools": b + 12,
        }
        self.urls = {
            n: f"http://127.0.0.1:{p}" for n, p in self.ports.items() if n not in ("postgres",)
        }
        self.urls["agent-issuer"] = f"https://127.0.0.1:{self.ports['agent-issuer']}"
        #: The development agent-token issuer's directory: its app keys, ``ca.pem`` (what the
        #: gateway trusts for the apps' JWKS) and ``apps.json`` (the trusted-app records).
        self.agent_issuer_dir = s / "agent-issuer"
        self.kafka = config.kafka or f"127.0.0.1:{self.ports['kafka']}"
        self.history_dsn = config.history_dsn or f"chdb://{s / 'history'}"

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
        all_audiences = [f"svc-{c}" for c in CALLERS]
        write_secret(
            self.secrets / "operator.token",
            issuer.mint(OPERATOR, all_audiences, TOKEN_LIFETIME_SECS),
        )
        write_secret(
            self.secrets / "pdp.token",
            issuer.mint(
                PDP_CALLER, ["svc-policy", "svc-context", "svc-challenge"], TOKEN_LIFETIME_SECS
            ),
        )
        write_secret(
            self.secrets / "challenge.token",
            issuer.mint(CHALLENGE_CALLER, ["svc-context", "svc-pdp"], TOKEN_LIFETIME_SECS),
        )
        write_secret(
            self.secrets / "gateway.token",
            issuer.mint(
                GATEWAY_CALLER,
                ["svc-pdp", "svc-policy", "svc-context", "svc-challenge"],
                TOKEN_LIFETIME_SECS,
            ),
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

    def _auth_env(self, component: str) -> dict[str, str]:
        """``SVC_<COMPONENT>_AUTH_*``: the local issuer's tokens, the callers of ``CALLERS``."""
        p = f"SVC_{component.upper()}_AUTH"
        return {
            f"{p}": "jwt",
            f"{p}_ISSUER": self._issuer().issuer,
            f"{p}_JWKS": f"file://{self.secrets / 'issuer' / 'jwks.json'}",
            f"{p}_CALLERS": ",".join(CALLERS[component]),
        }

    def _scim_env(self) -> dict[str, str]:
        """``SVC_CONTEXT_SCIM_TOKEN`` from ``scim.token`` (empty before the first start)."""
        try:
            return {"SVC_CONTEXT_SCIM_TOKEN": self.secret("scim.token")}
        except FileNotFoundError:
            return {}

    def _policy_history(self) -> list[str]:
        """``--history-dsn`` for the policy service's dry runs: only a ClickHouse server.

        chDB's directory belongs to the history process alone (docs/history.md#engines-and-dsns),
        so with chDB the policy service runs without dry runs.
        """
        if self.history_dsn.startswith(("http://", "https://")):
            return ["--history-dsn", self.history_dsn]
        return []

    def components(self) -> list[Component]:
        """Every process ``start`` runs (after PostgreSQL and Kafka), in start order."""
        s, sec, u, p = self.state, self.secrets, self.urls, self.ports
        kafka = f"kafka://{self.kafka}"
        parts = [
            Component(
                "policy",
                _py(
                    "policy",
                    "--port",
                    str(p["policy"]),
                    "--database-url",
                    self.database_url("policy"),
                    "--data-dir",
                    str(s),
                    "--signing-key-file",
                    str(sec / "policy-signing.key"),
                    *self._policy_history(),
                ),
                p["policy"],
                self._auth_env("policy"),
            ),
            Component(
                "context",
                _py(
                    "context",
                    "serve",
                    "--port",
                    str(p["context"]),
                    "--database-url",
                    self.database_url("context"),
                ),
                p["context"],
                {**self._auth_env("context"), **self._scim_env()},
            ),
            Component(
                "challenge",
                _py(
                    "challenge",
                    "serve",
                    "--port",
                    str(p["challenge"]),
                    "--database-url",
                    self.database_url("challenge"),
                    "--context-url",
                    u["context"],
                    "--context-token-file",
                    str(sec / "challenge.token"),
                    "--pdp-url",
                    u["pdp-1"],
                    "--pdp-token-file",
                    str(sec / "challenge.token"),
                ),
                p["challenge"],
                self._auth_env("challenge"),
            ),
        ]
        for name in ("pdp-1", "pdp-2"):
            parts.append(
                Component(
                    name,
                    _py(
                        "pdp",
                        "--port",
                        str(p[name]),
                        "--public-url",
                        u[name],
                        "--policy",
                        u["policy"],
                        "--public-key",
                        str(sec / "policy-signing.key.pub"),
                        "--policy-token-file",
                        str(sec / "pdp.token"),
                        "--context",
                        u["context"],
                        "--context-token-file",
                        str(sec / "pdp.token"),
                        "--challenge",
                        u["challenge"],
                        "--challenge-token-file",
                        str(sec / "pdp.token"),
                        "--kafka",
                        kafka,
                        "--spool-dir",
                        str(s / name / "spool"),
                        "--log-durability",
                        "durable",
                    ),
                    p[name],
                    self._auth_env("pdp"),
                )
            )
        parts.append(
            Component(
                "intake",
                _py("intake", "--port", str(p["intake"])),
                p["intake"],
                {
                    "SVC_KAFKA_URL": kafka,
                    "SVC_INTAKE_TOKEN_FILE": str(sec / "intake.token"),
                    "SVC_INTAKE_TRANSACTIONAL_ID": "svc-topology-intake",
                },
            )
        )
        parts.append(
            Component(
                "history",
                _py(
                    "topology",
                    "history",
                    "--dsn",
                    self.history_dsn,
                    "--kafka",
                    kafka,
                    "--port",
                    str(p["history"]),
                ),
                p["history"],
                self._auth_env("history"),
            )
        )
        parts.append(
            Component(
                "agent-issuer",
                [
                    sys.executable,
                    "-m",
                    "svc.demo.token_issuer",
                    "--directory",
                    str(self.agent_issuer_dir),
                    "--port",
                    str(p["agent-issuer"]),
                ],
                p["agent-issuer"],
            )
        )
        parts.append(
            Component(
                "tools",
                [
                    sys.executable,
                    "-m",
                    "svc.demo.tools_server",
                    "--http",
                    "--port",
                    str(p["tools"]),
                ],
                p["tools"],
            )
        )
        parts.append(
            Component(
                "gateway",
                _py(
                    "gateway",
                    "--port",
                    str(p["gateway"]),
                    "--public-url",
                    u["gateway"],
                    "--upstreams-file",
                    str(s / "gateway-upstreams.json"),
                    "--pdp-url",
                    u["pdp-1"],
                    "--pdp-token-file",
                    str(sec / "gateway.token"),
                    "--challenge-url",
                    u["challenge"],
                    "--challenge-token-file",
                    str(sec / "gateway.token"),
                    "--policy-url",
                    u["policy"],
                    "--policy-token-file",
                    str(sec / "gateway.token"),
                    "--context-url",
                    u["context"],
                    "--context-token-file",
                    str(sec / "gateway.token"),
                    "--jwks-ca-file",
                    str(self.agent_issuer_dir / "ca.pem"),
                    "--intake-url",
                    u["intake"],
                    "--intake-token-file",
                    str(sec / "intake.token"),
                ),
                p["gateway"],
            )
        )
        return parts

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

    def _spawn(self, c: Component) -> int:
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

        The agent-token issuer's is over HTTPS, trusting its own CA.
        """
        try:
            if name == "agent-issuer":
                ca = ssl.create_default_context(cafile=str(self.agent_issuer_dir / "ca.pem"))
                return httpx.get(f"{self.urls[name]}/readyz", timeout=5, verify=ca).is_success
            return httpx.get(f"http://127.0.0.1:{self.ports[name]}/readyz", timeout=5).is_success
        except (httpx.HTTPError, OSError):
            return False

    def _wait_ready(self, c: Component, timeout: float = READY_TIMEOUT) -> None:
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
            TopologyError: a part did not start (its log's tail in the message).

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
        for c in self.components():
            if self.pid(c.name) is None:
                progress(f"starting {c.name}")
                self._spawn(c)
                started.append(c.name)
            if c.name == "policy":
                self._wait_ready(c)
                self._publish_first_bundle()
            else:
                self._wait_ready(c)
            if c.name == "agent-issuer":
                self._trust_agent_apps()
        return started

    def _trust_agent_apps(self) -> None:
        """Trusts the agent-token issuer's apps and writes the gateway's upstreams.

        Run before the gateway starts: the apps go to the context service, and the upstreams
        (the demo company's tools server, its own process over Streamable HTTP) to
        ``<state>/gateway-upstreams.json``.

        The trusted-app records are upserts (``POST /v1/directory/trusted-apps``,
        docs/context.md), so a restart writes the same ones again.

        Raises:
            TopologyError: the context service refused a record.

        """
        from svc.demo.token_issuer import DevTokenIssuer
        from svc.up import demo_upstreams

        apps = DevTokenIssuer.from_directory(self.agent_issuer_dir).trusted_apps()
        headers = {"authorization": f"Bearer {self.secret('operator.token')}"}
        for app in apps:
            r = httpx.post(
                f"{self.urls['context']}/v1/directory/trusted-apps",
                json=app,
                headers=headers,
                timeout=30,
            )
            if not r.is_success:
                raise TopologyError(f"the context service refused trusted app {app}: {r.text}")
        upstreams = {
            name: {
                **u.model_dump(mode="json", exclude_none=True, exclude={"command", "env"}),
                "url": f"{self.urls['tools']}/mcp",
            }
            for name, u in demo_upstreams().items()
        }
        (self.state / "gateway-upstreams.json").write_text(json.dumps(upstreams, indent=2))

    def _publish_first_bundle(self) -> None:
        """Publishes ``--bundle`` (or the demo company's bundle) when nothing is active."""
        import grpc

        from svc.policy.v1 import policy_pb2 as pb
        from svc.policy.v1 import policy_pb2_grpc as pb_grpc

        meta = [("authorization", f"Bearer {self.secret('operator.token')}")]
        with grpc.insecure_channel(f"127.0.0.1:{self.ports['policy']}") as channel:
            stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                active = stub.GetActive(pb.GetActiveRequest(), timeout=30, metadata=meta)
                if active.bundle.version:
                    return
            except grpc.RpcError as e:
                if not isinstance(e, grpc.Call) or e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            bundle = self.config.bundle
            if bundle is None:
                from svc.demo.company import generate, write_bundle

                bundle = self.state / "bundle"
                if not bundle.exists():
                    write_bundle(generate(), bundle, entities=False)
            files = [
                pb.BundleFile(name=f.name, content=f.read_text(encoding="utf-8"))
                for f in sorted(bundle.iterdir())
                if f.is_file()
            ]
            draft = stub.CreateDraft(
                pb.CreateDraftRequest(files=files, author=OPERATOR, comment=f"first: {bundle}"),
                timeout=60,
                metadata=meta,
            )
            stub.Publish(
                pb.PublishRequest(version=draft.bundle.version, author=OPERATOR),
                timeout=60,
                metadata=meta,
            )

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


def serve_history(dsn: str, kafka_url: str, host: str, port: int) -> None:
    """The history process: the loader and the history routes (``svc topology history``).

    Applies the schema (idempotent; creating the DSN's database), runs ``svc.history.Loader``
    in a thread and serves ``svc.history.service.create_app`` (``/readyz`` is the loader's
    health, docs/history.md) under uvicorn until SIGTERM or SIGINT; then the loader stores and
    commits what it read and stops. Bearer-token settings: ``SVC_HISTORY_AUTH_*``.

    Args:
        dsn: the history store (docs/history.md#engines-and-dsns).
        kafka_url: the broker (``kafka://host:port``).
        host: the address to bind.
        port: the port.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the store or its schema failed.
        svc.common.auth.AuthConfigError: the auth settings are incomplete.

    """
    import uvicorn

    from svc import history
    from svc.common.auth import HistoryAuthSettings
    from svc.common.topics import bootstrap_servers
    from svc.history.service import create_app

    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    # The loader's own batch bounds (docs/history.md#loader), as `svc history load` and the chart
    # use them: one INSERT a second per kind, not five, is what the store is built for.
    loader = history.Loader(client, bootstrap_servers(kafka_url))
    failed: list[BaseException] = []

    def load() -> None:
        try:
            loader.run()
        except BaseException as e:
            failed.append(e)
            log.exception("the history loader stopped on an error")

    thread = threading.Thread(target=load, name="svc-history-loader", daemon=True)
    thread.start()
    auth = HistoryAuthSettings()
    app = create_app(client, loader, auth=auth, ready=thread.is_alive)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        loader.stop()
        thread.join(timeout=60)


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
    from svc.up import default_data_dir

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
    """The history process (loader and routes) that ``start`` runs; see ``serve_history``."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    serve_history(dsn, kafka, host, port)
