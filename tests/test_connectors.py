"""svc connectors end to end (docs/connectors.md).

A live context service on PostgreSQL (tests/test_context.py's ``Live``), a real decision point
following it (an engine behind a real listener with ``follow_context``, as
tests/test_context_follow.py), and the fake Drive and Jira APIs (``svc.demo.fake_drive``,
``svc.demo.fake_jira``) served over HTTP on 127.0.0.1. The connectors run as the component
runs (``ConnectorsServer``: the app's lifespan runs the loops), or one poll at a time where a
test needs to stop one mid-batch. Waits are bounded polls; times are printed, never asserted
as limits (only that a ``Retry-After`` was waited for).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from serverkit import metric, wait_until
from svc.common.net import tcp_listener
from svc.connectors.app import ConnectorsServer
from svc.connectors.service import ConnectorsService
from svc.connectors.settings import ConnectorsSettings
from svc.connectors.state import State
from svc.demo import fake_drive, fake_jira
from svc.demo.fake_drive import Failure, FakeDrive
from svc.demo.fake_jira import FakeJira
from svc.pdp import Engine, Server
from svc.pdp.context_follower import ContextFollower, follow_context
from test_context import GROUP, Live, create_user, database_url, live

__all__ = ["database_url", "live"]  # fixtures used by name

SCHEMA = """
entity Group in [Group];
entity Folder in [Folder];
entity WorkItem;
entity Ticket;
entity Human in [Group] = { active: Bool, department: String, title: String, manager?: Human };
entity ServiceAccount in [Group] = {
  owner: Human, ai: Bool, registered: Bool, app: String, description?: String,
};
entity Document in [Folder] = {
  owner?: Human,
  department: String,
  sensitivity: String,
  tags: Set<String>,
  shared_with: Set<Human>,
  shared_with_groups: Set<Group>,
  link_sharing: String,
  mime_type: String,
  labels: Set<String>,
  modified_at: String,
};
type DecisionContext = {
  risk_score?: Long, human_present?: Bool, agent?: ServiceAccount, work_item?: WorkItem,
  assigned?: Bool,
};
action read appliesTo {
  principal: [Human, ServiceAccount], resource: [Document], context: DecisionContext,
};
"""

POLICIES = """
@id("owner-reads")
permit (principal is Human, action == Action::"read", resource is Document)
when { resource has owner && resource.owner == principal };

@id("shared-with-person")
permit (principal is Human, action == Action::"read", resource is Document)
when { resource.shared_with.contains(principal) };

@id("shared-with-group")
permit (principal is Human, action == Action::"read", resource is Document)
when { principal in resource.shared_with_groups };

@id("anyone-with-the-link")
permit (principal is Human, action == Action::"read", resource is Document)
when { resource.link_sharing == "anyone" };

@id("secret-stays-with-owner")
forbid (principal, action, resource is Document)
when { resource.sensitivity == "secret" }
unless { resource has owner && resource.owner == principal };

@id("agents-on-assigned")
permit (principal is ServiceAccount, action == Action::"read", resource is Document)
when { context has assigned && context.assigned };
"""

DRIVE_TOKEN = "drive-" + "x" * 30
DANA, ERIN, FAY = "dana@example.com", "erin@example.com", "fay@example.com"


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 in a thread."""

    def __init__(self, app: Any) -> None:
        self.sock = tcp_listener("127.0.0.1", 0)
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        wait_until(lambda: self.server.started)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()


class Pdp:
    """A real engine behind a real listener, following the context service."""

    def __init__(self, context_url: str) -> None:
        self.engine = Engine(POLICIES, SCHEMA)
        self.server = Server(self.engine, port=0, workers=1, await_principals=True)
        self.server.start()
        self.server.set_ready(bundle=True, containments=True)
        self.follower: ContextFollower = follow_context(
            self.engine, self.server, context_url, wait_secs=1, fetch_timeout_ms=30_000
        )
        self.follower.loaded.wait()
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.server.port}", timeout=60)

    def check(self, principal: dict[str, str], doc: str, **extra: Any) -> dict[str, Any]:
        r = self.http.post(
            "/v1/access/evaluation",
            json={
                "principal": principal,
                "action": "read",
                "resource": {"type": "Document", "id": doc},
                **extra,
            },
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    def verdict(self, who: str, doc: str) -> str:
        return str(self.check({"type": "Human", "id": who}, doc)["verdict"])

    def stop(self) -> None:
        self.follower.stop()
        self.http.close()
        self.server.stop()


class World:
    """The context service with a directory, a decision point, and both fakes."""

    def __init__(self, live: Live, tmp: Path) -> None:
        self.live = live
        self.tmp = tmp
        dana = create_user(live, DANA)
        erin = create_user(live, ERIN)
        create_user(live, FAY)
        r = live.scim.post(
            "/Groups",
            json={"schemas": [GROUP], "displayName": "eng", "members": [{"value": erin["id"]}]},
        )
        assert r.status_code == 201, r.text
        self.dana_id = dana["id"]
        r = live.http.post(
            "/v1/service-accounts",
            json={"service_accounts": [{"id": "copilot.bot", "owner": DANA, "ai": True}]},
        )
        assert r.status_code == 200, r.text
        self.drive = FakeDrive(token=DRIVE_TOKEN)
        self.jira = FakeJira()
        self.drive_srv = Served(fake_drive.create_app(self.drive))
        self.jira_srv = Served(fake_jira.create_app(self.jira))
        (tmp / "drive.token").write_text(DRIVE_TOKEN + "\n")
        (tmp / "jira.token").write_text(self.jira.api_token + "\n")
        self.pdp = Pdp(live.url)

    def settings(self, **over: Any) -> ConnectorsSettings:
        base: dict[str, Any] = dict(
            port=0,
            context_url=self.live.url,
            state_path=str(self.tmp / "state.db"),
            poll_secs=0.3,
            drive_url=self.drive_srv.url,
            drive_token_file=str(self.tmp / "drive.token"),
            drive_sensitivity_field="cls.level",
            jira_url=self.jira_srv.url,
            jira_email=self.jira.email,
            jira_api_token_file=str(self.tmp / "jira.token"),
            retry_backoff_secs=0.05,
        )
        base.update(over)
        return ConnectorsSettings(**base)

    def resource(self, doc: str) -> dict[str, Any] | None:
        r = self.live.http.post(
            "/v1/resources/get", json={"resources": [{"type": "Document", "id": doc}]}
        )
        assert r.status_code == 200, r.text
        found = r.json()["resources"]
        return found[0] if found else None

    def work_item(self, wid: str) -> dict[str, Any] | None:
        r = self.live.http.post("/v1/work-items/get", json={"ids": [wid]})
        assert r.status_code == 200, r.text
        found = r.json()["work_items"]
        return found[0] if found else None

    def feed(self, name: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            body = self.live.http.get(f"/v1/{name}/changes", params={"after": after}).json()
            out += body["changes"]
            after = body["version"]
            if not body["more"]:
                return out

    def close(self) -> None:
        self.pdp.stop()
        self.drive_srv.stop()
        self.jira_srv.stop()


@pytest.fixture
def world(live: Live, tmp_path: Path) -> Iterator[World]:
    w = World(live, tmp_path)
    yield w
    w.close()


def until(what: str, probe: Callable[[], Any], timeout: float = 60) -> float:
    start = time.monotonic()
    wait_until(probe, timeout=timeout)
    took = time.monotonic() - start
    print(f"{what}: {took * 1000:.0f} ms")
    return took


def perms(*people: str, anyone: bool = False, groups: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "user", "role": "owner", "emailAddress": DANA}]
    out += [{"type": "user", "role": "reader", "emailAddress": p} for p in people]
    out += [{"type": "group", "role": "reader", "emailAddress": g} for g in groups]
    if anyone:
        out.append({"type": "anyone", "role": "reader"})
    return out


def label(level: str) -> list[dict[str, Any]]:
    return [{"id": "cls", "fields": {"level": {"valueType": "selection", "selection": [level]}}}]


@pytest.fixture
def running(world: World) -> Iterator[ConnectorsServer]:
    w = world
    w.drive.put_file("folder1", "Team", mime_type=fake_drive.FOLDER_MIME, owner=DANA)
    w.drive.put_file("f1", "plan", owner=DANA, parents=["folder1"], permissions=perms())
    w.drive.put_file("f2", "notes", owner=DANA, permissions=perms(anyone=True))
    w.drive.put_file(
        "f3",
        "shared",
        owner=None,
        drive_id="sd1",
        permissions=[
            {"type": "user", "role": "organizer", "emailAddress": DANA},
            {"type": "user", "role": "reader", "emailAddress": ERIN},
        ],
        labels=label("x"),
    )
    server = ConnectorsServer(w.settings(jira_url=None)).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    until("first sync, /readyz 200", lambda: http.get("/readyz").status_code == 200)
    yield server
    http.close()
    server.stop()


def test_drive_files_become_resources_and_changes_reach_decisions(
    world: World, running: ConnectorsServer
) -> None:
    w = world
    f1 = w.resource("gdrive:f1")
    assert f1 is not None
    assert f1["parents"] == [{"type": "Folder", "id": "gdrive:folder1"}]
    assert f1["attrs"]["owner"] == {"__entity": {"type": "Human", "id": DANA}}
    assert f1["attrs"]["link_sharing"] == "none" and f1["attrs"]["shared_with"] == []
    assert f1["attrs"]["sensitivity"] == "internal"  # no label: the default
    assert w.resource("gdrive:f2")["attrs"]["link_sharing"] == "anyone"  # type: ignore[index]
    # A shared drive's file: permissions from permissions.list (supportsAllDrives), no owner.
    f3 = w.resource("gdrive:f3")
    assert f3 is not None and "owner" not in f3["attrs"]
    assert f3["attrs"]["shared_with"] == [
        {"__entity": {"type": "Human", "id": u}} for u in (DANA, ERIN)
    ]
    assert f3["attrs"]["sensitivity"] == "x" and f3["attrs"]["labels"] == ["cls"]
    assert w.drive.calls("/files/f3/permissions")
    assert not w.drive.calls("/files/f1/permissions")  # files.list carried them

    assert w.pdp.verdict(DANA, "gdrive:f1") == "allow"
    assert w.pdp.verdict(ERIN, "gdrive:f1") == "deny"
    assert w.pdp.verdict(ERIN, "gdrive:f2") == "allow"

    # A permission change in Drive changes the decision within one poll.
    polls_before = len(w.drive.calls("/drive/v3/changes"))
    w.drive.set_permissions("f1", perms(ERIN))
    until("share reaches the decision", lambda: w.pdp.verdict(ERIN, "gdrive:f1") == "allow")
    polls = len(w.drive.calls("/drive/v3/changes")) - polls_before
    print(f"changes.list calls until the decision changed: {polls}")  # one poll: see below

    # Shared with a group: its members read it; unshared: denied again.
    w.drive.set_permissions("f1", perms(groups=("eng@example.com",)))
    until("group share", lambda: w.resource("gdrive:f1")["attrs"]["shared_with_groups"])  # type: ignore[index]
    until("group share decided", lambda: w.pdp.verdict(ERIN, "gdrive:f1") == "allow")  # in eng
    assert w.pdp.verdict(FAY, "gdrive:f1") == "deny"
    w.drive.set_permissions("f2", perms())
    until("link sharing off", lambda: w.pdp.verdict(ERIN, "gdrive:f2") == "deny")
    # A label makes a file secret: only its owner reads it.
    w.drive.put_file("f1", "plan", owner=DANA, permissions=perms(ERIN), labels=label("secret"))
    until("secret label", lambda: w.pdp.verdict(ERIN, "gdrive:f1") == "deny")
    assert w.resource("gdrive:f1")["attrs"]["sensitivity"] == "secret"  # type: ignore[index]
    assert w.pdp.verdict(DANA, "gdrive:f1") == "allow"

    # A trashed file and a deleted file are removed.
    w.drive.trash("f1")
    w.drive.delete("f2")
    until("trashed and deleted removed", lambda: not w.resource("gdrive:f1"))
    until("deleted removed", lambda: not w.resource("gdrive:f2"))
    assert w.pdp.verdict(DANA, "gdrive:f1") == "deny"

    text = httpx.get(f"{running.url}/metrics").text
    assert metric(text, "svc_connector_items_total", connector="drive", kind="upserted") >= 4
    assert metric(text, "svc_connector_items_total", connector="drive", kind="deleted") == 2
    assert metric(text, "svc_connector_lag_seconds", connector="drive") < 3600


def test_rate_limits_are_waited_out_a_share_takes_one_poll_and_a_refused_token_resyncs(
    world: World,
) -> None:
    w = world
    w.drive.put_file("a", "a", owner=DANA)
    w.drive.put_file("b", "b", owner=DANA)
    # The first call is answered 429 Retry-After 1, the next 403 userRateLimitExceeded with
    # Retry-After 0.5, then a 503: all retried, the Retry-After waits honoured.
    w.drive.fail_next(
        Failure(429, "rateLimitExceeded", 1.0),
        Failure(403, "userRateLimitExceeded", 0.5),
        Failure(503, "backendError"),
    )
    service = ConnectorsService(w.settings(jira_url=None))
    reg = service.metrics.registry

    async def scenario() -> None:
        await service.poll_once("drive")
        calls = w.drive.calls("/drive/v3/")
        assert calls[1] - calls[0] >= 1.0, calls
        assert calls[2] - calls[1] >= 0.5, calls
        errors = "svc_connector_errors_total"
        assert reg.get_sample_value(errors, {"connector": "drive", "kind": "rate_limited"}) == 2
        assert reg.get_sample_value(errors, {"connector": "drive", "kind": "server"}) == 1
        assert w.resource("gdrive:a") and w.resource("gdrive:b")

        # A permission change in Drive changes the decision after one poll.
        wait_until(lambda: w.pdp.verdict(DANA, "gdrive:a") == "allow", timeout=60)
        assert w.pdp.verdict(ERIN, "gdrive:a") == "deny"
        w.drive.set_permissions("a", perms(ERIN))
        await service.poll_once("drive")
        assert w.resource("gdrive:a")["attrs"]["shared_with"] == [  # type: ignore[index]
            {"__entity": {"type": "Human", "id": ERIN}}
        ]
        wait_until(lambda: w.pdp.verdict(ERIN, "gdrive:a") == "allow", timeout=60)

        # The change token expires; meanwhile b is deleted and c created. The refused token
        # starts a full resync, which finds c and deletes b.
        w.drive.delete("b")
        w.drive.put_file("c", "c", owner=DANA)
        w.drive.expire_tokens()
        await service.poll_once("drive")
        await service.aclose()

    asyncio.run(scenario())
    assert reg.get_sample_value("svc_connector_resyncs_total", {"connector": "drive"}) == 1
    assert w.resource("gdrive:a") and w.resource("gdrive:c")
    assert w.resource("gdrive:b") is None


class KillAfterWrites(httpx.AsyncBaseTransport):
    """Forwards requests; once ``n`` batch writes were accepted, the next call never returns
    (the connector is then cancelled: killed after the service took a batch, before the
    cursor was saved)."""

    def __init__(self, n: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.n = n
        self.killed = threading.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.killed.is_set():
            await asyncio.Event().wait()
        r = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path == "/v1/resources":
            self.n -= 1
            if self.n <= 0:
                await r.aread()
                self.killed.set()
                await asyncio.Event().wait()  # accepted, but the answer never arrives
        return r


def test_a_connector_killed_mid_batch_resumes_from_its_cursor(world: World) -> None:
    w = world
    n = 230
    for i in range(n):
        w.drive.put_file(f"k{i:03d}", f"file {i}", owner=DANA)
    settings = w.settings(jira_url=None, drive_page_size=40, batch_items=20)
    kill = KillAfterWrites(5)  # two pages and a half accepted

    async def killed() -> None:
        service = ConnectorsService(settings, transports={"context": kill})
        task = asyncio.create_task(service.poll_once("drive"))
        while not kill.killed.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        service.state.close()

    asyncio.run(killed())
    state = State(settings.state_path)
    saved = state.get("drive", "crawl_page")
    state.close()
    assert saved  # the second page's token: two pages were saved, the third not
    stored = len(w.feed("resources"))
    assert 100 <= stored < n

    before = len(w.drive.calls("/drive/v3/files"))
    service = ConnectorsService(settings)

    async def resume() -> None:
        await service.poll_once("drive")
        await service.aclose()

    asyncio.run(resume())
    # It went on from the saved page (no crawl from the start), and every file is there once.
    assert len(w.drive.calls("/drive/v3/files")) - before == (n - 80 + 39) // 40
    changes = w.feed("resources")
    ids = [c["id"] for c in changes]
    assert len(ids) == n == len(set(ids)), (len(ids), len(set(ids)))
    assert all(w.resource(f"gdrive:k{i:03d}") for i in (0, 99, 100, n - 1))


def test_jira_issues_become_work_items_and_a_closed_issue_stops_the_assignment(
    world: World,
) -> None:
    w = world
    w.drive.put_file("f9", "spec", owner=DANA)
    w.jira.put_issue(
        "OPS-1",
        category="indeterminate",
        assignee=DANA,
        remote_links=["https://drive.google.com/file/d/f9/view", "https://example.com/x"],
        links=[("blocks", "outward", "OPS-2")],
        custom={"customfield_10100": "cust-7, cust-8"},
    )
    w.jira.put_issue("OPS-2", category="new", assignee=ERIN)
    w.jira.fail_next((429, 0.5))  # Jira's rate limit, waited out
    settings = w.settings(
        jira_link_fields={"customfield_10100": "Customer"}, jira_reconcile_secs=0.5
    )
    server = ConnectorsServer(settings).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    try:
        until("first sync", lambda: http.get("/readyz").status_code == 200)
        calls = w.jira.calls("/search/jql")
        assert calls[1] - calls[0] >= 0.5
        item = w.work_item("jira:OPS-1")
        assert item is not None
        assert item["status"] == "open" and item["attrs"]["state"] == "in_progress"
        assert item["attrs"]["assignee"] == {"__entity": {"type": "Human", "id": DANA}}
        assert item["links"] == [
            {"type": "Document", "id": "gdrive:f9"},
            {"type": "Ticket", "id": "OPS-2"},
            {"type": "Customer", "id": "cust-7"},
            {"type": "Customer", "id": "cust-8"},
        ]
        assert w.work_item("jira:OPS-2")["attrs"]["state"] == "open"  # type: ignore[index]

        agent = {"type": "ServiceAccount", "id": "copilot.bot"}
        on = w.pdp.check(agent, "gdrive:f9", work_item_id="jira:OPS-1")
        assert on["verdict"] == "allow" and "agents-on-assigned" in on["policies"]
        assert w.pdp.check(agent, "gdrive:f9", work_item_id="jira:OPS-2")["verdict"] == "deny"

        # Unchanged issues are not written again (deduplicated on id and updated).
        written = metric(
            http.get("/metrics").text,
            "svc_connector_items_total",
            connector="jira",
            kind="upserted",
        )
        polls = len(w.jira.calls("/search/jql"))
        wait_until(lambda: len(w.jira.calls("/search/jql")) >= polls + 3)
        assert (
            metric(
                http.get("/metrics").text,
                "svc_connector_items_total",
                connector="jira",
                kind="upserted",
            )
            == written
        )

        # Closed in Jira: the agent is no longer assigned from the next decision on.
        w.jira.put_issue("OPS-1", category="done", assignee=DANA)
        until(
            "closed issue reaches the decision",
            lambda: w.pdp.check(agent, "gdrive:f9", work_item_id="jira:OPS-1")["verdict"] == "deny",
        )
        assert w.work_item("jira:OPS-1")["status"] == "closed"  # type: ignore[index]

        # Deleted in Jira: the reconciliation deletes the work item.
        w.jira.delete_issue("OPS-2")
        until("deleted issue removed", lambda: w.work_item("jira:OPS-2") is None)
    finally:
        http.close()
        server.stop()


def test_a_google_service_account_key_is_exchanged_for_tokens(world: World) -> None:
    w = world
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    w.drive.service_account_public_key = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    import json

    key_file = w.tmp / "sa.json"
    key_file.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": "svc-connector@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"{w.drive_srv.url}/token",
            }
        )
    )
    w.drive.put_file("g1", "g1", owner=DANA)
    service = ConnectorsService(
        w.settings(jira_url=None, drive_token_file=None, drive_service_account_file=str(key_file))
    )

    async def poll() -> None:
        await service.poll_once("drive")
        await service.aclose()

    asyncio.run(poll())
    assert w.resource("gdrive:g1") is not None


def test_a_port_in_use_is_an_error(world: World) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(OSError):
            ConnectorsServer(world.settings(port=port)).start()


def test_a_file_the_context_service_refuses_is_left_out_and_counted(world: World) -> None:
    w = world
    w.drive.put_file("good", "good", owner=DANA)
    w.drive.put_file("bad\x01id", "bad", owner=DANA)  # an id the context service refuses
    service = ConnectorsService(w.settings(jira_url=None))

    async def poll() -> None:
        await service.poll_once("drive")
        await service.aclose()

    asyncio.run(poll())
    assert w.resource("gdrive:good") is not None
    errors = service.metrics.registry.get_sample_value(
        "svc_connector_errors_total", {"connector": "drive", "kind": "refused_item"}
    )
    assert errors == 1


def test_retry_after_takes_seconds_and_http_dates() -> None:
    from svc.connectors.client import retry_after_secs

    assert retry_after_secs("3") == 3.0
    assert retry_after_secs(None) is None and retry_after_secs("soon") is None
    assert retry_after_secs("Sat, 28 Nov 2026 08:00:10 GMT", now=1795852800.0) == 10.0
    assert retry_after_secs("999999") == 3600.0  # bounded
