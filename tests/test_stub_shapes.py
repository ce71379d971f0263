"""The typed shapes of `svc.pdp` hold the engine's real answers, so the stub cannot drift.

`python/svc/_pdp_core.pyi` types `Engine.evaluate` / `evaluate_many` as `Decision`, `decide` as
`DecisionRecord` and `plan` as `Plan` (TypedDicts in `svc.pdp.shapes`, re-exported by
`svc.pdp`). These tests run real checks and plans on the corp bundle
(tests/testdata/bundles/corp) and on a bundle whose plan uses every filter operator
(docs/plans.md, "The filter tree"), and hold every answer to its type with typeguard: required
keys present, no unknown keys, Literal fields within their values, every value of its declared
type, the filter tree node by node. In the other direction, every declared key and every
Literal value of `Verdict`, `Mode` and `PlanOutcome` must show up in some answer, so a type
cannot claim what the engine never returns. A stub whose methods stop returning these types
fails too.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

import pytest
from typeguard import CollectionCheckStrategy, TypeCheckError, TypeHintWarning, check_type

import svc.pdp
from svc.pdp import (
    Decision,
    DecisionRecord,
    Engine,
    FilterNode,
    Mode,
    Plan,
    PlanOutcome,
    Verdict,
)
from svc.pdp.shapes import __all__ as SHAPES

REPO = Path(__file__).resolve().parent.parent
CORP = REPO / "tests" / "testdata" / "bundles" / "corp"
STUB = REPO / "python" / "svc" / "_pdp_core.pyi"


def conforms(value: object, tp: Any) -> None:
    """Raises `typeguard.TypeCheckError` naming the first place `value` breaks `tp`.

    Every item of every list is checked (typeguard checks only the first by default), and a
    part of the type typeguard cannot resolve fails instead of being skipped.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", TypeHintWarning)
        check_type(value, tp, collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS)


def declared(td: Any) -> set[str]:
    return set(td.__required_keys__) | set(td.__optional_keys__)


def keys_seen(answers: Iterable[Mapping[str, Any]]) -> set[str]:
    return {k for a in answers for k in a}


def filter_nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("args", []):
        yield from filter_nodes(child)
    if "arg" in node:
        yield from filter_nodes(node["arg"])


def ref(t: str, i: str) -> dict[str, str]:
    return {"type": t, "id": i}


ALICE, BOB, ZOE = ref("Human", "alice"), ref("Human", "bob"), ref("Human", "zoe")
HELPER, LEGACY = ref("ServiceAccount", "docs.helper"), ref("ServiceAccount", "legacy.bot")
DESIGN_DOC = ref("Document", "design")


def corp() -> Engine:
    """The corp bundle with an AI agent of alice's, an open work item linking the design
    document, and a risk score for bob, so that records fill every optional field."""
    engine = Engine.from_bundle_dir(CORP)
    engine.register_service_accounts(
        [{"id": "docs.helper", "owner": "alice", "ai": True, "groups": [], "description": "x"}]
    )
    engine.upsert_work_items([{"id": "T-1", "status": "open", "links": [DESIGN_DOC]}])
    engine.set_risk_scores([{"principal": BOB, "score": 80}])
    return engine


# Checks covering every verdict, an agent for a person (`on_behalf_of`), a work item, a risk
# score, and a principal the directory does not hold with an ignored inline entity.
CHECKS: list[dict[str, Any]] = [
    {"principal": ALICE, "action": "view", "resource": DESIGN_DOC},
    {"principal": ALICE, "action": "delete", "resource": DESIGN_DOC},
    {"principal": BOB, "action": "view", "resource": DESIGN_DOC},
    {"principal": LEGACY, "on_behalf_of": ALICE, "action": "view", "resource": DESIGN_DOC},
    {
        "principal": HELPER,
        "on_behalf_of": ALICE,
        "action": "edit",
        "resource": DESIGN_DOC,
        "work_item_id": "T-1",
    },
    {
        "principal": ZOE,
        "action": "view",
        "resource": DESIGN_DOC,
        "entities": [{"uid": ZOE, "attrs": {"department": "engineering"}, "parents": []}],
    },
]

# Plans covering every outcome on the corp bundle.
PLANS: list[dict[str, Any]] = [
    {"principal": ALICE, "action": "view", "resource_type": "Document"},  # conditional
    {"principal": ALICE, "action": "delete", "resource_type": "Document"},  # challenge
    {"principal": ALICE, "action": "read", "resource_type": "Ticket"},  # always_allowed
    {"principal": LEGACY, "action": "view", "resource_type": "Document"},  # always_denied
    {"principal": HELPER, "on_behalf_of": ALICE, "action": "view", "resource_type": "Document"},
]


def test_checks_are_decisions_and_records_in_both_modes() -> None:
    engine = corp()
    decisions: list[Decision] = []
    records: list[DecisionRecord] = []
    for mode in ("enforce", "monitor"):
        engine.set_mode(mode)
        for req in CHECKS:
            decisions.append(engine.evaluate(req))
            records.append(engine.decide(req))
    for d in decisions:
        conforms(d, Decision)
    for r in records:
        conforms(r, DecisionRecord)
    assert keys_seen(decisions) == declared(Decision)
    assert keys_seen(records) == declared(DecisionRecord)
    assert {d["verdict"] for d in decisions} == set(get_args(Verdict))
    assert {d["mode"] for d in decisions} == set(get_args(Mode))
    # The optional fields of a record are filled at least once, and left empty at least once.
    for field in ("on_behalf_of", "on_behalf_of_outcome", "work_item", "risk_score"):
        assert {r[field] is None for r in records} == {True, False}, field
    assert any(r["not_in_directory"] for r in records)
    assert any(r["inline_ignored"] for r in records)


def test_a_batch_is_a_list_of_decisions() -> None:
    # 100 requests: past the size from which evaluate_many decides on helper threads.
    engine = corp()
    batch = [CHECKS[i % len(CHECKS)] for i in range(100)]
    answers = engine.evaluate_many(batch)
    conforms(answers, list[Decision])
    assert len(answers) == len(batch)
    assert keys_seen(answers) == declared(Decision)


def test_plans_are_plans() -> None:
    engine = corp()
    plans = [engine.plan(req) for req in PLANS]
    # Paging with the first plan's qid answers the same plan again, pinned.
    plans.append(engine.plan({**PLANS[0], "plan_qid": plans[0]["qid"]}))
    for p in plans:
        conforms(p, Plan)
    assert keys_seen(plans) == declared(Plan)
    assert {p["outcome"] for p in plans} == set(get_args(PlanOutcome))
    assert {p["pinned"] for p in plans} == {True, False}
    # `filter` is present exactly for the outcomes docs/plans.md gives one.
    for p in plans:
        assert ("filter" in p) == (p["outcome"] in ("conditional", "challenge")), p


SCHEMA = """
entity Human = { level: Long };
entity Folder in [Folder];
entity Doc in [Folder] = {
  owner: Human, dept: String, level?: Long, title: String, tags: Set<String>
};
action view, edit appliesTo { principal: [Human], resource: [Doc] };
"""
# One policy per filter operator (docs/plans.md, "The filter tree").
POLICIES = """
@id("compare") permit (principal, action == Action::"view", resource) when { resource.owner == principal };
@id("has") permit (principal, action == Action::"view", resource) when { resource has level && resource.level < 3 };
@id("contains") permit (principal, action == Action::"view", resource) when { resource.tags.contains("a") };
@id("contains_any") permit (principal, action == Action::"view", resource) when { resource.tags.containsAny(["a", "b"]) };
@id("contains_all") permit (principal, action == Action::"view", resource) when { resource.tags.containsAll(["a", "b"]) };
@id("like") permit (principal, action == Action::"view", resource) when { resource.title like "Q*" };
@id("in") permit (principal, action == Action::"view", resource in Folder::"f1");
@id("is") permit (principal, action == Action::"view", resource == Doc::"d1");
@id("unknown") permit (principal, action == Action::"view", resource) when { resource.owner.level > 2 };
@id("unmappable") permit (principal, action == Action::"view", resource) when { resource has level && resource.level + 1 > 4 };
@id("not") forbid (principal, action == Action::"view", resource) when { resource.dept == "secret" };
@id("edit") permit (principal, action == Action::"edit", resource);
@id("step-up") @challenge("verification") forbid (principal, action == Action::"edit", resource);
"""


def test_filter_trees_of_every_operator_are_filter_nodes() -> None:
    engine = Engine(
        POLICIES, SCHEMA, [{"uid": ref("Human", "u1"), "attrs": {"level": 1}, "parents": []}]
    )
    u1 = ref("Human", "u1")
    view = engine.plan({"principal": u1, "action": "view", "resource_type": "Doc"})
    edit = engine.plan({"principal": u1, "action": "edit", "resource_type": "Doc"})
    for p in (view, edit):
        conforms(p, Plan)
        assert "filter" in p
    conforms(view["filter"], FilterNode)
    ops = {n["op"] for p in (view, edit) for n in filter_nodes(p["filter"])}
    every_op = {op for node in get_args(FilterNode) for op in get_args(node.__annotations__["op"])}
    # `false` is folded away by simplification (docs/plans.md), so no plan carries it; the
    # type keeps it because the filter contract has it. Every other operator is exercised.
    assert ops == every_op - {"false"}


def test_the_stub_returns_these_types_and_svc_pdp_exports_them() -> None:
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    returns = {
        f.name: ast.unparse(f.returns)
        for f in engine.body
        if isinstance(f, ast.FunctionDef) and f.returns is not None
    }
    assert returns["evaluate"] == "Decision"
    assert returns["evaluate_many"] == "list[Decision]"
    assert returns["decide"] == "DecisionRecord"
    assert returns["plan"] == "Plan"
    assert set(SHAPES) <= set(svc.pdp.__all__)
    for name in SHAPES:
        assert getattr(svc.pdp, name) is getattr(svc.pdp.shapes, name)


@pytest.mark.parametrize(
    ("changes", "drop", "message"),
    [
        ({"verdict": "permit"}, None, "verdict"),
        ({"mode": "audit"}, None, "mode"),
        ({"extra": 1}, None, "extra"),
        ({}, "qid", "qid"),
    ],
)
def test_the_check_catches_a_drifted_answer(
    changes: dict[str, Any], drop: str | None, message: str
) -> None:
    answer: dict[str, Any] = {**corp().evaluate(CHECKS[0]), **changes}
    if drop:
        del answer[drop]
    with pytest.raises(TypeCheckError, match=message):
        conforms(answer, Decision)


def test_the_check_catches_a_drifted_filter_node_deep_in_the_tree() -> None:
    plan = corp().plan(PLANS[0])
    assert plan["filter"]["op"] == "or"
    plan["filter"]["args"][1]["cmp"] = "equals"
    with pytest.raises(TypeCheckError, match="cmp"):
        conforms(plan, Plan)
