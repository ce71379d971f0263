"""The decision point's listener (crates/pdp_server) over real sockets on 127.0.0.1.

* the golden corpus of the decision core through every transport: HTTP, gRPC, AuthZEN single
  and batch (each `evaluations_semantic`), all agreeing with `Engine.evaluate`;
* AuthZEN specifics: properties, semantics, per-item errors, discovery, monitor mode;
* plans over HTTP and gRPC agreeing with `Engine.plan`, and paging;
* errors: each a precise 4xx problem (never a 5xx), and gRPC statuses with the same text;
* health, readiness, version, metrics, gRPC health and reflection;
* a bundle swapped back and forth under load fails no request.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from golden import BUNDLES, all_cases, engine_for, expected_response, without_qid
from serverkit import (
    UUID7,
    Served,
    Unmappable,
    assert_problem,
    authzen_field,
    authzen_got,
    authzen_request,
    authzen_view,
    bad_request_fields,
    check_json,
    check_request,
    metric,
    plan_json,
    plan_request,
    serve,
    wait_until,
)
from svc._pdp_core import DecisionLog
from svc.authz.v1 import authz_pb2
from svc.pdp import Engine, RequestError

CASES = all_cases()
IDS = [c[0] for c in CASES]
CORP = BUNDLES / "corp"
EVAL = "/v1/access/evaluation"
PLAN = "/v1/access/plan"
CHALLENGE = "/v1/access/challenge"
AZ = "/access/v1/evaluation"
AZS = "/access/v1/evaluations"
SEMANTICS = ["execute_all", "deny_on_first_deny", "permit_on_first_permit"]


def ref(t: str, i: str) -> dict[str, str]:
    return {"type": t, "id": i}


def req(p: str, action: str, r: str, rtype: str = "Document", **extra: Any) -> dict[str, Any]:
    return {"principal": ref("Human", p), "action": action, "resource": ref(rtype, r), **extra}


def az(p: str, action: str, r: str, rtype: str = "Document", **extra: Any) -> dict[str, Any]:
    return {
        "subject": ref("Human", p),
        "action": {"name": action},
        "resource": ref(rtype, r),
        **extra,
    }


@pytest.fixture(scope="module")
def golden_server() -> Iterator[Any]:
    """One server per golden file (its engine built as golden.py does), started on first use."""
    servers: dict[int, Served] = {}

    def get(doc: dict[str, Any]) -> Served:
        if id(doc) not in servers:
            servers[id(doc)] = Served(engine_for(doc))
        return servers[id(doc)]

    yield get
    for s in servers.values():
        s.close()


@pytest.fixture
def corp() -> Iterator[Served]:
    with serve(Engine.from_bundle_dir(CORP)) as s:
        yield s


def _mappable(mapper: Any, request: Any) -> bool:
    try:
        mapper(request)
    except Unmappable:
        return False
    return True


GRPC_CASES = [c for c in CASES if _mappable(check_request, c[2]["request"])]
AZ_CASES = [c for c in CASES if _mappable(authzen_request, c[2]["request"])]


def test_only_cases_without_an_equivalent_are_left_out() -> None:
    """Pins the exact set of golden cases a transport cannot express, so a mapping bug cannot
    silently shrink coverage. gRPC: inline `entities` are HTTP only (no proto field;
    docs/decisions.md#inline-entities);
    the proto is typed, so a wrong JSON type, an unknown field, a non-object request or an absent
    (rather than empty) id cannot be sent. AuthZEN: it has no `on_behalf_of`, `human_present` or
    `work_item_id`; `properties` carry attributes but never parents."""
    no_grpc = {c[0] for c in CASES} - {c[0] for c in GRPC_CASES}
    assert no_grpc == {
        "mode_and_inline: inline resource entity is used",
        "mode_and_inline: inline entity may write references as typed objects under the schema",
        "mode_and_inline: inline copy of a stored principal cannot change its groups",
        "mode_and_inline: an inline principal the directory does not hold is ignored: no attributes, no groups",
        "mode_and_inline: an inline copy of a stored resource cannot change its attributes",
        "mode_and_inline: an inline service account is ignored: it is not registered",
        "request_errors: missing principal id",
        "request_errors: unknown request field",
        "request_errors: human_present not a boolean",
        "request_errors: context not an object",
        "request_errors: inline entity breaking the schema",
        "request_errors: inline entity of an undeclared type",
        "request_errors: duplicate inline entities",
        "request_errors: request that is not an object",
        "request_errors: work_item_id not a string",
    }
    no_az = {c[0] for c in CASES} - {c[0] for c in AZ_CASES}
    assert all(
        n.startswith("agents:")
        or n
        in {
            "mode_and_inline: inline copy of a stored principal cannot change its groups",
            "mode_and_inline: an inline principal the directory does not hold is ignored: no attributes, no groups",
            "mode_and_inline: an inline service account is ignored: it is not registered",
            "request_errors: on_behalf_of with a Human principal",
            "request_errors: on_behalf_of naming a service account",
            "request_errors: human_present not a boolean",
            "request_errors: inline entity of an undeclared type",
            "request_errors: duplicate inline entities",
            "request_errors: work_item_id not a string",
            "verdicts: verification with nobody present is denied",
            "verdicts: approval does not need the person present",
            "verdicts: human_present=true keeps verification",
        }
        for n in no_az
    ), no_az
    assert len(GRPC_CASES) >= 55 and len(AZ_CASES) >= 40


# -------------------------------------------------------------------------------------------
# 1. The golden corpus over every transport


@pytest.mark.parametrize(("cid", "doc", "case"), CASES, ids=IDS)
def test_golden_over_http(golden_server: Any, cid: str, doc: Any, case: dict[str, Any]) -> None:
    s = golden_server(doc)
    r = s.post(EVAL, case["request"], headers={"X-Request-ID": cid.encode().hex()[:60]})
    assert r.headers["x-request-id"] == cid.encode().hex()[:60]
    if "error" in case:
        body = assert_problem(r, 400, field=case["error"]["field"])
        assert body["type"] == "urn:svc:problem:invalid-request"
        assert case["error"]["contains"] in body["detail"]
        with pytest.raises(RequestError) as info:
            s.engine.evaluate(case["request"])
        assert body["detail"] == str(info.value)
        return
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    got = r.json()
    assert UUID7.match(got["qid"])
    want = s.engine.evaluate(case["request"])
    assert without_qid(got) == without_qid(want) == expected_response(case)
    assert got["qid"] != want["qid"]
    assert "challenge_qid" not in got  # standalone: no svc-challenge, no challenge_qid


@pytest.mark.parametrize(("cid", "doc", "case"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_golden_over_grpc(golden_server: Any, cid: str, doc: Any, case: dict[str, Any]) -> None:
    s = golden_server(doc)
    message = check_request(case["request"])
    if "error" in case:
        with pytest.raises(grpc.RpcError) as info:
            s.stub.Check(message, timeout=10)
        err = info.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        problem = assert_problem(s.post(EVAL, case["request"]), 400, case["error"]["field"])
        assert err.details() == problem["detail"]
        assert bad_request_fields(err) == [case["error"]["field"]]
        return
    resp = s.stub.Check(message, timeout=10)
    got = check_json(resp)
    assert UUID7.match(got["qid"])
    assert resp.challenge_qid == ""
    want = s.engine.evaluate(case["request"])
    assert without_qid(got) == without_qid(want) == expected_response(case)


@pytest.mark.parametrize(("cid", "doc", "case"), AZ_CASES, ids=[c[0] for c in AZ_CASES])
def test_golden_over_authzen(golden_server: Any, cid: str, doc: Any, case: dict[str, Any]) -> None:
    s = golden_server(doc)
    body, order = authzen_request(case["request"])
    r = s.post(AZ, body)
    if "error" in case:
        problem = assert_problem(r, 400, authzen_field(case["error"]["field"], order))
        assert case["error"]["contains"] in problem["detail"]
        return
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == {"decision", "context"}
    assert UUID7.match(got["context"]["qid"])
    assert authzen_got(got) == authzen_view(s.engine.evaluate(case["request"]))


def _batch_items(doc: dict[str, Any]) -> list[tuple[dict[str, Any], Any, list[str]]]:
    out = []
    for _, d, case in AZ_CASES:
        # A non-object item is not an evaluation at all: the batch is refused (tested below).
        if d is doc and isinstance(case["request"], dict):
            body, order = authzen_request(case["request"])
            out.append((case, body, order))
    return out


# Every case of agents.json names on_behalf_of or work_item_id, which AuthZEN cannot express.
GOLDEN_DOCS = [d for d in {id(c[1]): c[1] for c in CASES}.values() if _batch_items(d)]


@pytest.mark.parametrize("semantic", SEMANTICS)
@pytest.mark.parametrize("doc", GOLDEN_DOCS, ids=[d["description"][:40] for d in GOLDEN_DOCS])
def test_golden_over_authzen_batch(golden_server: Any, doc: Any, semantic: str) -> None:
    s = golden_server(doc)
    items = _batch_items(doc)
    r = s.post(
        AZS,
        {"evaluations": [b for _, b, _ in items], "options": {"evaluations_semantic": semantic}},
    )
    assert r.status_code == 200, r.text
    got = r.json()["evaluations"]
    want: list[Any] = []
    for case, _, order in items:
        if "error" in case:
            want.append(("error", authzen_field(case["error"]["field"], order)))
            decision = False
        else:
            view = authzen_view(s.engine.evaluate(case["request"]))
            want.append(view)
            decision = view["decision"]
        if (semantic == "deny_on_first_deny" and not decision) or (
            semantic == "permit_on_first_permit" and decision
        ):
            break
    assert len(got) == len(want)
    for g, w, (case, _, _) in zip(got, want, items, strict=False):
        if isinstance(w, tuple):
            assert g["decision"] is False
            err = g["context"]["error"]
            assert err["status"] == 400 and err["field"] == w[1], (case["name"], g)
            assert case["error"]["contains"] in err["message"]
        else:
            assert authzen_got(g) == w, case["name"]
            assert UUID7.match(g["context"]["qid"])


def test_authzen_batch_refuses_a_non_object_item(corp: Served) -> None:
    r = corp.post(AZS, {"evaluations": [az("alice", "view", "design"), [1, 2]]})
    assert_problem(r, 400, "evaluations[1]")


@pytest.mark.parametrize("field", ["subject", "action", "resource", "context"])
def test_authzen_batch_refuses_a_default_that_is_not_an_object(corp: Served, field: str) -> None:
    """A top-level default of the wrong type is the request's fault: one 400 naming it, not an
    error in every item that would have taken it (AuthZEN 1.0 section 7.1)."""
    r = corp.post(AZS, {field: "alice", "evaluations": [az("alice", "view", "design")]})
    assert_problem(r, 400, field)


# -------------------------------------------------------------------------------------------
# 2. AuthZEN specifics

FOLDERS_SCHEMA = """
entity Folder;
entity Doc in [Folder] = { level: Long };
entity User = { clearance?: Long };
action view appliesTo { principal: [User], resource: [Doc] };
"""
FOLDERS_POLICIES = """
@id("shared-low-level")
permit (principal, action == Action::"view", resource in Folder::"shared")
when { resource.level <= 2 };
@id("cleared")
permit (principal, action == Action::"view", resource)
when { principal has clearance && principal.clearance >= 9 };
"""
FOLDERS_ENTITIES = [
    {"uid": ref("Folder", "shared"), "attrs": {}, "parents": []},
    {"uid": ref("Doc", "d1"), "attrs": {"level": 5}, "parents": [ref("Folder", "shared")]},
    {"uid": ref("Doc", "d2"), "attrs": {"level": 1}, "parents": []},
    {"uid": ref("User", "u"), "attrs": {}, "parents": []},
]


@pytest.fixture
def folders() -> Iterator[Served]:
    engine = Engine(policies=FOLDERS_POLICIES, schema=FOLDERS_SCHEMA, entities=FOLDERS_ENTITIES)
    with serve(engine) as s:
        yield s


def _az_doc(s: Served, subject: dict[str, Any], doc: str, props: Any = None) -> dict[str, Any]:
    resource: dict[str, Any] = ref("Doc", doc)
    if props is not None:
        resource["properties"] = props
    r = s.post(AZ, {"subject": subject, "action": {"name": "view"}, "resource": resource})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_authzen_resource_properties_never_override_a_stored_entity(folders: Served) -> None:
    """Properties describe what the store does not hold (docs/api.md, "AuthZEN"): for a
    stored resource they are ignored, over AuthZEN as inline on /v1/access/evaluation."""
    u = ref("User", "u")
    assert _az_doc(folders, u, "d1")["decision"] is False  # level 5
    assert _az_doc(folders, u, "d1", {"level": 1})["decision"] is False  # still level 5
    inline = folders.engine.evaluate(
        {
            "principal": u,
            "action": "view",
            "resource": ref("Doc", "d1"),
            "entities": [{"uid": ref("Doc", "d1"), "attrs": {"level": 1}, "parents": []}],
        }
    )
    assert inline["verdict"] == "deny"
    # A resource the store does not hold is created with just its properties (no parents).
    assert _az_doc(folders, u, "new", {"level": 1})["decision"] is False
    # Properties breaking the schema name the AuthZEN field.
    r = folders.post(
        AZ,
        {
            "subject": u,
            "action": {"name": "view"},
            "resource": {**ref("Doc", "new"), "properties": {"level": "high"}},
        },
    )
    assert assert_problem(r, 400)["field"].startswith("resource.properties")
    r = folders.post(
        AZ,
        {
            "subject": u,
            "action": {"name": "view"},
            "resource": {**ref("Doc", "d1"), "properties": 3},
        },
    )
    assert_problem(r, 400, "resource.properties")


def test_authzen_subject_properties_only_for_subjects_the_store_lacks(folders: Served) -> None:
    # The directory is authoritative: a stored subject cannot grant itself a clearance.
    stored = {**ref("User", "u"), "properties": {"clearance": 10}}
    assert _az_doc(folders, stored, "d2")["decision"] is False
    unknown = {**ref("User", "visitor"), "properties": {"clearance": 10}}
    got = _az_doc(folders, unknown, "d2")
    assert got["decision"] is True and got["context"]["policies"] == ["cleared"]


def test_authzen_properties_on_corp_resource(corp: Served) -> None:
    # bob (sales) may not view engineering's design document, whatever properties say of it.
    base = az("bob", "view", "design")
    assert corp.post(AZ, base).json()["decision"] is False
    base["resource"]["properties"] = {"department": "sales"}
    assert corp.post(AZ, base).json()["decision"] is False
    # A document the store does not hold is described by its properties.
    new = az("bob", "view", "brief")
    new["resource"]["properties"] = {
        "owner": {"type": "Human", "id": "carol"},
        "department": "sales",
        "sensitivity": "internal",
        "tags": [],
    }
    got = corp.post(AZ, new).json()
    assert got.get("decision") is True, got
    assert got["context"]["policies"] == ["view-own-department"]


def _decisions(s: Served, items: list[dict[str, Any]], semantic: str | None) -> list[Any]:
    body: dict[str, Any] = {"evaluations": items}
    if semantic is not None:
        body["options"] = {"evaluations_semantic": semantic}
    r = s.post(AZS, body)
    assert r.status_code == 200, r.text
    return [e["decision"] for e in r.json()["evaluations"]]


ALLOW = az("alice", "view", "design")
DENY = az("bob", "edit", "design")


def test_authzen_evaluations_semantics(corp: Served) -> None:
    mixed = [DENY, ALLOW, DENY, ALLOW]
    assert _decisions(corp, mixed, None) == [False, True, False, True]
    assert _decisions(corp, mixed, "execute_all") == [False, True, False, True]
    assert _decisions(corp, mixed, "deny_on_first_deny") == [False]
    assert _decisions(corp, [ALLOW, ALLOW, DENY, ALLOW], "deny_on_first_deny") == [
        True,
        True,
        False,
    ]
    assert _decisions(corp, [ALLOW, ALLOW], "deny_on_first_deny") == [True, True]
    assert _decisions(corp, mixed, "permit_on_first_permit") == [False, True]
    assert _decisions(corp, [DENY, DENY, DENY], "permit_on_first_permit") == [False] * 3
    assert _decisions(corp, [ALLOW, DENY], "permit_on_first_permit") == [True]
    r = corp.post(AZS, {"evaluations": mixed, "options": {"evaluations_semantic": "first"}})
    assert_problem(r, 400, "options.evaluations_semantic")
    assert_problem(corp.post(AZS, {"evaluations": mixed, "options": [1]}), 400, "options")
    assert_problem(corp.post(AZS, {"evaluations": {"a": 1}}), 400, "evaluations")


def test_authzen_evaluations_take_top_level_defaults(corp: Served) -> None:
    body = {
        "subject": ref("Human", "alice"),
        "action": {"name": "view"},
        "evaluations": [
            {"resource": ref("Document", "design")},
            {"resource": ref("Document", "roadmap")},
            {"resource": ref("Document", "design"), "subject": ref("Human", "bob")},
            {"resource": ref("Document", "design"), "action": {"name": "delete"}},
        ],
    }
    got = corp.post(AZS, body).json()["evaluations"]
    assert [g["context"]["verdict"] for g in got] == ["allow", "deny", "deny", "challenge"]
    assert got[3]["decision"] is False and got[3]["context"]["challenges"] == ["verification"]


def test_authzen_item_errors_do_not_fail_the_batch(corp: Served) -> None:
    bad_type = az("alice", "view", "design")
    bad_type["resource"]["type"] = "Planet"
    typo = {**az("carol", "view", "design"), "contxt": {"risk_score": 99}}
    items = [
        ALLOW,
        bad_type,
        {"subject": 5},
        typo,
        az("alice", "view", "design", context=[1]),
        ALLOW,
    ]
    r = corp.post(AZS, {"evaluations": items})
    assert r.status_code == 200
    got = r.json()["evaluations"]
    assert [g["decision"] for g in got] == [True, False, False, False, False, True]
    errors = [g["context"].get("error") for g in got]
    assert errors[0] is None and errors[5] is None
    assert [e["field"] for e in errors[1:5]] == ["resource.type", "subject", "contxt", "context"]
    assert all(e["status"] == 400 and e["message"] for e in errors[1:5])
    # An erroneous item is a deny for the short-circuit semantics.
    assert _decisions(corp, [ALLOW, bad_type, ALLOW], "deny_on_first_deny") == [True, False]
    assert _decisions(corp, [bad_type, ALLOW, ALLOW], "permit_on_first_permit") == [False, True]


def test_authzen_single_refuses_unknown_members(corp: Served) -> None:
    r = corp.post(AZ, {**az("carol", "view", "design"), "contxt": {"risk_score": 99}})
    assert_problem(r, 400, "contxt")


def test_authzen_evaluations_without_items_is_one_evaluation(corp: Served) -> None:
    for body in [ALLOW, {**ALLOW, "evaluations": []}, {**ALLOW, "evaluations": None}]:
        r = corp.post(AZS, body)
        assert r.status_code == 200
        got = r.json()
        assert set(got) == {"decision", "context"} and got["decision"] is True
    assert_problem(corp.post(AZS, {"evaluations": []}), 400, "subject")


def test_authzen_well_known_configuration(corp: Served) -> None:
    r = corp.http.get("/.well-known/authzen-configuration")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    base = corp.url
    assert r.json() == {
        "policy_decision_point": base,
        "access_evaluation_endpoint": f"{base}{AZ}",
        "access_evaluations_endpoint": f"{base}{AZS}",
        "search_subject_endpoint": f"{base}/access/v1/search/subject",
        "search_resource_endpoint": f"{base}/access/v1/search/resource",
        "search_action_endpoint": f"{base}/access/v1/search/action",
    }
    # The published endpoints are the ones served.
    assert httpx.post(r.json()["access_evaluation_endpoint"], json=ALLOW).json()["decision"]
    with serve(Engine.from_bundle_dir(CORP), public_url="https://pdp.example.com/") as s:
        got = s.http.get("/.well-known/authzen-configuration").json()
        assert got["policy_decision_point"] == "https://pdp.example.com"
        assert got["access_evaluations_endpoint"] == "https://pdp.example.com/access/v1/evaluations"


def test_authzen_monitor_mode_allows_with_the_real_verdict(corp: Served) -> None:
    corp.engine.set_mode("monitor")
    got = corp.post(AZ, DENY).json()
    assert got["decision"] is True
    assert got["context"]["verdict"] == "deny" and got["context"]["mode"] == "monitor"
    challenged = corp.post(AZ, az("alice", "delete", "design")).json()
    assert challenged["decision"] is True
    assert challenged["context"]["verdict"] == "challenge"
    assert challenged["context"]["challenges"] == ["verification"]
    batch = corp.post(
        AZS,
        {
            "evaluations": [DENY, DENY],
            "options": {"evaluations_semantic": "permit_on_first_permit"},
        },
    ).json()["evaluations"]
    assert [(e["decision"], e["context"]["verdict"]) for e in batch] == [(True, "deny")]
    corp.engine.set_mode("enforce")
    assert corp.post(AZ, DENY).json()["decision"] is False


# -------------------------------------------------------------------------------------------
# 3. Plans over HTTP and gRPC

PLAN_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "document_cloud",
        {
            "principal": 'User::"alice"',
            "action": "ViewDocument",
            "context": {"is_authenticated": True},
            "resource_type": "Document",
        },
    ),
    (
        "document_cloud",
        {
            "principal": 'Public::"unauthenticated"',
            "action": "ViewDocument",
            "context": {"is_authenticated": False},
            "resource_type": "Document",
        },
    ),
    (
        "document_cloud",
        {
            "principal": 'User::"bob"',
            "action": "ModifyDocument",
            "context": {"is_authenticated": True},
            "resource_type": "Document",
        },
    ),
    ("tinytodo", {"principal": 'User::"aaron"', "action": "GetList", "resource_type": "List"}),
    ("tinytodo", {"principal": 'User::"kesha"', "action": "UpdateList", "resource_type": "List"}),
    ("corp", {"principal": ref("Human", "alice"), "action": "view", "resource_type": "Document"}),
    ("corp", {"principal": ref("Human", "bob"), "action": "share", "resource_type": "Document"}),
    ("corp", {"principal": ref("Human", "alice"), "action": "delete", "resource_type": "Document"}),
    (
        "corp",
        {
            "principal": ref("Human", "carol"),
            "action": "view",
            "resource_type": "Document",
            "context": {"risk_score": 90},
        },
    ),
    ("corp", {"principal": ref("Human", "ivan"), "action": "write", "resource_type": "Ticket"}),
    ("corp", {"principal": ref("Human", "ivan"), "action": "read", "resource_type": "Ticket"}),
]


@pytest.fixture(scope="module")
def app_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    servers: dict[str, Served] = {}

    def get(app: str) -> Served:
        if app not in servers:
            if app == "corp":
                path = CORP
            else:
                path = request.getfixturevalue("cedar_examples") / app
            servers[app] = Served(Engine.from_bundle_dir(path))
        return servers[app]

    yield get
    for s in servers.values():
        s.close()


@pytest.mark.parametrize(
    ("app", "body"), PLAN_CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(PLAN_CASES)]
)
def test_plan_over_http_and_grpc_agrees_with_engine(app_server: Any, app: str, body: Any) -> None:
    s = app_server(app)
    want = without_qid(s.engine.plan(body))
    r = s.post(PLAN, body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert UUID7.match(got["qid"])
    assert without_qid(got) == want
    resp = s.stub.Plan(plan_request(body), timeout=10)
    grpc_got = plan_json(resp)
    assert UUID7.match(grpc_got["qid"])
    assert without_qid(grpc_got) == want


def test_plan_outcomes_are_all_covered(app_server: Any) -> None:
    outcomes = {app_server(a).engine.plan(b)["outcome"] for a, b in PLAN_CASES}
    assert outcomes == {"always_allowed", "always_denied", "challenge", "conditional"}


def test_plan_paging_over_http_and_grpc(corp: Served) -> None:
    body = {"principal": ref("Human", "alice"), "action": "view", "resource_type": "Document"}
    first = corp.post(PLAN, body).json()
    assert first["pinned"] is False
    again = corp.post(PLAN, {**body, "plan_qid": first["qid"]}).json()
    assert again["pinned"] is True and again["qid"] == first["qid"]
    assert {k: v for k, v in again.items() if k != "pinned"} == {
        k: v for k, v in first.items() if k != "pinned"
    }
    via_grpc = plan_json(corp.stub.Plan(plan_request({**body, "plan_qid": first["qid"]})))
    assert via_grpc["pinned"] is True and via_grpc["qid"] == first["qid"]
    # Another principal with the same plan_qid gets a new plan.
    other = corp.post(PLAN, {**body, "principal": ref("Human", "bob"), "plan_qid": first["qid"]})
    assert other.json()["pinned"] is False and other.json()["qid"] != first["qid"]
    # A new bundle unpins.
    corp.engine.load_bundle_dir(CORP)
    after = corp.post(PLAN, {**body, "plan_qid": first["qid"]}).json()
    assert after["pinned"] is False and after["policy_version"] > first["policy_version"]


def test_plan_errors_over_http_and_grpc(corp: Served) -> None:
    for body, field in [
        (
            {"principal": ref("Human", "alice"), "action": "view", "resource_type": "Planet"},
            "resource_type",
        ),
        (
            {"principal": ref("Human", "alice"), "action": "fly", "resource_type": "Document"},
            "action",
        ),
        (
            {
                "principal": ref("Human", "alice"),
                "action": "view",
                "resource_type": "Document",
                "context": {"risk_score": "high"},
            },
            "context",
        ),
    ]:
        problem = assert_problem(corp.post(PLAN, body), 400, field)
        with pytest.raises(grpc.RpcError) as info:
            corp.stub.Plan(plan_request(body), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == problem["detail"]
        assert bad_request_fields(info.value) == [field]
    resource = {
        "principal": ref("Human", "alice"),
        "action": "view",
        "resource": ref("Document", "design"),
    }
    assert_problem(corp.post(PLAN, resource), 400)


# -------------------------------------------------------------------------------------------
# 4. Errors: a precise 4xx problem each, never a 5xx

POST_ROUTES = [EVAL, PLAN, CHALLENGE, AZ, AZS]


@pytest.mark.parametrize("path", POST_ROUTES)
def test_malformed_json_names_line_and_column(corp: Served, path: str) -> None:
    r = corp.http.post(
        path,
        content=b'{\n  "principal": {"type": "Human",\n  }\n}',
        headers={"content-type": "application/json"},
    )
    body = assert_problem(r, 400)
    assert body["type"] == "urn:svc:problem:malformed-json"
    assert "line 3 column 3" in body["detail"], body
    r = corp.http.post(path, content=b'{"a": tru}')
    assert "line 1 column" in assert_problem(r, 400)["detail"]


@pytest.mark.parametrize("path", POST_ROUTES)
def test_empty_body(corp: Served, path: str) -> None:
    for content in [b"", b"  \n"]:
        r = corp.http.post(path, content=content, headers={"content-type": "application/json"})
        body = assert_problem(r, 400)
        assert body["type"] == "urn:svc:problem:malformed-json" and "empty" in body["detail"]


@pytest.mark.parametrize("path", POST_ROUTES)
def test_non_json_content_type(corp: Served, path: str) -> None:
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/xml",
        "multipart/form-data; boundary=x",
    ]:
        r = corp.http.post(path, content=b'{"a": 1}', headers={"content-type": ct})
        body = assert_problem(r, 415)
        assert body["type"] == "urn:svc:problem:unsupported-media-type"
        assert ct.split(";")[0] in body["detail"]


def test_json_content_types_and_no_content_type_are_accepted(corp: Served) -> None:
    body = b'{"principal": {"type": "Human", "id": "alice"}, "action": "view", "resource": {"type": "Document", "id": "design"}}'
    for headers in [
        {},
        {"content-type": "application/json"},
        {"content-type": "Application/JSON; charset=utf-8"},
        {"content-type": "application/vnd.svc+json"},
    ]:
        r = corp.http.post(EVAL, content=body, headers=headers)
        assert r.status_code == 200, (headers, r.text)
        assert r.json()["verdict"] == "allow"


@pytest.fixture
def small() -> Iterator[Served]:
    with serve(Engine.from_bundle_dir(CORP), max_body_bytes=2048) as s:
        yield s


def _big_request(size: int) -> dict[str, Any]:
    return {**req("alice", "view", "design"), "context": {"pad": "x" * size}}


@pytest.mark.parametrize("path", POST_ROUTES)
def test_oversize_body(small: Served, path: str) -> None:
    r = small.post(path, _big_request(5000), headers={"X-Request-ID": "big-1"})
    body = assert_problem(r, 413)
    assert body["type"] == "urn:svc:problem:payload-too-large" and "2048" in body["detail"]
    assert r.headers["x-request-id"] == "big-1"

    def chunks() -> Iterator[bytes]:
        yield b'{"principal": {"type": "Human", "id": "alice"}, "pad": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    r = small.http.post(path, content=chunks(), headers={"content-type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert_problem(r, 413)
    # Just under the limit is read (and then judged on its content).
    r = small.post(EVAL, _big_request(1800))
    assert_problem(r, 400, "context")


def test_oversize_grpc_message(small: Served) -> None:
    message = check_request(_big_request(5000))
    with pytest.raises(grpc.RpcError) as info:
        small.stub.Check(message, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The connection still serves.
    assert (
        check_json(small.stub.Check(check_request(req("alice", "view", "design"))))["verdict"]
        == "allow"
    )


def test_long_error_texts_are_cut_alike_on_both_transports(corp: Served) -> None:
    """An error quoting a huge request value stays readable on gRPC, whose text travels in
    headers that clients cap (8 KiB in grpc-java, 16 KiB in grpc-core)."""
    for body, field in [
        (
            {"principal": ref("Human", "alice"), "action": "view", "resource_type": "T" * 20_000},
            "resource_type",
        ),
        (
            {**req("alice", "view", "design"), "context": {"risk_score": "é" * 20_000}},
            "context",
        ),
    ]:
        path = PLAN if "resource_type" in body else EVAL
        problem = assert_problem(corp.post(path, body), 400, field)
        assert len(problem["detail"].encode()) < 1200 and "bytes in all)" in problem["detail"]
        call = corp.stub.Plan if path == PLAN else corp.stub.Check
        message = plan_request(body) if path == PLAN else check_request(body)
        with pytest.raises(grpc.RpcError) as info:
            call(message, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert info.value.details() == problem["detail"]
        assert bad_request_fields(info.value) == [field]


def test_unknown_entity_type_and_context_breaking_the_schema(corp: Served) -> None:
    r = corp.post(EVAL, req("alice", "view", "design") | {"resource": ref("Planet", "mars")})
    assert "`Planet`" in assert_problem(r, 400, "resource.type")["detail"]
    r = corp.post(
        EVAL, req("alice", "export", "design", context={"risk_score": 10, "destination": 7})
    )
    assert "destination" in assert_problem(r, 400, "context")["detail"]
    r = corp.post(EVAL, req("alice", "export", "design", context={"risk_score": 10}))
    assert "destination" in assert_problem(r, 400, "context")["detail"]
    r = corp.post(AZ, az("alice", "view", "design") | {"subject": ref("Robot", "r2")})
    assert_problem(r, 400, "subject.type")
    r = corp.post(AZ, az("alice", "view", "design", context={"risk_score": "high"}))
    assert_problem(r, 400, "context")


def test_unknown_route_and_wrong_method(corp: Served) -> None:
    for method, path in [
        ("GET", "/nope"),
        ("POST", "/v1/access/evaluations"),
        ("GET", "/v2/access/evaluation"),
        ("DELETE", "/"),
    ]:
        r = corp.http.request(method, path, headers={"X-Request-ID": "r-404"})
        body = assert_problem(r, 404)
        assert body["type"] == "urn:svc:problem:not-found" and path in body["detail"]
        assert r.headers["x-request-id"] == "r-404"
    for method, path in [
        ("GET", EVAL),
        ("PUT", PLAN),
        ("GET", CHALLENGE),
        ("GET", AZ),
        ("DELETE", AZS),
        ("POST", "/healthz"),
        ("POST", "/readyz"),
        ("POST", "/metrics"),
        ("POST", "/.well-known/authzen-configuration"),
    ]:
        r = corp.http.request(method, path)
        body = assert_problem(r, 405)
        assert body["type"] == "urn:svc:problem:method-not-allowed"
        assert method in body["detail"] and path in body["detail"]


def test_undecodable_grpc_messages_are_invalid_argument(corp: Served) -> None:
    """tonic says INTERNAL for a message that does not decode; it is the client's fault."""
    raw = corp.channel.unary_unary("/svc.authz.v1.Authorizer/Check")
    for payload in [b"\xff\xff\xff\xff", b"\x0a\x05\x0a\x03\xff\xfe\xfd"]:
        with pytest.raises(grpc.RpcError) as info:
            raw(payload, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert "failed to decode" in info.value.details()
    deep: Any = 1
    for _ in range(60):
        deep = {"a": deep}
    message = check_request(req("alice", "view", "design"))
    message.context.update({"risk_score": deep})
    with pytest.raises(grpc.RpcError) as info:
        corp.stub.Check(message, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "recursion limit" in info.value.details()


def test_connection_close_when_the_body_is_left_unread(small: Served) -> None:
    """404, 405, 413 and 415 answer without reading the body; hyper then closes the
    connection, so the answer must say so or a keep-alive client's next request fails."""
    big = b"x" * 100_000
    for _ in range(20):
        for method, path, headers, status in [
            ("POST", EVAL, {"content-type": "application/json"}, 413),
            ("POST", EVAL, {"content-type": "text/plain"}, 415),
            ("POST", "/nope", {"content-type": "application/json"}, 404),
            ("PUT", EVAL, {"content-type": "application/json"}, 405),
        ]:
            r = small.http.request(method, path, content=big, headers=headers)
            assert r.status_code == status
            assert r.headers["connection"] == "close"
            ok = small.post(EVAL, req("alice", "view", "design"))
            assert ok.status_code == 200 and ok.headers.get("connection") != "close"
    # A request whose body was read keeps its connection.
    r = small.post(EVAL, {"principal": 1})
    assert r.status_code == 400 and r.headers.get("connection") != "close"


def test_unknown_grpc_method_is_unimplemented(corp: Served) -> None:
    call = corp.channel.unary_unary("/svc.authz.v1.Authorizer/Nope")
    with pytest.raises(grpc.RpcError) as info:
        call(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    call = corp.channel.unary_unary("/svc.other.v1.Thing/Do")
    with pytest.raises(grpc.RpcError) as info:
        call(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


WAIT = {
    "challenge_qid": "01a202b3-e183-730f-b9ee-51e49dfc56dc",
    "principal": ref("Human", "alice"),
    "wait_secs": 5,
}


def test_challenge_wait_validation_then_503_naming_svc_challenge(corp: Served) -> None:
    for body, field in [
        ({**WAIT, "wait_secs": 26}, "wait_secs"),
        ({**WAIT, "wait_secs": -1}, "wait_secs"),
        ({**WAIT, "wait_secs": 2.5}, "wait_secs"),
        ({**WAIT, "wait_secs": "5"}, "wait_secs"),
        ({**WAIT, "challenge_qid": ""}, "challenge_qid"),
        ({k: v for k, v in WAIT.items() if k != "challenge_qid"}, "challenge_qid"),
        ({k: v for k, v in WAIT.items() if k != "principal"}, "principal"),
        ({**WAIT, "principal": ref("Human", 5)}, "principal.id"),
        ({**WAIT, "on_behalf_of": "nobody"}, "on_behalf_of"),
        ({**WAIT, "outcome": "PASSED"}, "outcome"),
        ([WAIT], "request"),
    ]:
        r = corp.post(CHALLENGE, body)
        problem = assert_problem(r, 400)
        assert problem["field"].startswith(field), (body, problem)
    for body in [
        WAIT,
        {**WAIT, "wait_secs": 0},
        {**WAIT, "wait_secs": 25},
        {k: v for k, v in WAIT.items() if k != "wait_secs"},
        {**WAIT, "on_behalf_of": ref("Human", "bob")},
        {**WAIT, "on_behalf_of": None},
    ]:
        r = corp.post(CHALLENGE, body, headers={"X-Request-ID": "wait-1"})
        problem = assert_problem(r, 503)
        assert problem["type"] == "urn:svc:problem:challenge-service-unavailable"
        assert "svc-challenge" in problem["detail"]
        assert r.headers["retry-after"] == "30" and r.headers["x-request-id"] == "wait-1"
    assert metric(corp.metrics(), "svc_pdp_challenge_unavailable_total") == 6


def test_grpc_wait_for_challenge(corp: Served) -> None:
    http_detail = corp.post(CHALLENGE, WAIT).json()["detail"]
    message = authz_pb2.WaitForChallengeRequest(
        challenge_qid=WAIT["challenge_qid"],
        principal=authz_pb2.EntityRef(**WAIT["principal"]),
        wait_secs=5,
    )
    with pytest.raises(grpc.RpcError) as info:
        corp.stub.WaitForChallenge(message, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == http_detail
    for bad, field in [
        (
            authz_pb2.WaitForChallengeRequest(
                challenge_qid="q", principal=authz_pb2.EntityRef(type="Human", id="a"), wait_secs=30
            ),
            "wait_secs",
        ),
        (
            authz_pb2.WaitForChallengeRequest(principal=authz_pb2.EntityRef(type="Human", id="a")),
            "challenge_qid",
        ),
        (authz_pb2.WaitForChallengeRequest(challenge_qid="q"), "principal"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            corp.stub.WaitForChallenge(bad, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(info.value) == [field]


BATCH = [
    req("alice", "view", "design"),
    req("alice", "delete", "design"),
    req("mallory", "view", "design"),
    req("alice", "export", "design", context={"risk_score": 10, "destination": "usb"}),
]


def test_grpc_batch_check_answers_each_check_as_check_does(corp: Served) -> None:
    """``BatchCheck``: one ``CheckResponse`` per check, in order, each what ``Check`` answers."""
    batch = authz_pb2.BatchCheckRequest(checks=[check_request(r) for r in BATCH])
    got = [check_json(r) for r in corp.stub.BatchCheck(batch, timeout=10).results]
    singly = [check_json(corp.stub.Check(check_request(r), timeout=10)) for r in BATCH]
    assert [without_qid(g) for g in got] == [without_qid(s) for s in singly]
    assert [g["verdict"] for g in got][:2] == ["allow", "challenge"]
    assert len({g["qid"] for g in got}) == len(BATCH) and all(UUID7.match(g["qid"]) for g in got)


def test_grpc_batch_check_is_refused_whole_naming_every_bad_check(tmp_path: Path) -> None:
    """An invalid check refuses the batch: every bad one named, none decided or logged."""
    log = DecisionLog(tmp_path / "spool")
    with serve(Engine.from_bundle_dir(CORP), decision_log=log, max_batch_items=3) as s:
        bad = [
            check_request(req("alice", "view", "design")),
            authz_pb2.CheckRequest(
                action="view", resource=authz_pb2.EntityRef(type="Document", id="design")
            ),
            check_request(req("alice", "view", "design") | {"resource": ref("Planet", "mars")}),
        ]
        with pytest.raises(grpc.RpcError) as info:
            s.stub.BatchCheck(authz_pb2.BatchCheckRequest(checks=bad), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fields = bad_request_fields(info.value)
        assert fields[0] == "checks[1].principal" and fields[1].startswith("checks[2]."), fields
        assert "and 1 more" in (info.value.details() or "")
        for checks in ([], [check_request(req("alice", "view", "design"))] * 4):
            with pytest.raises(grpc.RpcError) as info:
                s.stub.BatchCheck(authz_pb2.BatchCheckRequest(checks=checks), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert bad_request_fields(info.value) == ["checks"]
            assert "max_batch_items" in (info.value.details() or "")
        assert log.read(100, 0.2)[0] == []
        ok = s.stub.BatchCheck(authz_pb2.BatchCheckRequest(checks=bad[:1] * 3), timeout=10)
        assert [r.verdict for r in ok.results] == [authz_pb2.VERDICT_ALLOW] * 3
        assert len(wait_until(lambda: log.read(100, 0.2)[0])) == 3


def test_challenge_verdict_carries_no_challenge_qid(corp: Served) -> None:
    r = corp.post(EVAL, req("alice", "delete", "design"))
    assert r.json()["verdict"] == "challenge" and "challenge_qid" not in r.json()
    resp = corp.stub.Check(check_request(req("alice", "delete", "design")))
    assert resp.verdict == authz_pb2.VERDICT_CHALLENGE and resp.challenge_qid == ""


def test_request_id_is_echoed(corp: Served) -> None:
    cases = [
        ("POST", EVAL, req("alice", "view", "design"), 200),
        ("POST", EVAL, {"principal": 1}, 400),
        ("POST", AZ, ALLOW, 200),
        ("POST", AZS, {"evaluations": [ALLOW]}, 200),
        (
            "POST",
            PLAN,
            {"principal": ref("Human", "alice"), "action": "view", "resource_type": "Document"},
            200,
        ),
        ("GET", "/healthz", None, 200),
        ("GET", "/metrics", None, 200),
        ("GET", "/nope", None, 404),
        ("GET", EVAL, None, 405),
    ]
    for i, (method, path, body, status) in enumerate(cases):
        rid = f"req-{i}.{method}"
        r = corp.http.request(method, path, json=body, headers={"X-Request-ID": rid})
        assert r.status_code == status
        assert r.headers["x-request-id"] == rid
    # Without one (or with an unsafe one, tests/test_hardening.py) a fresh id is set.
    r = corp.http.get("/healthz")
    assert len(r.headers["x-request-id"]) == 36


# -------------------------------------------------------------------------------------------
# 5. Health, readiness, version, metrics, gRPC health and reflection


def _health(s: Served, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(s.channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)


def test_readiness_follows_the_control_plane() -> None:
    with serve(Engine.from_bundle_dir(CORP), ready=False) as s:
        assert s.http.get("/healthz").json() == {"status": "ok"}
        r = s.http.get("/readyz")
        body = assert_problem(r, 503)
        assert body["type"] == "urn:svc:problem:not-ready"
        assert "policy bundle" in body["detail"] and "containment list" in body["detail"]
        assert s.server.ready is False
        for service in ["", "svc.authz.v1.Authorizer"]:
            assert _health(s, service) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert metric(s.metrics(), "svc_pdp_ready") == 0
        s.server.set_ready(bundle=True)
        body = assert_problem(s.http.get("/readyz"), 503)
        assert "containment list" in body["detail"] and "policy bundle" not in body["detail"]
        assert _health(s) == health_pb2.HealthCheckResponse.NOT_SERVING
        s.server.set_ready(containments=True)
        r = s.http.get("/readyz")
        assert r.status_code == 200
        assert r.json() == {
            "ready": True,
            "policy_version": s.engine.versions["policy_version"],
            "principals_version": s.engine.versions["principals_version"],
        }
        assert s.server.ready is True
        for service in ["", "svc.authz.v1.Authorizer"]:
            assert _health(s, service) == health_pb2.HealthCheckResponse.SERVING
        assert metric(s.metrics(), "svc_pdp_ready") == 1
        s.server.set_ready(containments=False)
        assert "containment list" in assert_problem(s.http.get("/readyz"), 503)["detail"]
        assert _health(s) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            _health(s, "svc.nope.v1.X")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_decisions_are_served_before_ready() -> None:
    # Readiness is for the orchestrator; the listener answers from the start.
    with serve(Engine.from_bundle_dir(CORP), ready=False) as s:
        assert s.post(EVAL, req("alice", "view", "design")).json()["verdict"] == "allow"


def test_bundle_error_on_readyz_and_metrics(corp: Served) -> None:
    corp.server.bundle_reloaded("policies.cedar:3:1: unexpected token")
    r = corp.http.get("/readyz")
    assert r.status_code == 200
    assert r.json()["bundle_error"] == "policies.cedar:3:1: unexpected token"
    text = corp.metrics()
    assert metric(text, "svc_pdp_bundle_error") == 1
    assert metric(text, "svc_pdp_bundle_reloads_total", result="error") == 1
    corp.server.bundle_reloaded(None)
    assert "bundle_error" not in corp.http.get("/readyz").json()
    text = corp.metrics()
    assert metric(text, "svc_pdp_bundle_error") == 0
    assert metric(text, "svc_pdp_bundle_reloads_total", result="ok") == 1
    corp.server.set_ready(bundle=False)
    corp.server.bundle_reloaded("bad")
    assert "last bundle load failed: bad" in assert_problem(corp.http.get("/readyz"), 503)["detail"]


def test_version() -> None:
    with serve(Engine.from_bundle_dir(CORP), version="9.9.9-test") as s:
        got = s.http.get("/version").json()
        assert got["component"] == "svc-pdp" and got["version"] == "9.9.9-test"
        assert isinstance(got["cedar_policy"], str)
        before = got["policy_version"]
        s.engine.load_bundle_dir(CORP)
        assert s.http.get("/version").json()["policy_version"] > before
    import svc

    with serve(Engine.from_bundle_dir(CORP)) as s:
        assert s.http.get("/version").json()["version"] == svc.__version__


def test_metrics_count_decisions_by_transport_verdict_and_mode(corp: Served) -> None:
    for _ in range(2):
        corp.post(EVAL, req("alice", "view", "design"))
    corp.post(EVAL, req("bob", "edit", "design"))
    corp.stub.Check(check_request(req("alice", "view", "design")))
    corp.stub.Check(check_request(req("alice", "delete", "design")))
    corp.post(AZ, DENY)
    corp.post(AZS, {"evaluations": [ALLOW, ALLOW, {"subject": 1}]})
    corp.post(EVAL, {"principal": 1})
    corp.engine.set_mode("monitor")
    corp.post(EVAL, req("bob", "edit", "design"))
    corp.stub.Check(check_request(req("alice", "delete", "design")))
    text = corp.metrics()
    assert text.count("svc_pdp_decisions_total{") == 18  # every series present from the start

    def d(transport: str, verdict: str, mode: str = "enforce") -> float:
        return metric(
            text, "svc_pdp_decisions_total", transport=transport, verdict=verdict, mode=mode
        )

    assert d("http", "allow") == 2 and d("http", "deny") == 1 and d("http", "challenge") == 0
    assert d("http", "deny", "monitor") == 1
    assert d("grpc", "allow") == 1 and d("grpc", "challenge") == 1
    assert d("grpc", "challenge", "monitor") == 1
    assert d("authzen", "deny") == 1 and d("authzen", "allow") == 2
    assert metric(text, "svc_pdp_decision_duration_seconds_count", transport="http") == 4
    assert metric(text, "svc_pdp_decision_duration_seconds_count", transport="grpc") == 3
    assert metric(text, "svc_pdp_decision_duration_seconds_count", transport="authzen") == 3
    assert metric(text, "svc_pdp_requests_rejected_total", status="400") == 1
    assert "# TYPE svc_pdp_decision_duration_seconds histogram" in text


def test_metrics_count_plans_and_plan_cache_hits(corp: Served) -> None:
    body = {"principal": ref("Human", "alice"), "action": "view", "resource_type": "Document"}
    first = corp.post(PLAN, body).json()
    corp.post(PLAN, {**body, "plan_qid": first["qid"]})
    corp.stub.Plan(plan_request({**body, "plan_qid": first["qid"]}))
    corp.stub.Plan(plan_request({**body, "principal": ref("Human", "bob"), "action": "delete"}))
    text = corp.metrics()
    assert metric(text, "svc_pdp_plan_cache_hits_total") == 2
    assert metric(text, "svc_pdp_plan_cache_misses_total") == 2
    assert metric(text, "svc_pdp_plans_total", transport="http", outcome="conditional") == 2
    assert metric(text, "svc_pdp_plans_total", transport="grpc", outcome="conditional") == 1
    assert metric(text, "svc_pdp_plans_cached") == corp.engine.plans_cached >= 2
    assert metric(text, "svc_pdp_plan_duration_seconds_count") == 4
    assert metric(text, "svc_pdp_policy_version") == corp.engine.versions["policy_version"]


def test_metrics_count_searches_by_kind_and_method(corp: Served) -> None:
    alice, design = ref("Human", "alice"), ref("Document", "design")
    view = {"name": "view"}
    pages = [
        corp.post(
            "/access/v1/search/resource",
            {**{"subject": alice, "action": view}, "resource": {"type": "Document"}},
        ),
        corp.post(
            "/access/v1/search/subject",
            {"subject": {"type": "Human"}, "action": view, "resource": design},
        ),
        corp.post("/access/v1/search/action", {"subject": alice, "resource": design}),
        corp.post("/access/v1/search/action", {"subject": alice, "resource": design}),
    ]
    assert all(r.status_code == 200 for r in pages), [r.text for r in pages]
    text = corp.metrics()
    assert metric(text, "svc_pdp_searches_total", kind="resource", method="plan") == 1
    assert metric(text, "svc_pdp_searches_total", kind="subject", method="plan") == 1
    assert metric(text, "svc_pdp_searches_total", kind="action", method="checks") == 2
    for kind, n in (("resource", 1), ("subject", 1), ("action", 2)):
        found = sum(len(r.json()["results"]) for r in pages if r.url.path.endswith(kind))
        assert metric(text, "svc_pdp_search_results_total", kind=kind) == found > 0
        assert metric(text, "svc_pdp_search_duration_seconds_count", kind=kind) == n


def test_grpc_reflection_lists_the_services(corp: Served) -> None:
    db = ProtoReflectionDescriptorDatabase(corp.channel)
    services = set(db.get_services())
    assert {"svc.authz.v1.Authorizer", "grpc.health.v1.Health"} <= services
    assert "svc.authz.v1.NoopAuthorizer" not in services
    fd = db.FindFileContainingSymbol("svc.authz.v1.Authorizer")
    assert fd.package == "svc.authz.v1"
    assert [m.name for m in fd.service[0].method] == [
        "Check",
        "BatchCheck",
        "WaitForChallenge",
        "Plan",
    ]


def test_noop_routes_only_when_asked_for(corp: Served) -> None:
    assert_problem(corp.post("/v1/noop", {}), 404)
    noop = corp.channel.unary_unary(
        "/svc.authz.v1.NoopAuthorizer/Check",
        request_serializer=authz_pb2.CheckRequest.SerializeToString,
        response_deserializer=authz_pb2.CheckResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        noop(authz_pb2.CheckRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with serve(Engine.from_bundle_dir(CORP), noop_routes=True) as s:
        assert s.post("/v1/noop", {"anything": [1]}).json()["verdict"] == "allow"
        noop = s.channel.unary_unary(
            "/svc.authz.v1.NoopAuthorizer/Check",
            request_serializer=authz_pb2.CheckRequest.SerializeToString,
            response_deserializer=authz_pb2.CheckResponse.FromString,
        )
        assert noop(authz_pb2.CheckRequest(), timeout=10).verdict == authz_pb2.VERDICT_ALLOW
        services = set(ProtoReflectionDescriptorDatabase(s.channel).get_services())
        assert "svc.authz.v1.NoopAuthorizer" in services
        # The benchmark ceiling decides nothing and counts no decision.
        assert (
            metric(
                s.metrics(),
                "svc_pdp_decisions_total",
                transport="http",
                verdict="allow",
                mode="enforce",
            )
            == 0
        )


# -------------------------------------------------------------------------------------------
# 6. A bundle swapped under load fails no request

SWAP_FORBID = '@id("swap-forbid")\nforbid (principal, action == Action::"view", resource == Document::"design");\n'


def test_bundle_swap_under_load_fails_no_request(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(CORP, a)
    shutil.copytree(CORP, b)
    (b / "zz_swap.cedar").write_text(SWAP_FORBID)
    view = req("alice", "view", "design")
    edit = req("bob", "edit", "design")
    # What each bundle answers, from engines of their own.
    allowed = {}
    for name, path in [("a", a), ("b", b)]:
        e = Engine.from_bundle_dir(path)
        allowed[name] = {
            "view": without_qid(e.evaluate(view)),
            "edit": without_qid(e.evaluate(edit)),
        }
    assert allowed["a"]["view"]["verdict"] == "allow"
    assert allowed["b"]["view"] == {
        "verdict": "deny",
        "challenges": [],
        "policies": ["swap-forbid"],
        "mode": "enforce",
    }
    valid_view = [allowed["a"]["view"], allowed["b"]["view"]]
    valid_edit = [allowed["a"]["edit"], allowed["b"]["edit"]]

    stop = threading.Event()
    lock = threading.Lock()
    failures: list[Any] = []
    seen: list[str] = []
    count = [0]

    def record(kind: str, got: dict[str, Any]) -> None:
        ok = got in (valid_view if kind == "view" else valid_edit)
        with lock:
            count[0] += 1
            if not ok:
                failures.append((kind, got))
            elif kind == "view":
                seen.append(got["verdict"])

    def http_worker(s: Served) -> None:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            while not stop.is_set():
                for kind, body in [("view", view), ("edit", edit)]:
                    try:
                        r = c.post(EVAL, json=body)
                    except httpx.HTTPError as e:
                        failures.append(("http error", repr(e)))
                        continue
                    if r.status_code != 200:
                        failures.append((r.status_code, r.text))
                        continue
                    record(kind, without_qid(r.json()))

    def grpc_worker(s: Served) -> None:
        while not stop.is_set():
            try:
                got = check_json(s.stub.Check(check_request(view), timeout=30))
            except grpc.RpcError as e:
                failures.append(("grpc", e.code(), e.details()))
                continue
            record("view", without_qid(got))

    def authzen_worker(s: Served) -> None:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            while not stop.is_set():
                r = c.post(
                    AZS, json={"evaluations": [authzen_request(view)[0], authzen_request(edit)[0]]}
                )
                if r.status_code != 200:
                    failures.append((r.status_code, r.text))
                    continue
                for kind, e in zip(["view", "edit"], r.json()["evaluations"], strict=True):
                    ctx = e["context"]
                    record(kind, {k: ctx[k] for k in ("verdict", "challenges", "policies", "mode")})

    engine = Engine.from_bundle_dir(a)
    with serve(engine) as s:
        threads = [threading.Thread(target=http_worker, args=(s,)) for _ in range(3)]
        threads += [
            threading.Thread(target=grpc_worker, args=(s,)),
            threading.Thread(target=authzen_worker, args=(s,)),
        ]
        for t in threads:
            t.start()
        try:
            for i in range(60):
                engine.load_bundle_dir(b if i % 2 == 0 else a)
                # Let requests run against this bundle before the next swap.
                mark = count[0]
                wait_until(
                    lambda mark=mark: count[0] >= mark + 5 or failures, timeout=30, every=0.001
                )
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert not failures, failures[:5]
        assert count[0] >= 300
        assert {"allow", "deny"} <= set(seen)
        assert s.engine.versions["policy_version"] >= 61
        assert not any(t.is_alive() for t in threads)
