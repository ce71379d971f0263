"""The decision point following the context service (svc.pdp.context_follower, docs/context.md).

A live context service on PostgreSQL (as tests/test_context.py starts it) and a real in-process
Engine served by a real decision-point listener (as tests/test_policy_follower.py does). Every
wait is on what the follower has applied (``ContextFollower.wait_for``), never a sleep.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import uvicorn

from serverkit import check_json, check_request, wait_until
from svc.authz.v1 import authz_pb2_grpc
from svc.common.auth import LOCAL_ISSUER, LocalIssuer
from svc.common.net import tcp_listener
from svc.context.app import create_app
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.pdp import Engine, Server
from svc.pdp.context_follower import BearerToken, ContextFollower, follow_context
from test_context import (
    PATCH,
    SCIM_TOKEN,
    Live,
    create_group,
    create_user,
    database_url,
    live,
    snapshot,
)

__all__ = ["database_url", "live"]  # fixtures, shared with tests/test_context.py

#: The fetch deadline of the followers below: far past what a busy machine takes, so a check
#: that misses always sees its fetch land (the deadline itself is tested where it matters).
FETCH_MS = 30_000

SCHEMA = """
entity Group in [Group];
entity WorkItem;
entity Human in [Group] = {
  active: Bool,
  department: String,
  title: String,
  manager?: Human,
};
entity ServiceAccount in [Group] = {
  owner: Human,
  ai: Bool,
  registered: Bool,
  app: String,
  description?: String,
};
entity Document = { department: String, sensitivity: String };
type DecisionContext = {
  risk_score?: Long,
  human_present?: Bool,
  agent?: ServiceAccount,
  work_item?: WorkItem,
  assigned?: Bool,
};
action read appliesTo {
  principal: [Human, ServiceAccount],
  resource: [Document],
  context: DecisionContext,
};
"""

POLICIES = """
@id("inactive-people-denied")
forbid (principal is Human, action, resource) unless { principal.active };

@id("readers-read-public")
permit (principal in Group::"readers", action == Action::"read", resource is Document)
when { resource.sensitivity == "public" };

@id("own-department")
permit (principal is Human, action == Action::"read", resource is Document)
when { principal.department == resource.department };

@id("agents-read-public")
permit (principal is ServiceAccount, action == Action::"read", resource is Document)
when { resource.sensitivity == "public" };

@id("agents-on-assigned")
permit (principal is ServiceAccount, action == Action::"read", resource is Document)
when { context has assigned && context.assigned };

@id("high-risk-denied")
forbid (principal, action, resource)
when { context has risk_score && context.risk_score >= 90 };
"""


class Pdp:
    """A real engine behind a real listener that waits for the principals only."""

    def __init__(self) -> None:
        self.engine = Engine(POLICIES, SCHEMA)
        self.server = Server(self.engine, port=0, workers=1, await_principals=True)
        self.server.start()
        self.server.set_ready(bundle=True, containments=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.server.port}", timeout=60)

    def verdict(self, principal: dict[str, str], doc: str) -> str:
        r = self.http.post(
            "/v1/access/evaluation",
            json={
                "principal": principal,
                "action": "read",
                "resource": {"type": "Document", "id": doc},
            },
        )
        assert r.status_code == 200, r.text
        return str(r.json()["verdict"])

    def metric(self, name: str) -> float:
        """The value of one series of ``/metrics`` (0 when absent)."""
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def readyz(self) -> int:
        return self.http.get("/readyz").status_code

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture
def pdp() -> Iterator[Pdp]:
    p = Pdp()
    yield p
    p.stop()


def human(user_name: str) -> dict[str, str]:
    return {"type": "Human", "id": user_name}


def principals_version(live: Live) -> int:
    return int(snapshot(live)["principals_version"])


def put_docs(live: Live, *docs: tuple[str, str, str]) -> int:
    r = live.http.post(
        "/v1/resources",
        json={
            "resources": [
                {"type": "Document", "id": d, "attrs": {"department": dep, "sensitivity": s}}
                for d, dep, s in docs
            ]
        },
    )
    assert r.status_code == 200, r.text
    return int(r.json()["version"])


def test_readiness_waits_for_the_snapshot(live: Live, pdp: Pdp) -> None:
    # Nothing listens at this address: the follower retries, the decision point stays unready.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    lost = follow_context(pdp.engine, pdp.server, nowhere, backoff_secs=0.01)
    try:
        status = lost.wait_for(lambda s: s.reconnects >= 2)
        assert not status.loaded and "ConnectError" in status.error
        assert pdp.readyz() == 503 and not pdp.server.ready
    finally:
        lost.stop()

    follower = follow_context(
        pdp.engine, pdp.server, live.url, wait_secs=1, fetch_timeout_ms=FETCH_MS
    )
    try:
        follower.loaded.wait()
        assert follower.status.snapshots == 1
        assert pdp.readyz() == 200
    finally:
        follower.stop()


def test_deactivation_groups_rescore_and_resources_are_followed(live: Live, pdp: Pdp) -> None:
    dana = create_user(
        live,
        "dana@example.com",
        **{"urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "eng"}},
    )
    erin = create_user(live, "erin@example.com")
    readers = create_group(live, "readers", [dana["id"]])
    put_docs(live, ("plan", "eng", "internal"), ("faq", "sales", "public"))
    r = live.http.post(
        "/v1/service-accounts",
        json={
            "service_accounts": [
                {
                    "id": "copilot.bot",
                    "owner": "dana@example.com",
                    "ai": True,
                    "groups": [],
                    "description": "",
                }
            ]
        },
    )
    assert r.status_code == 200, r.text

    follower = follow_context(
        pdp.engine, pdp.server, live.url, wait_secs=1, fetch_timeout_ms=FETCH_MS
    )
    try:
        v = principals_version(live)
        follower.wait_for(lambda s: s.loaded and s.principals_version >= v)
        assert pdp.readyz() == 200
        # The feeds start at their head: no resource is held until a check asks for it.
        assert follower.status.fetched == 0
        # Dana reads her department's document and, as a reader, the public one: both
        # fetched on the miss, in one read each.
        assert pdp.verdict(human("dana@example.com"), "plan") == "allow"
        assert pdp.verdict(human("dana@example.com"), "faq") == "allow"
        assert follower.status.fetches == 2 and follower.status.fetched == 2
        # Erin is in no group and has no department: denied.
        assert pdp.verdict(human("erin@example.com"), "faq") == "deny"
        # A registered service account reads public documents; an unknown one is denied.
        assert pdp.verdict({"type": "ServiceAccount", "id": "copilot.bot"}, "faq") == "allow"
        unknown = pdp.http.post(
            "/v1/access/evaluation",
            json={
                "principal": {"type": "ServiceAccount", "id": "other.bot"},
                "action": "read",
                "resource": {"type": "Document", "id": "faq"},
            },
        ).json()
        assert unknown["verdict"] == "deny" and "svc:unregistered" in unknown["policies"]

        # A group membership change changes a decision.
        r = live.scim.patch(
            f"/Groups/{readers['id']}",
            json={
                "schemas": [PATCH],
                "Operations": [{"op": "add", "path": "members", "value": [{"value": erin["id"]}]}],
            },
        )
        assert r.status_code in (200, 204), r.text
        v = principals_version(live)
        follower.wait_for(lambda s: s.principals_version >= v)
        assert pdp.verdict(human("erin@example.com"), "faq") == "allow"

        # The reasoner's rescore raises principals_version, and a score of 90 denies.
        before = pdp.engine.versions["principals_version"]
        r = live.http.post(
            "/v1/risk", json={"scores": [{"principal": human("erin@example.com"), "score": 95}]}
        )
        assert r.status_code == 200, r.text
        v = int(r.json()["principals_version"])
        follower.wait_for(lambda s: s.principals_version >= v)
        assert pdp.engine.versions["principals_version"] > before
        assert pdp.verdict(human("erin@example.com"), "faq") == "deny"
        # Decisions carry the principals_version they were made at.
        record = pdp.engine.decide(
            {"principal": human("erin@example.com"), "action": "read", "resource": _doc("faq")}
        )
        assert record["principals_version"] == pdp.engine.versions["principals_version"]

        # A resource written through the batch route is decided with its attributes.
        version = put_docs(live, ("launch", "eng", "internal"), ("faq", "eng", "internal"))
        follower.wait_for(lambda s: s.resources_version >= version)
        assert pdp.verdict(human("dana@example.com"), "launch") == "allow"
        # faq is now internal to eng: Dana (eng) still reads it, the copilot no longer does.
        assert pdp.verdict({"type": "ServiceAccount", "id": "copilot.bot"}, "faq") == "deny"

        # An open work item linking faq lets the copilot read it on that work item.
        r = live.http.post(
            "/v1/work-items",
            json={
                "work_items": [
                    {
                        "id": "jira:A-1",
                        "status": "open",
                        "links": [{"type": "Document", "id": "faq"}],
                    }
                ]
            },
        )
        assert r.status_code == 200, r.text
        version = int(r.json()["version"])
        follower.wait_for(lambda s: s.work_items_version >= version)
        on_item = pdp.http.post(
            "/v1/access/evaluation",
            json={
                "principal": {"type": "ServiceAccount", "id": "copilot.bot"},
                "action": "read",
                "resource": {"type": "Document", "id": "faq"},
                "work_item_id": "jira:A-1",
            },
        ).json()
        assert on_item["verdict"] == "allow" and "agents-on-assigned" in on_item["policies"]

        # Dana deactivated over SCIM is denied, her record kept.
        r = live.scim.patch(
            f"/Users/{dana['id']}",
            json={
                "schemas": [PATCH],
                "Operations": [{"op": "replace", "value": {"active": False}}],
            },
        )
        assert r.status_code in (200, 204), r.text
        v = principals_version(live)
        follower.wait_for(lambda s: s.principals_version >= v)
        denied = pdp.http.post(
            "/v1/access/evaluation",
            json={
                "principal": human("dana@example.com"),
                "action": "read",
                "resource": {"type": "Document", "id": "plan"},
            },
        ).json()
        assert denied["verdict"] == "deny"
        assert "inactive-people-denied" in denied["policies"]

        # Erin deleted over SCIM: removed (no groups), inactive, denied.
        assert live.scim.delete(f"/Users/{erin['id']}").status_code == 204
        v = principals_version(live)
        follower.wait_for(lambda s: s.principals_version >= v)
        assert pdp.verdict(human("erin@example.com"), "faq") == "deny"

        # The service account unregistered: denied svc:unregistered.
        assert live.http.delete("/v1/service-accounts/copilot.bot").status_code == 204
        v = principals_version(live)
        follower.wait_for(lambda s: s.principals_version >= v)
        gone = pdp.http.post(
            "/v1/access/evaluation",
            json={
                "principal": {"type": "ServiceAccount", "id": "copilot.bot"},
                "action": "read",
                "resource": {"type": "Document", "id": "plan"},
            },
        ).json()
        assert "svc:unregistered" in gone["policies"]
        assert follower.status.refused == 0 and follower.status.snapshots == 1

        # A resource the schema refuses (no `sensitivity`) is left out; the rest of its batch
        # is stored.
        create_user(
            live,
            "fay@example.com",
            **{
                "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {
                    "department": "sales"
                }
            },
        )
        bad = {"type": "Document", "id": "bad", "attrs": {"department": "sales"}}
        good = {
            "type": "Document",
            "id": "good",
            "attrs": {"department": "sales", "sensitivity": "x"},
        }
        r = live.http.post("/v1/resources", json={"resources": [bad, good]})
        assert r.status_code == 200, r.text
        version = int(r.json()["version"])
        v = principals_version(live)
        status = follower.wait_for(
            lambda s: s.resources_version >= version and s.principals_version >= v
        )
        assert status.refused == 0  # not held: the feed applies nothing of them
        assert pdp.verdict(human("fay@example.com"), "good") == "allow"
        assert pdp.verdict(human("fay@example.com"), "bad") == "deny"
        assert follower.status.refused == 1
        # Refused, so remembered as absent: asked again, not fetched again.
        fetches = follower.status.fetches
        assert pdp.verdict(human("fay@example.com"), "bad") == "deny"
        assert follower.status.fetches == fetches
        assert pdp.metric('svc_pdp_resource_fetches_total{outcome="ok"}') == fetches
    finally:
        follower.stop()


def _doc(doc: str) -> dict[str, str]:
    return {"type": "Document", "id": doc}


def test_misses_of_every_transport_are_fetched(live: Live, pdp: Pdp) -> None:
    create_user(
        live,
        "gus@example.com",
        **{"urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "eng"}},
    )
    put_docs(live, *((d, "eng", "internal") for d in ("a", "b", "c", "d")))
    follower = follow_context(
        pdp.engine, pdp.server, live.url, wait_secs=1, fetch_timeout_ms=FETCH_MS
    )
    try:
        follower.loaded.wait()
        gus = human("gus@example.com")
        # An AuthZEN batch: its two misses (and a repeat) are fetched in one call.
        r = pdp.http.post(
            "/access/v1/evaluations",
            json={
                "subject": {"type": "Human", "id": "gus@example.com"},
                "action": {"name": "read"},
                "evaluations": [
                    {"resource": {"type": "Document", "id": "a"}},
                    {"resource": {"type": "Document", "id": "b"}},
                    {"resource": {"type": "Document", "id": "a"}},
                ],
            },
        )
        assert r.status_code == 200, r.text
        assert [e["decision"] for e in r.json()["evaluations"]] == [True, True, True]
        assert follower.status.fetches == 1 and follower.status.fetched == 2
        # A single AuthZEN evaluation.
        r = pdp.http.post(
            "/access/v1/evaluation",
            json={
                "subject": {"type": "Human", "id": "gus@example.com"},
                "action": {"name": "read"},
                "resource": {"type": "Document", "id": "c"},
            },
        )
        assert r.status_code == 200 and r.json()["decision"] is True, r.text
        # gRPC Check.
        with grpc.insecure_channel(f"127.0.0.1:{pdp.server.port}") as ch:
            answer = authz_pb2_grpc.AuthorizerStub(ch).Check(
                check_request({"principal": gus, "action": "read", "resource": _doc("d")})
            )
        assert check_json(answer)["verdict"] == "allow"
        assert follower.status.fetches == 3 and follower.status.fetched == 4
        assert follower.status.fetch_errors == 0
    finally:
        follower.stop()
    # Stopped: the source is removed, and a miss is decided without it.
    put_docs(live, ("e", "eng", "internal"))
    assert pdp.verdict(human("gus@example.com"), "e") == "deny"
    assert follower.status.fetches == 3


def test_resource_search_sees_every_resource_the_service_holds(live: Live, pdp: Pdp) -> None:
    """A resource search's candidates are all the type's resources (docs/search.md): the
    decision point reads the type whole from the service (pages of ``GET /v1/resources``)
    before the first search, and the feed keeps it whole: a resource created, changed or
    deleted after the load shows in the next search."""
    create_user(
        live,
        "hal@example.com",
        **{"urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "eng"}},
    )
    # More than one page of the listing (FETCH_CHUNK), half of them in hal's department.
    n = 1203
    docs = [(f"doc{i:05}", "eng" if i % 2 else "ops", "internal") for i in range(n)]
    for i in range(0, n, 500):
        put_docs(live, *docs[i : i + 500])
    follower = follow_context(
        pdp.engine, pdp.server, live.url, wait_secs=1, fetch_timeout_ms=FETCH_MS
    )
    body = {
        "subject": {"type": "Human", "id": "hal@example.com"},
        "action": {"name": "read"},
        "resource": {"type": "Document"},
        "page": {"limit": 1000},
    }

    def search() -> list[str]:
        out: list[str] = []
        token = ""
        while True:
            r = pdp.http.post(
                "/access/v1/search/resource", json={**body, "page": {"limit": 1000, "token": token}}
            )
            if r.status_code == 410:  # the feed moved the resources mid-search: start again
                out, token = [], ""
                continue
            assert r.status_code == 200, r.text
            out += [x["id"] for x in r.json()["results"]]
            token = r.json()["page"]["next_token"]
            if not token:
                return out

    try:
        follower.loaded.wait()
        want = [d for d, dep, _ in docs if dep == "eng"]
        assert search() == want
        assert follower.status.fetched == n
        # Loaded once: the next search reads nothing more.
        assert search() == want
        assert follower.status.fetched == n
        # The feed keeps the type whole: a new resource, one moved out, one deleted.
        put_docs(live, ("new", "eng", "internal"), (want[0], "ops", "internal"))
        r = live.http.post("/v1/resources/delete", json={"resources": [_doc(want[1])]})
        assert r.status_code == 200, r.text
        expect = sorted([*want[2:], "new"])
        wait_until(lambda: search() == expect)
        # The listing itself: pages in id order, `next` empty on the last.
        page = live.http.get("/v1/resources", params={"type": "Document", "limit": 2}).json()
        assert [x["uid"]["id"] for x in page["resources"]] == ["doc00000", "doc00001"]
        assert page["next"] == "doc00001"
        last = live.http.get(
            "/v1/resources", params={"type": "Document", "after": "doc01202", "limit": 5}
        ).json()
        assert [x["uid"]["id"] for x in last["resources"]] == ["new"] and last["next"] == ""
        bad = live.http.get("/v1/resources", params={"type": "Document", "limit": 0})
        assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "limit"
    finally:
        follower.stop()


def test_resource_search_refuses_when_the_type_cannot_be_read_whole(pdp: Pdp) -> None:
    """A resource search whose type the source cannot read whole answers 503 rather than a
    result that may miss resources; a directory type is never asked for."""
    asked: list[str] = []

    def fetch(
        resources: list[tuple[str, str]], work_items: list[str]
    ) -> tuple[list[tuple[str, str]], list[str]]:
        return resources, work_items

    def load_type(resource_type: str) -> None:
        asked.append(resource_type)
        raise RuntimeError("the context service is down")

    pdp.server.set_resource_source(fetch, timeout_ms=1000, load_type=load_type)
    pdp.engine.upsert_entities(
        [
            {
                "uid": {"type": "Human", "id": "ida"},
                "attrs": {"active": True, "department": "eng", "title": "x"},
                "parents": [],
            }
        ]
    )
    body = {
        "subject": {"type": "Human", "id": "ida"},
        "action": {"name": "read"},
        "resource": {"type": "Document"},
    }
    r = pdp.http.post("/access/v1/search/resource", json=body)
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "the context service is down" in r.json()["detail"]
    assert asked == ["Document"]
    # An unknown type is the request's fault, not the source's.
    r = pdp.http.post("/access/v1/search/resource", json={**body, "resource": {"type": "Nope"}})
    assert r.status_code == 400, r.text
    assert asked == ["Document"]


def _serve(
    service: ContextService, settings: ContextSettings, auth: ContextAuthSettings, port: int = 0
) -> tuple[uvicorn.Server, threading.Thread, socket.socket, str]:
    """Serves the context service's app on 127.0.0.1:`port` (0: a free one) in a thread."""
    app = create_app(service, settings, auth)
    sock = tcp_listener("127.0.0.1", port)
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, thread, sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _shut(server: uvicorn.Server, thread: threading.Thread, sock: socket.socket) -> None:
    server.should_exit = True
    thread.join()
    sock.close()


def test_a_gap_reloads_the_snapshot(database_url: str, pdp: Pdp) -> None:
    settings = ContextSettings(database_url=database_url, scim_token=SCIM_TOKEN, port=0)
    service = ContextService(settings)
    noauth = ContextAuthSettings(auth="none")
    check = {
        "principal": {"type": "ServiceAccount", "id": "a.bot"},
        "action": "read",
        "resource": {"type": "Document", "id": "none"},
    }
    try:
        service.put_service_accounts(
            [{"id": "a.bot", "owner": "x", "ai": False, "groups": [], "description": ""}]
        )
        server, thread, sock, url = _serve(service, settings, noauth)
        port = sock.getsockname()[1]
        # Principals only: every failure counted is then the watch's, which makes a gap.
        follower = follow_context(
            pdp.engine, pdp.server, url, wait_secs=1, backoff_secs=0.05, follow_resources=False
        )
        try:
            follower.loaded.wait()
            assert "svc:unregistered" not in pdp.engine.evaluate(check)["policies"]
            # The service goes away; meanwhile the account is unregistered and a score set.
            _shut(server, thread, sock)
            follower.wait_for(lambda s: s.reconnects >= 1)
            service.delete_service_account("a.bot")
            service.put_risk_scores([{"principal": human("x"), "score": 10}])
            server, thread, sock, _ = _serve(service, settings, noauth, port)
            v = service.principals_snapshot()["principals_version"]
            status = follower.wait_for(lambda s: s.snapshots >= 2 and s.principals_version >= v)
            assert status.error == ""
            assert "svc:unregistered" in pdp.engine.evaluate(check)["policies"]
        finally:
            follower.stop()
            _shut(server, thread, sock)
    finally:
        service.close()


def test_bearer_tokens_for_the_context_service(database_url: str, pdp: Pdp, tmp_path: Path) -> None:
    issuer = LocalIssuer(tmp_path / "issuer")
    settings = ContextSettings(database_url=database_url, scim_token=SCIM_TOKEN, port=0)
    auth = ContextAuthSettings(
        auth_issuer=LOCAL_ISSUER, auth_jwks=issuer.jwks_url, auth_callers=["svc-pdp-a"]
    )
    service = ContextService(settings)
    server, thread, sock, url = _serve(service, settings, auth)
    try:
        # Without a token: 401, nothing loaded.
        bare = ContextFollower(pdp.engine, url, None, follow_resources=False).start()
        try:
            status = bare.wait_for(lambda s: s.reconnects >= 1)
            assert "HTTP 401" in status.error and not status.loaded
        finally:
            bare.stop()
        # Minted by the issuer, and read from a token file (renewed in place).
        token_file = tmp_path / "token"
        token_file.write_text(issuer.mint("svc-pdp-a", "svc-context", 600) + "\n")
        sources: list[Any] = [
            BearerToken.from_issuer(issuer, "svc-pdp-a"),
            BearerToken.from_file(token_file),
        ]
        for n, source in enumerate(sources):
            follower = ContextFollower(pdp.engine, url, source, wait_secs=1).start()
            try:
                follower.loaded.wait()
                version = service.put_resources(
                    [
                        {
                            "type": "Document",
                            "id": f"memo{n}",
                            "attrs": {"department": "eng", "sensitivity": "public"},
                        }
                    ]
                )["version"]
                status = follower.wait_for(lambda s, v=version: s.resources_version >= v)
                assert status.error == "" and status.reconnects == 0
            finally:
                follower.stop()
    finally:
        _shut(server, thread, sock)
        service.close()
