"""Challenge flows end to end (docs/challenges.md): every kind, over gRPC and HTTP.

A real challenge service on PostgreSQL (as tests/test_challenge.py starts it), real
`svc pdp --bundle DIR --challenge URL` processes (two for the cross-replica case), and
soft-webauthn as the person's security key. For each kind (verification, justification,
approval passed, approval rejected) and each transport (gRPC `svc.authz.v1.Authorizer` with
`WaitForChallenge`; HTTP `POST /v1/access/evaluation` with `POST /v1/access/challenge`):
check -> `challenge` with a `challenge_qid` -> a wait answers pending -> a wait held while the
person (or approver) answers -> passed or rejected -> the retry is allowed or denied. Also:
another agent or principal waiting gets NOT_FOUND; a challenge that expires (the shortest
`challenge_ttl_secs`, 10 s) ends its wait `expired` and the retry opens a new one; a grant covers
only its exact request; containing the principal during a wait ends it with a deny and the
retry is denied `svc:contained`; a wait on a second decision point of a challenge the first
resolved; the approver check (the decision point asked whether the approver may `approve`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from svc.authz.v1 import authz_pb2, authz_pb2_grpc
from svc.challenge.app import ChallengeServer
from svc.challenge.pdp_client import ApproverCheck
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeSettings
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from svc.common.net import tcp_listener
from test_challenge import DIRECTORY, ORIGIN, Key, register
from test_context import database_url
from test_pdp_standalone import Pdp

__all__ = ["database_url"]  # the fixture, used by name

SCHEMA = """
entity Human;
entity ServiceAccount;
entity Document;
action read, delete, share, download, approve
  appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
"""

# download: a security key; delete: a reason; share: the manager's approval. The test
# directory names bo ana's manager; bo may approve anything but Document::"locked".
POLICIES = """
@id("read-anything")
permit (principal is Human, action == Action::"read", resource is Document);

@id("download-needs-key") @challenge("verification")
permit (principal is Human, action == Action::"download", resource is Document);

@id("delete-needs-reason") @challenge("justification")
permit (principal is Human, action == Action::"delete", resource is Document);

@id("share-needs-approval") @challenge("approval")
permit (principal is Human, action == Action::"share", resource is Document);

@id("bo-approves")
permit (principal == Human::"bo", action == Action::"approve", resource is Document);

@id("nobody-approves-locked")
forbid (principal, action == Action::"approve", resource == Document::"locked");
"""

#: The bundle of a decision point that lets nobody approve anything.
POLICIES_NO_APPROVERS = POLICIES.replace('@id("bo-approves")\npermit', '@id("bo-approves")\nforbid')

KIND_ACTION = {
    "verification": "download",
    "justification": "delete",
    "approval": "share",
}


def _bundle(path: Path, policies: str) -> Path:
    path.mkdir()
    (path / "schema.cedarschema").write_text(SCHEMA)
    (path / "policies.cedar").write_text(policies)
    return path


def _pdp(bundle: Path, challenge_url: str) -> Pdp:
    return Pdp(
        "--bundle", str(bundle), "--port", "0", "--no-watch",
        "--challenge", challenge_url,
        # A busy machine must not make Resolve miss its deadline in these checks.
        "--challenge-timeout-ms", "30000",
    )  # fmt: skip


def _metric(http: httpx.Client, name: str) -> float:
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.split()[-1])
    return total


@dataclass
class Checked:
    """A check's answer, whichever transport carried it."""

    verdict: str
    challenges: list[str]
    policies: list[str]
    challenge_qid: str


@dataclass
class Waited:
    """A wait's answer; ``found`` False for NOT_FOUND."""

    found: bool
    outcome: str = ""
    retry: bool = False
    expires_at: bool = False
    grant_expires_at: bool = False


_VERDICTS = {
    authz_pb2.VERDICT_ALLOW: "allow",
    authz_pb2.VERDICT_DENY: "deny",
    authz_pb2.VERDICT_CHALLENGE: "challenge",
}
_OUTCOMES = {
    authz_pb2.CHALLENGE_OUTCOME_PENDING: "pending",
    authz_pb2.CHALLENGE_OUTCOME_PASSED: "passed",
    authz_pb2.CHALLENGE_OUTCOME_REJECTED: "rejected",
    authz_pb2.CHALLENGE_OUTCOME_EXPIRED: "expired",
}

Pair = tuple[str, str]


class DecisionPoint:
    """One `svc pdp` process, called over gRPC or HTTP (``transport``)."""

    def __init__(self, pdp: Pdp, transport: str) -> None:
        self.pdp = pdp
        self.transport = transport
        self.base = f"http://127.0.0.1:{pdp.port()}"
        self.http = httpx.Client(base_url=self.base, timeout=60)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{pdp.port()}")
        self.authz = authz_pb2_grpc.AuthorizerStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        code = self.pdp.stop()
        self.http.close()
        self.channel.close()
        assert code == 0, self.pdp.log

    def check(self, who: str, action: str, resource: str) -> Checked:
        if self.transport == "grpc":
            r = self.authz.Check(
                authz_pb2.CheckRequest(
                    principal=authz_pb2.EntityRef(type="Human", id=who),
                    action=action,
                    resource=authz_pb2.EntityRef(type="Document", id=resource),
                ),
                timeout=60,
            )
            return Checked(
                _VERDICTS[r.verdict], list(r.challenges), list(r.policies), r.challenge_qid
            )
        body = {
            "principal": {"type": "Human", "id": who},
            "action": action,
            "resource": {"type": "Document", "id": resource},
        }
        resp = self.http.post("/v1/access/evaluation", json=body)
        assert resp.status_code == 200, resp.text
        j = resp.json()
        return Checked(j["verdict"], j["challenges"], j["policies"], j.get("challenge_qid", ""))

    def wait(self, qid: str, who: Pair, obo: Pair | None = None, secs: int = 0) -> Waited:
        if self.transport == "grpc":
            req = authz_pb2.WaitForChallengeRequest(
                challenge_qid=qid,
                principal=authz_pb2.EntityRef(type=who[0], id=who[1]),
                on_behalf_of=authz_pb2.EntityRef(type=obo[0], id=obo[1]) if obo else None,
                wait_secs=secs,
            )
            try:
                r = self.authz.WaitForChallenge(req, timeout=120)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND, e  # type: ignore[attr-defined]
                return Waited(found=False)
            return Waited(
                True,
                _OUTCOMES[r.outcome],
                r.retry,
                r.HasField("expires_at"),
                r.HasField("grant_expires_at"),
            )
        body: dict[str, Any] = {
            "challenge_qid": qid,
            "principal": {"type": who[0], "id": who[1]},
            "wait_secs": secs,
        }
        if obo:
            body["on_behalf_of"] = {"type": obo[0], "id": obo[1]}
        resp = self.http.post("/v1/access/challenge", json=body, timeout=120)
        if resp.status_code == 404:
            assert resp.json()["type"] == "urn:svc:problem:challenge-not-found"
            return Waited(found=False)
        assert resp.status_code == 200, resp.text
        j = resp.json()
        return Waited(
            True, j["outcome"], j["retry"], bool(j["expires_at"]), bool(j["grant_expires_at"])
        )

    def waits_held(self) -> float:
        return _metric(self.http, "svc_pdp_challenge_waits")


ANA: Pair = ("Human", "ana")
BO: Pair = ("Human", "bo")
AGENT: Pair = ("ServiceAccount", "copilot.assistant")


class World:
    """The challenge service and one decision point (more with ``another``)."""

    def __init__(self, database_url: str, tmp: Path, transport: str, **overrides: Any) -> None:
        self.tmp = tmp
        self.transport = transport
        settings: dict[str, Any] = {
            "database_url": database_url,
            "port": 0,
            "heartbeat_secs": 0.2,
            "watch_poll_secs": 0.1,
            "origins": [ORIGIN],
            "challenge_ttl_secs": 600,
            "grant_ttl_secs": 1800,
        }
        self.service = ChallengeService(
            ChallengeSettings(**{**settings, **overrides}), directory=DIRECTORY
        )
        self.challenge = ChallengeServer(self.service.settings, self.service, outbox=False).start()
        self.bundle = _bundle(tmp / "bundle", POLICIES)
        self.pdp = DecisionPoint(_pdp(self.bundle, self.challenge.url), transport)
        # The approver check asks this decision point (the service starts before it).
        self.set_approvers(self.pdp.base)
        self.others: list[DecisionPoint] = []
        self.channel = grpc.insecure_channel(self.challenge.target)
        self.stub = pb_grpc.ChallengeServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.pool = ThreadPoolExecutor(max_workers=8)

    def set_approvers(self, url: str, **options: Any) -> None:
        """Points the service's approver check at the decision point at `url`."""
        old = self.service.approvers
        self.service.approvers = ApproverCheck(url, **options)
        if old is not None:
            old.close()

    def another(self, bundle: Path | None = None) -> DecisionPoint:
        """A second decision point following the same challenge service."""
        dp = DecisionPoint(_pdp(bundle or self.bundle, self.challenge.url), self.transport)
        self.others.append(dp)
        return dp

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for dp in [self.pdp, *self.others]:
            dp.close()
        self.channel.close()
        self.challenge.stop()
        self.service.close()

    def held(self, dp: DecisionPoint, qid: str, who: Pair = ANA, n: int = 1) -> Future[Waited]:
        """A wait of 25 s started in a thread, returned once the listener holds it."""
        before = dp.waits_held()
        fut = self.pool.submit(dp.wait, qid, who, None, 25)
        while dp.waits_held() < before + n:
            assert not fut.done(), fut.result()
            time.sleep(0.02)
        return fut

    # -- answers through the challenge service, as the page would send them

    def justify(self, qid: str, person: str = "ana") -> pb.Challenge:
        return self.stub.Justify(
            pb.JustifyRequest(qid=qid, person=person, text="cleaning up the old drafts"),
            timeout=30,
        ).challenge

    def decide(self, qid: str, approve: bool, approver: str = "bo") -> pb.Challenge:
        return self.stub.Decide(
            pb.DecideRequest(qid=qid, approver=approver, approve=approve, reason="seen"),
            timeout=30,
        ).challenge

    def touch_key(self, qid: str, key: Key, person: str = "ana") -> pb.Challenge:
        begin = self.stub.BeginVerification(
            pb.BeginVerificationRequest(qid=qid, person=person), timeout=30
        )
        return self.stub.FinishVerification(
            pb.FinishVerificationRequest(
                ceremony_id=begin.ceremony_id,
                person=person,
                credential_json=key.get_json(begin.options_json),
            ),
            timeout=30,
        ).challenge


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def world(database_url: str, tmp_path: Path, transport: str) -> Iterator[World]:
    w = World(database_url, tmp_path, transport)
    yield w
    w.close()


@pytest.mark.parametrize(
    ("kind", "passes"),
    [("verification", True), ("justification", True), ("approval", True), ("approval", False)],
)
def test_flow_of_each_kind(world: World, kind: str, passes: bool) -> None:
    key = Key()
    if kind == "verification":
        register(world.stub, "ana", key)
    action = KIND_ACTION[kind]
    dp = world.pdp

    first = dp.check("ana", action, "d1")
    assert first.verdict == "challenge"
    assert first.challenges == [kind]
    qid = first.challenge_qid
    assert qid
    # The same request again names the same challenge.
    assert dp.check("ana", action, "d1").challenge_qid == qid

    look = dp.wait(qid, ANA)
    assert look == Waited(True, "pending", False, True, False)

    # Another principal, an agent acting for ana, or ana's agent alone learn nothing of it.
    assert dp.wait(qid, BO) == Waited(found=False)
    assert dp.wait(qid, AGENT, ANA) == Waited(found=False)
    assert dp.wait(qid, AGENT) == Waited(found=False)
    assert dp.wait(qid, ANA, AGENT) == Waited(found=False)

    # A wait held while the person (or approver) answers.
    held = world.held(dp, qid)
    answers: dict[str, Callable[[], pb.Challenge]] = {
        "verification": lambda: world.touch_key(qid, key),
        "justification": lambda: world.justify(qid),
        "approval": lambda: world.decide(qid, passes),
    }
    answered = answers[kind]()
    want = pb.CHALLENGE_STATE_PASSED if passes else pb.CHALLENGE_STATE_REJECTED
    assert answered.state == want
    done = held.result()
    if passes:
        assert done == Waited(True, "passed", True, True, True)
    else:
        assert done == Waited(True, "rejected", False, True, False)

    retry = dp.check("ana", action, "d1")
    assert retry.challenge_qid == qid
    assert retry.challenges == []
    if passes:
        assert retry.verdict == "allow"
        assert "svc:challenge_passed" in retry.policies
    else:
        assert retry.verdict == "deny"
        assert "svc:challenge_rejected" in retry.policies
    # A look after the answer says the same, and still only to ana.
    assert dp.wait(qid, ANA).outcome == ("passed" if passes else "rejected")
    assert not dp.wait(qid, BO).found


def test_expiry_ends_the_wait_and_the_retry_opens_a_new_challenge(
    database_url: str, tmp_path: Path, transport: str
) -> None:
    world = World(database_url, tmp_path, transport, challenge_ttl_secs=10)
    try:
        dp = world.pdp
        first = dp.check("ana", "delete", "d1")
        qid = first.challenge_qid
        assert first.verdict == "challenge" and qid
        # Held until expires_at (10 s after the challenge opened), not until wait_secs.
        outcome = dp.wait(qid, ANA, secs=25)
        while outcome.outcome == "pending":  # a wait that started late can end at wait_secs
            outcome = dp.wait(qid, ANA, secs=25)
        assert outcome == Waited(True, "expired", True, True, False)
        assert (
            world.stub.GetChallenge(
                pb.GetChallengeRequest(qid=qid, principal=pb.EntityRef(type="Human", id="ana")),
                timeout=30,
            ).challenge.state
            == pb.CHALLENGE_STATE_EXPIRED
        )
        # An answer after expiry is refused; the retry opens a new challenge.
        with pytest.raises(grpc.RpcError) as info:
            world.justify(qid)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        retry = dp.check("ana", "delete", "d1")
        assert retry.verdict == "challenge"
        assert retry.challenge_qid and retry.challenge_qid != qid
        assert dp.wait(retry.challenge_qid, ANA).outcome == "pending"
    finally:
        world.close()


def test_a_grant_covers_only_its_exact_request(world: World) -> None:
    dp = world.pdp
    qid = dp.check("ana", "delete", "d1").challenge_qid
    world.justify(qid)
    assert dp.wait(qid, ANA, secs=25).outcome == "passed"
    assert dp.check("ana", "delete", "d1").verdict == "allow"

    # Another resource, another action, another principal: new challenges of their own.
    other_resource = dp.check("ana", "delete", "d2")
    other_action = dp.check("ana", "share", "d1")
    other_principal = dp.check("bo", "delete", "d1")
    qids = {qid}
    for c in (other_resource, other_action, other_principal):
        assert c.verdict == "challenge"
        assert c.challenge_qid and c.challenge_qid not in qids
        qids.add(c.challenge_qid)
    assert dp.wait(other_resource.challenge_qid, ANA).outcome == "pending"
    # ana's grant is not bo's, and ana cannot wait on bo's challenge.
    assert not dp.wait(other_principal.challenge_qid, ANA).found


def test_containment_during_a_wait_ends_it_with_a_deny(world: World) -> None:
    dp = world.pdp
    qid = dp.check("ana", "delete", "d1").challenge_qid
    bo_qid = dp.check("bo", "delete", "d1").challenge_qid
    held = world.held(dp, qid)
    held_bo = world.held(dp, bo_qid, BO)

    changed = world.stub.Contain(
        pb.ContainRequest(
            principal=pb.EntityRef(type="Human", id="ana"), reason="odd downloads", author="soc"
        ),
        timeout=30,
    )
    assert changed.changed
    assert held.result() == Waited(True, "rejected", False, True, False)
    retry = dp.check("ana", "delete", "d1")
    assert retry.verdict == "deny"
    assert retry.policies == ["svc:contained"]
    assert retry.challenge_qid == ""
    # A wait started now ends at once too; bo's wait is still held.
    assert dp.wait(qid, ANA, secs=25).outcome == "rejected"
    assert not held_bo.done() or held_bo.result().outcome == "pending"  # a late machine
    # An answer after it changes nothing for ana while contained.
    world.justify(qid)
    assert dp.wait(qid, ANA, secs=25).outcome == "rejected"
    assert dp.check("ana", "delete", "d1").verdict == "deny"

    # Lifted: the challenge answers as the service holds it (passed by the answer above).
    world.stub.Lift(
        pb.LiftRequest(principal=pb.EntityRef(type="Human", id="ana"), reason="ok", author="soc"),
        timeout=30,
    )
    while (look := dp.wait(qid, ANA)).outcome == "rejected":  # the lift reaches the listener
        time.sleep(0.05)
    assert look.outcome == "passed"
    assert dp.check("ana", "delete", "d1").verdict == "allow"

    # bo's wait was never ended by ana's containment.
    world.justify(bo_qid, "bo")
    assert held_bo.result().outcome in ("passed", "pending")
    assert dp.wait(bo_qid, BO, secs=25).outcome == "passed"


def test_a_wait_on_another_decision_point(world: World) -> None:
    second = world.another()
    for kind, passes in (("justification", True), ("approval", False)):
        action = KIND_ACTION[kind]
        qid = world.pdp.check("ana", action, "x1").challenge_qid
        assert qid
        # The second decision point resolved nothing: it asks the service, as ana only.
        assert not second.wait(qid, BO).found
        assert second.wait(qid, ANA).outcome == "pending"
        held = world.held(second, qid)
        if passes:
            world.justify(qid)
        else:
            world.decide(qid, False)
        done = held.result()
        assert done.outcome == ("passed" if passes else "rejected")
        # The retry through the second decision point finds the same challenge.
        retry = second.check("ana", action, "x1")
        assert retry.challenge_qid == qid
        assert retry.verdict == ("allow" if passes else "deny")


def test_the_decision_point_is_asked_whether_the_approver_may_approve(
    world: World, tmp_path: Path
) -> None:
    dp = world.pdp
    # bo may not approve Document::"locked": Resolve refuses, the verdict carries no qid.
    locked = dp.check("ana", "share", "locked")
    assert locked.verdict == "challenge"
    assert locked.challenge_qid == ""
    with pytest.raises(grpc.RpcError) as info:
        world.stub.Resolve(
            pb.ResolveRequest(
                principal=pb.EntityRef(type="Human", id="ana"),
                action="share",
                resource=pb.EntityRef(type="Document", id="locked"),
                challenges=["approval"],
            ),
            timeout=30,
        )
    err: Any = info.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "approver may not approve" in err.details()
    # A named approver is asked about too: ana may approve nothing.
    with pytest.raises(grpc.RpcError) as info:
        world.stub.Resolve(
            pb.ResolveRequest(
                principal=pb.EntityRef(type="Human", id="cy"),
                action="share",
                resource=pb.EntityRef(type="Document", id="d5"),
                challenges=["approval"],
                approver="ana",
            ),
            timeout=30,
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    # An agent acting alone: its owner (ana) approves as its person, without being asked about.
    alone = world.stub.Resolve(
        pb.ResolveRequest(
            principal=pb.EntityRef(type="ServiceAccount", id="copilot.assistant"),
            action="share",
            resource=pb.EntityRef(type="Document", id="locked"),
            challenges=["approval"],
        ),
        timeout=30,
    ).challenge
    assert alone.approver == "ana"
    assert world.decide(alone.qid, True, "ana").state == pb.CHALLENGE_STATE_PASSED

    # bo may approve d1: the challenge opens with bo as approver.
    qid = dp.check("ana", "share", "d1").challenge_qid
    assert qid
    # The policy changes (a decision point that lets nobody approve): Decide is refused.
    strict = world.another(_bundle(tmp_path / "strict", POLICIES_NO_APPROVERS))
    world.set_approvers(strict.base)
    with pytest.raises(grpc.RpcError) as info:
        world.decide(qid, True)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    # A decision point that does not answer: UNAVAILABLE at Decide and at Resolve.
    sock = tcp_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    world.set_approvers(f"http://127.0.0.1:{port}", timeout_secs=2)
    with pytest.raises(grpc.RpcError) as info:
        world.decide(qid, True)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as info:
        world.stub.Resolve(
            pb.ResolveRequest(
                principal=pb.EntityRef(type="Human", id="ana"),
                action="share",
                resource=pb.EntityRef(type="Document", id="d9"),
                challenges=["approval"],
            ),
            timeout=30,
        )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    # The decision point allows again: bo's approval is taken.
    world.set_approvers(dp.base)
    assert world.decide(qid, True).state == pb.CHALLENGE_STATE_PASSED
    assert dp.check("ana", "share", "d1").verdict == "allow"
