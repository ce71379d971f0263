"""Snapshot plus watch under concurrent writers (docs/context.md#versions-and-feeds).

A hypothesis property: whatever SCIM and registration writes several clients make at once, a
follower that loads the snapshot and applies the watch's changes in order ends with exactly the
principals the database holds, having seen exactly the database's changes after its snapshot,
in order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from test_context import GROUP, PATCH, Live, database_url, scim_user

__all__ = ["database_url"]  # the fixture, shared with tests/test_context.py

PEOPLE = [f"p{i}@example.com" for i in range(5)]
GROUPS = ["red", "green", "blue"]

op = st.one_of(
    st.tuples(st.just("create_user"), st.sampled_from(PEOPLE)),
    st.tuples(st.just("set_active"), st.sampled_from(PEOPLE), st.booleans()),
    st.tuples(st.just("delete_user"), st.sampled_from(PEOPLE)),
    st.tuples(st.just("create_group"), st.sampled_from(GROUPS)),
    st.tuples(st.just("add_member"), st.sampled_from(GROUPS), st.sampled_from(PEOPLE)),
    st.tuples(st.just("remove_member"), st.sampled_from(GROUPS), st.sampled_from(PEOPLE)),
    st.tuples(st.just("nest"), st.sampled_from(GROUPS), st.sampled_from(GROUPS)),
    st.tuples(st.just("delete_group"), st.sampled_from(GROUPS)),
    st.tuples(st.just("rescore"), st.sampled_from(PEOPLE), st.integers(0, 100)),
    st.tuples(st.just("register"), st.sampled_from(["bot.a", "bot.b"]), st.sampled_from(PEOPLE)),
)


@pytest.fixture
def shared(database_url: str) -> Iterator[Live]:
    """One live service for every example (each example starts from a fresh snapshot)."""
    svc = Live(database_url, max_changes=7)  # small pages: the watch must page too
    yield svc
    svc.stop()


def _find(scim: httpx.Client, endpoint: str, attr: str, value: str) -> str | None:
    r = scim.get(endpoint, params={"filter": f'{attr} eq "{value}"'})
    assert r.status_code == 200, r.text
    found = r.json().get("Resources") or []
    return found[0]["id"] if found else None


def run_op(live: Live, scim: httpx.Client, http: httpx.Client, o: tuple[Any, ...]) -> None:
    """Runs one write; refusals a concurrent writer can cause (404, 409, 400) are fine."""
    name = o[0]
    if name == "create_user":
        r = scim.post("/Users", json=scim_user(o[1]))
    elif name == "set_active":
        uid = _find(scim, "/Users", "userName", o[1])
        if uid is None:
            return
        r = scim.patch(
            f"/Users/{uid}",
            json={"schemas": [PATCH], "Operations": [{"op": "replace", "value": {"active": o[2]}}]},
        )
    elif name == "delete_user":
        uid = _find(scim, "/Users", "userName", o[1])
        if uid is None:
            return
        r = scim.delete(f"/Users/{uid}")
    elif name == "create_group":
        r = scim.post("/Groups", json={"schemas": [GROUP], "displayName": o[1]})
    elif name in ("add_member", "remove_member", "nest"):
        gid = _find(scim, "/Groups", "displayName", o[1])
        mid = (
            _find(scim, "/Groups", "displayName", o[2])
            if name == "nest"
            else _find(scim, "/Users", "userName", o[2])
        )
        if gid is None or mid is None:
            return
        operation = (
            {"op": "remove", "path": f'members[value eq "{mid}"]'}
            if name == "remove_member"
            else {"op": "add", "path": "members", "value": [{"value": mid}]}
        )
        r = scim.patch(f"/Groups/{gid}", json={"schemas": [PATCH], "Operations": [operation]})
    elif name == "delete_group":
        gid = _find(scim, "/Groups", "displayName", o[1])
        if gid is None:
            return
        r = scim.delete(f"/Groups/{gid}")
    elif name == "rescore":
        r = http.post(
            "/v1/risk",
            json={"scores": [{"principal": {"type": "Human", "id": o[1]}, "score": o[2]}]},
        )
    else:
        r = http.post(
            "/v1/service-accounts",
            json={"service_accounts": [{"id": o[1], "owner": o[2], "ai": True}]},
        )
    assert r.status_code < 500, (o, r.status_code, r.text)


def state_of(records: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, bool]]:
    return {(p["kind"], p["id"]): (p["value"], p["removed"]) for p in records}


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(writers=st.lists(st.lists(op, min_size=1, max_size=12), min_size=2, max_size=4))
def test_watch_follows_every_change_in_order(shared: Live, writers: list[list[Any]]) -> None:
    live = shared
    snap = live.http.get("/v1/principals").json()
    start = snap["principals_version"]
    state = state_of(snap["principals"])
    seen: list[dict[str, Any]] = []
    target: dict[str, int] = {}
    done = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:
        version = start
        try:
            with httpx.Client(base_url=live.url, timeout=120) as c:
                while not (done.is_set() and version >= target["v"]):
                    r = c.get("/v1/principals/watch", params={"after": version, "wait_secs": 2})
                    assert r.status_code == 200, r.text
                    body = r.json()
                    for ch in body["changes"]:
                        assert ch["version"] > version, (ch, version)
                        version = ch["version"]
                        seen.append(ch)
                        key = (ch["kind"], ch["id"])
                        if ch["value"] is None:
                            state.pop(key, None)
                        else:
                            state[key] = (ch["value"], ch["removed"])
                    assert body["principals_version"] == version
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    def write(ops: list[Any]) -> None:
        try:
            with (
                httpx.Client(
                    base_url=f"{live.url}/scim/v2",
                    timeout=120,
                    headers=dict(live.scim.headers),
                ) as scim,
                httpx.Client(base_url=live.url, timeout=120) as http,
            ):
                for o in ops:
                    run_op(live, scim, http, o)
        except BaseException as e:
            errors.append(e)

    follower = threading.Thread(target=follow)
    follower.start()
    threads = [threading.Thread(target=write, args=(ops,)) for ops in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = live.http.get("/v1/principals").json()
    target["v"] = final["principals_version"]
    done.set()
    follower.join()
    assert not errors, errors

    # The follower holds the snapshot, which is what the database holds.
    assert state == state_of(final["principals"])
    engine = create_engine(live.settings.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT kind, id, value, removed FROM principals")).all()
            changes = conn.execute(
                text(
                    "SELECT seq, kind, key FROM changes WHERE feed = 'principals' AND seq > :s "
                    "ORDER BY seq"
                ),
                {"s": start},
            ).all()
    finally:
        engine.dispose()
    assert state == {(k, i): (v, rm) for k, i, v, rm in rows}
    # Every change the database numbered after the snapshot reached the follower, in order.
    assert [(c["version"], c["kind"], c["id"]) for c in seen] == [tuple(c) for c in changes]
