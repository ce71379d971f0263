"""The context service over real HTTP against PostgreSQL (docs/context.md).

Each test gets a fresh database on the suite's PostgreSQL (`postgres_url`) and a live service
(uvicorn in a thread, on a socket bound to a free 127.0.0.1 port before the server starts, so
no request has to wait for it to come up).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from svc.common.net import tcp_listener
from svc.context.app import create_app
from svc.context.migrate import HEAD, current_revision, migrate
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings

SCIM_TOKEN = "scim-" + "t" * 40
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


@pytest.fixture
def database_url(postgres_url: str) -> Iterator[str]:
    """A fresh, empty schema on the suite's PostgreSQL, as the database URL's search path;
    dropped afterwards."""
    url = make_url(postgres_url)
    name = f"ctx_{uuid.uuid4().hex[:12]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
        hide_password=False
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


class Live:
    """A running context service: its service layer, base URL and HTTP clients."""

    def __init__(self, database_url: str, **overrides: Any) -> None:
        self.settings = ContextSettings(
            database_url=database_url, scim_token=SCIM_TOKEN, port=0, **overrides
        )
        self.service = ContextService(self.settings)
        app = create_app(self.service, self.settings, ContextAuthSettings(auth="none"))
        self.sock = tcp_listener("127.0.0.1", 0)
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        self.http = httpx.Client(base_url=self.url, timeout=60)
        self.scim = httpx.Client(
            base_url=f"{self.url}/scim/v2",
            timeout=60,
            headers={"Authorization": f"Bearer {SCIM_TOKEN}"},
        )

    def stop(self) -> None:
        """Stops the server and closes the clients and the database connections."""
        self.http.close()
        self.scim.close()
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()
        self.service.close()


@pytest.fixture
def live(database_url: str) -> Iterator[Live]:
    """A live service on a fresh database."""
    svc = Live(database_url)
    yield svc
    svc.stop()


def scim_user(user_name: str, **extra: Any) -> dict[str, Any]:
    """A SCIM user document as identity providers send it."""
    return {
        "schemas": [USER, ENTERPRISE],
        "userName": user_name,
        "name": {"givenName": user_name.split("@")[0], "familyName": "Test"},
        "emails": [
            {
                "primary": True,
                "value": user_name if "@" in user_name else f"{user_name}@example.com",
                "type": "work",
            }
        ],
        "active": True,
        **extra,
    }


def create_user(live: Live, user_name: str, **extra: Any) -> dict[str, Any]:
    r = live.scim.post("/Users", json=scim_user(user_name, **extra))
    assert r.status_code == 201, r.text
    return r.json()


def create_group(live: Live, name: str, members: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"schemas": [GROUP], "displayName": name}
    if members:
        body["members"] = [{"value": m} for m in members]
    r = live.scim.post("/Groups", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def snapshot(live: Live) -> dict[str, Any]:
    r = live.http.get("/v1/principals")
    assert r.status_code == 200, r.text
    return r.json()


def principal(snap: dict[str, Any], kind: str, pid: str) -> dict[str, Any] | None:
    for p in snap["principals"]:
        if p["kind"] == kind and p["id"] == pid:
            return p
    return None


# -- migrations ------------------------------------------------------------------------------


def test_migrations_applied_twice_change_nothing(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        assert current_revision(engine) is None
        assert migrate(engine) == HEAD
        with engine.connect() as conn:
            tables = sorted(
                r[0]
                for r in conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
                )
            )
            counter = conn.execute(text("SELECT value FROM counters")).scalar_one()
        assert migrate(engine) == HEAD
        with engine.connect() as conn:
            again = sorted(
                r[0]
                for r in conn.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
                )
            )
            counters = conn.execute(text("SELECT name, value FROM counters")).all()
        assert again == tables
        assert "scim_users" in tables and "changes" in tables and "alembic_version" in tables
        assert counters == [("changes", counter)] and counter == 0
    finally:
        engine.dispose()


# -- probes and authentication ---------------------------------------------------------------


def test_probes_and_scim_token(live: Live) -> None:
    assert live.http.get("/healthz").json() == {"status": "ok"}
    ready = live.http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert live.http.get("/version").json()["component"] == "svc-context"
    assert "svc_context_rows" in live.http.get("/metrics").text
    # The service provider configuration needs no token (RFC 7643 section 5); the rest does.
    spc = live.http.get("/scim/v2/ServiceProviderConfig")
    assert spc.status_code == 200
    assert spc.json()["authenticationSchemes"][0]["type"] == "oauthbearertoken"
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {SCIM_TOKEN}"},
    ):
        r = live.http.get("/scim/v2/Users", headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert live.scim.get("/Users").status_code == 200


# -- scim2-tester ----------------------------------------------------------------------------


def test_scim2_tester_finds_no_failure(live: Live) -> None:
    import httpx2
    from scim2_client.engines.httpx2 import SyncSCIMClient
    from scim2_tester import Status, check_server

    with httpx2.Client(
        base_url=f"{live.url}/scim/v2",
        headers={"Authorization": f"Bearer {SCIM_TOKEN}"},
        timeout=60,
    ) as http:
        results = check_server(SyncSCIMClient(http), raise_exceptions=False)
    failures = [
        (r.title, r.status.name, r.reason)
        for r in results
        if r.status in (Status.ERROR, Status.CRITICAL)
    ]
    assert results and not failures, failures
    # Every check ran but the search across resource types, which the service does not offer.
    assert sum(r.status == Status.SUCCESS for r in results) >= 100
    assert {r.status for r in results} <= {Status.SUCCESS, Status.SKIPPED}


# -- lists and the snapshot at directory sizes (docs/context.md#scim, #principals) -----------


def test_lists_page_in_the_database_and_the_snapshot_is_the_directory(live: Live) -> None:
    boss = create_user(live, "boss@example.com", externalId="ext-boss")
    names = [f"u{i}@example.com" for i in range(5)] + ['zo\u00eb "q" \\ <x>']
    users = [
        create_user(
            live,
            n,
            externalId=f"ext-{i}",
            emails=[{"value": f"e{i}@example.com", "type": "work", "primary": True}],
            **{ENTERPRISE: {"department": "eng", "manager": {"value": boss["id"]}}},
        )
        for i, n in enumerate(names)
    ]
    assert live.scim.delete(f"/Users/{users[1]['id']}").status_code == 204
    present = [boss, users[0], *users[2:]]

    # Without a filter: counted and paged by the database, oldest first, removed users left out.
    def page(path: str, **params: Any) -> dict[str, Any]:
        r = live.scim.get(path, params=params)
        assert r.status_code == 200, r.text
        return dict(r.json())

    got = page("/Users", startIndex=2, count=3)
    assert got["totalResults"] == len(present) and got["startIndex"] == 2
    assert [u["id"] for u in got["Resources"]] == [u["id"] for u in present[1:4]]
    got = page("/Users", startIndex=6, count=3)
    assert [u["id"] for u in got["Resources"]] == [present[5]["id"]]
    got = page("/Users", count=0)
    assert got["totalResults"] == len(present) and not got.get("Resources")
    # externalId eq through its index; a removed user is not found.
    got = page("/Users", filter='externalId eq "ext-3"')
    assert [u["userName"] for u in got["Resources"]] == [names[3]]
    assert page("/Users", filter='externalId eq "ext-1"')["totalResults"] == 0
    # co, sw, ew of a column tried on the column first, then matched whole by scim2-models.
    for flt, want in (
        ('userName sw "U"', [names[0], *names[2:5]]),
        ('userName co "ZO\u00cb \\"Q"', [names[5]]),
        ('userName ew ".COM" and externalId eq "ext-3"', [names[3]]),
        ('externalId ew "-4" or userName eq "boss@example.com"', ["boss@example.com", names[4]]),
        ('externalId sw "EXT-"', []),
    ):
        got = page("/Users", filter=flt, count=3)
        assert got["totalResults"] == len(want), (flt, got)
        assert [u["userName"] for u in got.get("Resources", [])] == want[:3], flt

    # A group write names many members at once: each member's record gains the group.
    staff = create_group(live, "staff", [u["id"] for u in present[1:]])
    create_group(live, "all", [boss["id"], staff["id"]])
    got = page("/Groups", startIndex=2, count=1)
    assert got["totalResults"] == 2 and [g["displayName"] for g in got["Resources"]] == ["all"]
    got = page("/Groups", filter='displayName ew "FF"', excludedAttributes="members")
    assert [g["displayName"] for g in got["Resources"]] == ["staff"]

    # The snapshot is JSON as the service layer reads it, names escaped as JSON escapes them.
    r = live.http.get("/v1/principals")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    snap = r.json()
    assert snap == live.service.principals_snapshot()
    keys = [(p["kind"], p["id"]) for p in snap["principals"]]
    assert keys == sorted(keys)
    odd = principal(snap, "Human", names[5])
    assert odd is not None and odd["value"]["uid"] == {"type": "Human", "id": names[5]}
    for u in present[1:]:
        rec = principal(snap, "Human", u["userName"])
        assert rec is not None and rec["removed"] is False
        assert rec["value"]["parents"] == [{"type": "Group", "id": "staff"}]
        assert rec["value"]["attrs"]["manager"] == {
            "__entity": {"type": "Human", "id": "boss@example.com"}
        }
    boss_rec = principal(snap, "Human", "boss@example.com")
    assert boss_rec is not None and boss_rec["value"]["parents"] == [{"type": "Group", "id": "all"}]
    gone = principal(snap, "Human", names[1])
    assert gone is not None and gone["removed"] is True and gone["value"]["parents"] == []
    staff_rec = principal(snap, "Group", "staff")
    assert staff_rec is not None and staff_rec["value"]["parents"] == [
        {"type": "Group", "id": "all"}
    ]

    # Leaving the group takes it out of the member's record, and only that member's.
    r = live.scim.patch(
        f"/Groups/{staff['id']}",
        json={
            "schemas": [PATCH],
            "Operations": [{"op": "remove", "path": f'members[value eq "{users[0]["id"]}"]'}],
        },
    )
    assert r.status_code in (200, 204), r.text
    after = snapshot(live)
    rec = principal(after, "Human", names[0])
    assert rec is not None and rec["value"]["parents"] == []
    rec = principal(after, "Human", names[2])
    assert rec is not None and rec["value"]["parents"] == [{"type": "Group", "id": "staff"}]


# -- resources and work items ------------------------------------------------------------------


def test_resources_all_or_nothing_and_change_feed(live: Live) -> None:
    good = {"type": "Document", "id": "d1", "attrs": {"owner": "ann"}, "parents": []}
    r = live.http.post(
        "/v1/resources",
        json={
            "resources": [
                good,
                {"type": "Document", "id": "d2", "colour": "red"},
                {"type": "Document", "id": ""},
                {"type": "Document", "id": "d1"},
                {"type": "Document", "id": "d3", "parents": [{"type": "Folder"}]},
            ]
        },
    )
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"] == "urn:svc:problem:invalid-batch"
    named = sorted({(e["index"], e["field"]) for e in problem["errors"]})
    assert named == [(1, "colour"), (2, "id"), (3, "id"), (4, "parents.0.id")], problem
    # Nothing of the batch was stored.
    got = live.http.post(
        "/v1/resources/get", json={"resources": [{"type": "Document", "id": "d1"}]}
    )
    assert got.json()["resources"] == [] and got.json()["missing"] == [
        {"type": "Document", "id": "d1"}
    ]
    feed = live.http.get("/v1/resources/changes", params={"after": 0}).json()
    assert feed["changes"] == [] and feed["version"] == 0
    assert live.http.get("/v1/feeds").json() == {"principals": 0, "resources": 0, "work_items": 0}

    ok = live.http.post(
        "/v1/resources",
        json={"resources": [good, {"type": "Folder", "id": "f1"}]},
    )
    assert ok.status_code == 200, ok.text
    v1 = ok.json()["version"]
    got = live.http.post(
        "/v1/resources/get",
        json={"resources": [{"type": "Folder", "id": "f1"}, {"type": "Document", "id": "nope"}]},
    ).json()
    assert got["resources"] == [{"uid": {"type": "Folder", "id": "f1"}, "attrs": {}, "parents": []}]
    assert got["missing"] == [{"type": "Document", "id": "nope"}]
    # A write that changes nothing adds no change; a change and a delete do.
    live.http.post("/v1/resources", json={"resources": [good]})
    moved = {**good, "parents": [{"type": "Folder", "id": "f1"}]}
    live.http.post("/v1/resources", json={"resources": [moved]})
    live.http.post("/v1/resources/delete", json={"resources": [{"type": "Folder", "id": "f1"}]})
    feed = live.http.get("/v1/resources/changes", params={"after": v1}).json()
    assert [(c["id"], c["value"] is None) for c in feed["changes"]] == [
        ('Document::"d1"', False),
        ('Folder::"f1"', True),
    ]
    assert feed["changes"][0]["value"]["parents"] == [{"type": "Folder", "id": "f1"}]
    # The resource feed does not move the principals version; /v1/feeds names each head.
    assert snapshot(live)["principals_version"] == 0
    heads = live.http.get("/v1/feeds").json()
    assert heads == {"principals": 0, "resources": feed["version"], "work_items": 0}


def test_work_items_all_or_nothing(live: Live) -> None:
    r = live.http.post(
        "/v1/work-items",
        json={
            "work_items": [
                {"id": "jira:SEC-1", "status": "open", "links": [{"type": "Document", "id": "d1"}]},
                {"id": "no-tracker", "status": "open"},
                {"id": "jira:SEC-2", "status": "done"},
                {"id": "jira:SEC-1", "status": "closed"},
            ]
        },
    )
    assert r.status_code == 400
    named = sorted({(e["index"], e["field"]) for e in r.json()["errors"]})
    assert named == [(1, "id"), (2, "status"), (3, "id")], r.json()
    assert live.http.post("/v1/work-items/get", json={"ids": ["jira:SEC-1"]}).json()["missing"] == [
        "jira:SEC-1"
    ]
    ok = live.http.post(
        "/v1/work-items",
        json={
            "work_items": [
                {"id": "jira:SEC-1", "status": "open", "links": [{"type": "Document", "id": "d1"}]}
            ]
        },
    )
    assert ok.status_code == 200, ok.text
    live.http.post(
        "/v1/work-items", json={"work_items": [{"id": "jira:SEC-1", "status": "closed"}]}
    )
    got = live.http.post("/v1/work-items/get", json={"ids": ["jira:SEC-1"]}).json()
    assert got["work_items"] == [{"id": "jira:SEC-1", "status": "closed", "links": [], "attrs": {}}]
    feed = live.http.get("/v1/work-items/changes", params={"after": 0}).json()
    assert [c["value"]["status"] for c in feed["changes"]] == ["open", "closed"]
    live.http.post("/v1/work-items/delete", json={"ids": ["jira:SEC-1"]})
    feed = live.http.get("/v1/work-items/changes", params={"after": feed["version"]}).json()
    assert [(c["id"], c["value"]) for c in feed["changes"]] == [("jira:SEC-1", None)]
    # An unknown member of the request is named.
    r = live.http.post("/v1/work-items", json={"work_items": [], "extra": 1})
    assert r.status_code == 400 and "`extra`" in r.json()["detail"]


# -- service accounts, risk, directory, investigations -----------------------------------------


def test_service_accounts_risk_and_directory(live: Live) -> None:
    alice = create_user(live, "alice", title="CTO")
    create_group(live, "staff", [alice["id"]])
    r = live.http.post(
        "/v1/service-accounts",
        json={
            "service_accounts": [
                {"id": "copilot.assistant", "owner": "alice", "ai": True, "groups": ["staff"]},
                {"id": "", "owner": "alice"},
                {"id": "x", "owner": "alice", "ai": "maybe"},
            ]
        },
    )
    assert r.status_code == 400
    assert sorted({(e["index"], e["field"]) for e in r.json()["errors"]}) == [(1, "id"), (2, "ai")]
    r = live.http.post(
        "/v1/service-accounts",
        json={
            "service_accounts": [
                {"id": "copilot.assistant", "owner": "alice", "ai": True, "groups": ["staff"]}
            ]
        },
    )
    assert r.status_code == 200, r.text
    v = r.json()["principals_version"]
    sa = principal(snapshot(live), "ServiceAccount", "copilot.assistant")
    assert sa is not None and sa["value"]["app"] == "copilot" and sa["value"]["owner"] == "alice"
    # A rescore raises principals_version, even to the same score.
    for _ in range(2):
        r = live.http.post(
            "/v1/risk",
            json={"scores": [{"principal": {"type": "Human", "id": "alice"}, "score": 70}]},
        )
        assert r.status_code == 200 and r.json()["principals_version"] > v, r.text
        v = r.json()["principals_version"]
    bad = live.http.post(
        "/v1/risk", json={"scores": [{"principal": {"type": "Human", "id": "alice"}, "score": 101}]}
    )
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "score"
    score = principal(snapshot(live), "RiskScore", 'Human::"alice"')
    assert score is not None and score["value"] == {
        "principal": {"type": "Human", "id": "alice"},
        "score": 70,
    }
    # The directory pages.
    people = live.http.get("/v1/directory/people").json()["people"]
    assert [(p["user_name"], p["title"], p["groups"]) for p in people] == [
        ("alice", "CTO", ["staff"])
    ]
    assert live.http.get("/v1/directory/groups/staff").json()["members"] == {
        "people": ["alice"],
        "groups": [],
    }
    assert [
        s["id"] for s in live.http.get("/v1/directory/service-accounts").json()["service_accounts"]
    ] == ["copilot.assistant"]
    app = {
        "name": "copilot",
        "iss": "https://copilot.example",
        "jwks_url": "https://copilot.example/jwks",
        "aud": "svc",
    }
    assert live.http.post("/v1/directory/trusted-apps", json=app).status_code == 200
    bad = live.http.post("/v1/directory/trusted-apps", json={**app, "jwks_url": "http://plain"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "jwks_url"
    assert [
        a["name"] for a in live.http.get("/v1/directory/trusted-apps").json()["trusted_apps"]
    ] == ["copilot"]
    assert live.http.delete("/v1/directory/trusted-apps/copilot").status_code == 204
    assert live.http.get("/v1/directory/trusted-apps").json()["trusted_apps"] == []
    # Unregistering removes the record from the snapshot.
    assert live.http.delete("/v1/service-accounts/copilot.assistant").status_code == 204
    assert principal(snapshot(live), "ServiceAccount", "copilot.assistant") is None
    assert live.http.get("/v1/service-accounts/copilot.assistant").status_code == 404


def test_investigations(live: Live) -> None:
    r = live.http.post(
        "/v1/investigations",
        json={
            "principal": {"type": "Human", "id": "bob"},
            "reason": "bulk export",
            "opened_by": "reasoner",
        },
    )
    assert r.status_code == 201, r.text
    inv = r.json()
    assert inv["status"] == "open" and inv["principal"] == 'Human::"bob"'
    listed = live.http.get("/v1/investigations", params={"status": "open"}).json()["investigations"]
    assert [i["id"] for i in listed] == [inv["id"]]
    closed = live.http.post(
        f"/v1/investigations/{inv['id']}/close", json={"closed_by": "sec", "resolution": "benign"}
    )
    assert closed.status_code == 200 and closed.json()["status"] == "closed"
    again = live.http.post(f"/v1/investigations/{inv['id']}/close", json={"closed_by": "sec"})
    assert again.status_code == 409
    assert (
        live.http.get("/v1/investigations", params={"status": "open"}).json()["investigations"]
        == []
    )


# -- restarts ------------------------------------------------------------------------------------


def test_removed_person_stays_removed_across_restart(database_url: str) -> None:
    first = Live(database_url)
    try:
        uid = create_user(first, "carol")["id"]
        assert first.scim.delete(f"/Users/{uid}").status_code == 204
        before = snapshot(first)
    finally:
        first.stop()
    second = Live(database_url)  # migrations run again on start and change nothing
    try:
        after = snapshot(second)
        assert after == before
        carol = principal(after, "Human", "carol")
        assert carol is not None and carol["removed"] is True
        assert carol["value"]["attrs"]["active"] is False
        assert second.scim.get(f"/Users/{uid}").status_code == 404
        assert (
            second.scim.get("/Users", params={"filter": 'userName eq "carol"'}).json()[
                "totalResults"
            ]
            == 0
        )
        person = second.http.get("/v1/directory/people/carol").json()
        assert person["removed"] is True and person["removed_at"]
        # The user name may be provisioned again; the new person is present, not removed.
        create_user(second, "carol")
        assert principal(snapshot(second), "Human", "carol")["removed"] is False
    finally:
        second.stop()


# -- the command line ----------------------------------------------------------------------------


def test_cli_migrate_and_unsafe_bind(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from svc.cli import app

    url = f"sqlite:///{tmp_path / 'context.db'}"
    runner = CliRunner()
    for _ in range(2):
        r = runner.invoke(app, ["context", "migrate", "--database-url", url])
        assert r.exit_code == 0, r.output
        assert r.output.strip() == f"context schema at revision {HEAD}"
    r = runner.invoke(app, ["context", "serve", "--host", "0.0.0.0", "--database-url", url])
    assert r.exit_code == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in r.output
