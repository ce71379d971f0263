"""The entity store: incremental upserts and removals, atomic snapshots, versions, service
account registration, containment and risk scores; bad input changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from svc.pdp import Engine, RequestError

CORP = Path(__file__).parent / "testdata" / "bundles" / "corp"
H = lambda i: {"type": "Human", "id": i}  # noqa: E731


def human(uid: str, dept: str = "engineering", groups: tuple[str, ...] = ()) -> dict:
    return {
        "uid": H(uid),
        "attrs": {"department": dept},
        "parents": [{"type": "Group", "id": g} for g in groups],
    }


def view(principal: dict, doc: str = "design") -> dict:
    return {"principal": principal, "action": "view", "resource": {"type": "Document", "id": doc}}


@pytest.fixture
def engine() -> Engine:
    return Engine.from_bundle_dir(CORP)


def test_upsert_and_remove_move_principals_version(engine: Engine) -> None:
    v0 = engine.versions
    assert engine.upsert_entities([human("zed", "engineering")]) == 1
    v1 = engine.versions
    assert v1["principals_version"] == v0["principals_version"] + 1
    assert v1["resources_version"] == v0["resources_version"]
    assert engine.evaluate(view(H("zed")))["verdict"] == "allow"
    engine.upsert_entities([human("zed", "sales")])
    assert engine.evaluate(view(H("zed")))["verdict"] == "deny"
    assert engine.remove_entities([H("zed"), H("never-there")]) == 1
    assert engine.versions["principals_version"] == v1["principals_version"] + 2
    doc = {
        "uid": {"type": "Document", "id": "new"},
        "attrs": {"owner": H("zed"), "department": "x", "sensitivity": "internal", "tags": []},
        "parents": [],
    }
    engine.upsert_entities([doc])
    assert engine.versions["resources_version"] == v1["resources_version"] + 1


def test_store_entities_override_bundle_entities(engine: Engine) -> None:
    assert engine.evaluate(view(H("alice")))["verdict"] == "allow"
    engine.upsert_entities([human("alice", "sales")])
    # alice still owns `design` (owner-full-access) but no longer shares its department
    assert engine.evaluate(view(H("alice")))["policies"] == ["owner-full-access"]


def test_bad_batch_is_rejected_whole(engine: Engine) -> None:
    v = engine.versions
    bad = {"uid": H("x"), "attrs": {"department": 7}, "parents": []}
    with pytest.raises(RequestError) as info:
        engine.upsert_entities([human("ok1"), bad])
    assert info.value.field == "entities[1]"
    assert engine.versions == v and engine.store_size == 0
    with pytest.raises(RequestError) as info:
        engine.upsert_entities([human("a1"), human("a1")])
    assert "duplicate" in str(info.value)
    with pytest.raises(RequestError) as info:
        engine.upsert_entities([{"uid": {"type": "Planet", "id": "p"}, "attrs": {}, "parents": []}])
    assert info.value.field == "entities[0].uid.type"
    with pytest.raises(RequestError):
        engine.remove_entities([H("a"), {"type": "Human"}])
    assert engine.versions == v


def test_replace_entities_is_one_snapshot(engine: Engine) -> None:
    engine.upsert_entities([human("p1"), human("p2")])
    assert engine.replace_entities([human("p3")]) == 1
    assert engine.store_size == 1
    with pytest.raises(RequestError):
        engine.replace_entities([human("p4"), {"uid": H("p5")}])
    assert engine.store_size == 1


def test_service_account_registration_lifecycle(engine: Engine) -> None:
    sa = {"type": "ServiceAccount", "id": "crm.sync"}
    req = {"principal": sa, "action": "view", "resource": {"type": "Document", "id": "handbook"}}
    assert engine.evaluate(req)["policies"] == ["svc:unregistered"]
    engine.register_service_accounts(
        [{"id": "crm.sync", "owner": "alice", "ai": False, "groups": [], "description": "sync"}]
    )
    assert engine.evaluate(req)["verdict"] == "allow"
    assert engine.unregister_service_accounts(["crm.sync"]) == 1
    assert engine.evaluate(req)["policies"] == ["svc:unregistered"]
    with pytest.raises(RequestError) as info:
        engine.register_service_accounts(
            [{"id": "a.b", "owner": "alice"}, {"id": "", "owner": "x"}]
        )
    assert info.value.field == "service_accounts[1].id"
    with pytest.raises(RequestError) as info:
        engine.register_service_accounts([{"id": "a.b", "owner": "alice", "ai": "yes"}])
    assert info.value.field == "service_accounts[0].ai"
    with pytest.raises(RequestError) as info:
        engine.register_service_accounts([{"id": "a.b", "owner": "alice", "colour": "red"}])
    assert info.value.field == "service_accounts[0].colour"


def test_containment_and_lift(engine: Engine) -> None:
    req = view(H("alice"))
    engine.contain([H("alice")])
    assert engine.evaluate(req)["policies"] == ["svc:contained"]
    engine.lift([H("alice")])
    assert engine.evaluate(req)["verdict"] == "allow"
    engine.set_containments([H("alice"), H("bob")])
    assert engine.evaluate(req)["verdict"] == "deny"
    engine.set_containments([])
    assert engine.evaluate(req)["verdict"] == "allow"
    with pytest.raises(RequestError):
        engine.contain(["not a reference"])


def test_risk_scores_validate_and_replace(engine: Engine) -> None:
    req = view(H("alice"))
    engine.set_risk_scores([{"principal": H("alice"), "score": 90}])
    assert engine.evaluate(req)["challenges"] == ["approval"]
    engine.set_risk_scores([{"principal": H("bob"), "score": 1}], replace=True)
    assert engine.evaluate(req)["verdict"] == "allow"
    for bad in ([{"principal": H("a"), "score": 101}], [{"principal": H("a")}], [{"score": 5}]):
        with pytest.raises(RequestError):
            engine.set_risk_scores(bad)


def test_work_item_validation(engine: Engine) -> None:
    with pytest.raises(RequestError) as info:
        engine.upsert_work_items([{"id": "jira:A-1", "status": "maybe"}])
    assert info.value.field == "work_items[0].status"
    with pytest.raises(RequestError) as info:
        engine.upsert_work_items([{"id": "jira:A-1", "links": ["nope"]}])
    assert info.value.field == "work_items[0].links[0]"
    assert engine.upsert_work_items([{"id": "jira:A-1", "status": "closed", "links": []}]) == 1
    assert engine.remove_work_items(["jira:A-1", "jira:A-2"]) == 1


def test_mode_is_reported_never_applied(engine: Engine) -> None:
    engine.set_mode("monitor")
    assert engine.mode == "monitor"
    resp = engine.evaluate(view(H("bob")))
    assert resp["verdict"] == "deny" and resp["mode"] == "monitor"
    with pytest.raises(RequestError) as info:
        engine.set_mode("audit")
    assert info.value.field == "mode"


def test_check_reaches_only_its_slice_of_a_large_store(engine: Engine) -> None:
    engine.upsert_entities([human(f"user{i}", "sales", ("staff",)) for i in range(20_000)])
    assert engine.store_size == 20_000
    assert engine.evaluate(view(H("alice")))["verdict"] == "allow"
    assert engine.evaluate(view(H("user19999")))["verdict"] == "deny"
