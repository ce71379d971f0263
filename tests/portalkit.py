"""Helpers of the portal's tests (tests/test_portal*.py): real parts on real sockets.

``World`` starts what the portal calls and the portal itself:

* a context service (``svc.context``) on a PostgreSQL schema of its own, served by uvicorn in a
  thread, provisioned over SCIM with a few people and groups;
* the trusted apps' JWK Sets over HTTPS (``gwkit.JwksServer``, a trustme CA) and their signing
  keys (``gwkit.Issuer``), trusted through the context service's directory;
* the challenge service (``ChallengeServer``, SQLite) and the policy service (``PolicyServer``,
  SQLite), each in a thread;
* ``svc pdp --bundle DIR --context URL --challenge URL`` as a process, over a bundle with
  ``PortalArea`` and its ``view``/``administer`` actions (``SCHEMA``, ``POLICIES``), following
  the context service and the containment list;
* the demo OpenID Connect provider (``svc.challenge.dev_idp``, oidc-provider-mock) people sign
  in with, and ``sign_in``, which signs a person in the way a browser would (the provider's form
  posted with httpx);
* the portal (``PortalServer``) on a free port.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import make_url

from gwkit import Issuer, JwksServer
from svc.challenge.app import ChallengeServer
from svc.challenge.dev_idp import DevIdentityProvider
from svc.challenge.pdp_client import ApproverCheck
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeSettings
from svc.common.net import tcp_listener
from svc.policy import signing
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.portal.app import PortalServer, build_service
from svc.portal.settings import PortalSettings
from test_context import Live, create_group, create_user
from test_pdp_standalone import Pdp

SCHEMA = """
entity Group in [Group];
entity WorkItem;
entity Human in [Group] = {
  active: Bool,
  department: String,
  title: String,
  manager?: Human,
};
entity ServiceAccount in [Group] = {
  owner: Human,
  ai: Bool,
  registered: Bool,
  app: String,
  description?: String,
};
entity Document;
entity PortalArea;
entity Tool;
type DecisionContext = {
  risk_score?: Long,
  human_present?: Bool,
  agent?: ServiceAccount,
  work_item?: WorkItem,
  assigned?: Bool,
};
type PortalContext = {
  risk_score?: Long,
  human_present?: Bool,
  agent?: ServiceAccount,
  work_item?: WorkItem,
  assigned?: Bool,
  own?: Bool,
};
action read, write appliesTo {
  principal: [Human, ServiceAccount], resource: [Document], context: DecisionContext,
};
action call appliesTo {
  principal: [Human, ServiceAccount], resource: [Tool], context: DecisionContext,
};
action approve appliesTo {
  principal: [Human], resource: [Document], context: DecisionContext,
};
action view, administer appliesTo {
  principal: [Human, ServiceAccount], resource: [PortalArea], context: PortalContext,
};
"""

POLICIES = """
@id("inactive-people-denied")
forbid (principal is Human, action, resource) unless { principal.active };

@id("agents-read-documents")
permit (principal is ServiceAccount, action == Action::"read", resource is Document);

@id("portal-security-team-administers")
permit (principal in Group::"security-team", action in [Action::"view", Action::"administer"],
        resource is PortalArea);

@id("portal-auditors-view")
permit (principal in Group::"auditors", action == Action::"view", resource is PortalArea);

@id("portal-own-challenges-and-keys")
permit (principal is Human, action in [Action::"view", Action::"administer"], resource is PortalArea)
when {
  (resource == PortalArea::"challenges" || resource == PortalArea::"keys") &&
  context has own && context.own
};

@id("portal-ai-agents-view-for-their-person")
permit (principal is ServiceAccount, action == Action::"view", resource is PortalArea)
when { principal.ai };

@id("portal-ai-agents-draft-policies")
permit (principal is ServiceAccount, action == Action::"administer",
        resource == PortalArea::"policies")
when { principal.ai };

@id("agents-call-tools")
permit (principal is ServiceAccount, action == Action::"call", resource is Tool);

@id("agent-writes-need-approval") @challenge("approval")
permit (principal is ServiceAccount, action == Action::"write", resource is Document);
"""

#: People provisioned over SCIM: user name -> groups.
PEOPLE = {"ana": ["security-team"], "bo": ["auditors"], "cy": [], "dee": []}
#: Tries of a poll, 50 ms apart: 60 s at most.
TRIES = 1200


def until(what: str, probe: Callable[[], Any]) -> Any:
    """Asks `probe` until it answers something truthy; prints the time it took (never asserted)."""
    start = time.monotonic()
    for _ in range(TRIES):
        got = probe()
        if got:
            print(f"{what}: {(time.monotonic() - start) * 1000:.0f} ms")
            return got
        time.sleep(0.05)
    raise AssertionError(f"not after {TRIES} tries: {what}")


@contextmanager
def pg_schema(postgres_url: str) -> Iterator[str]:
    """A fresh PostgreSQL schema as a database URL's search path; dropped afterwards."""
    url = make_url(postgres_url)
    name = f"portal_{uuid.uuid4().hex[:12]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
            hide_password=False
        )
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


class HistoryLoader:
    """``svc history load`` as a process: both topics into chDB in `tmp`, its routes on a port.

    Args:
        tmp: where the chDB directory goes.
        bootstrap: the Kafka bootstrap servers.
        decisions_topic: the decision log's topic.
        events_topic: the events' topic.

    """

    def __init__(self, tmp: Path, bootstrap: str, decisions_topic: str, events_topic: str) -> None:
        import subprocess
        import sys

        sock = tcp_listener("127.0.0.1", 0)
        self.port = int(sock.getsockname()[1])
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        svc = Path(sys.executable).parent / "svc"
        self.log = tmp / "history.log"
        self._out = self.log.open("w")
        args = [
            str(svc), "history", "load", "--dsn", f"chdb://{tmp / 'history'}",
            "--kafka", f"kafka://{bootstrap}", "--decisions-topic", decisions_topic,
            "--events-topic", events_topic, "--group", f"portal-{uuid.uuid4().hex[:8]}",
            "--migrate", "--port", str(self.port), "--batch-ms", "100",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        until("history routes up", self._up)

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stops the loader (SIGTERM, then SIGKILL after 20 s)."""
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


class DecisionLog:
    """Kafka topics of a test module's own and ``svc history load`` reading them (``logged``).

    Attributes:
        decisions: the decision log's topic.
        events: the events' topic.
        history: the loader, its routes at ``history.url``.
        pdp_args: ``svc pdp`` options that send its decision log to ``decisions``, spooled
            under the module's directory.

    """

    def __init__(self, bootstrap: str, tmp: Path, name: str) -> None:
        from kafka_fixture import create_topics

        suffix = uuid.uuid4().hex[:8]
        self.decisions, self.events = f"{name}.decisions.{suffix}", f"{name}.events.{suffix}"
        create_topics(bootstrap, self.decisions, self.events)
        self.history = HistoryLoader(tmp, bootstrap, self.decisions, self.events)
        self.pdp_args: tuple[str, ...] = (
            "--kafka", f"kafka://{bootstrap}", "--decisions-topic", self.decisions,
            "--spool-dir", str(tmp / "spool"),
        )  # fmt: skip


@contextmanager
def logged(bootstrap: str, tmp: Path, name: str) -> Iterator[DecisionLog]:
    """A module's decision log through Kafka into chDB (``DecisionLog``); the loader stops
    after the block."""
    log = DecisionLog(bootstrap, tmp, name)
    try:
        yield log
    finally:
        log.history.stop()


class World:
    """The context service, the JWKS server, the decision point and the portal (module docs).

    Args:
        database_url: the context service's database.
        tmp: a directory for the bundle and the CA file.
        pdp_args: more options of the decision point.
        policy_history: a history client (``svc.history.connect``) for the policy service's
            dry runs; none: a dry run answers that no history is configured.
        pdp_follows_policy: the decision point follows the policy service (``--policy``, the
            bundle's files published there first as version 1) instead of reading the bundle
            directory, so a publish reaches it.
        portal: more portal settings.

    """

    def __init__(
        self,
        database_url: str,
        tmp: Path,
        *,
        pdp_args: tuple[str, ...] = (),
        policy_history: Any = None,
        pdp_follows_policy: bool = False,
        **portal: Any,
    ) -> None:
        self.tmp = tmp
        self.pdp_args = pdp_args
        self.policy_history = policy_history
        self.pdp_follows_policy = pdp_follows_policy
        self.context = Live(database_url)
        self.scim_ids: dict[str, str] = {}
        try:
            self._start(tmp, portal)
        except BaseException:
            self.close()
            raise

    def _start(self, tmp: Path, portal: dict[str, Any]) -> None:
        for name in PEOPLE:
            self.scim_ids[name] = create_user(self.context, name, title="t")["id"]
        groups = sorted({g for gs in PEOPLE.values() for g in gs})
        for g in groups:
            create_group(self.context, g, [self.scim_ids[p] for p, gs in PEOPLE.items() if g in gs])
        self.jwks = JwksServer(tmp)
        self.copilot = Issuer("https://copilot.example.com", "RS256")
        self.billing = Issuer("https://billing.example.com", "ES256")
        self.idp = Issuer("https://idp.example.com", "ES256")
        self.jwks.publish("idp", self.idp)
        for name, issuer in (("copilot", self.copilot), ("billing", self.billing)):
            self.trust(name, issuer)
        bundle = tmp / "bundle"
        bundle.mkdir(exist_ok=True)
        (bundle / "schema.cedarschema").write_text(SCHEMA)
        (bundle / "policies.cedar").write_text(POLICIES)
        self.challenge_service = ChallengeService(
            ChallengeSettings(
                database_url=f"sqlite:///{tmp / 'challenge.db'}",
                port=0,
                heartbeat_secs=0.2,
                watch_poll_secs=0.1,
                context_url=self.context.url,
            )
        )
        self.challenge = ChallengeServer(
            self.challenge_service.settings, self.challenge_service, outbox=False
        ).start()
        # Dry runs decide with the directory, as in production (docs/policy.md#dry-runs).
        policy_settings = PolicySettings(
            port=0,
            data_dir=tmp,
            database_url=f"sqlite:///{tmp / 'policy.db'}",
            context_url=self.context.url,
        )
        self.policy = PolicyServer(
            policy_settings, PolicyService(policy_settings, history=self.policy_history)
        ).start()
        source: tuple[str, ...] = ("--bundle", str(bundle))
        if self.pdp_follows_policy:
            policy = self.policy.service
            files = {"schema.cedarschema": SCHEMA, "policies.cedar": POLICIES}
            policy.publish(policy.create_draft(files, "ana").version, "ana")
            key = tmp / "policy-signing.pub"
            key.write_text(signing.public_key_text(policy.public_key))
            source = ("--policy", self.policy.url, "--public-key", str(key))
        self.pdp = Pdp(
            *source, "--port", "0", "--no-watch", "--context", self.context.url,
            "--challenge", self.challenge.url, "--challenge-timeout-ms", "30000",
            *self.pdp_args,
        )  # fmt: skip
        self.pdp_url = f"http://127.0.0.1:{self.pdp.port()}"
        self.pdp_http = httpx.Client(base_url=self.pdp_url, timeout=30)
        until("decision point ready", lambda: self.pdp_http.get("/readyz").status_code == 200)
        self.challenge_service.approvers = ApproverCheck(self.pdp_url)
        self.oidc = DevIdentityProvider(users=list(PEOPLE)).start()
        secret = tmp / "oidc-secret"
        secret.write_text("portal-client-secret\n")
        sock = tcp_listener("127.0.0.1", 0)  # the port is known before the portal starts:
        port = int(sock.getsockname()[1])  # its public URL is the OIDC redirect URI's base
        sock.close()
        self.settings = PortalSettings(
            port=port,
            public_url=f"http://127.0.0.1:{port}",
            oidc_issuer=self.oidc.issuer,
            oidc_client_secret_file=str(secret),
            session_key_file=str(tmp / "session.key"),
            history_url=portal.pop("history_url", None),
            # The API's own tests send their own queries (the web app's are persisted).
            allow_any_query=portal.pop("allow_any_query", True),
            person_issuer=self.idp.iss,
            person_jwks_url=self.jwks.url("idp"),
            pdp_url=self.pdp_url,
            context_url=self.context.url,
            policy_url=self.policy.url,
            challenge_url=self.challenge.url,
            jwks_ca_file=str(self.jwks.ca_file),
            trust_refresh_secs=0.2,
            **portal,
        )
        self.service = build_service(self.settings)
        self.portal = PortalServer(self.settings, self.service).start()
        self.http = httpx.Client(base_url=self.portal.url, timeout=30)

    def sign_in(self, user: str) -> httpx.Client:
        """A client signed in as `user` at the provider, as a browser would be.

        Its ``headers`` carry ``X-CSRF-Token`` (from ``GET /api/v1/me``).
        """
        c = httpx.Client(base_url=self.portal.url, timeout=30)
        r = c.get("/auth/login")
        assert r.status_code in (302, 303), r.text
        r = httpx.post(r.headers["location"], data={"sub": user}, timeout=30)
        assert r.status_code in (302, 303), r.text
        r = c.get(r.headers["location"])
        assert r.status_code == 303, r.text
        me = c.get("/api/v1/me")
        assert me.status_code == 200 and me.json()["user"] == user, me.text
        c.headers["x-csrf-token"] = me.json()["csrf"]
        return c

    def trust(self, name: str, issuer: Issuer) -> None:
        """Trusts `issuer` as the app `name` through the context service's directory."""
        r = self.context.http.post(
            "/v1/directory/trusted-apps",
            json={
                "name": name,
                "iss": issuer.iss,
                "jwks_url": self.jwks.publish(name, issuer),
                "aud": "svc-portal",
            },
        )
        assert r.status_code == 200, r.text

    def check(
        self,
        principal: dict[str, str],
        action: str,
        resource: dict[str, str],
        on_behalf_of: dict[str, str] | None = None,
    ) -> Any:
        """A check at the decision point (an agent's for a person with `on_behalf_of`): its
        answer's JSON."""
        body: dict[str, Any] = {"principal": principal, "action": action, "resource": resource}
        if on_behalf_of is not None:
            body["on_behalf_of"] = on_behalf_of
        r = self.pdp_http.post("/v1/access/evaluation", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        """Stops everything that was started."""
        for name in ("http", "pdp_http"):
            c = getattr(self, name, None)
            if c is not None:
                c.close()
        portal = getattr(self, "portal", None)
        if portal is not None:
            portal.stop()
        service = getattr(self, "service", None)
        if service is not None:
            service.close()
        pdp = getattr(self, "pdp", None)
        if pdp is not None:
            pdp.stop()
        for name in ("policy", "challenge"):
            server = getattr(self, name, None)
            if server is not None:
                server.stop()
                server.service.close()
        oidc = getattr(self, "oidc", None)
        if oidc is not None:
            oidc.stop()
        jwks = getattr(self, "jwks", None)
        if jwks is not None:
            jwks.close()
        self.context.stop()
