"""Property tests (hypothesis).

1. Dual-principal combination (docs/decisions.md#an-agent-acting-for-a-person): for any pair of
   agent/person outcomes, containment and presence, the engine's answer equals a direct model of
   the rules.
2. Atomic snapshot swaps: checks running while snapshots and bundles are swapped never see
   half of an update.
3. Group hierarchy: after any sequence of upserts and removals of groups and users, `principal
   in Group` answers as a direct reachability model says, on the pre-closed fast path and on the
   inline-entity path where Cedar computes the closure itself.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svc.pdp import Engine, RequestError

SCHEMA = """
entity Group;
entity Human in [Group] = { v: String, c: String };
entity ServiceAccount in [Group] = { v: String, c: String, owner: Human, ai: Bool, registered: Bool, app: String };
entity Doc;
action act appliesTo { principal: [Human, ServiceAccount], resource: [Doc] };
"""
# `v` picks what the permits say, `c` what the step-up forbids say, per principal.
POLICIES = """
@id("allow") permit (principal, action, resource) when { principal.v == "allow" };
@id("p-verification") @challenge("verification")
permit (principal, action, resource) when { principal.v == "verification" };
@id("p-approval") @challenge("approval")
permit (principal, action, resource) when { principal.v == "approval" };
@id("forbid") forbid (principal, action, resource) when { principal.c == "forbid" };
@id("f-justification") @challenge("justification")
forbid (principal, action, resource) when { principal.c == "justification" };
@id("f-verification") @challenge("verification")
forbid (principal, action, resource) when { principal.c == "verification" };
"""
PERMITS = {
    "allow": ("allow", []),
    "verification": ("p-verification", ["verification"]),
    "approval": ("p-approval", ["approval"]),
    "none": (None, []),
}
FORBIDS = {
    "forbid": "forbid",
    "justification": "f-justification",
    "verification": "f-verification",
    "none": None,
}
ORDER = {"allow": 0, "challenge": 1, "deny": 2}


def model(v: str, c: str, contained: bool, present: bool) -> tuple[str, list[str], list[str]]:
    """The verdict rules of docs/decisions.md for one principal, written out directly."""
    if contained:
        return "deny", [], ["svc:contained"]
    permit, pkinds = PERMITS[v]
    forbid = FORBIDS[c]
    if forbid == "forbid":
        return "deny", [], ["forbid"]
    if forbid is not None and permit is not None:
        kinds = {c} | (set(pkinds) if v != "allow" else set())
        verdict, kinds_l, pols = "challenge", sorted(kinds), sorted([forbid, permit])
    elif permit == "allow":
        verdict, kinds_l, pols = "allow", [], ["allow"]
    elif permit is not None:
        verdict, kinds_l, pols = "challenge", pkinds, [permit]
    else:
        return "deny", [], []
    if verdict == "challenge" and not present and "verification" in kinds_l:
        return "deny", [], [*pols, "svc:human_not_present"]
    return verdict, kinds_l, pols


def engine_with(agent: tuple[str, str], person: tuple[str, str]) -> Engine:
    engine = Engine(policies=POLICIES, schema=SCHEMA)
    engine.upsert_entities(
        [
            {
                "uid": {"type": "Human", "id": "p"},
                "attrs": {"v": person[0], "c": person[1]},
                "parents": [],
            },
            {
                "uid": {"type": "ServiceAccount", "id": "app.a"},
                "attrs": {
                    "v": agent[0],
                    "c": agent[1],
                    "owner": {"__entity": {"type": "Human", "id": "p"}},
                    "ai": True,
                    "registered": True,
                    "app": "app",
                },
                "parents": [],
            },
        ]
    )
    return engine


outcome = st.tuples(st.sampled_from(sorted(PERMITS)), st.sampled_from(sorted(FORBIDS)))


@settings(max_examples=300, deadline=None)
@given(
    agent=outcome,
    person=outcome,
    agent_contained=st.booleans(),
    person_contained=st.booleans(),
    present=st.booleans(),
)
def test_dual_principal_combination(
    agent: tuple[str, str],
    person: tuple[str, str],
    agent_contained: bool,
    person_contained: bool,
    present: bool,
) -> None:
    engine = engine_with(agent, person)
    contained = ([{"type": "ServiceAccount", "id": "app.a"}] if agent_contained else []) + (
        [{"type": "Human", "id": "p"}] if person_contained else []
    )
    engine.set_containments(contained)
    resp = engine.evaluate(
        {
            "principal": {"type": "ServiceAccount", "id": "app.a"},
            "on_behalf_of": {"type": "Human", "id": "p"},
            "action": "act",
            "resource": {"type": "Doc", "id": "d"},
            "human_present": present,
        }
    )
    a = model(*agent, agent_contained, present)
    p = model(*person, person_contained, present)
    want = max(a[0], p[0], key=ORDER.__getitem__)
    assert resp["verdict"] == want
    assert resp["policies"] == a[2]
    assert resp["on_behalf_of"] == {"verdict": p[0], "challenges": p[1], "policies": p[2]}
    if want == "challenge":
        assert resp["challenges"] == sorted(set(a[1]) | set(p[1]))
        assert resp["challenges"]
    else:
        assert resp["challenges"] == []
    # Stricter wins: the combined verdict is never weaker than either principal's own.
    assert ORDER[resp["verdict"]] >= ORDER[a[0]] and ORDER[resp["verdict"]] >= ORDER[p[0]]


SNAP_SCHEMA = """
entity Human = { gen: Long };
entity Doc = { gen: Long };
action read appliesTo { principal: [Human], resource: [Doc] };
"""


def snapshot(gen: int, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"uid": {"type": "Human", "id": f"u{i}"}, "attrs": {"gen": gen}, "parents": []})
        out.append({"uid": {"type": "Doc", "id": f"d{i}"}, "attrs": {"gen": gen}, "parents": []})
    return out


@settings(max_examples=8, deadline=None)
@given(
    generations=st.integers(min_value=5, max_value=40),
    size=st.integers(min_value=1, max_value=50),
    readers=st.integers(min_value=1, max_value=3),
)
def test_snapshot_swaps_are_atomic_under_concurrent_checks(
    generations: int, size: int, readers: int
) -> None:
    # A principal and a document always carry the same generation within one snapshot; the
    # policy allows only when they match, so a check that saw half a swap would be denied.
    policies = {
        "a.cedar": '@id("same-gen-a") permit (principal, action, resource) when { principal.gen == resource.gen };'
    }
    policies_b = {
        "b.cedar": '@id("same-gen-b") permit (principal, action, resource) when { principal.gen == resource.gen };'
    }
    engine = Engine(policies=policies, schema=SNAP_SCHEMA)
    engine.replace_entities(snapshot(0, size))
    requests = [
        {
            "principal": {"type": "Human", "id": f"u{i % size}"},
            "action": "read",
            "resource": {"type": "Doc", "id": f"d{i % size}"},
        }
        for i in range(200)
    ]
    stop = threading.Event()
    bad: list[dict[str, Any]] = []
    checked = [0]

    def reader() -> None:
        while not stop.is_set():
            for r in engine.evaluate_many(requests):
                if r["verdict"] != "allow" or r["policies"] not in (["same-gen-a"], ["same-gen-b"]):
                    bad.append(r)
            checked[0] += len(requests)

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for t in threads:
        t.start()
    try:
        for gen in range(1, generations + 1):
            engine.replace_entities(snapshot(gen, size))
            if gen % 5 == 0:
                engine.load_bundle(
                    policies=policies_b if gen % 10 else policies, schema=SNAP_SCHEMA
                )
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:3]
    assert checked[0] > 0


HIER_GROUPS = [f"g{k}" for k in range(5)]
HIER_USERS = ["u0", "u1", "u2"]
HIER_SCHEMA = """
entity Group in [Group];
entity User in [Group];
entity Doc;
action view appliesTo { principal: [User], resource: [Doc] };
"""
# One permit per group: the policies a check reports are exactly the groups the user is in.
HIER_POLICIES = "\n".join(
    f'@id("{g}") permit (principal in Group::"{g}", action, resource);' for g in HIER_GROUPS
)

hier_op = st.one_of(
    st.tuples(
        st.just("group"), st.sampled_from(HIER_GROUPS), st.sets(st.sampled_from(HIER_GROUPS))
    ),
    st.tuples(st.just("user"), st.sampled_from(HIER_USERS), st.sets(st.sampled_from(HIER_GROUPS))),
    st.tuples(st.just("remove"), st.sampled_from(HIER_GROUPS), st.just(frozenset())),
)


def _reach(parents: dict[str, set[str]], start: set[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(start)
    while stack:
        g = stack.pop()
        if g not in seen:
            seen.add(g)
            stack.extend(parents.get(g, ()))
    return seen


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(hier_op, min_size=1, max_size=12))
def test_group_hierarchy_follows_every_change(ops: list[tuple[str, str, Any]]) -> None:
    engine = Engine(HIER_POLICIES, HIER_SCHEMA)
    groups: dict[str, set[str]] = {}
    users: dict[str, set[str]] = {}
    for kind, name, parents in ops:
        ps = [{"type": "Group", "id": p} for p in sorted(parents)]
        if kind == "group":
            entity = {"uid": {"type": "Group", "id": name}, "attrs": {}, "parents": ps}
            if name in _reach(groups, set(parents)):
                # Cedar requires a DAG: a group may not become its own ancestor.
                with pytest.raises(RequestError, match="cycle"):
                    engine.upsert_entities([entity])
                continue
            engine.upsert_entities([entity])
            groups[name] = set(parents)
        elif kind == "user":
            engine.upsert_entities(
                [{"uid": {"type": "User", "id": name}, "attrs": {}, "parents": ps}]
            )
            users[name] = set(parents)
        else:
            engine.remove_entities([{"type": "Group", "id": name}])
            groups.pop(name, None)
        for u, direct in users.items():
            want = sorted(_reach(groups, direct))
            req = {
                "principal": {"type": "User", "id": u},
                "action": "view",
                "resource": {"type": "Doc", "id": "d"},
            }
            assert engine.evaluate(req)["policies"] == want
            # An inline entity sends the check down the path where Cedar closes the slice.
            inline = {
                **req,
                "entities": [{"uid": {"type": "Doc", "id": "d"}, "attrs": {}, "parents": []}],
            }
            assert engine.evaluate(inline)["policies"] == want
