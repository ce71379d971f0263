"""The request sequences Okta and Microsoft Entra ID send, against the live service
(docs/context.md#identity-providers), and what each does to the principals snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from test_context import (
    ENTERPRISE,
    GROUP,
    PATCH,
    Live,
    database_url,
    principal,
    scim_user,
    snapshot,
)

__all__ = ["database_url"]  # the fixture, shared with tests/test_context.py


@pytest.fixture
def idp(database_url: str) -> Iterator[Live]:
    svc = Live(database_url)
    yield svc
    svc.stop()


def human(live: Live, user_name: str) -> dict[str, Any]:
    p = principal(snapshot(live), "Human", user_name)
    assert p is not None, user_name
    return p


def patch(live: Live, path: str, *ops: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = live.scim.patch(path, json={"schemas": [PATCH], "Operations": list(ops)})
    assert r.status_code in (status, 204), r.text
    return r.json() if r.status_code == 200 else {}


def test_okta_sequence(idp: Live) -> None:
    live = idp
    # Import: Okta pages through users 100 at a time; then looks the user up before a create.
    r = live.scim.get("/Users", params={"startIndex": 1, "count": 100})
    assert r.status_code == 200 and r.json()["totalResults"] == 0
    r = live.scim.get(
        "/Users", params={"filter": 'userName eq "dana@example.com"', "startIndex": 1, "count": 100}
    )
    assert r.json()["totalResults"] == 0
    # Create.
    created = live.scim.post(
        "/Users",
        json=scim_user(
            "dana@example.com", displayName="Dana", externalId="00u1okta", title="Engineer"
        ),
    )
    assert created.status_code == 201, created.text
    uid = created.json()["id"]
    boss = live.scim.post("/Users", json=scim_user("boss@example.com")).json()["id"]
    assert live.scim.get(f"/Users/{uid}").json()["userName"] == "dana@example.com"
    # The lookup is case-insensitive (userName is caseExact false, RFC 7643 section 4.1.1).
    r = live.scim.get("/Users", params={"filter": 'userName eq "DANA@example.com"'})
    assert [u["id"] for u in r.json()["Resources"]] == [uid]
    # Profile change: Okta PUTs the whole user.
    whole = live.scim.get(f"/Users/{uid}").json()
    whole["title"] = "Staff engineer"
    whole[ENTERPRISE] = {"department": "Platform", "manager": {"value": boss}}
    r = live.scim.put(f"/Users/{uid}", json=whole)
    assert r.status_code == 200, r.text
    h = human(live, "dana@example.com")["value"]
    assert h["attrs"] == {
        "active": True,
        "department": "Platform",
        "title": "Staff engineer",
        "manager": {"__entity": {"type": "Human", "id": "boss@example.com"}},
    }
    # Groups: create with a member (value and display only), rename, add and remove members.
    g = live.scim.post(
        "/Groups",
        json={
            "schemas": [GROUP],
            "displayName": "eng",
            "members": [{"value": uid, "display": "Dana"}],
        },
    )
    assert g.status_code == 201, g.text
    gid = g.json()["id"]
    assert human(live, "dana@example.com")["value"]["parents"] == [{"type": "Group", "id": "eng"}]
    patch(
        live,
        f"/Groups/{gid}",
        {"op": "replace", "value": {"id": gid, "displayName": "engineering"}},
    )
    snap = snapshot(live)
    assert principal(snap, "Group", "eng") is None
    assert principal(snap, "Group", "engineering") is not None
    assert principal(snap, "Human", "dana@example.com")["value"]["parents"] == [
        {"type": "Group", "id": "engineering"}
    ]
    patch(
        live,
        f"/Groups/{gid}",
        {"op": "add", "path": "members", "value": [{"value": boss, "display": "Boss"}]},
    )
    assert human(live, "boss@example.com")["value"]["parents"] == [
        {"type": "Group", "id": "engineering"}
    ]
    patch(live, f"/Groups/{gid}", {"op": "remove", "path": f'members[value eq "{uid}"]'})
    assert human(live, "dana@example.com")["value"]["parents"] == []
    # Okta lists groups without their members.
    r = live.scim.get(
        "/Groups", params={"excludedAttributes": "members", "startIndex": 1, "count": 100}
    )
    assert r.status_code == 200
    assert [x["displayName"] for x in r.json()["Resources"]] == ["engineering"]
    assert "members" not in r.json()["Resources"][0]
    # Deactivation: PATCH active false without a path.
    patch(live, f"/Users/{uid}", {"op": "replace", "value": {"active": False}})
    assert human(live, "dana@example.com")["value"]["attrs"]["active"] is False
    assert live.scim.get(f"/Users/{uid}").json()["active"] is False
    # Reactivation, then deactivation by PUT.
    patch(live, f"/Users/{uid}", {"op": "replace", "value": {"active": True}})
    assert human(live, "dana@example.com")["value"]["attrs"]["active"] is True
    whole = live.scim.get(f"/Users/{uid}").json()
    whole["active"] = False
    assert live.scim.put(f"/Users/{uid}", json=whole).status_code == 200
    assert human(live, "dana@example.com")["value"]["attrs"]["active"] is False
    # Group deleted: its members lose it.
    assert live.scim.delete(f"/Groups/{gid}").status_code == 204
    snap = snapshot(live)
    assert principal(snap, "Group", "engineering") is None
    assert principal(snap, "Human", "boss@example.com")["value"]["parents"] == []


def test_entra_sequence(idp: Live) -> None:
    live = idp
    # Entra looks users up by userName (and by externalId when so mapped) before creating.
    r = live.scim.get("/Users", params={"filter": 'userName eq "lee@contoso.com"'})
    assert r.json()["totalResults"] == 0
    body = scim_user("lee@contoso.com", externalId="lee", displayName="Lee")
    body[ENTERPRISE] = {"department": "Sales"}
    uid = live.scim.post("/Users", json=body).json()["id"]
    mgr = live.scim.post("/Users", json=scim_user("max@contoso.com", externalId="max")).json()["id"]
    r = live.scim.get("/Users", params={"filter": 'externalId eq "lee"'})
    assert [u["id"] for u in r.json()["Resources"]] == [uid]
    # Capitalised ops, attribute paths with filters, the enterprise manager by path.
    patch(
        live,
        f"/Users/{uid}",
        {"op": "Replace", "path": 'emails[type eq "work"].value', "value": "lee.new@contoso.com"},
        {"op": "Replace", "path": "name.familyName", "value": "Lee-Smith"},
        {"op": "Add", "path": f"{ENTERPRISE}:manager", "value": mgr},
        {"op": "Replace", "path": "title", "value": "Account executive"},
    )
    u = live.scim.get(f"/Users/{uid}").json()
    assert u["emails"][0]["value"] == "lee.new@contoso.com"
    assert u["name"]["familyName"] == "Lee-Smith"
    assert u[ENTERPRISE]["manager"]["value"] == mgr
    h = human(live, "lee@contoso.com")["value"]["attrs"]
    assert h["manager"] == {"__entity": {"type": "Human", "id": "max@contoso.com"}}
    assert h["title"] == "Account executive" and h["department"] == "Sales"
    # Groups: lookup without members, create empty, add members in a value array, remove some.
    r = live.scim.get(
        "/Groups", params={"filter": 'displayName eq "Sales"', "excludedAttributes": "members"}
    )
    assert r.json()["totalResults"] == 0
    gid = live.scim.post(
        "/Groups", json={"schemas": [GROUP], "displayName": "Sales", "externalId": "g1"}
    ).json()["id"]
    patch(
        live,
        f"/Groups/{gid}",
        {"op": "Add", "path": "members", "value": [{"value": uid}, {"value": mgr}]},
    )
    assert human(live, "max@contoso.com")["value"]["parents"] == [{"type": "Group", "id": "Sales"}]
    patch(live, f"/Groups/{gid}", {"op": "Remove", "path": "members", "value": [{"value": mgr}]})
    assert human(live, "max@contoso.com")["value"]["parents"] == []
    assert human(live, "lee@contoso.com")["value"]["parents"] == [{"type": "Group", "id": "Sales"}]
    # userName change: the person's principal record moves to the new name; reports follow.
    patch(
        live, f"/Users/{mgr}", {"op": "Replace", "path": "userName", "value": "maxine@contoso.com"}
    )
    snap = snapshot(live)
    assert principal(snap, "Human", "max@contoso.com") is None
    assert principal(snap, "Human", "maxine@contoso.com") is not None
    assert principal(snap, "Human", "lee@contoso.com")["value"]["attrs"]["manager"] == {
        "__entity": {"type": "Human", "id": "maxine@contoso.com"}
    }
    # Deactivation: "False" as a string, with and without a path.
    patch(live, f"/Users/{uid}", {"op": "Replace", "path": "active", "value": "False"})
    assert human(live, "lee@contoso.com")["value"]["attrs"]["active"] is False
    patch(live, f"/Users/{uid}", {"op": "Replace", "value": {"active": "True"}})
    assert human(live, "lee@contoso.com")["value"]["attrs"]["active"] is True
    # Deletion: the person is kept as removed, leaves the group, and SCIM no longer finds it.
    assert live.scim.delete(f"/Users/{uid}").status_code == 204
    assert live.scim.get(f"/Users/{uid}").status_code == 404
    p = human(live, "lee@contoso.com")
    assert (
        p["removed"] is True
        and p["value"]["attrs"]["active"] is False
        and p["value"]["parents"] == []
    )
    g = live.scim.get(f"/Groups/{gid}").json()
    assert "members" not in g or g["members"] == []
    people = live.http.get("/v1/directory/people", params={"include_removed": "true"}).json()[
        "people"
    ]
    assert [(p["user_name"], p["removed"]) for p in people] == [
        ("lee@contoso.com", True),
        ("maxine@contoso.com", False),
    ]
