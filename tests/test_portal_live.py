"""The portal's live updates (docs/portal.md#live-updates): GraphQL subscriptions over
``graphql-transport-ws`` on a real port, with real services.

What tests/portalkit.py starts (a context service on PostgreSQL, the challenge service, ``svc
pdp`` as a process, the demo OpenID Connect provider) and the portal on a port of its own,
running only the operations of a manifest this test writes (as ``make web`` writes the app's),
so the websocket's persisted-operations rule is the one production has. A websocket client
(httpx-ws) signs in with the session cookie a real sign-in gave.

Covered: the upgrade is refused from another ``Origin`` and without a session; a subscription
sent by its hash runs, an unknown hash and a text of its own are refused on the socket; the
queue's subscription delivers a challenge opened after it started (everyone's for the security
team, one's own for a person who may see only theirs), and the containments' one a new
containment; both are refused, with the decision's qid, to a person who may not view them; and
signing out closes the socket.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from httpx_ws import WebSocketDisconnect, WebSocketSession, WebSocketUpgradeError, connect_ws

from portalkit import World, pg_schema, until
from serverkit import UUID7
from svc.challenge.service import Ref
from svc.portal.sessions import COOKIE

QUEUE = """subscription Queue($mine: Boolean!) {
  challengeChanges(mine: $mine) { qid state approver principal { type id } }
}"""
CONTAINMENTS = """subscription Contained {
  containmentChanges { contained containment { principal { type id } author } }
}"""
CONTAIN = """mutation Contain($p: EntityRefInput!) {
  contain(principal: $p, reason: "live") { changed }
}"""
OPERATIONS = {hashlib.sha256(t.encode()).hexdigest(): t for t in (QUEUE, CONTAINMENTS, CONTAIN)}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def world(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("portal-live")
    web = tmp / "web"
    web.mkdir()
    (web / "persisted-operations.json").write_text(json.dumps(OPERATIONS))
    with pg_schema(postgres_url) as url:
        w = World(url, tmp, web_dir=str(web), allow_any_query=False)
        try:
            yield w
        finally:
            w.close()


def ws_url(world: World) -> str:
    return world.portal.url.replace("http://", "ws://") + "/graphql"


def cookie_of(client: httpx.Client) -> str:
    value = client.cookies.get(COOKIE)
    assert value, "signed in without a session cookie"
    return str(value)


def connect(world: World, cookie: str | None, origin: str | None = None) -> Any:
    """A graphql-transport-ws socket to the portal as a browser on `origin` opens it."""
    headers = {"origin": origin or world.settings.public_url}
    if cookie is not None:
        headers["cookie"] = f"{COOKIE}={cookie}"
    return connect_ws(
        ws_url(world),
        httpx.Client(timeout=60),
        subprotocols=["graphql-transport-ws"],
        headers=headers,
        keepalive_ping_interval_seconds=None,
    )


def init(ws: WebSocketSession) -> None:
    ws.send_json({"type": "connection_init"})
    assert ws.receive_json(timeout=60)["type"] == "connection_ack"


def subscribe(ws: WebSocketSession, sid: str, text: str, variables: Any = None) -> None:
    """Subscribes by the operation's hash only, as the web app does (``query`` empty)."""
    ws.send_json(
        {
            "id": sid,
            "type": "subscribe",
            "payload": {
                "query": "",
                "variables": variables or {},
                "extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest(text)}},
            },
        }
    )


def next_of(ws: WebSocketSession, sid: str, match: Any) -> dict[str, Any]:
    """The first ``next`` of subscription `sid` whose data `match` accepts (others skipped)."""
    while True:
        msg = ws.receive_json(timeout=60)
        if msg.get("id") != sid:  # another subscription's, or a ping
            continue
        assert msg["type"] == "next", msg
        assert not msg["payload"].get("errors"), msg
        data: dict[str, Any] = msg["payload"]["data"]
        if match(data):
            return data


def refusal(ws: WebSocketSession, sid: str) -> dict[str, Any]:
    """The error a refused subscription `sid` ends with: its first error's extensions."""
    while True:
        msg = ws.receive_json(timeout=60)
        if msg.get("id") != sid:
            continue
        if msg["type"] == "error":
            ext: dict[str, Any] = msg["payload"][0]["extensions"]
            return ext
        assert msg["type"] == "next" and msg["payload"].get("errors"), msg
        ext = msg["payload"]["errors"][0]["extensions"]
        return ext


def challenge_for(world: World, agent_id: str, owner: str) -> str:
    """Registers an AI agent of `owner` and has it write a document: the challenge's qid."""
    r = world.context.http.post(
        "/v1/service-accounts",
        json={"service_accounts": [{"id": agent_id, "owner": owner, "ai": True}]},
    )
    assert r.status_code == 200, r.text
    agent = {"type": "ServiceAccount", "id": agent_id}
    doc = {"type": "Document", "id": "budget"}
    d = until(
        f"{agent_id} registered and challenged",
        lambda: (
            (x := world.check(agent, "write", doc))["verdict"] == "challenge"
            and x.get("challenge_qid")
            and x
        ),
    )
    return str(d["challenge_qid"])


def test_the_upgrade_needs_the_portals_origin_and_a_session(world: World) -> None:
    ana = world.sign_in("ana")
    cookie = cookie_of(ana)
    with pytest.raises(WebSocketUpgradeError) as foreign:
        with connect(world, cookie, origin="https://evil.example.com"):
            pass
    assert foreign.value.response.status_code == 403
    with pytest.raises(WebSocketUpgradeError) as anonymous:
        with connect(world, None):
            pass
    assert anonymous.value.response.status_code == 403
    with pytest.raises(WebSocketUpgradeError):  # a forged cookie signs nobody in
        with connect(world, cookie + "x"):
            pass
    # The same cookie from the portal's own origin is let in.
    with connect(world, cookie) as ws:
        init(ws)
    ana.close()


def test_only_the_apps_operations_run_on_the_socket(world: World) -> None:
    ana = world.sign_in("ana")
    with connect(world, cookie_of(ana)) as ws:
        init(ws)
        ws.send_json(
            {
                "id": "unknown",
                "type": "subscribe",
                "payload": {
                    "query": "",
                    "extensions": {"persistedQuery": {"version": 1, "sha256Hash": "ab" * 32}},
                },
            }
        )
        assert refusal(ws, "unknown")["code"] == "PERSISTED_QUERY_NOT_FOUND"
        own = "subscription { containmentChanges { contained } }"
        ws.send_json({"id": "own", "type": "subscribe", "payload": {"query": own}})
        assert refusal(ws, "own")["code"] == "PERSISTED_QUERY_REQUIRED"
    ana.close()


def test_the_queue_and_the_containments_arrive_live(world: World) -> None:
    ana = world.sign_in("ana")
    with connect(world, cookie_of(ana)) as ws:
        init(ws)
        subscribe(ws, "queue", QUEUE, {"mine": False})
        subscribe(ws, "contained", CONTAINMENTS)
        # Opened after the subscription started: it arrives without asking again.
        qid = challenge_for(world, "copilot.live", "ana")
        opened = time.monotonic()
        got = next_of(ws, "queue", lambda d: d["challengeChanges"]["qid"] == qid)
        # How long the queue took to hear of it (printed, never asserted; polling took 5 s).
        print(
            f"challenge opened -> subscription event: {(time.monotonic() - opened) * 1000:.0f} ms"
        )
        assert got["challengeChanges"] == {
            "qid": qid,
            "state": "PENDING",
            "approver": "ana",
            "principal": {"type": "ServiceAccount", "id": "copilot.live"},
        }
        r = ana.post(
            "/graphql",
            json={
                "variables": {"p": {"type": "Human", "id": "bo"}},
                "extensions": {"persistedQuery": {"version": 1, "sha256Hash": digest(CONTAIN)}},
            },
        )
        assert r.status_code == 200 and not r.json().get("errors"), r.text
        got = next_of(
            ws,
            "contained",
            lambda d: d["containmentChanges"]["containment"]["principal"]["id"] == "bo",
        )
        assert got["containmentChanges"] == {
            "contained": True,
            "containment": {"principal": {"type": "Human", "id": "bo"}, "author": "ana"},
        }
        world.challenge_service.lift(Ref("Human", "bo"), "done", "test")
        got = next_of(
            ws,
            "contained",
            lambda d: d["containmentChanges"]["containment"]["principal"]["id"] == "bo",
        )
        assert got["containmentChanges"]["contained"] is False
    ana.close()


def test_a_person_who_may_not_view_is_refused_and_sign_out_ends_the_socket(world: World) -> None:
    cy = world.sign_in("cy")
    with connect(world, cookie_of(cy)) as ws:
        init(ws)
        # cy may not view everyone's challenges nor the containments: refused, with the
        # decision in the log.
        subscribe(ws, "queue", QUEUE, {"mine": False})
        ext = refusal(ws, "queue")
        assert ext["code"] == "FORBIDDEN" and UUID7.match(ext["decision_qid"]), ext
        assert (ext["area"], ext["action"], ext["verdict"]) == ("challenges", "view", "deny")
        subscribe(ws, "contained", CONTAINMENTS)
        ext = refusal(ws, "contained")
        assert ext["code"] == "FORBIDDEN" and ext["area"] == "containments", ext
        # Their own queue they may follow (context.own): a challenge they approve arrives.
        subscribe(ws, "mine", QUEUE, {"mine": True})
        qid = challenge_for(world, "copilot.cys", "cy")
        got = next_of(ws, "mine", lambda d: d["challengeChanges"]["qid"] == qid)
        assert got["challengeChanges"]["approver"] == "cy"
        # Signing out ends the session, and with it the socket and its subscriptions.
        assert cy.post("/auth/logout").status_code == 204
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                msg = ws.receive_json(timeout=60)
                assert msg["type"] in ("next", "complete", "ping", "pong"), msg
        assert closed.value.code == 4401, (closed.value.code, closed.value.reason)
    cy.close()
