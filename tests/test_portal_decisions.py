"""The portal's decision search and explanations (docs/portal.md#graphql), over a real history.

`svc pdp` writes its decision log to Kafka (topics of this module's own), `svc history load`
(a process) loads it into chDB and serves the history routes, and the portal reads them
(tests/portalkit.py starts the rest). The portal's own checks are decisions like any other, so
they are what is searched: covered are a refusal's qid found in the history, filters by action,
verdict, policy and mode, cursor paging that neither repeats nor skips a decision, an
explanation with the deciding policies' text from the active bundle and the challenge a
decision opened, and the refusals (by policy, a bad cursor, a subject missing or doubled).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from portalkit import POLICIES, SCHEMA, World, logged, pg_schema, until
from serverkit import UUID7
from test_portal_graphql import Gql, forbidden

SEARCH = """
query($p: EntityRefInput, $r: EntityRefInput, $action: String, $verdict: String,
      $policy: String, $mode: String, $first: Int! = 50, $after: String) {
  decisions(principal: $p, resource: $r, action: $action, verdict: $verdict, policy: $policy,
            mode: $mode, first: $first, after: $after) {
    decisions { qid at action verdict policies mode principal { type id } resource { id } }
    endCursor hasNextPage scanned
  }
}
"""


@pytest.fixture(scope="module")
def world(
    postgres_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("portal-decisions")
    with logged(kafka_bootstrap, tmp, "portal") as log, pg_schema(postgres_url) as url:
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


def search(who: Gql, **variables: Any) -> dict[str, Any]:
    out: dict[str, Any] = who.ok(SEARCH, variables)["decisions"]
    return out


def test_a_refusal_is_in_the_history_and_found_by_its_filters(
    world: World, people: dict[str, Gql]
) -> None:
    ext = people["cy"].refused("{ trustedApps { name } }")
    forbidden(ext, "directory", "view")
    qid = ext["decision_qid"]
    cy = {"type": "Human", "id": "cy"}
    page = until(
        "the portal's refusal loaded into the history",
        lambda: (
            (p := search(people["bo"], p=cy)) and qid in [d["qid"] for d in p["decisions"]] and p
        ),
    )
    row = next(d for d in page["decisions"] if d["qid"] == qid)
    assert row["action"] == "view" and row["verdict"] == "deny" and row["mode"] == "enforce"
    assert row["resource"] == {"id": "directory"} and row["principal"] == cy
    denied = search(people["bo"], p=cy, verdict="deny", action="view")["decisions"]
    assert qid in [d["qid"] for d in denied]
    assert all(d["verdict"] == "deny" and d["action"] == "view" for d in denied)
    allowed = search(people["bo"], p=cy, verdict="allow")["decisions"]
    assert qid not in [d["qid"] for d in allowed]
    assert all(d["verdict"] == "allow" for d in allowed)
    # bo's own searches are checked and logged too: each allowed by portal-auditors-view.
    bo = {"type": "Human", "id": "bo"}
    mine = until(
        "bo's searches in the history",
        lambda: search(people["bo"], p=bo, policy="portal-auditors-view")["decisions"],
    )
    assert all(d["policies"] == ["portal-auditors-view"] for d in mine)
    assert search(people["bo"], p=bo, mode="monitor")["decisions"] == []
    forbidden(people["cy"].refused(SEARCH, {"p": cy}), "decisions", "view")


def test_paging_neither_repeats_nor_skips(world: World, people: dict[str, Gql]) -> None:
    doc = {"type": "Document", "id": f"paged-{uuid.uuid4().hex[:6]}"}
    agent = {"type": "ServiceAccount", "id": "copilot.pager"}
    made = [world.check(agent, "read", doc)["qid"] for _ in range(7)]
    until(
        "seven checks loaded",
        lambda: len(search(people["ana"], r=doc, first=50)["decisions"]) == 7,
    )
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = search(people["ana"], r=doc, first=3, after=after)
        pages += 1
        seen += [d["qid"] for d in page["decisions"]]
        assert len(page["decisions"]) <= 3
        if not page["hasNextPage"]:
            break
        after = page["endCursor"]
        assert pages < 10
    assert seen == made and pages == 3
    # A filter that matches one decision in four still pages in order.
    every = search(people["ana"], r=doc, verdict="deny", first=2)
    assert [d["qid"] for d in every["decisions"]] == made[:2]
    bad = people["ana"].refused(SEARCH, {"r": doc, "after": "not-a-cursor"})
    assert bad["code"] == "INVALID_ARGUMENT", bad
    both = people["ana"].refused(SEARCH, {"r": doc, "p": agent})
    assert both["code"] == "INVALID_ARGUMENT", both
    neither = people["ana"].refused(SEARCH, {})
    assert neither["code"] == "INVALID_ARGUMENT", neither
    big = people["ana"].refused(SEARCH, {"r": doc, "first": 100_000})
    assert big["code"] == "INVALID_ARGUMENT", big


EXPLAIN = """
query($q: String!) {
  explainDecision(qid: $q) {
    decision { qid verdict policies }
    policies { name file text }
    challenge { qid state approver }
  }
}
"""


def test_an_explanation_names_the_policies_text_and_the_challenge(
    world: World, people: dict[str, Gql]
) -> None:
    draft = "mutation($f: [BundleFileInput!]!) { createDraft(files: $f) { bundle { version } } }"
    files = [
        {"name": "schema.cedarschema", "content": SCHEMA},
        {"name": "policies.cedar", "content": POLICIES},
    ]
    version = people["ana"].ok(draft, {"f": files})["createDraft"]["bundle"]["version"]
    people["ana"].ok(f"mutation {{ publishBundle(version: {version}) {{ state }} }}")
    r = world.context.http.post(
        "/v1/service-accounts",
        json={"service_accounts": [{"id": "copilot.explained", "owner": "ana", "ai": True}]},
    )
    assert r.status_code == 200, r.text
    agent = {"type": "ServiceAccount", "id": "copilot.explained"}
    doc = {"type": "Document", "id": "explained"}
    d = until(
        "challenged",
        lambda: (x := world.check(agent, "write", doc))["verdict"] == "challenge" and x,
    )
    out = until(
        "the challenged check loaded",
        lambda: (
            (e := people["bo"].raw(EXPLAIN, {"q": d["qid"]}))["data"]["explainDecision"]
            and e["data"]["explainDecision"]
        ),
    )
    assert out["decision"] == {
        "qid": d["qid"],
        "verdict": "challenge",
        "policies": ["agent-writes-need-approval"],
    }
    (policy,) = out["policies"]
    assert policy["name"] == "agent-writes-need-approval" and policy["file"] == "policies.cedar"
    assert policy["text"].startswith('@id("agent-writes-need-approval")')
    assert policy["text"].endswith(";") and '@challenge("approval")' in policy["text"]
    assert out["challenge"] == {"qid": d["challenge_qid"], "state": "PENDING", "approver": "ana"}
    # What if: the same decision under the active bundle, and under a draft without the
    # approval policy (nothing permits the write: deny).
    what = "query($q: String!, $v: Int) { whatIf(qid: $q, version: $v) { recorded version verdict policies error } }"
    same = people["bo"].ok(what, {"q": d["qid"]})["whatIf"]
    assert same == {
        "recorded": "challenge",
        "version": version,
        "verdict": "challenge",
        "policies": ["agent-writes-need-approval"],
        "error": None,
    }
    stricter = POLICIES.replace(
        '@id("agent-writes-need-approval") @challenge("approval")',
        '// gone\n@id("gone") @challenge("approval")',
    ).replace(
        'permit (principal is ServiceAccount, action == Action::"write", resource is Document);',
        'forbid (principal is ServiceAccount, action == Action::"write", resource is Document);',
    )
    files2 = [files[0], {"name": "policies.cedar", "content": stricter}]
    v2 = people["ana"].ok(draft, {"f": files2})["createDraft"]["bundle"]["version"]
    under = people["bo"].ok(what, {"q": d["qid"], "v": v2})["whatIf"]
    assert under["verdict"] == "deny" and under["version"] == v2, under
    forbidden(people["cy"].refused(what, {"q": d["qid"]}), "decisions", "view")
    # A built-in denial is named without text.
    contained = world.check(
        {"type": "ServiceAccount", "id": "copilot.never-registered"}, "read", doc
    )
    out = until(
        "the unregistered check loaded",
        lambda: people["ana"].raw(EXPLAIN, {"q": contained["qid"]})["data"]["explainDecision"],
    )
    assert out["policies"] == [{"name": "svc:unregistered", "file": None, "text": None}]
    assert people["ana"].ok(EXPLAIN, {"q": "0190b0c0-0000-7000-8000-000000000000"}) == {
        "explainDecision": None
    }
    forbidden(people["cy"].refused(EXPLAIN, {"q": d["qid"]}), "decisions", "view")
    assert UUID7.match(d["qid"])


READS = """
query($q: String!) {
  explainDecision(qid: $q) {
    decision { qid at verdict policies }
    policies {
      name file effect startLine endLine entities
      reads { path read has lines status value source asOf note }
    }
    personPolicies { name file effect reads { path status value source } }
  }
}
"""


def test_an_explanation_names_what_its_policies_read_with_values(
    world: World, people: dict[str, Gql]
) -> None:
    """Each deciding policy's reads from the decision core's outline, with the directory's
    current value (``asOf`` when the portal read it) or ``unknown`` for the unrecorded context.
    """
    draft = "mutation($f: [BundleFileInput!]!) { createDraft(files: $f) { bundle { version } } }"
    files = [
        {"name": "schema.cedarschema", "content": SCHEMA},
        {"name": "policies.cedar", "content": POLICIES},
    ]
    version = people["ana"].ok(draft, {"f": files})["createDraft"]["bundle"]["version"]
    people["ana"].ok(f"mutation {{ publishBundle(version: {version}) {{ state }} }}")
    agent = {"type": "ServiceAccount", "id": "copilot.reader"}

    def register(ai: bool) -> None:
        r = world.context.http.post(
            "/v1/service-accounts",
            json={"service_accounts": [{"id": agent["id"], "owner": "ana", "ai": ai}]},
        )
        assert r.status_code == 200, r.text

    register(True)
    area = {"type": "PortalArea", "id": "decisions"}
    d = until(
        "the agent registered at the decision point",
        lambda: (x := world.check(agent, "view", area))["verdict"] == "allow" and x,
    )
    assert d["policies"] == ["portal-ai-agents-view-for-their-person"]
    out = until(
        "the agent's check loaded",
        lambda: people["bo"].raw(READS, {"q": d["qid"]})["data"]["explainDecision"],
    )
    (policy,) = out["policies"]
    lines = POLICIES.splitlines()
    start = lines.index('@id("portal-ai-agents-view-for-their-person")') + 1
    assert policy["file"] == "policies.cedar" and policy["effect"] == "permit"
    assert (policy["startLine"], policy["endLine"]) == (start, start + 2)
    assert policy["entities"] == ['Action::"view"']
    (ai,) = policy["reads"]
    assert {k: ai[k] for k in ("path", "read", "has", "lines", "status", "value", "source")} == {
        "path": "principal.ai",
        "read": True,
        "has": False,
        "lines": [start + 2],
        "status": "value",
        "value": True,
        "source": "directory",
    }
    read_at = datetime.fromisoformat(ai["asOf"])
    assert read_at >= datetime.fromisoformat(out["decision"]["at"]) and ai["note"] is None
    # The value is the directory's now, not the one at decision time: changed since, the same
    # decision's explanation shows the new value, read later.
    register(False)
    after = until(
        "the changed record read back",
        lambda: (
            (p := people["bo"].ok(READS, {"q": d["qid"]})["explainDecision"]["policies"][0])[
                "reads"
            ][0]["value"]
            is False
            and p
        ),
    )
    assert datetime.fromisoformat(after["reads"][0]["asOf"]) > read_at
    assert out["personPolicies"] == []
    # The agent acting for ana: the person's own check is explained too, its policies read with
    # ana as the principal.
    ana = {"type": "Human", "id": "ana"}
    register(True)
    obo = until(
        "the agent an AI again at the decision point",
        lambda: (x := world.check(agent, "view", area, ana))["verdict"] == "allow" and x,
    )
    assert obo["on_behalf_of"]["policies"] == ["portal-security-team-administers"], obo
    both = until(
        "the agent's check for ana loaded",
        lambda: people["bo"].raw(READS, {"q": obo["qid"]})["data"]["explainDecision"],
    )
    assert [p["name"] for p in both["policies"]] == ["portal-ai-agents-view-for-their-person"]
    (mine,) = both["personPolicies"]
    assert (mine["name"], mine["file"], mine["effect"]) == (
        "portal-security-team-administers",
        "policies.cedar",
        "permit",
    )
    assert mine["reads"] == []  # its scope alone decides: `principal in Group::"security-team"`
    # A person's own challenges: the policy reads `context.own`, which the decision record
    # does not keep, and names two areas.
    people["cy"].ok("{ challenges(mine: true) { qid } }")
    cy = {"type": "Human", "id": "cy"}
    own = until(
        "cy's own-challenges check loaded",
        lambda: search(people["bo"], p=cy, policy="portal-own-challenges-and-keys")["decisions"],
    )
    out = people["bo"].ok(READS, {"q": own[-1]["qid"]})["explainDecision"]
    (policy,) = out["policies"]
    assert policy["entities"] == [
        'Action::"view"',
        'Action::"administer"',
        'PortalArea::"challenges"',
        'PortalArea::"keys"',
    ]
    assert [(r["path"], r["has"], r["read"], r["status"]) for r in policy["reads"]] == [
        ("context.own", True, True, "unknown")
    ]
    assert "context" in policy["reads"][0]["note"]
    forbidden(people["cy"].refused(READS, {"q": d["qid"]}), "decisions", "view")
