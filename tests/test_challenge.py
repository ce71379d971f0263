"""The challenge service (docs/challenges.md) over the wire: a real service on a free 127.0.0.1
port, PostgreSQL behind it (a schema of its own per test), gRPC clients from grpcio, a Connect
client from httpx, and soft-webauthn as the security key."""

from __future__ import annotations

import json
import struct
from base64 import urlsafe_b64encode
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor
from fido2.utils import sha256
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from soft_webauthn import SoftWebauthnDevice
from sqlalchemy import create_engine
from sqlmodel import Session, col, select

from svc.challenge.app import ChallengeServer
from svc.challenge.directory import ContextDirectory, StaticDirectory
from svc.challenge.migrate import HEAD, current_revision, migrate
from svc.challenge.models import KeyResetRow, OutboxRow
from svc.challenge.service import ChallengeService, Ref, fingerprint
from svc.challenge.settings import ChallengeSettings
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from test_context import ENTERPRISE, Live, create_user, database_url

__all__ = ["Clock", "database_url", "make_service"]  # shared with tests/test_challenge_outbox.py

ORIGIN = "https://localhost:8443"
T0 = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
DIRECTORY = StaticDirectory(
    owners={"copilot.assistant": "ana", "reporter.bot": "bo"},
    managers={"ana": "bo", "bo": "cy"},
)

ANA = pb.EntityRef(type="Human", id="ana")
BO = pb.EntityRef(type="Human", id="bo")
AGENT = pb.EntityRef(type="ServiceAccount", id="copilot.assistant")
DOC = pb.EntityRef(type="Document", id="d1")


class Clock:
    """A clock the test moves: starts at T0."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += timedelta(seconds=secs)


def make_service(
    database_url: str, clock: Clock | None = None, **overrides: Any
) -> ChallengeService:
    settings = ChallengeSettings(
        database_url=database_url,
        port=0,
        heartbeat_secs=0.2,
        watch_poll_secs=0.1,
        rp_id="localhost",
        origins=[ORIGIN],
        challenge_ttl_secs=600,
        grant_ttl_secs=1800,
        **overrides,
    )
    kwargs: dict[str, Any] = {"directory": DIRECTORY}
    if clock is not None:
        kwargs["clock"] = clock
    return ChallengeService(settings, **kwargs)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(database_url: str, clock: Clock) -> Iterator[ChallengeServer]:
    service = make_service(database_url, clock)
    srv = ChallengeServer(service.settings, service, outbox=False).start()
    yield srv
    srv.stop()
    service.close()


@pytest.fixture
def stub(server: ChallengeServer) -> Iterator[pb_grpc.ChallengeServiceStub]:
    channel = grpc.insecure_channel(server.target)
    yield pb_grpc.ChallengeServiceStub(channel)
    channel.close()


def refused(call: Any, request: Any) -> grpc.RpcError:
    """The error a call answers; for a stream, the error of its first message."""
    with pytest.raises(grpc.RpcError) as info:
        out = call(request, timeout=30)
        if isinstance(out, grpc.Call) and hasattr(out, "__next__"):
            next(out)
    return info.value


def violations(e: grpc.RpcError) -> list[str]:
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    out = []
    for d in status.details if status else []:
        bad = error_details_pb2.BadRequest()
        if d.Unpack(bad):
            out.extend(v.field for v in bad.field_violations)
    return out


def resolve(stub: Any, principal: Any, kinds: list[str], **kw: Any) -> pb.ResolveResponse:
    kw.setdefault("action", "delete")
    kw.setdefault("resource", DOC)
    kw.setdefault("decision_qid", "q-1")
    return stub.Resolve(pb.ResolveRequest(principal=principal, challenges=kinds, **kw), timeout=30)


def outbox_events(server: ChallengeServer, qid: str) -> list[str]:
    with Session(server.service.db) as s:
        rows = s.exec(
            select(OutboxRow).where(OutboxRow.challenge_qid == qid).order_by(col(OutboxRow.id))
        ).all()
        return [r.event for r in rows]


# -- schema


def test_migrations_applied_twice_change_nothing(database_url: str) -> None:
    engine = create_engine(database_url)
    assert current_revision(engine) is None
    assert migrate(engine) == HEAD
    assert migrate(engine) == HEAD
    engine.dispose()


def test_fingerprint_leaves_the_decision_qid_out_and_ignores_kind_order() -> None:
    a = fingerprint(Ref("Human", "ana"), None, "delete", Ref("Document", "d1"), ["b", "a"])
    assert a == fingerprint(Ref("Human", "ana"), None, "delete", Ref("Document", "d1"), ["a", "b"])
    assert a != fingerprint(Ref("Human", "ana"), None, "delete", Ref("Document", "d2"), ["a", "b"])
    assert a != fingerprint(
        Ref("ServiceAccount", "x"), Ref("Human", "ana"), "delete", Ref("Document", "d1"), ["a", "b"]
    )


# -- lifecycle


def test_justification_flow_and_grants_bound_to_the_request(
    stub: pb_grpc.ChallengeServiceStub, server: ChallengeServer, clock: Clock
) -> None:
    first = resolve(stub, ANA, ["justification"], decision_qid="q-1")
    c = first.challenge
    assert first.created and not first.granted
    assert c.state == pb.CHALLENGE_STATE_PENDING
    assert (c.person, c.approver, list(c.kinds)) == ("ana", "", ["justification"])
    assert c.expires_at.ToDatetime(tzinfo=UTC) == T0 + timedelta(seconds=600)

    # The agent's retry has a new decision qid and finds the same challenge.
    again = resolve(stub, ANA, ["justification"], decision_qid="q-2")
    assert not again.created and again.challenge.qid == c.qid
    assert (again.challenge.decision_qid, again.challenge.last_decision_qid) == ("q-1", "q-2")

    e = refused(stub.Justify, pb.JustifyRequest(qid=c.qid, person="bo", text="because"))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    e = refused(stub.Justify, pb.JustifyRequest(qid=c.qid, person="ana", text="  "))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(e) == ["text"]

    clock.advance(30)
    done = stub.Justify(
        pb.JustifyRequest(qid=c.qid, person="ana", text="cleaning up the draft"), timeout=30
    ).challenge
    assert done.state == pb.CHALLENGE_STATE_PASSED
    assert done.justification == "cleaning up the draft"
    assert done.grant_expires_at.ToDatetime(tzinfo=UTC) == T0 + timedelta(seconds=30 + 1800)
    e = refused(stub.Justify, pb.JustifyRequest(qid=c.qid, person="ana", text="again"))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION

    retry = resolve(stub, ANA, ["justification"], decision_qid="q-3")
    assert retry.granted and not retry.created and retry.challenge.qid == c.qid
    # The grant covers that exact request only.
    other_doc = resolve(
        stub, ANA, ["justification"], resource=pb.EntityRef(type="Document", id="d2")
    )
    assert other_doc.created and not other_doc.granted
    other_action = resolve(stub, ANA, ["justification"], action="share_external")
    assert other_action.created and not other_action.granted
    more_kinds = resolve(stub, ANA, ["justification", "verification"])
    assert more_kinds.created and more_kinds.challenge.qid != c.qid
    assert outbox_events(server, c.qid) == ["opened", "passed"]

    # Past the grant, a retry opens a new challenge.
    clock.advance(1800)
    after = resolve(stub, ANA, ["justification"], decision_qid="q-4")
    assert after.created and after.challenge.qid != c.qid


def test_approval_for_an_agent_acting_for_a_person(
    stub: pb_grpc.ChallengeServiceStub, server: ChallengeServer
) -> None:
    r = resolve(stub, AGENT, ["approval", "justification"], on_behalf_of=ANA)
    c = r.challenge
    assert (c.person, c.approver) == ("ana", "bo")  # the person answers, their manager approves
    assert list(c.kinds) == ["approval", "justification"]

    e = refused(stub.Decide, pb.DecideRequest(qid=c.qid, approver="bo", approve=True))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION  # waits for the justification
    c = stub.Justify(
        pb.JustifyRequest(qid=c.qid, person="ana", text="quarterly report"), timeout=30
    ).challenge
    assert c.state == pb.CHALLENGE_STATE_PENDING and list(c.satisfied) == ["justification"]
    for who in ("ana", "cy", ""):
        e = refused(stub.Decide, pb.DecideRequest(qid=c.qid, approver=who, approve=True))
        assert e.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)
    c = stub.Decide(
        pb.DecideRequest(qid=c.qid, approver="bo", approve=True, reason="ok"), timeout=30
    ).challenge
    assert c.state == pb.CHALLENGE_STATE_PASSED and c.decided_by == "bo"
    assert outbox_events(server, c.qid) == ["opened", "forwarded", "passed"]
    assert resolve(stub, AGENT, ["approval", "justification"], on_behalf_of=ANA).granted
    # The same agent alone, or for another person, is another request.
    assert resolve(stub, AGENT, ["approval", "justification"]).created
    assert resolve(stub, AGENT, ["approval", "justification"], on_behalf_of=BO).created


def test_rejection_denies_until_expiry_then_a_retry_opens_a_new_one(
    stub: pb_grpc.ChallengeServiceStub, server: ChallengeServer, clock: Clock
) -> None:
    c = resolve(stub, ANA, ["approval"]).challenge
    assert c.approver == "bo"
    c = stub.Decide(
        pb.DecideRequest(qid=c.qid, approver="bo", approve=False, reason="not now"), timeout=30
    ).challenge
    assert c.state == pb.CHALLENGE_STATE_REJECTED and c.reason == "not now"
    e = refused(stub.Decide, pb.DecideRequest(qid=c.qid, approver="bo", approve=True))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    clock.advance(599)
    again = resolve(stub, ANA, ["approval"])
    assert (again.challenge.qid, again.granted, again.created) == (c.qid, False, False)
    assert again.challenge.state == pb.CHALLENGE_STATE_REJECTED
    clock.advance(1)
    fresh = resolve(stub, ANA, ["approval"])
    assert fresh.created and fresh.challenge.qid != c.qid
    assert outbox_events(server, c.qid) == ["opened", "rejected"]


def test_expiry_is_read_from_the_stored_times(
    stub: pb_grpc.ChallengeServiceStub, clock: Clock
) -> None:
    c = resolve(stub, ANA, ["justification"]).challenge
    clock.advance(600)
    got = stub.GetChallenge(pb.GetChallengeRequest(qid=c.qid, principal=ANA), timeout=30).challenge
    assert got.state == pb.CHALLENGE_STATE_EXPIRED
    e = refused(stub.Justify, pb.JustifyRequest(qid=c.qid, person="ana", text="late"))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "expired" in (e.details() or "")
    listed = stub.ListChallenges(
        pb.ListChallengesRequest(person="ana", state=pb.CHALLENGE_STATE_EXPIRED), timeout=30
    ).challenges
    assert [x.qid for x in listed] == [c.qid]
    fresh = resolve(stub, ANA, ["justification"])
    assert fresh.created and fresh.challenge.qid != c.qid


def test_who_answers_for_an_agent_alone_and_a_named_approver(
    stub: pb_grpc.ChallengeServiceStub,
) -> None:
    c = resolve(stub, AGENT, ["approval", "justification"]).challenge
    assert (c.person, c.approver) == ("ana", "ana")  # its owner (docs/architecture.md)
    named = resolve(stub, ANA, ["approval"], approver="dee").challenge
    assert named.approver == "dee"
    unknown = pb.EntityRef(type="ServiceAccount", id="stray.bot")
    e = refused(
        stub.Resolve,
        pb.ResolveRequest(
            principal=unknown, action="read", resource=DOC, challenges=["justification"]
        ),
    )
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "owner" in (e.details() or "")
    e = refused(
        stub.Resolve,
        pb.ResolveRequest(
            principal=pb.EntityRef(type="Human", id="cy"),
            action="read",
            resource=DOC,
            challenges=["approval"],
        ),
    )
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "manager" in (e.details() or "")
    e = refused(
        stub.Resolve,
        pb.ResolveRequest(
            principal=ANA, action="read", resource=DOC, challenges=["approval"], approver="ana"
        ),
    )
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_someone_else_gets_not_found(stub: pb_grpc.ChallengeServiceStub) -> None:
    c = resolve(stub, AGENT, ["justification"], on_behalf_of=ANA).challenge
    ok = stub.GetChallenge(
        pb.GetChallengeRequest(qid=c.qid, principal=AGENT, on_behalf_of=ANA), timeout=30
    )
    assert ok.challenge.qid == c.qid
    other_agent = pb.EntityRef(type="ServiceAccount", id="reporter.bot")
    for req in (
        pb.GetChallengeRequest(qid=c.qid, principal=other_agent, on_behalf_of=ANA),
        pb.GetChallengeRequest(qid=c.qid, principal=AGENT, on_behalf_of=BO),
        pb.GetChallengeRequest(qid=c.qid, principal=AGENT),
        pb.GetChallengeRequest(qid=c.qid, principal=ANA),
        pb.GetChallengeRequest(qid="0193-nope", principal=AGENT, on_behalf_of=ANA),
        pb.GetChallengeRequest(qid="x" * 5000, principal=AGENT, on_behalf_of=ANA),
    ):
        e = refused(stub.GetChallenge, req)
        assert e.code() == grpc.StatusCode.NOT_FOUND
    e = refused(
        stub.WatchChallenges,
        pb.WatchChallengesRequest(qid=c.qid, principal=other_agent, on_behalf_of=ANA),
    )
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_junk_is_refused_naming_the_fields(stub: pb_grpc.ChallengeServiceStub) -> None:
    e = refused(
        stub.Resolve,
        pb.ResolveRequest(
            principal=pb.EntityRef(type="Human", id="a\x07b"),
            action="",
            challenges=["verification", "telepathy"],
            decision_qid="q" * 100,
        ),
    )
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(e) == [
        "principal.id",
        "action",
        "resource.type",
        "resource.id",
        "challenges[1]",
        "decision_qid",
    ]
    e = refused(stub.Resolve, pb.ResolveRequest(principal=ANA, action="read", resource=DOC))
    assert violations(e) == ["challenges"]
    e = refused(stub.ListChallenges, pb.ListChallengesRequest(limit=5000))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(e) == ["limit"]
    e = refused(stub.ListChallenges, pb.ListChallengesRequest(state=42))  # type: ignore[arg-type]
    assert violations(e) == ["state"]
    e = refused(stub.Contain, pb.ContainRequest(principal=ANA, author=""))
    assert violations(e) == ["author"]
    e = refused(stub.WatchChallenges, pb.WatchChallengesRequest())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    e = refused(
        stub.FinishVerification,
        pb.FinishVerificationRequest(ceremony_id="c", person="ana", credential_json="{not json"),
    )
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(e) == ["credential_json"]
    e = refused(
        stub.FinishKeyRegistration,
        pb.FinishKeyRegistrationRequest(ceremony_id="nope", person="ana", credential_json="{}"),
    )
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_connect_protocol_and_probes(server: ChallengeServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post(
            "/svc.challenge.v1.ChallengeService/Resolve",
            json={
                "principal": {"type": "Human", "id": "ana"},
                "action": "read",
                "resource": {"type": "Document", "id": "d9"},
                "challenges": ["justification"],
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["created"] is True and body["challenge"]["state"] == "CHALLENGE_STATE_PENDING"
        r = http.post(
            "/svc.challenge.v1.ChallengeService/GetChallenge",
            json={"qid": body["challenge"]["qid"], "principal": {"type": "Human", "id": "bo"}},
        )
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        r = http.post(
            "/svc.challenge.v1.ChallengeService/Resolve",
            content=b"\x00junk",
            headers={"content-type": "application/proto"},
        )
        assert r.status_code == 400, r.text
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["migration"] == HEAD
        assert http.get("/version").json()["component"] == "svc-challenge"
        assert "svc_challenge_calls_total" in http.get("/metrics").text


# -- watches


def test_watch_one_challenge_and_a_persons(stub: pb_grpc.ChallengeServiceStub) -> None:
    c = resolve(stub, AGENT, ["justification"], on_behalf_of=ANA).challenge
    one = stub.WatchChallenges(
        pb.WatchChallengesRequest(qid=c.qid, principal=AGENT, on_behalf_of=ANA), timeout=60
    )
    mine = stub.WatchChallenges(pb.WatchChallengesRequest(person="ana"), timeout=60)
    first = next(one)
    assert first.challenge.qid == c.qid and first.challenge.state == pb.CHALLENGE_STATE_PENDING
    assert next(mine).challenge.qid == c.qid
    beat = next(one)  # nothing changes: a heartbeat
    assert beat.WhichOneof("event") == "heartbeat" and beat.heartbeat.count == 1
    stub.Justify(pb.JustifyRequest(qid=c.qid, person="ana", text="needed"), timeout=30)
    seen = next(m for m in one if m.WhichOneof("event") == "challenge")
    assert seen.challenge.state == pb.CHALLENGE_STATE_PASSED
    other = resolve(stub, ANA, ["justification"]).challenge
    news: list[pb.Challenge] = []
    for m in mine:
        if m.WhichOneof("event") == "challenge":
            news.append(m.challenge)
            if {x.qid for x in news} >= {c.qid, other.qid}:
                break
    assert {(x.qid, x.state) for x in news} >= {
        (c.qid, pb.CHALLENGE_STATE_PASSED),
        (other.qid, pb.CHALLENGE_STATE_PENDING),
    }
    one.cancel()
    mine.cancel()


def test_containments_and_their_watch(stub: pb_grpc.ChallengeServiceStub) -> None:
    r = stub.Contain(
        pb.ContainRequest(principal=BO, reason="exfiltration", author="reasoner"), timeout=30
    )
    assert r.changed and r.containment.author == "reasoner"
    watch = stub.WatchContainments(pb.WatchContainmentsRequest(), timeout=60)
    first = next(watch)
    assert [c.principal.id for c in first.list.containments] == ["bo"]
    assert first.list.containments[0].reason == "exfiltration"
    again = stub.Contain(pb.ContainRequest(principal=BO, reason="twice", author="ana"), timeout=30)
    assert not again.changed and again.containment.reason == "exfiltration"
    stub.Contain(
        pb.ContainRequest(principal=AGENT, reason="odd tool use", author="portal:ana"), timeout=30
    )
    change = next(m for m in watch if m.WhichOneof("event") == "change").change
    assert change.contained and change.containment.principal.id == "copilot.assistant"
    assert stub.Lift(
        pb.LiftRequest(principal=BO, reason="cleared", author="ana"), timeout=30
    ).changed
    assert not stub.Lift(pb.LiftRequest(principal=BO, author="ana"), timeout=30).changed
    change = next(m for m in watch if m.WhichOneof("event") == "change").change
    assert not change.contained and change.containment.principal.id == "bo"
    beat = next(watch)
    assert beat.WhichOneof("event") == "heartbeat" and beat.heartbeat.count == 1
    listed = stub.ListContainments(pb.ListContainmentsRequest(), timeout=30).containments
    assert [(c.principal.type, c.principal.id) for c in listed] == [
        ("ServiceAccount", "copilot.assistant")
    ]
    watch.cancel()


def test_containment_made_through_another_replica_reaches_the_watch(
    server: ChallengeServer, stub: pb_grpc.ChallengeServiceStub, database_url: str
) -> None:
    other = make_service(database_url)  # a second replica on the same database
    try:
        watch = stub.WatchContainments(pb.WatchContainmentsRequest(), timeout=60)
        assert list(next(watch).list.containments) == []
        other.contain(Ref("Human", "cy"), "stolen laptop", "reasoner")
        change = next(m for m in watch if m.WhichOneof("event") == "change").change
        assert change.contained and change.containment.principal.id == "cy"
        watch.cancel()
    finally:
        other.close()


# -- security keys (WebAuthn, driven by soft-webauthn)


def _b64(data: bytes) -> str:
    return urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return bytes(__import__("webauthn").base64url_to_bytes(text))


class Key(SoftWebauthnDevice):  # type: ignore[misc]
    """soft-webauthn's authenticator, optionally reporting user verification (UV flag).

    soft-webauthn sets only user presence; a key with a PIN or fingerprint also sets UV
    (WebAuthn Level 3, section 6.1, flags bit 2), which the service requires.
    """

    def __init__(self, uv: bool = True) -> None:
        super().__init__()
        self.uv = uv

    def create_json(self, options_json: str, origin: str = ORIGIN) -> str:
        o = json.loads(options_json)
        options = {
            "publicKey": {
                **o,
                "challenge": _unb64(o["challenge"]),
                "user": {**o["user"], "id": _unb64(o["user"]["id"])},
            }
        }
        out = self.create(options, origin)
        att = cbor.decode(out["response"]["attestationObject"])
        if self.uv:
            auth = bytearray(att["authData"])
            auth[32] |= 0x04
            att["authData"] = bytes(auth)
        return json.dumps(
            {
                "id": _b64(out["rawId"]),
                "rawId": _b64(out["rawId"]),
                "type": "public-key",
                "response": {
                    "clientDataJSON": _b64(out["response"]["clientDataJSON"]),
                    "attestationObject": _b64(cbor.encode(att)),
                },
            }
        )

    def get_json(self, options_json: str, origin: str = ORIGIN) -> str:
        o = json.loads(options_json)
        self.sign_count += 1
        client_data = json.dumps(
            {"type": "webauthn.get", "challenge": o["challenge"], "origin": origin}
        ).encode()
        flags = 0x05 if self.uv else 0x01
        auth = sha256(self.rp_id.encode()) + bytes([flags]) + struct.pack(">I", self.sign_count)
        signature = self.private_key.sign(auth + sha256(client_data), ec.ECDSA(hashes.SHA256()))
        return json.dumps(
            {
                "id": _b64(self.credential_id),
                "rawId": _b64(self.credential_id),
                "type": "public-key",
                "response": {
                    "authenticatorData": _b64(auth),
                    "clientDataJSON": _b64(client_data),
                    "signature": _b64(signature),
                    "userHandle": _b64(self.user_handle),
                },
            }
        )


def register(stub: Any, person: str, key: Key, name: str = "blue key") -> pb.SecurityKey:
    begin = stub.BeginKeyRegistration(
        pb.BeginKeyRegistrationRequest(person=person, name=name), timeout=30
    )
    opts = json.loads(begin.options_json)
    assert opts["rp"]["id"] == "localhost"
    assert opts["authenticatorSelection"]["userVerification"] == "required"
    return stub.FinishKeyRegistration(
        pb.FinishKeyRegistrationRequest(
            ceremony_id=begin.ceremony_id,
            person=person,
            credential_json=key.create_json(begin.options_json),
        ),
        timeout=30,
    ).key


def test_security_key_flow(stub: pb_grpc.ChallengeServiceStub, server: ChallengeServer) -> None:
    key = Key()
    reg = register(stub, "ana", key)
    assert reg.person == "ana" and reg.name == "blue key" and reg.sign_count == 0
    assert [
        k.credential_id
        for k in stub.ListSecurityKeys(pb.ListSecurityKeysRequest(person="ana"), timeout=30).keys
    ] == [reg.credential_id]

    c = resolve(stub, AGENT, ["verification"], on_behalf_of=ANA).challenge
    begin = stub.BeginVerification(pb.BeginVerificationRequest(qid=c.qid, person="ana"), timeout=30)
    opts = json.loads(begin.options_json)
    assert [a["id"] for a in opts["allowCredentials"]] == [reg.credential_id]
    assert opts["userVerification"] == "required"
    assertion = key.get_json(begin.options_json)
    done = stub.FinishVerification(
        pb.FinishVerificationRequest(
            ceremony_id=begin.ceremony_id, person="ana", credential_json=assertion
        ),
        timeout=30,
    ).challenge
    assert done.state == pb.CHALLENGE_STATE_PASSED and list(done.satisfied) == ["verification"]
    assert (
        stub.ListSecurityKeys(pb.ListSecurityKeysRequest(person="ana"), timeout=30)
        .keys[0]
        .sign_count
        == 1
    )
    # A ceremony finishes once.
    e = refused(
        stub.FinishVerification,
        pb.FinishVerificationRequest(
            ceremony_id=begin.ceremony_id, person="ana", credential_json=assertion
        ),
    )
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert resolve(stub, AGENT, ["verification"], on_behalf_of=ANA).granted
    assert outbox_events(server, c.qid) == ["opened", "passed"]


def test_a_cloned_key_and_one_without_user_verification_are_refused(
    stub: pb_grpc.ChallengeServiceStub,
) -> None:
    key = Key()
    register(stub, "ana", key)
    c = resolve(stub, ANA, ["verification"]).challenge

    def attempt(k: Key) -> grpc.RpcError:
        begin = stub.BeginVerification(
            pb.BeginVerificationRequest(qid=c.qid, person="ana"), timeout=30
        )
        return refused(
            stub.FinishVerification,
            pb.FinishVerificationRequest(
                ceremony_id=begin.ceremony_id,
                person="ana",
                credential_json=k.get_json(begin.options_json),
            ),
        )

    key.sign_count = 5  # the key has been used elsewhere: the service stored 0, then sees 6
    begin = stub.BeginVerification(pb.BeginVerificationRequest(qid=c.qid, person="ana"), timeout=30)
    stub.FinishVerification(
        pb.FinishVerificationRequest(
            ceremony_id=begin.ceremony_id,
            person="ana",
            credential_json=key.get_json(begin.options_json),
        ),
        timeout=30,
    )
    c = resolve(stub, ANA, ["verification"], action="purge").challenge
    key.sign_count = 2  # a clone replaying an older counter
    e = attempt(key)
    assert (
        e.code() == grpc.StatusCode.PERMISSION_DENIED
        and "sign count" in (e.details() or "").lower()
    )
    key.sign_count = 10
    key.uv = False  # touched, but no PIN or biometric
    e = attempt(key)
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "verif" in (e.details() or "").lower()
    # A key that cannot verify the user is not registered at all.
    begin = stub.BeginKeyRegistration(pb.BeginKeyRegistrationRequest(person="ana"), timeout=30)
    e = refused(
        stub.FinishKeyRegistration,
        pb.FinishKeyRegistrationRequest(
            ceremony_id=begin.ceremony_id,
            person="ana",
            credential_json=Key(uv=False).create_json(begin.options_json),
        ),
    )
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(e) == ["credential_json"]
    # From another origin: refused too.
    begin = stub.BeginKeyRegistration(pb.BeginKeyRegistrationRequest(person="ana"), timeout=30)
    e = refused(
        stub.FinishKeyRegistration,
        pb.FinishKeyRegistrationRequest(
            ceremony_id=begin.ceremony_id,
            person="ana",
            credential_json=Key().create_json(begin.options_json, "https://evil.example"),
        ),
    )
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_only_a_key_registered_to_that_person_passes(stub: pb_grpc.ChallengeServiceStub) -> None:
    ana_key, bo_key = Key(), Key()
    register(stub, "ana", ana_key)
    bo_reg = register(stub, "bo", bo_key)
    c = resolve(stub, ANA, ["verification"]).challenge
    e = refused(stub.BeginVerification, pb.BeginVerificationRequest(qid=c.qid, person="bo"))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    begin = stub.BeginVerification(pb.BeginVerificationRequest(qid=c.qid, person="ana"), timeout=30)
    # bo's key signs ana's ceremony (a forwarded link): refused.
    e = refused(
        stub.FinishVerification,
        pb.FinishVerificationRequest(
            ceremony_id=begin.ceremony_id,
            person="ana",
            credential_json=bo_key.get_json(begin.options_json),
        ),
    )
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "not registered to `ana`" in (
        e.details() or ""
    )
    # ... and bo cannot finish ana's ceremony with it either.
    e = refused(
        stub.FinishVerification,
        pb.FinishVerificationRequest(
            ceremony_id=begin.ceremony_id,
            person="bo",
            credential_json=bo_key.get_json(begin.options_json),
        ),
    )
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    got = stub.GetChallenge(pb.GetChallengeRequest(qid=c.qid, principal=ANA), timeout=30).challenge
    assert got.state == pb.CHALLENGE_STATE_PENDING
    # Keys are removed by their person only.
    e = refused(
        stub.RemoveSecurityKey,
        pb.RemoveSecurityKeyRequest(person="ana", credential_id=bo_reg.credential_id),
    )
    assert e.code() == grpc.StatusCode.NOT_FOUND
    stub.RemoveSecurityKey(
        pb.RemoveSecurityKeyRequest(person="bo", credential_id=bo_reg.credential_id), timeout=30
    )
    assert (
        list(stub.ListSecurityKeys(pb.ListSecurityKeysRequest(person="bo"), timeout=30).keys) == []
    )
    # Without a key, a verification cannot start.
    other = resolve(stub, BO, ["verification"]).challenge
    e = refused(stub.BeginVerification, pb.BeginVerificationRequest(qid=other.qid, person="bo"))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_key_change_needs_the_old_key_and_replaces_it(
    stub: pb_grpc.ChallengeServiceStub,
) -> None:
    old, new, bos = Key(), Key(), Key()
    old_reg = register(stub, "ana", old)
    register(stub, "bo", bos)
    begin = stub.BeginKeyChange(
        pb.BeginKeyChangeRequest(person="ana", credential_id=old_reg.credential_id, name="green"),
        timeout=30,
    )
    proof_opts = json.loads(begin.assertion_options_json)
    assert [a["id"] for a in proof_opts["allowCredentials"]] == [old_reg.credential_id]
    assert proof_opts["userVerification"] == "required"
    # Other keys of the person are excluded, not the one being replaced.
    assert json.loads(begin.options_json).get("excludeCredentials", []) == []
    created = new.create_json(begin.options_json)

    def finish(assertion: str, person: str = "ana") -> grpc.RpcError:
        return refused(
            stub.FinishKeyRegistration,
            pb.FinishKeyRegistrationRequest(
                ceremony_id=begin.ceremony_id,
                person=person,
                credential_json=created,
                assertion_json=assertion,
            ),
        )

    # Without the old key's assertion, with another person's key, or by another person: refused.
    e = finish("")
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(e) == ["assertion_json"]
    e = finish(bos.get_json(begin.assertion_options_json))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    e = finish(old.get_json(begin.assertion_options_json), person="bo")
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    # An assertion over another challenge (a replay of a verification) does not verify.
    other = stub.BeginKeyChange(
        pb.BeginKeyChangeRequest(person="ana", credential_id=old_reg.credential_id), timeout=30
    )
    e = finish(old.get_json(other.assertion_options_json))
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    # bo cannot start changing ana's key.
    e = refused(
        stub.BeginKeyChange,
        pb.BeginKeyChangeRequest(person="bo", credential_id=old_reg.credential_id),
    )
    assert e.code() == grpc.StatusCode.NOT_FOUND

    done = stub.FinishKeyRegistration(
        pb.FinishKeyRegistrationRequest(
            ceremony_id=begin.ceremony_id,
            person="ana",
            credential_json=created,
            assertion_json=old.get_json(begin.assertion_options_json),
        ),
        timeout=30,
    )
    assert done.replaced_credential_id == old_reg.credential_id
    assert done.key.name == "green" and done.key.person == "ana"
    keys = stub.ListSecurityKeys(pb.ListSecurityKeysRequest(person="ana"), timeout=30).keys
    assert [k.credential_id for k in keys] == [done.key.credential_id]
    # The other change ceremony cannot finish now: its old key is gone.
    e = refused(
        stub.FinishKeyRegistration,
        pb.FinishKeyRegistrationRequest(
            ceremony_id=other.ceremony_id,
            person="ana",
            credential_json=Key().create_json(other.options_json),
            assertion_json=old.get_json(other.assertion_options_json),
        ),
    )
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION

    # The new key passes a verification; the old one is no longer allowed.
    c = resolve(stub, ANA, ["verification"]).challenge
    v = stub.BeginVerification(pb.BeginVerificationRequest(qid=c.qid, person="ana"), timeout=30)
    assert [a["id"] for a in json.loads(v.options_json)["allowCredentials"]] == [
        done.key.credential_id
    ]
    e = refused(
        stub.FinishVerification,
        pb.FinishVerificationRequest(
            ceremony_id=v.ceremony_id, person="ana", credential_json=old.get_json(v.options_json)
        ),
    )
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    passed = stub.FinishVerification(
        pb.FinishVerificationRequest(
            ceremony_id=v.ceremony_id, person="ana", credential_json=new.get_json(v.options_json)
        ),
        timeout=30,
    ).challenge
    assert passed.state == pb.CHALLENGE_STATE_PASSED


def test_reset_removes_every_key_recorded_and_the_person_registers_again(
    stub: pb_grpc.ChallengeServiceStub, server: ChallengeServer
) -> None:
    register(stub, "ana", Key(), "blue")
    register(stub, "ana", Key(), "spare")
    bo_reg = register(stub, "bo", Key())
    e = refused(stub.ResetSecurityKey, pb.ResetSecurityKeyRequest(person="ana", reason="lost"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(e) == ["author"]
    out = stub.ResetSecurityKey(
        pb.ResetSecurityKeyRequest(person="ana", reason="both keys lost", author="admin.eve"),
        timeout=30,
    )
    assert out.removed == 2
    assert (
        list(stub.ListSecurityKeys(pb.ListSecurityKeysRequest(person="ana"), timeout=30).keys) == []
    )
    # Only ana's keys.
    bo_keys = stub.ListSecurityKeys(pb.ListSecurityKeysRequest(person="bo"), timeout=30).keys
    assert [k.credential_id for k in bo_keys] == [bo_reg.credential_id]
    c = resolve(stub, ANA, ["verification"]).challenge
    e = refused(stub.BeginVerification, pb.BeginVerificationRequest(qid=c.qid, person="ana"))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    # A reset of nobody's keys is recorded too.
    again = stub.ResetSecurityKey(
        pb.ResetSecurityKeyRequest(person="ana", reason="check", author="admin.eve"), timeout=30
    )
    assert again.removed == 0
    with Session(server.service.db) as s:
        rows = s.exec(select(KeyResetRow).order_by(col(KeyResetRow.id))).all()
        assert [(r.person, r.author, r.reason, r.removed) for r in rows] == [
            ("ana", "admin.eve", "both keys lost", 2),
            ("ana", "admin.eve", "check", 0),
        ]
    # The person registers again and answers the challenge with the new key.
    key = Key()
    register(stub, "ana", key)
    v = stub.BeginVerification(pb.BeginVerificationRequest(qid=c.qid, person="ana"), timeout=30)
    passed = stub.FinishVerification(
        pb.FinishVerificationRequest(
            ceremony_id=v.ceremony_id, person="ana", credential_json=key.get_json(v.options_json)
        ),
        timeout=30,
    ).challenge
    assert passed.state == pb.CHALLENGE_STATE_PASSED


# -- the directory over the context service


def test_context_directory_names_owners_and_managers(database_url: str, postgres_url: str) -> None:
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    # The context service on a schema of its own, beside the challenge service's.
    url = make_url(postgres_url)
    name = f"ctx_{uuid.uuid4().hex[:12]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    ctx_url = url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
        hide_password=False
    )
    live = Live(ctx_url)
    try:
        bo = create_user(live, "bo")
        create_user(live, "ana", **{ENTERPRISE: {"manager": {"value": bo["id"]}}})
        r = live.http.post(
            "/v1/service-accounts",
            json={"service_accounts": [{"id": "copilot.assistant", "owner": "ana", "ai": True}]},
        )
        assert r.status_code == 200, r.text
        directory = ContextDirectory(live.url)
        assert directory.manager("ana") == "bo"
        assert directory.manager("bo") is None
        assert directory.manager("nobody") is None
        assert directory.owner("copilot.assistant") == "ana"
        assert directory.owner("stray.bot") is None
        service = ChallengeService(
            ChallengeSettings(database_url=database_url, context_url=live.url)
        )
        try:
            info, created, _ = service.resolve(
                Ref("ServiceAccount", "copilot.assistant"),
                None,
                "read",
                Ref("Document", "d1"),
                ["approval", "justification"],
            )
            assert created and (info.person, info.approver) == ("ana", "ana")
            info, _, _ = service.resolve(
                Ref("ServiceAccount", "copilot.assistant"),
                Ref("Human", "ana"),
                "read",
                Ref("Document", "d1"),
                ["approval"],
            )
            assert (info.person, info.approver) == ("ana", "bo")
        finally:
            service.close()
        directory.close()
    finally:
        live.stop()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    # A context service that does not answer: UNAVAILABLE, never a crash.
    service = ChallengeService(
        ChallengeSettings(database_url=database_url, context_url="http://127.0.0.1:9")
    )
    try:
        from svc.challenge.service import ChallengeError

        with pytest.raises(ChallengeError) as info_:
            service.resolve(Ref("Human", "zed"), None, "read", Ref("Document", "d1"), ["approval"])
        assert info_.value.code == "unavailable"
    finally:
        service.close()


# -- callers and the command line


def test_callers_need_a_bearer_token_of_a_listed_caller(database_url: str, tmp_path: Any) -> None:
    """docs/auth.md: every gRPC call needs a bearer token of a listed caller, audience
    `svc-challenge`; the probes take none."""
    from svc.challenge.settings import ChallengeAuthSettings
    from svc.common.auth import LocalIssuer

    issuer = LocalIssuer(tmp_path / "issuer")
    auth = ChallengeAuthSettings(
        auth_issuer=issuer.issuer, auth_jwks=issuer.jwks_url, auth_callers=["svc-up-pdp"]
    )
    service = make_service(database_url)
    srv = ChallengeServer(service.settings, service, auth=auth, outbox=False).start()
    channel = grpc.insecure_channel(srv.target)
    stub = pb_grpc.ChallengeServiceStub(channel)
    try:

        def call(token: str | None) -> Any:
            md = [("authorization", f"Bearer {token}")] if token is not None else []
            try:
                return stub.ListContainments(pb.ListContainmentsRequest(), metadata=md, timeout=30)
            except grpc.RpcError as e:
                return e

        assert call(None).code() == grpc.StatusCode.UNAUTHENTICATED
        wrong_aud = call(issuer.mint("svc-up-pdp", "svc-pdp", 60))
        assert wrong_aud.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "svc-challenge" in (wrong_aud.details() or "")
        assert call(issuer.mint("mallory", "svc-challenge", 60)).code() == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        ok = call(issuer.mint("svc-up-pdp", "svc-challenge", 60))
        assert isinstance(ok, pb.ListContainmentsResponse)
        assert httpx.get(f"{srv.url}/readyz", timeout=30).status_code == 200
    finally:
        channel.close()
        srv.stop()
        service.close()


def test_cli_migrate_and_unsafe_bind(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from svc.cli import app

    url = f"sqlite:///{tmp_path / 'challenge.db'}"
    runner = CliRunner()
    for _ in range(2):
        r = runner.invoke(app, ["challenge", "migrate", "--database-url", url])
        assert r.exit_code == 0, r.output
        assert r.output.strip() == f"challenge schema at revision {HEAD}"
    r = runner.invoke(app, ["challenge", "serve", "--host", "0.0.0.0", "--database-url", url])
    assert r.exit_code == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in r.output


def test_replicas_resolving_the_same_request_at_once_open_one_challenge(
    database_url: str,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    replicas = [make_service(database_url), make_service(database_url)]
    try:

        def one(i: int) -> tuple[str, bool]:
            info, created, _ = replicas[i % 2].resolve(
                Ref("ServiceAccount", "copilot.assistant"),
                Ref("Human", "ana"),
                "export",
                Ref("Customer", "c1"),
                ["justification"],
                decision_qid=f"q-{i}",
            )
            return info.qid, created

        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(one, range(16)))
        assert len({qid for qid, _ in got}) == 1
        assert sum(created for _, created in got) == 1
    finally:
        for r in replicas:
            r.close()


@pytest.mark.parametrize("junk", ["", "\x00\x07", "x" * 5000, "ünïcode ☃"])
def test_no_junk_makes_the_service_fail(stub: pb_grpc.ChallengeServiceStub, junk: str) -> None:
    """Every method, with every string field (entity refs included) set to junk: refused or
    answered, never UNKNOWN or INTERNAL."""
    from google.protobuf.descriptor import FieldDescriptor

    def fill(msg: Any) -> None:
        for f in msg.DESCRIPTOR.fields:
            if f.type == FieldDescriptor.TYPE_STRING:
                if f.is_repeated:
                    getattr(msg, f.name).append(junk)
                else:
                    setattr(msg, f.name, junk)
            elif f.type == FieldDescriptor.TYPE_MESSAGE and not f.is_repeated:
                fill(getattr(msg, f.name))

    for m in pb.DESCRIPTOR.services_by_name["ChallengeService"].methods:
        req = getattr(pb, m.input_type.name)()
        fill(req)
        call = getattr(stub, m.name)
        try:
            out = call(req, timeout=30)
            if m.server_streaming:
                next(out)
                out.cancel()
        except grpc.RpcError as e:
            assert e.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (
                m.name,
                e.details(),
            )
