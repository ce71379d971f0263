"""`svc pdp --context URL` end to end (docs/context.md#the-decision-point-following-it).

A live context service on PostgreSQL (as tests/test_context.py starts it) with callers' tokens
on, and `svc pdp --bundle DIR --context URL` as a real process (as tests/test_pdp_standalone.py
starts it) with bearer tokens on too (docs/auth.md): both trust one local issuer; the decision
point sends the context service the token in `--context-token-file`, the test sends both its
own. What the decision point applies is waited for by asking it again (a bounded number of
tries with short sleeps: a subprocess has no hook to wait on); the time each change took to be
applied is printed (`-s` shows it), never asserted. Also `serve_bundle` in-process with both
`--policy` and `--context`: the bundle from the policy service, the rest from the context
service.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from serverkit import wait_until
from svc.common.auth import LOCAL_ISSUER, LocalIssuer
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.pdp.server import StandaloneOptions, serve_bundle
from svc.policy.app import PolicyServer
from test_context import PATCH, SCIM_TOKEN, USER, Live, create_user, database_url, live
from test_context_follow import POLICIES, SCHEMA, _doc, _serve, _shut, put_docs
from test_pdp_standalone import Pdp
from test_policy import admin_key, pg, server  # noqa: F401  (fixtures used by name)

__all__ = ["database_url", "live"]  # fixtures, shared with tests/test_context.py

EVAL = "/v1/access/evaluation"
#: Tries of a poll, 50 ms apart: 60 s at most (the follower applies a change within a second).
TRIES = 1200
PDP_CALLER = "svc-pdp-e2e"
TEST_CALLER = "svc-test"


def human(user_name: str) -> dict[str, str]:
    return {"type": "Human", "id": user_name}


def until(what: str, probe: Callable[[], bool], since: float | None = None) -> float:
    """Asks `probe` until it holds (at most TRIES times); returns and prints the time taken."""
    start = time.monotonic() if since is None else since
    for _ in range(TRIES):
        if probe():
            took = time.monotonic() - start
            print(f"change-to-applied: {what}: {took * 1000:.0f} ms")
            return took
        time.sleep(0.05)
    raise AssertionError(f"not applied after {TRIES} tries: {what}")


class World:
    """The context service, the decision point and clients of both, with their tokens."""

    def __init__(self, database_url: str, tmp: Path) -> None:
        self.issuer = LocalIssuer(tmp / "issuer")
        settings = ContextSettings(database_url=database_url, scim_token=SCIM_TOKEN, port=0)
        self.auth = ContextAuthSettings(
            auth_issuer=LOCAL_ISSUER,
            auth_jwks=self.issuer.jwks_url,
            auth_callers=[PDP_CALLER, TEST_CALLER],
        )
        self.settings = settings
        self.service = ContextService(settings)
        # The decision point starts before the service listens: /readyz answers 503 meanwhile.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.served: tuple[Any, Any, Any, str] | None = None
        bundle = tmp / "bundle"
        bundle.mkdir()
        (bundle / "schema.cedarschema").write_text(SCHEMA)
        (bundle / "policies.cedar").write_text(POLICIES)
        token_file = tmp / "context.token"
        token_file.write_text(self.issuer.mint(PDP_CALLER, "svc-context", 3600) + "\n")
        self.pdp = Pdp(
            "--bundle", str(bundle), "--port", "0", "--no-watch",
            "--context", self.url, "--context-token-file", str(token_file),
            "--auth-issuer", LOCAL_ISSUER, "--auth-jwks", self.issuer.jwks_url,
            "--auth-callers", TEST_CALLER,
        )  # fmt: skip
        bearer = {"authorization": f"Bearer {self.issuer.mint(TEST_CALLER, 'svc-pdp', 3600)}"}
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{self.pdp.port()}", headers=bearer, timeout=30
        )
        ctx = {"authorization": f"Bearer {self.issuer.mint(TEST_CALLER, 'svc-context', 3600)}"}
        self.ctx = httpx.Client(base_url=self.url, headers=ctx, timeout=30)
        self.scim = httpx.Client(
            base_url=self.url + "/scim/v2",
            headers={"authorization": f"Bearer {SCIM_TOKEN}"},
            timeout=30,
        )

    def serve(self) -> None:
        self.served = _serve(self.service, self.settings, self.auth, self.port)

    def close(self) -> None:
        code = self.pdp.stop()
        for c in (self.http, self.ctx, self.scim):
            c.close()
        if self.served is not None:
            _shut(*self.served[:3])
        self.service.close()
        assert code == 0, self.pdp.log

    # -- the decision point ------------------------------------------------------------

    def check(self, principal: dict[str, str], doc: str, **extra: Any) -> dict[str, Any]:
        body = {
            "principal": principal,
            "action": "read",
            "resource": {"type": "Document", "id": doc},
            **extra,
        }
        r = self.http.post(EVAL, json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def verdict(self, principal: dict[str, str], doc: str) -> str:
        return str(self.check(principal, doc)["verdict"])

    def metric(self, name: str) -> float:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    # -- the context service -----------------------------------------------------------

    def put_docs(self, *docs: tuple[str, str, str]) -> None:
        r = self.ctx.post(
            "/v1/resources",
            json={
                "resources": [
                    {"type": "Document", "id": d, "attrs": {"department": dep, "sensitivity": s}}
                    for d, dep, s in docs
                ]
            },
        )
        assert r.status_code == 200, r.text

    def user(self, user_name: str, department: str = "") -> dict[str, Any]:
        ent = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
        doc: dict[str, Any] = {
            "schemas": [USER, ent],
            "userName": user_name,
            "name": {"givenName": user_name.split("@")[0], "familyName": "Test"},
            "active": True,
            ent: {"department": department},
        }
        r = self.scim.post("/Users", json=doc)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def patch(self, path: str, *ops: dict[str, Any]) -> None:
        r = self.scim.patch(path, json={"schemas": [PATCH], "Operations": list(ops)})
        assert r.status_code in (200, 204), r.text


@pytest.fixture
def world(database_url: str, tmp_path: Path) -> Iterator[World]:
    w = World(database_url, tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_svc_pdp_follows_the_context_service(world: World) -> None:
    w = world
    # Before the service answers, the decision point is not ready, and says why.
    r = w.http.get("/readyz")
    assert r.status_code == 503, r.text
    assert "the principals snapshot" in r.json()["detail"]

    w.serve()
    until("snapshot loaded, /readyz 200", lambda: w.http.get("/readyz").status_code == 200)
    ready = w.http.get("/readyz").json()
    assert ready["ready"] is True

    # The directory, written over SCIM and the service-account route once the decision point
    # follows the watch; one document through the batch route.
    t0 = time.monotonic()
    dana = w.user("dana@example.com", "eng")
    erin = w.user("erin@example.com")
    w.user("fay@example.com", "eng")
    readers = w.scim.post(
        "/Groups",
        json={
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
            "displayName": "readers",
            "members": [{"value": dana["id"]}],
        },
    )
    assert readers.status_code == 201, readers.text
    r = w.ctx.post(
        "/v1/service-accounts",
        json={
            "service_accounts": [
                {"id": "copilot.bot", "owner": "dana@example.com", "ai": True, "groups": []}
            ]
        },
    )
    assert r.status_code == 200, r.text
    w.put_docs(("faq", "sales", "public"))
    until(
        "people, group and service account",
        lambda: (
            w.verdict({"type": "ServiceAccount", "id": "copilot.bot"}, "faq") == "allow"
            and w.verdict(human("dana@example.com"), "faq") == "allow"
        ),
        t0,
    )

    # Loaded: dana (eng) reads public faq as a reader (faq fetched on the miss); erin, in
    # no group, does not; a registered account reads it, an unknown one is unregistered.
    d = w.check(human("dana@example.com"), "faq")
    assert d["verdict"] == "allow", d
    assert w.verdict(human("erin@example.com"), "faq") == "deny"
    assert w.verdict({"type": "ServiceAccount", "id": "copilot.bot"}, "faq") == "allow"
    stranger = w.check({"type": "ServiceAccount", "id": "other.bot"}, "faq")
    assert stranger["verdict"] == "deny" and "svc:unregistered" in stranger["policies"]

    # A group membership change over SCIM changes a decision.
    t0 = time.monotonic()
    w.patch(
        f"/Groups/{readers.json()['id']}",
        {"op": "add", "path": "members", "value": [{"value": erin["id"]}]},
    )
    until(
        "group membership",
        lambda: w.verdict(human("erin@example.com"), "faq") == "allow",
        t0,
    )

    # A resource written through the batch route after the start is decided with its
    # attributes (fetched on the miss) ...
    w.put_docs(("launch", "eng", "internal"))
    fetches = w.metric('svc_pdp_resource_fetches_total{outcome="ok"}')
    assert w.verdict(human("fay@example.com"), "launch") == "allow"
    assert w.metric('svc_pdp_resource_fetches_total{outcome="ok"}') == fetches + 1
    # ... then changed through it, and decided with the new attributes (via the feed).
    t0 = time.monotonic()
    w.put_docs(("launch", "sales", "internal"))
    until("resource change", lambda: w.verdict(human("fay@example.com"), "launch") == "deny", t0)
    assert w.metric('svc_pdp_resource_fetches_total{outcome="ok"}') == fetches + 1

    # An unknown resource is fetched once, not per check.
    fetches = w.metric('svc_pdp_resource_fetches_total{outcome="ok"}')
    for _ in range(5):
        assert w.verdict(human("dana@example.com"), "nowhere") == "deny"
    assert w.metric('svc_pdp_resource_fetches_total{outcome="ok"}') == fetches + 1
    # Once written, the feed names it and the next check fetches it.
    t0 = time.monotonic()
    w.put_docs(("nowhere", "eng", "internal"))
    until(
        "unknown resource written",
        lambda: w.verdict(human("dana@example.com"), "nowhere") == "allow",
        t0,
    )

    # A rescore raises principals_version and remakes a pinned plan of that principal.
    plan_req = {
        "principal": human("erin@example.com"),
        "action": "read",
        "resource_type": "Document",
    }
    r = w.http.post("/v1/access/plan", json=plan_req)
    assert r.status_code == 200, r.text
    first = r.json()
    again = w.http.post("/v1/access/plan", json={**plan_req, "plan_qid": first["qid"]}).json()
    assert again["pinned"] is True and again["qid"] == first["qid"]
    t0 = time.monotonic()
    r = w.ctx.post(
        "/v1/risk", json={"scores": [{"principal": human("erin@example.com"), "score": 95}]}
    )
    assert r.status_code == 200, r.text

    def remade() -> bool:
        p = w.http.post("/v1/access/plan", json={**plan_req, "plan_qid": first["qid"]}).json()
        if p["pinned"]:
            return False
        assert p["qid"] != first["qid"]
        assert p["principals_version"] > first["principals_version"]
        return True

    until("rescore remakes the pinned plan", remade, t0)
    rescored = w.check(human("erin@example.com"), "faq")
    assert rescored["verdict"] == "deny" and "high-risk-denied" in rescored["policies"]

    # Dana deactivated over SCIM (PATCH) is denied; erin deleted is denied.
    t0 = time.monotonic()
    w.patch(f"/Users/{dana['id']}", {"op": "replace", "value": {"active": False}})

    def dana_denied() -> bool:
        d = w.check(human("dana@example.com"), "faq")
        return d["verdict"] == "deny" and "inactive-people-denied" in d["policies"]

    until("deactivation", dana_denied, t0)
    t0 = time.monotonic()
    assert w.scim.delete(f"/Users/{erin['id']}").status_code == 204

    def erin_denied() -> bool:
        d = w.check(human("erin@example.com"), "faq")
        return "inactive-people-denied" in d["policies"]

    until("deletion", erin_denied, t0)

    # The service account unregistered: denied svc:unregistered.
    t0 = time.monotonic()
    assert w.ctx.delete("/v1/service-accounts/copilot.bot").status_code == 204

    def unregistered() -> bool:
        d = w.check({"type": "ServiceAccount", "id": "copilot.bot"}, "faq")
        return "svc:unregistered" in d["policies"]

    until("service account unregistered", unregistered, t0)
    assert w.metric('svc_pdp_resource_fetches_total{outcome="failed"}') == 0
    assert w.metric('svc_pdp_resource_fetches_total{outcome="timeout"}') == 0


def test_serve_bundle_follows_both_a_policy_and_a_context_service(
    live: Live,
    server: PolicyServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``--policy URL --context URL``: the bundle from one, principals and resources from the
    other; ready once both are loaded."""
    policy = server.service
    version = policy.create_draft({"s.cedarschema": SCHEMA, "p.cedar": POLICIES}, "ana").version
    policy.publish(version, "ana")
    key = tmp_path / "policy.pub"
    key.write_bytes(policy.public_key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    create_user(
        live,
        "hal@example.com",
        **{"urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "eng"}},
    )
    put_docs(live, ("h", "eng", "internal"))
    options = StandaloneOptions(
        port=0, watch=False, policy=server.target, public_key=key, context=live.url
    )
    with serve_bundle(None, options) as pdp:
        with httpx.Client(base_url=f"http://127.0.0.1:{pdp.port}", timeout=30) as c:
            wait_until(lambda: c.get("/readyz").status_code == 200, timeout=60)
            r = c.post(
                "/v1/access/evaluation",
                json={
                    "principal": human("hal@example.com"),
                    "action": "read",
                    "resource": _doc("h"),
                },
            )
            assert r.status_code == 200, r.text
            assert r.json()["verdict"] == "allow" and r.json()["policies"] == ["own-department"]
