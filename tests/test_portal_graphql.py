"""The portal's GraphQL API (docs/portal.md#graphql), against real services.

tests/portalkit.py starts a context service on PostgreSQL, the challenge and policy services,
`svc pdp --context URL --challenge URL` as a process, the demo OpenID Connect provider and the
portal; people sign in the way a browser would. Covered: every query and mutation allowed for
one person and refused by policy for another, the refusal carrying the decision's qid; a
person's own challenges and keys (`context.own`); a contain from GraphQL denying at the decision
point and a lift allowing again; an approval decided through GraphQL passing an agent's
challenge; a newly trusted app's token taken by the agents API; drafts refused with every
problem by file, line and column, a draft published, the modes set; the limits (depth, aliases,
tokens, page size) refusing hostile queries; introspection and the IDE off; GraphQL only over
POST with a session and its CSRF token; the exported schema matching the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gwkit import Issuer
from portalkit import World, pg_schema, until
from serverkit import UUID7
from svc.portal.gql import schema_sdl

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "python" / "svc" / "portal" / "schema.graphql"


class Gql:
    """A signed-in person's GraphQL client."""

    def __init__(self, client: httpx.Client) -> None:
        self.http = client

    def raw(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.http.post("/graphql", json={"query": query, "variables": variables or {}})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def ok(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        out = self.raw(query, variables)
        assert not out.get("errors"), out
        data: dict[str, Any] = out["data"]
        return data

    def refused(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        out = self.raw(query, variables)
        assert out.get("errors"), out
        ext: dict[str, Any] = out["errors"][0]["extensions"]
        return ext


@pytest.fixture(scope="module")
def world(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with pg_schema(postgres_url) as url:
        w = World(url, tmp_path_factory.mktemp("portal-graphql"))
        try:
            # dee is deactivated: the bundle's inactive-people-denied forbids everything.
            r = w.context.scim.patch(
                f"/Users/{w.scim_ids['dee']}",
                json={
                    "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
                    "Operations": [{"op": "replace", "value": {"active": False}}],
                },
            )
            assert r.status_code in (200, 204), r.text
            yield w
        finally:
            w.close()


@pytest.fixture(scope="module")
def people(world: World) -> Iterator[dict[str, Gql]]:
    clients = {u: Gql(world.sign_in(u)) for u in ("ana", "bo", "cy", "dee")}
    yield clients
    for c in clients.values():
        c.http.close()


def forbidden(ext: dict[str, Any], area: str, action: str) -> None:
    assert ext["code"] == "FORBIDDEN", ext
    assert UUID7.match(ext["decision_qid"]), ext
    assert ext["verdict"] == "deny" and ext["area"] == area and ext["action"] == action, ext


# Every query: (query, variables, area). ana (security team) and bo (auditors) may view;
# cy (nobody) may not.
QUERIES: list[tuple[str, dict[str, Any], str]] = [
    ("{ people { userName groups } }", {}, "directory"),
    ("{ serviceAccounts { id owner } }", {}, "directory"),
    ("{ trustedApps { name iss } }", {}, "directory"),
    ("{ riskScores { principal { type id } score } }", {}, "directory"),
    ("{ investigations { id status } }", {}, "investigations"),
    (
        'query($r: EntityRefInput!) { whoCan(action: "read", resource: $r, '
        'principalType: "ServiceAccount") { results { id } decisionQid } }',
        {"r": {"type": "Document", "id": "plan"}},
        "policies",
    ),
    (
        'query($p: EntityRefInput!) { reachable(principal: $p, action: "read", '
        'resourceType: "Document") { results { id } } }',
        {"p": {"type": "Human", "id": "ana"}},
        "policies",
    ),
    ("{ containments { principal { id } reason } }", {}, "containments"),
    ("{ challenges(mine: false) { qid } }", {}, "challenges"),
    ('{ securityKeys(person: "bo") { credentialId } }', {}, "keys"),
    ("{ bundles { version state } }", {}, "policies"),
    ("{ bundle { version } }", {}, "policies"),
    ("{ enforcement { mode containmentMode } }", {}, "enforcement"),
    ("{ enforcementChanges { id } }", {}, "enforcement"),
    ("{ outageFallbacks { tool tier } }", {}, "enforcement"),
]


@pytest.mark.parametrize(
    ("query", "variables", "area"), QUERIES, ids=[q[2] + ":" + q[0][:30] for q in QUERIES]
)
def test_each_query_is_allowed_for_viewers_and_refused_by_policy(
    people: dict[str, Gql], query: str, variables: dict[str, Any], area: str
) -> None:
    people["ana"].ok(query, variables)
    people["bo"].ok(query, variables)
    forbidden(people["cy"].refused(query, variables), area, "view")
    forbidden(people["dee"].refused(query, variables), area, "view")


def test_a_person_sees_their_own_challenges_and_keys(people: dict[str, Gql]) -> None:
    for user in ("cy", "bo"):
        assert people[user].ok("{ challenges { qid } securityKeys { credentialId } }") == {
            "challenges": [],
            "securityKeys": [],
        }
    forbidden(people["dee"].refused("{ challenges { qid } }"), "challenges", "view")
    forbidden(people["cy"].refused('{ securityKeys(person: "ana") { name } }'), "keys", "view")


def test_contain_and_lift_through_graphql_reach_the_decision_point(
    world: World, people: dict[str, Gql]
) -> None:
    cy = {"type": "Human", "id": "cy"}
    contain = (
        "mutation($p: EntityRefInput!) { contain(principal: $p, reason: $r) "
        "{ changed containment { author reason principal { id } } } }"
    ).replace("$r)", '"suspicious downloads")')
    forbidden(people["bo"].refused(contain, {"p": cy}), "containments", "administer")
    forbidden(people["cy"].refused(contain, {"p": cy}), "containments", "administer")
    out = people["ana"].ok(contain, {"p": cy})["contain"]
    assert out["changed"] is True and out["containment"]["author"] == "ana"
    until(
        "contained at the decision point",
        lambda: (
            "svc:contained" in world.check(cy, "read", {"type": "Document", "id": "x"})["policies"]
        ),
    )
    # cy, contained, is denied the portal too: svc:contained before any policy.
    ext = people["cy"].refused("{ challenges { qid } }")
    forbidden(ext, "challenges", "view")
    assert ext["policies"] == ["svc:contained"]
    listed = people["bo"].ok("{ containments { principal { id } author } }")["containments"]
    assert {"principal": {"id": "cy"}, "author": "ana"} in listed
    lift = 'mutation($p: EntityRefInput!) { lift(principal: $p, reason: "cleared") }'
    forbidden(people["bo"].refused(lift, {"p": cy}), "containments", "administer")
    assert people["ana"].ok(lift, {"p": cy}) == {"lift": True}
    until(
        "lifted at the decision point",
        lambda: (
            "svc:contained"
            not in world.check(cy, "read", {"type": "Document", "id": "x"})["policies"]
        ),
    )
    assert people["ana"].ok(lift, {"p": cy}) == {"lift": False}


def test_an_approval_decided_through_graphql_passes_the_agents_challenge(
    world: World, people: dict[str, Gql]
) -> None:
    r = world.context.http.post(
        "/v1/service-accounts",
        json={"service_accounts": [{"id": "copilot.writer", "owner": "ana", "ai": True}]},
    )
    assert r.status_code == 200, r.text
    agent = {"type": "ServiceAccount", "id": "copilot.writer"}
    doc = {"type": "Document", "id": "roadmap"}
    first = until(
        "registered and challenged",
        lambda: (
            (d := world.check(agent, "write", doc))["verdict"] == "challenge"
            and d.get("challenge_qid")
            and d
        ),
    )
    qid = first["challenge_qid"]
    mine = people["ana"].ok("{ challenges { qid state approver kinds decisionQid } }")
    assert {
        "qid": qid,
        "state": "PENDING",
        "approver": "ana",
        "kinds": ["approval"],
        "decisionQid": first["qid"],
    } in mine["challenges"]
    assert qid not in [c["qid"] for c in people["cy"].ok("{ challenges { qid } }")["challenges"]]
    decide = 'mutation($q: String!) { decideChallenge(qid: $q, approve: true, reason: "ok") { state decidedBy } }'
    # cy may answer their own challenges, but this one is not theirs: the challenge service says no.
    ext = people["cy"].refused(decide, {"q": qid})
    assert ext["code"] == "PERMISSION_DENIED" and ext["status"] == 403, ext
    forbidden(people["dee"].refused(decide, {"q": qid}), "challenges", "administer")
    # The agent waits for its challenge at the decision point while ana decides.
    waited: dict[str, Any] = {}

    def wait() -> None:
        r = world.pdp_http.post(
            "/v1/access/challenge",
            json={"challenge_qid": qid, "principal": agent, "wait_secs": 25},
            timeout=60,
        )
        waited.update(r.json())

    import threading

    waiter = threading.Thread(target=wait)
    waiter.start()
    out = people["ana"].ok(decide, {"q": qid})["decideChallenge"]
    assert out == {"state": "PASSED", "decidedBy": "ana"}
    waiter.join(60)
    assert waited.get("outcome") == "passed" and waited.get("retry") is True, waited
    after = world.check(agent, "write", doc)
    assert after["verdict"] == "allow" and "svc:challenge_passed" in after["policies"]


def test_directory_mutations_and_a_new_apps_token(world: World, people: dict[str, Gql]) -> None:
    newapp = Issuer("https://newapp.example.com", "ES256")
    url = world.jwks.publish("newapp", newapp)
    trust = (
        "mutation($a: TrustedAppInput!) { trustApp(app: $a) { name iss jwksUrl aud createdAt } }"
    )
    app = {"name": "newapp", "iss": newapp.iss, "jwksUrl": url, "aud": "svc-portal"}
    forbidden(people["bo"].refused(trust, {"a": app}), "directory", "administer")
    forbidden(people["cy"].refused(trust, {"a": app}), "directory", "administer")
    out = people["ana"].ok(trust, {"a": app})["trustApp"]
    assert out["name"] == "newapp" and out["createdAt"]
    bad = people["ana"].refused(trust, {"a": {**app, "jwksUrl": "http://plain.example.com/k"}})
    assert bad["status"] == 400 and any(e["field"] == "jwks_url" for e in bad["errors"]), bad
    token = newapp.mint("newapp", "svc-portal")
    r = until(
        "a newly trusted app's token taken",
        lambda: (
            (
                r := world.http.put(
                    "/api/v1/agents/newapp.bot",
                    json={"owner": "bo", "ai": True},
                    headers={"authorization": f"Bearer {token}"},
                )
            ).status_code
            == 201
            and r
        ),
    )
    assert r.json()["app"] == "newapp"
    sas = people["bo"].ok('{ serviceAccounts(app: "newapp") { id owner } }')["serviceAccounts"]
    assert sas == [{"id": "newapp.bot", "owner": "bo"}]
    untrust = 'mutation { untrustApp(name: "newapp") }'
    forbidden(people["bo"].refused(untrust), "directory", "administer")
    assert people["ana"].ok(untrust) == {"untrustApp": True}
    assert people["ana"].ok(untrust) == {"untrustApp": False}


def test_risk_scores_and_investigations(world: World, people: dict[str, Gql]) -> None:
    r = world.context.http.post(
        "/v1/risk",
        json={
            "scores": [
                {"principal": {"type": "Human", "id": "cy"}, "score": 87, "reason": "exports"}
            ]
        },
    )
    assert r.status_code == 200, r.text
    q = "{ riskScores(minScore: 50) { principal { type id } score reason factors updatedAt } }"
    scores = people["bo"].ok(q)["riskScores"]
    assert scores[0]["principal"] == {"type": "Human", "id": "cy"} and scores[0]["score"] == 87
    assert scores[0]["reason"] == "exports" and scores[0]["updatedAt"]
    assert isinstance(scores[0]["factors"], list)
    assert people["bo"].ok("{ riskScores(minScore: 90) { score } }") == {"riskScores": []}
    r = world.context.http.post(
        "/v1/investigations",
        json={
            "principal": {"type": "Human", "id": "cy"},
            "reason": "bulk export",
            "opened_by": "reasoner",
        },
    )
    assert r.status_code == 201, r.text
    inv = r.json()["id"]
    close = 'mutation($i: String!) { closeInvestigation(id: $i, resolution: "benign") { status closedBy resolution } }'
    forbidden(people["bo"].refused(close, {"i": inv}), "investigations", "administer")
    out = people["ana"].ok(close, {"i": inv})["closeInvestigation"]
    assert out == {"status": "closed", "closedBy": "ana", "resolution": "benign"}
    again = people["ana"].refused(close, {"i": inv})
    assert again["status"] == 409, again
    listed = people["bo"].ok('{ investigations(status: "closed") { id } }')["investigations"]
    assert {"id": inv} in listed


def test_who_can_answers_from_the_decision_point(people: dict[str, Gql]) -> None:
    q = (
        'query($r: EntityRefInput!) { whoCan(action: "administer", resource: $r) '
        "{ results { type id } decisionQid } }"
    )
    out = people["bo"].ok(q, {"r": {"type": "PortalArea", "id": "directory"}})["whoCan"]
    assert out["results"] == [{"type": "Human", "id": "ana"}]
    assert UUID7.match(out["decisionQid"])


def test_policies_drafts_publish_and_modes(people: dict[str, Gql]) -> None:
    from portalkit import POLICIES, SCHEMA

    draft = (
        "mutation($f: [BundleFileInput!]!) { createDraft(files: $f, comment: $c) "
        "{ bundle { version state author policies } problems { field message } } }"
    ).replace("$c)", '"from the portal")')
    bad = [
        {"name": "schema.cedarschema", "content": SCHEMA},
        {
            "name": "policies.cedar",
            "content": "permit (principal, action, resource) when { principal. };\n",
        },
    ]
    forbidden(people["bo"].refused(draft, {"f": bad}), "policies", "administer")
    out = people["ana"].ok(draft, {"f": bad})["createDraft"]
    assert out["bundle"] is None and out["problems"], out
    assert re.fullmatch(r"policies\.cedar:1:\d+", out["problems"][0]["field"]), out
    good = [
        {"name": "schema.cedarschema", "content": SCHEMA},
        {"name": "policies.cedar", "content": POLICIES},
    ]
    made = people["ana"].ok(draft, {"f": good})["createDraft"]
    assert made["problems"] == [] and made["bundle"]["state"] == "DRAFT"
    assert (
        made["bundle"]["author"] == "ana" and "portal-auditors-view" in made["bundle"]["policies"]
    )
    version = made["bundle"]["version"]
    publish = "mutation($v: Int!) { publishBundle(version: $v) { version state } }"
    forbidden(people["bo"].refused(publish, {"v": version}), "policies", "administer")
    assert people["ana"].ok(publish, {"v": version})["publishBundle"] == {
        "version": version,
        "state": "ACTIVE",
    }
    # A second draft, changed in one file, against the active bundle.
    changed = [good[0], {"name": "policies.cedar", "content": POLICIES + "\n// reviewed\n"}]
    v2 = people["ana"].ok(draft, {"f": changed})["createDraft"]["bundle"]["version"]
    dry = 'query($v: Int!) { dryRun(version: $v, since: "2026-01-01T00:00:00Z") { decisions } }'
    forbidden(people["cy"].refused(dry, {"v": v2}), "policies", "view")
    # This policy service has no history store: its DryRun answers UNAVAILABLE.
    assert people["bo"].refused(dry, {"v": v2})["code"] == "SERVICE_UNAVAILABLE"
    diff = "query($v: Int!) { bundleDiff(version: $v) { file change diff } }"
    forbidden(people["cy"].refused(diff, {"v": v2}), "policies", "view")
    (only,) = people["bo"].ok(diff, {"v": v2})["bundleDiff"]
    assert only["file"] == "policies.cedar" and only["change"] == "changed"
    assert "+// reviewed" in only["diff"] and only["diff"].startswith(f"--- active (v{version})")
    assert people["bo"].ok(diff, {"v": version})["bundleDiff"] == []
    missing = people["bo"].refused("{ bundleDiff(version: 99999) { file } }")
    assert missing["code"] == "NOT_FOUND", missing
    active = people["bo"].ok("{ bundle { version files { name } } }")["bundle"]
    assert active["version"] == version
    assert {f["name"] for f in active["files"]} == {"schema.cedarschema", "policies.cedar"}
    mode = 'mutation { setEnforcement(mode: MONITOR, reason: "rollout") { mode containmentMode } }'
    forbidden(people["bo"].refused(mode), "enforcement", "administer")
    assert people["ana"].ok(mode)["setEnforcement"]["mode"] == "MONITOR"
    tier = (
        'mutation { setOutageFallback(tool: "docs/*", tier: CACHED, reason: "drill") '
        "{ tool tier author reason } }"
    )
    forbidden(people["bo"].refused(tier), "enforcement", "administer")
    assert people["ana"].ok(tier)["setOutageFallback"] == {
        "tool": "docs/*",
        "tier": "CACHED",
        "author": "ana",
        "reason": "drill",
    }
    assert people["bo"].ok("{ outageFallbacks { tool tier } }")["outageFallbacks"] == [
        {"tool": "docs/*", "tier": "CACHED"}
    ]
    bad = people["ana"].refused(
        'mutation { setOutageFallback(tool: "", tier: FAIL_OPEN) { tool } }'
    )
    assert bad["code"] == "INVALID_ARGUMENT", bad
    changes = people["bo"].ok("{ enforcementChanges { author toMode containment reason } }")
    assert changes["enforcementChanges"][0] == {
        "author": "ana",
        "toMode": "MONITOR",
        "containment": False,
        "reason": "rollout",
    }


def test_keys_mutations_are_checked(people: dict[str, Gql]) -> None:
    reset = 'mutation { resetSecurityKeys(person: "cy", reason: "lost") }'
    forbidden(people["bo"].refused(reset), "keys", "administer")
    assert people["ana"].ok(reset) == {"resetSecurityKeys": 0}
    remove = 'mutation { removeSecurityKey(credentialId: "nope") }'
    forbidden(people["dee"].refused(remove), "keys", "administer")
    ext = people["cy"].refused(remove)  # allowed by policy (own), unknown to the service
    assert ext["code"] == "NOT_FOUND", ext


def test_hostile_queries_are_refused_by_the_limits(people: dict[str, Gql]) -> None:
    ana = people["ana"]
    cycle = (
        "query { challenges { principal { ...A } } } "
        "fragment A on EntityRef { ...B } fragment B on EntityRef { ...A }"
    )
    out = ana.raw(cycle)
    assert out["errors"] and out.get("data") is None, out
    assert ana.ok(" ".join(f"a{i}: me {{ user }}" for i in range(15)).join("{}"))
    aliases = "{ " + " ".join(f"a{i}: me {{ user }}" for i in range(16)) + " }"
    out = ana.raw(aliases)
    assert out["errors"] and "aliases" in out["errors"][0]["message"].lower(), out
    assert out.get("data") is None
    tokens = "{ " + "me { user } " * 700 + "}"
    out = ana.raw(tokens)
    assert out["errors"] and "token" in out["errors"][0]["message"].lower(), out
    page = ana.raw("{ bundles(first: 100000) { version } }")
    assert page["errors"][0]["extensions"]["code"] == "INVALID_ARGUMENT", page
    intro = ana.raw("{ __schema { types { name } } }")
    assert intro["errors"] and "introspection" in intro["errors"][0]["message"].lower(), intro
    typename = ana.raw('{ __type(name: "Query") { fields { name } } }')
    assert typename["errors"], typename


def test_depth_limit() -> None:
    import asyncio

    from svc.portal.gql import make_schema
    from svc.portal.settings import PortalSettings

    schema = make_schema(PortalSettings(max_query_depth=1))
    deep = asyncio.run(schema.execute("{ bundle { files { name } } }"))
    assert deep.errors and "exceeds maximum operation depth" in deep.errors[0].message
    assert deep.data is None  # refused before any resolver ran
    shallow = asyncio.run(schema.execute("{ me { user } }"))
    assert shallow.errors and "depth" not in shallow.errors[0].message


def test_graphql_takes_post_with_a_session_and_its_csrf_token(
    world: World, people: dict[str, Gql]
) -> None:
    q = {"query": "{ me { user } }"}
    r = httpx.post(f"{world.portal.url}/graphql", json=q)
    assert r.status_code == 401 and r.json()["type"] == "urn:svc:problem:unauthenticated"
    ana = people["ana"].http
    token = ana.headers["x-csrf-token"]
    r = ana.post("/graphql", json=q, headers={"x-csrf-token": ""})
    assert r.status_code == 403 and r.json()["type"] == "urn:svc:problem:csrf-refused"
    r = ana.post("/graphql", json=q, headers={"origin": "https://evil.example.com"})
    assert r.status_code == 403
    r = ana.post(
        "/graphql", json=q, headers={"x-csrf-token": people["bo"].http.headers["x-csrf-token"]}
    )
    assert r.status_code == 403
    r = ana.get("/graphql", params=q)
    assert r.status_code == 405
    r = ana.post("/graphql", json=q, headers={"x-csrf-token": token})
    assert r.json() == {"data": {"me": {"user": "ana"}}}


def test_the_exported_schema_matches_the_code() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_sdl(), (
        "python/svc/portal/schema.graphql is stale: run "
        "`.venv/bin/svc portal schema > python/svc/portal/schema.graphql`"
    )


def test_subscriptions_over_graphql_transport_ws(world: World, people: dict[str, Gql]) -> None:
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from svc.portal.app import create_app
    from svc.portal.sessions import COOKIE

    app = create_app(world.settings, world.service)
    origin = world.settings.public_url
    with TestClient(app, base_url=origin) as client:
        _, ana_cookie = app.state.sessions.create("ana")
        _, cy_cookie = app.state.sessions.create("cy")

        def connect(cookie: str, origin_header: str = origin) -> Any:
            client.cookies.clear()
            client.cookies.set(COOKIE, cookie)
            return client.websocket_connect(
                "/graphql", subprotocols=["graphql-transport-ws"], headers={"origin": origin_header}
            )

        with pytest.raises(WebSocketDisconnect):  # another origin: refused before accept
            with connect(ana_cookie, "https://evil.example.com") as ws:
                ws.receive_json()
        with pytest.raises(WebSocketDisconnect):  # no session
            with connect("not-a-session") as ws:
                ws.receive_json()
        sub = "subscription { containmentChanges { contained containment { principal { id } author } } }"
        with connect(cy_cookie) as ws:
            ws.send_json({"type": "connection_init"})
            assert ws.receive_json()["type"] == "connection_ack"
            ws.send_json({"id": "1", "type": "subscribe", "payload": {"query": sub}})
            msg = ws.receive_json()
            assert msg["type"] == "error" or msg["payload"].get("errors"), msg
            errors = msg["payload"] if msg["type"] == "error" else msg["payload"]["errors"]
            forbidden(errors[0]["extensions"], "containments", "view")
        with connect(ana_cookie) as ws:
            ws.send_json({"type": "connection_init"})
            assert ws.receive_json()["type"] == "connection_ack"
            ws.send_json({"id": "1", "type": "subscribe", "payload": {"query": sub}})
            ws.send_json(
                {
                    "id": "2",
                    "type": "subscribe",
                    "payload": {"query": "subscription { myChallenges { qid state } }"},
                }
            )
            target = {"type": "Human", "id": "dee"}
            people["ana"].ok(
                'mutation($p: EntityRefInput!) { contain(principal: $p, reason: "watch") { changed } }',
                {"p": target},
            )
            seen = []
            while True:
                msg = ws.receive_json()
                assert msg["type"] == "next", msg
                if msg["id"] != "1":
                    continue
                event = msg["payload"]["data"]["containmentChanges"]
                seen.append(event)
                if event["containment"]["principal"]["id"] == "dee":
                    break
            assert seen[-1] == {
                "contained": True,
                "containment": {"principal": {"id": "dee"}, "author": "ana"},
            }
            people["ana"].ok(
                'mutation($p: EntityRefInput!) { lift(principal: $p, reason: "done") }',
                {"p": target},
            )
            while True:
                msg = ws.receive_json()
                if msg["id"] == "1":
                    break
            assert msg["payload"]["data"]["containmentChanges"]["contained"] is False
            ws.send_json({"id": "1", "type": "complete"})
            ws.send_json({"id": "2", "type": "complete"})
