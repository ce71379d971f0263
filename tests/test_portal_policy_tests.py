"""Saving a decision as a policy test from the portal's GraphQL API (docs/portal.md#policy-tests).

Real parts: `svc pdp` writes its decision log to Kafka (topics of this module's own), `svc
history load` (a process) loads it into chDB and serves the history routes, and
tests/portalkit.py starts the context service (PostgreSQL), the policy and challenge services
and the portal. Covered: a person's check and an agent's challenged write saved as tests, their
request and entity snapshot built from the recorded decision and the directory (groups, the
agent's record and owner), each passing under the active bundle; a draft that drops the deciding
policy failing the test with expected and got; publish refused naming the failing test, then
published when the failure is accepted; listing and deleting; the refusals (by policy for
auditors and people with no access, an unknown decision, a bad name, a name in use).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from portalkit import POLICIES, SCHEMA, World, logged, pg_schema, until
from test_portal_graphql import Gql, forbidden

SAVE = """
mutation($q: String!, $n: String!, $e: String) {
  saveDecisionAsTest(qid: $q, name: $n, expect: $e) {
    test {
      name action expect savedBy fromDecision createdAt entities context
      principal { type id } resource { type id } onBehalfOf { type id } contained { id }
    }
    active { name passed expected got policies error }
  }
}
"""
RUN = """
query($v: Int!) {
  runPolicyTests(version: $v) {
    version passed failed results { name passed expected got policies error notes }
  }
}
"""
LIST = "{ policyTests { name expect savedBy fromDecision principal { id } } }"
DRAFT = "mutation($f: [BundleFileInput!]!) { createDraft(files: $f) { bundle { version } } }"
PUBLISH = """
mutation($v: Int!, $a: [String!]) {
  publishBundle(version: $v, acceptFailingTests: $a) { version state }
}
"""


@pytest.fixture(scope="module")
def world(
    postgres_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("portal-policy-tests")
    with logged(kafka_bootstrap, tmp, "portal.tests") as log, pg_schema(postgres_url) as url:
        w = World(url, tmp, pdp_args=log.pdp_args, history_url=log.history.url)
        try:
            yield w
        finally:
            w.close()


@pytest.fixture(scope="module")
def people(world: World) -> Iterator[dict[str, Gql]]:
    clients = {u: Gql(world.sign_in(u)) for u in ("ana", "bo", "cy")}
    yield clients
    for c in clients.values():
        c.http.close()


def loaded(world: World, who: Gql, qid: str) -> None:
    """Waits until the history holds decision `qid`."""
    query = "query($q: String!) { explainDecision(qid: $q) { decision { qid } } }"
    until(f"decision {qid} loaded", lambda: who.ok(query, {"q": qid})["explainDecision"])


def files(policies: str) -> list[dict[str, str]]:
    return [
        {"name": "schema.cedarschema", "content": SCHEMA},
        {"name": "policies.cedar", "content": policies},
    ]


def test_decisions_saved_as_tests_guard_a_publish(world: World, people: dict[str, Gql]) -> None:
    ana, bo, cy = people["ana"], people["bo"], people["cy"]
    v1 = ana.ok(DRAFT, {"f": files(POLICIES)})["createDraft"]["bundle"]["version"]
    ana.ok(PUBLISH, {"v": v1})

    # bo (an auditor) viewing the decisions: allowed through the auditors group, which only the
    # directory knows (the bundle has no entities): the snapshot carries it.
    seen = world.check(
        {"type": "Human", "id": "bo"}, "view", {"type": "PortalArea", "id": "decisions"}
    )
    assert seen["verdict"] == "allow", seen
    loaded(world, ana, seen["qid"])
    saved = ana.ok(SAVE, {"q": seen["qid"], "n": "auditors see decisions"})["saveDecisionAsTest"]
    test = saved["test"]
    assert {k: test[k] for k in ("name", "action", "expect", "savedBy", "fromDecision")} == {
        "name": "auditors see decisions",
        "action": "view",
        "expect": "allow",
        "savedBy": "ana",
        "fromDecision": seen["qid"],
    }
    assert test["principal"] == {"type": "Human", "id": "bo"}
    assert test["resource"] == {"type": "PortalArea", "id": "decisions"}
    assert test["onBehalfOf"] is None and test["contained"] == [] and test["context"] == {}
    (bo_entity,) = test["entities"]
    assert bo_entity["uid"] == {"type": "Human", "id": "bo"}
    assert bo_entity["parents"] == [{"type": "Group", "id": "auditors"}]
    assert bo_entity["attrs"]["active"] is True
    assert saved["active"] == {
        "name": "auditors see decisions",
        "passed": True,
        "expected": "allow",
        "got": "allow",
        "policies": ["portal-auditors-view"],
        "error": None,
    }

    # An agent's write, challenged: the agent's record (its owner, ai) and its owner are in
    # the snapshot, and `challenge` is what is expected.
    r = world.context.http.post(
        "/v1/service-accounts",
        json={"service_accounts": [{"id": "copilot.tested", "owner": "ana", "ai": True}]},
    )
    assert r.status_code == 200, r.text
    agent = {"type": "ServiceAccount", "id": "copilot.tested"}
    doc = {"type": "Document", "id": "tested"}
    wrote = until(
        "challenged",
        lambda: (x := world.check(agent, "write", doc))["verdict"] == "challenge" and x,
    )
    loaded(world, ana, wrote["qid"])
    saved = ana.ok(SAVE, {"q": wrote["qid"], "n": "agent writes need approval"})[
        "saveDecisionAsTest"
    ]
    by_uid = {(e["uid"]["type"], e["uid"]["id"]): e for e in saved["test"]["entities"]}
    assert set(by_uid) == {("ServiceAccount", "copilot.tested"), ("Human", "ana")}
    sa = by_uid[("ServiceAccount", "copilot.tested")]["attrs"]
    assert sa["owner"] == {"__entity": {"type": "Human", "id": "ana"}}
    assert sa["ai"] is True and sa["registered"] is True and sa["app"] == "copilot"
    assert saved["active"]["passed"] and saved["active"]["got"] == "challenge"
    assert saved["active"]["policies"] == ["agent-writes-need-approval"]

    listed = bo.ok(LIST)["policyTests"]
    assert [(t["name"], t["expect"], t["principal"]["id"]) for t in listed] == [
        ("agent writes need approval", "challenge", "copilot.tested"),
        ("auditors see decisions", "allow", "bo"),
    ]

    # A draft without the auditors' policy fails the first test, with what it got.
    v2 = ana.ok(
        DRAFT,
        {
            "f": files(
                POLICIES.replace(
                    '@id("portal-auditors-view")\npermit', '@id("auditors-blocked")\nforbid', 1
                )
            )
        },
    )["createDraft"]["bundle"]["version"]
    run = bo.ok(RUN, {"v": v2})["runPolicyTests"]
    assert (run["version"], run["passed"], run["failed"]) == (v2, 1, 1)
    failed = {r["name"]: r for r in run["results"]}["auditors see decisions"]
    assert (failed["passed"], failed["expected"], failed["got"]) == (False, "allow", "deny")
    assert failed["policies"] == ["auditors-blocked"]

    # Publishing it is refused, naming the test; accepted, it is published.
    ext = ana.refused(PUBLISH, {"v": v2})
    assert ext["code"] == "FAILED_PRECONDITION" and ext["status"] == 409, ext
    assert [e["field"] for e in ext["errors"]] == ["tests[auditors see decisions]"]
    assert ext["errors"][0]["message"].startswith("expected allow, got deny")
    assert ana.ok("{ bundle { version } }")["bundle"]["version"] == v1
    out = ana.ok(PUBLISH, {"v": v2, "a": ["auditors see decisions"]})["publishBundle"]
    assert out == {"version": v2, "state": "ACTIVE"}
    ana.ok(PUBLISH, {"v": v1})

    # Who may: auditors view tests but not save or delete; people with no access neither.
    forbidden(bo.refused(SAVE, {"q": seen["qid"], "n": "mine"}), "policies", "administer")
    forbidden(cy.refused(SAVE, {"q": seen["qid"], "n": "mine"}), "policies", "administer")
    forbidden(cy.refused(LIST), "policies", "view")
    delete = "mutation($n: String!) { deletePolicyTest(name: $n) }"
    forbidden(bo.refused(delete, {"n": "auditors see decisions"}), "policies", "administer")

    # Bad requests: an unknown decision, a bad name, a name in use, a bad verdict.
    ext = ana.refused(SAVE, {"q": "0190b0c0-0000-7000-8000-000000000000", "n": "x"})
    assert ext["code"] == "NOT_FOUND" and ext["errors"] == [{"field": "qid", "message": "unknown"}]
    ext = ana.refused(SAVE, {"q": seen["qid"], "n": " ", "e": "maybe"})
    assert ext["code"] == "INVALID_ARGUMENT", ext
    assert {e["field"] for e in ext["errors"]} == {"name", "expect"}
    ext = ana.refused(SAVE, {"q": seen["qid"], "n": "auditors see decisions"})
    assert ext["code"] == "FAILED_PRECONDITION" and ext["errors"][0]["field"] == "name", ext

    assert ana.ok(delete, {"n": "auditors see decisions"}) == {"deletePolicyTest": True}
    assert [t["name"] for t in ana.ok(LIST)["policyTests"]] == ["agent writes need approval"]
    ext = ana.refused(delete, {"n": "auditors see decisions"})
    assert ext["code"] == "NOT_FOUND", ext
