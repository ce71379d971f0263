"""The portal's checks and its agents API for trusted apps (docs/portal.md), against real parts.

tests/portalkit.py starts a context service on PostgreSQL, the apps' JWK Sets over HTTPS, `svc
pdp --context URL` as a process and the portal on a real port. Covered: `authorize` allowed and
denied by policy with the decision's qid; an app registering, changing, listing and retiring its
agents with real tokens, the app recorded as author; a retired agent denied `svc:unregistered`
at the decision point; every refused token (a person's, another app's, an agent's, a token
exchange result, expired, an unknown `kid`, `alg: none`, HS256, another audience, none at
all); another app's prefix; bad bodies named field by field; an owner who is not a provisioned,
present, active person; a body over the limit; an app no longer trusted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from portalkit import World, pg_schema, until
from serverkit import UUID7
from svc.portal.service import Denied

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def world(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with pg_schema(postgres_url) as url:
        w = World(url, tmp_path_factory.mktemp("portal"), max_body_bytes=4096)
        try:
            yield w
        finally:
            w.close()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def problem(r: httpx.Response, status: int, slug: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert body["type"] == f"urn:svc:problem:{slug}", body
    assert body["status"] == status and body["detail"], body
    return body


AGENT = {"owner": "ana", "ai": True, "groups": ["agents"], "description": "the assistant"}


def test_authorize_allows_and_denies_by_policy_with_the_decisions_qid(world: World) -> None:
    ok = world.service.authorize("ana", "administer", "directory")
    assert UUID7.match(ok.qid) and ok.policies == ["portal-security-team-administers"]
    assert UUID7.match(world.service.authorize("bo", "view", "decisions").qid)
    with pytest.raises(Denied) as e:
        world.service.authorize("bo", "administer", "containments")
    assert UUID7.match(e.value.qid) and e.value.verdict == "deny"
    assert e.value.extensions()["decision_qid"] == e.value.qid
    with pytest.raises(Denied) as e:
        world.service.authorize("cy", "view", "challenges")
    assert e.value.verdict == "deny" and e.value.qid and e.value.qid != ok.qid
    with pytest.raises(Denied) as e:
        world.service.authorize("nobody-at-all", "view", "keys")
    assert e.value.verdict == "deny"


def test_an_app_registers_changes_lists_and_retires_its_agent(world: World) -> None:
    token = world.copilot.mint("copilot", "svc-portal")
    agent = {"type": "ServiceAccount", "id": "copilot.assistant"}
    doc = {"type": "Document", "id": "plan"}
    assert "svc:unregistered" in world.check(agent, "read", doc)["policies"]

    r = world.http.put("/api/v1/agents/copilot.assistant", json=AGENT, headers=bearer(token))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["id"] == "copilot.assistant" and body["app"] == "copilot"
    assert body["owner"] == "ana" and body["ai"] is True and body["registered"] is True
    assert body["groups"] == ["agents"] and isinstance(body["principals_version"], int)
    until(
        "registered agent allowed at the decision point",
        lambda: world.check(agent, "read", doc)["verdict"] == "allow",
    )

    changed = {**AGENT, "description": "renamed", "ai": False}
    r = world.http.put("/api/v1/agents/copilot.assistant", json=changed, headers=bearer(token))
    assert r.status_code == 200 and r.json()["description"] == "renamed", r.text
    r = world.http.put(
        "/api/v1/agents/copilot.helper", json={"owner": "bo", "ai": True}, headers=bearer(token)
    )
    assert r.status_code == 201, r.text
    other = world.billing.mint("billing", "svc-portal")
    r = world.http.put("/api/v1/agents/billing.bot", json=AGENT, headers=bearer(other))
    assert r.status_code == 201, r.text

    r = world.http.get("/api/v1/agents", headers=bearer(token))
    assert r.status_code == 200, r.text
    listed = r.json()
    assert listed["app"] == "copilot"
    assert [a["id"] for a in listed["agents"]] == ["copilot.assistant", "copilot.helper"]
    assert listed["agents"][0]["description"] == "renamed"
    r = world.http.get("/api/v1/agents", headers=bearer(other))
    assert [a["id"] for a in r.json()["agents"]] == ["billing.bot"]

    r = world.http.get("/api/v1/agents/copilot.assistant", headers=bearer(token))
    one = r.json()
    assert one["registered"] is True
    assert [(c["change"], c["author"]) for c in one["changes"]] == [
        ("changed", "copilot"),
        ("registered", "copilot"),
    ]

    start = time.monotonic()
    r = world.http.delete("/api/v1/agents/copilot.assistant", headers=bearer(token))
    assert r.status_code == 204 and r.content == b"", r.text
    until(
        "retired agent denied svc:unregistered",
        lambda: "svc:unregistered" in world.check(agent, "read", doc)["policies"],
    )
    print(f"DELETE to svc:unregistered: {(time.monotonic() - start) * 1000:.0f} ms")
    d = world.check(agent, "read", doc)
    assert d["verdict"] == "deny" and d["policies"] == ["svc:unregistered"]

    r = world.http.get("/api/v1/agents/copilot.assistant", headers=bearer(token))
    gone = r.json()
    assert gone["registered"] is False
    assert [c["change"] for c in gone["changes"]] == ["retired", "changed", "registered"]
    assert gone["changes"][0]["author"] == "copilot" and gone["changes"][0]["record"] is None
    r = world.http.get("/api/v1/agents", headers=bearer(token))
    assert [a["id"] for a in r.json()["agents"]] == ["copilot.helper"]
    problem(
        world.http.delete("/api/v1/agents/copilot.assistant", headers=bearer(token)),
        404,
        "agent-not-found",
    )
    problem(
        world.http.get("/api/v1/agents/copilot.never", headers=bearer(token)),
        404,
        "agent-not-found",
    )


def test_an_app_writes_only_its_own_prefix(world: World) -> None:
    token = world.copilot.mint("copilot", "svc-portal")
    for path in ("billing.bot", "copilotx.bot", "copilot-two.bot"):
        problem(
            world.http.put(f"/api/v1/agents/{path}", json=AGENT, headers=bearer(token)),
            403,
            "agent-not-yours",
        )
        problem(
            world.http.delete(f"/api/v1/agents/{path}", headers=bearer(token)),
            403,
            "agent-not-yours",
        )
    for bad in ("copilot", "copilot.", "copilot.a b", "Copilot.bot", "copilot." + "x" * 201):
        r = world.http.put(f"/api/v1/agents/{bad}", json=AGENT, headers=bearer(token))
        problem(r, 400, "invalid-agent-id")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(claims: dict[str, object], alg: str = "none") -> str:
    head = _b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    return f"{head}.{_b64(json.dumps(claims).encode())}."


def test_every_other_token_is_refused(world: World, tmp_path: Path) -> None:
    from gwkit import Issuer

    now = int(time.time())
    own = {"iss": world.copilot.iss, "sub": "copilot", "aud": "svc-portal", "exp": now + 300}
    hs_key = world.jwks.sets["copilot"][0]["n"].encode()
    hs_head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": world.copilot.kid}).encode())
    hs_body = _b64(json.dumps(own).encode())
    hs_sig = _b64(hmac.new(hs_key, f"{hs_head}.{hs_body}".encode(), hashlib.sha256).digest())
    stranger = Issuer(world.copilot.iss, "RS256")  # same iss, a key the JWKS does not hold
    refused = {
        "a person's own token": world.idp.mint("ana", "svc-portal"),
        "an agent's token": world.copilot.mint("copilot.assistant", "svc-portal"),
        "a token exchange result": world.copilot.mint("ana", "svc-portal", act="copilot.assistant"),
        "the app's name under act": world.copilot.mint("copilot", "svc-portal", act="copilot"),
        "another app's name": world.copilot.mint("billing", "svc-portal"),
        "expired": world.copilot.mint("copilot", "svc-portal", lifetime=-120),
        "another audience": world.copilot.mint("copilot", "svc-gateway"),
        "an unknown kid": stranger.mint("copilot", "svc-portal"),
        "alg none": _unsigned(own),
        "HS256 over the public key": f"{hs_head}.{hs_body}.{hs_sig}",
        "not a JWT": "not-a-token",
    }
    for what, token in refused.items():
        r = world.http.get("/api/v1/agents", headers=bearer(token))
        body = problem(r, 401, "unauthenticated")
        assert r.headers["www-authenticate"] == (
            'Bearer realm="svc-portal", error="invalid_token"'
        ), what
        print(f"{what}: {body['detail']}")
        r = world.http.put("/api/v1/agents/copilot.x", json=AGENT, headers=bearer(token))
        problem(r, 401, "unauthenticated")
    r = world.http.get("/api/v1/agents")
    problem(r, 401, "unauthenticated")
    assert r.headers["www-authenticate"] == 'Bearer realm="svc-portal"'


def test_bad_bodies_and_owners_are_named(world: World) -> None:
    token = world.copilot.mint("copilot", "svc-portal")

    def put(body: object) -> httpx.Response:
        return world.http.put("/api/v1/agents/copilot.bad", json=body, headers=bearer(token))

    body = problem(put({"owner": "ana"}), 400, "invalid-agent")
    assert [e["field"] for e in body["errors"]] == ["ai"]  # type: ignore[union-attr,index]
    body = problem(put({**AGENT, "colour": "red", "groups": "x"}), 400, "invalid-agent")
    assert {e["field"] for e in body["errors"]} == {"colour", "groups"}  # type: ignore[union-attr,index]
    problem(put([AGENT]), 400, "invalid-agent")
    body = problem(put({**AGENT, "owner": "zed"}), 400, "invalid-agent")
    assert "not a provisioned person" in str(body["detail"])
    r = world.context.scim.patch(
        f"/Users/{world.scim_ids['dee']}",
        json={
            "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "replace", "value": {"active": False}}],
        },
    )
    assert r.status_code in (200, 204), r.text
    body = problem(put({**AGENT, "owner": "dee"}), 400, "invalid-agent")
    assert "deactivated" in str(body["detail"])
    r = world.http.put(
        "/api/v1/agents/copilot.bad",
        content=b"{" + b" " * 5000 + b"}",
        headers={**bearer(token), "content-type": "application/json"},
    )
    problem(r, 413, "payload-too-large")
    r = world.http.get("/api/v1/agents/copilot.bad", headers=bearer(token))
    problem(r, 404, "agent-not-found")  # nothing of a refused body was written


def test_an_app_no_longer_trusted_is_refused(world: World) -> None:
    from gwkit import Issuer

    temp = Issuer("https://temp.example.com", "ES256")
    world.trust("temp", temp)
    token = temp.mint("temp", "svc-portal")
    until(
        "new app trusted",
        lambda: world.http.get("/api/v1/agents", headers=bearer(token)).status_code == 200,
    )
    r = world.context.http.delete("/v1/directory/trusted-apps/temp")
    assert r.status_code == 204
    until(
        "removed app refused",
        lambda: world.http.get("/api/v1/agents", headers=bearer(token)).status_code == 401,
    )


def test_probes(world: World) -> None:
    assert world.http.get("/healthz").json() == {"status": "ok"}
    r = world.http.get("/readyz")
    assert r.status_code == 200 and set(r.json()["trusted_apps"]) >= {"billing", "copilot"}
    assert world.http.get("/version").json()["component"] == "svc-portal"
    r = world.http.get("/metrics")
    assert "svc_portal_agent_calls_total" in r.text
