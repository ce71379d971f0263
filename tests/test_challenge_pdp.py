"""`svc pdp --challenge URL` end to end (docs/challenges.md#the-decision-point).

A real challenge service on PostgreSQL (as tests/test_challenge.py starts it) and
`svc pdp --bundle DIR --challenge URL` as a real process (as tests/test_context_pdp.py starts
`svc pdp`), with a bundle whose `delete` steps up with `@challenge("justification")`: the check
answers `challenge` with a `challenge_qid`; a wait answers pending, then passed once the person
justifies through the service; the retry of the same check is allowed; anyone else waiting gets
NOT_FOUND; another resource opens another challenge; many waits held at once all end when the
challenge passes; a rejected challenge ends a wait held by a second decision point (which asks
the service for a challenge it did not resolve) and denies the request. Over HTTP, AuthZEN and
gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from svc.authz.v1 import authz_pb2, authz_pb2_grpc
from svc.challenge.app import ChallengeServer
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from test_challenge import make_service
from test_context import database_url
from test_pdp_standalone import Pdp

__all__ = ["database_url"]  # the fixture, used by name

SCHEMA = """
entity Human;
entity Document;
action read, delete, share appliesTo { principal: [Human], resource: [Document] };
"""

POLICIES = """
@id("read-anything")
permit (principal is Human, action == Action::"read", resource is Document);

@id("delete-needs-reason") @challenge("justification")
permit (principal is Human, action == Action::"delete", resource is Document);

@id("share-needs-approval") @challenge("approval")
permit (principal is Human, action == Action::"share", resource is Document);
"""

EVAL = "/v1/access/evaluation"
WAIT = "/v1/access/challenge"


def human(name: str) -> dict[str, str]:
    return {"type": "Human", "id": name}


def doc(name: str) -> dict[str, str]:
    return {"type": "Document", "id": name}


class World:
    """The challenge service, `svc pdp --challenge` and clients of both."""

    def __init__(self, database_url: str, tmp: Path) -> None:
        self.service = make_service(database_url)
        self.challenge = ChallengeServer(self.service.settings, self.service, outbox=False).start()
        bundle = tmp / "bundle"
        bundle.mkdir()
        (bundle / "schema.cedarschema").write_text(SCHEMA)
        (bundle / "policies.cedar").write_text(POLICIES)
        self.pdp = Pdp(
            "--bundle", str(bundle), "--port", "0", "--no-watch",
            "--challenge", self.challenge.url,
            # A busy machine must not make Resolve miss its deadline in these checks.
            "--challenge-timeout-ms", "30000",
        )  # fmt: skip
        self.bundle = bundle
        self.base = f"http://127.0.0.1:{self.pdp.port()}"
        self.http = httpx.Client(base_url=self.base, timeout=60)
        self.channel = grpc.insecure_channel(self.challenge.target)
        self.stub = pb_grpc.ChallengeServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.pdp_channel = grpc.insecure_channel(f"127.0.0.1:{self.pdp.port()}")
        self.authz = authz_pb2_grpc.AuthorizerStub(self.pdp_channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        code = self.pdp.stop()
        self.http.close()
        self.channel.close()
        self.pdp_channel.close()
        self.challenge.stop()
        self.service.close()
        assert code == 0, self.pdp.log

    def check(self, who: str, action: str, resource: str) -> dict[str, Any]:
        body = {"principal": human(who), "action": action, "resource": doc(resource)}
        r = self.http.post(EVAL, json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait(self, qid: str, who: str, secs: int = 0) -> httpx.Response:
        return self.http.post(
            WAIT, json={"challenge_qid": qid, "principal": human(who), "wait_secs": secs}
        )

    def justify(self, qid: str, person: str) -> pb.Challenge:
        resp = self.stub.Justify(
            pb.JustifyRequest(qid=qid, person=person, text="cleaning up the old drafts"),
            timeout=30,
        )
        return resp.challenge

    def metric(self, name: str) -> float:
        return _metric(self.http, name)


@pytest.fixture
def world(database_url: str, tmp_path: Path) -> Iterator[World]:
    w = World(database_url, tmp_path)
    yield w
    w.close()


def test_challenge_resolved_waited_passed_and_retry_allowed(world: World) -> None:
    first = world.check("ana", "delete", "d1")
    assert first["verdict"] == "challenge"
    assert first["challenges"] == ["justification"]
    qid = first["challenge_qid"]
    assert qid

    # The service holds it, opened by this decision, for ana.
    got = world.stub.GetChallenge(
        pb.GetChallengeRequest(qid=qid, principal=pb.EntityRef(type="Human", id="ana")),
        timeout=30,
    ).challenge
    assert got.decision_qid == first["qid"]
    assert got.state == pb.CHALLENGE_STATE_PENDING

    # The same request again finds the same challenge; an allowed one resolves nothing.
    assert world.check("ana", "delete", "d1")["challenge_qid"] == qid
    assert "challenge_qid" not in world.check("ana", "read", "d1")

    # wait_secs 0 only looks.
    r = world.wait(qid, "ana", 0)
    assert r.status_code == 200, r.text
    look = r.json()
    assert look["outcome"] == "pending"
    assert look["retry"] is False
    assert look["pending"] == ["justification"]
    assert look["expires_at"] and look["grant_expires_at"] is None

    # Anyone else learns nothing of it; nor does an unknown qid.
    other = world.wait(qid, "bo", 0)
    assert other.status_code == 404, other.text
    assert other.json()["type"] == "urn:svc:problem:challenge-not-found"
    unknown = world.wait("0190f0f0-0000-7000-8000-000000000000", "ana", 0)
    assert unknown.status_code == 404, unknown.text

    # Another resource opens another challenge.
    d2 = world.check("ana", "delete", "d2")
    assert d2["verdict"] == "challenge"
    assert d2["challenge_qid"] and d2["challenge_qid"] != qid

    # ana justifies through the service; a wait then answers passed.
    assert world.justify(qid, "ana").state == pb.CHALLENGE_STATE_PASSED
    r = world.wait(qid, "ana", 25)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["outcome"] == "passed"
    assert done["retry"] is True
    assert done["grant_expires_at"] is not None

    # The retry of the same request is allowed, naming the passed challenge.
    retry = world.check("ana", "delete", "d1")
    assert retry["verdict"] == "allow"
    assert retry["challenges"] == []
    assert "svc:challenge_passed" in retry["policies"]
    assert retry["challenge_qid"] == qid
    # The grant is bound to that request: d2 still steps up.
    assert world.check("ana", "delete", "d2")["verdict"] == "challenge"
    # Another principal asking the same is a challenge of its own.
    bo = world.check("bo", "delete", "d1")
    assert bo["verdict"] == "challenge" and bo["challenge_qid"] not in (qid, d2["challenge_qid"])

    assert world.metric("svc_pdp_challenge_calls_total") >= 6
    assert world.metric('svc_pdp_challenge_calls_total{outcome="failed"}') == 0


def test_many_waits_end_when_the_challenge_passes(world: World) -> None:
    qid = world.check("ana", "delete", "d7")["challenge_qid"]
    n = 200
    body = {"challenge_qid": qid, "principal": human("ana"), "wait_secs": 25}

    async def waits() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
        async with httpx.AsyncClient(base_url=world.base, timeout=60, limits=limits) as c:
            tasks = [asyncio.create_task(c.post(WAIT, json=body)) for _ in range(n)]
            # Once every wait is held by the listener, the person answers.
            while world.metric("svc_pdp_challenge_waits") < n:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(world.justify, qid, "ana")
            return list(await asyncio.gather(*tasks))

    answers = asyncio.run(waits())
    assert [r.status_code for r in answers] == [200] * n
    assert {r.json()["outcome"] for r in answers} == {"passed"}
    assert world.metric("svc_pdp_challenge_waits") == 0
    print(f"{n} waits held at once ended passed")


def test_grpc_and_authzen(world: World) -> None:
    ana = authz_pb2.EntityRef(type="Human", id="ana")
    checked = world.authz.Check(
        authz_pb2.CheckRequest(
            principal=ana, action="delete", resource=authz_pb2.EntityRef(type="Document", id="g1")
        ),
        timeout=60,
    )
    assert checked.verdict == authz_pb2.VERDICT_CHALLENGE
    qid = checked.challenge_qid
    assert qid

    look = world.authz.WaitForChallenge(
        authz_pb2.WaitForChallengeRequest(challenge_qid=qid, principal=ana, wait_secs=0),
        timeout=60,
    )
    assert look.outcome == authz_pb2.CHALLENGE_OUTCOME_PENDING
    assert list(look.pending) == ["justification"]
    assert not look.retry

    with pytest.raises(grpc.RpcError) as info:
        world.authz.WaitForChallenge(
            authz_pb2.WaitForChallengeRequest(
                challenge_qid=qid, principal=authz_pb2.EntityRef(type="Human", id="bo")
            ),
            timeout=60,
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]

    # AuthZEN: the single evaluation and a batch carry the challenge in context.
    z = {"subject": human("ana"), "action": {"name": "delete"}, "resource": doc("g1")}
    one = world.http.post("/access/v1/evaluation", json=z).json()
    assert one["decision"] is False
    assert one["context"]["verdict"] == "challenge"
    assert one["context"]["challenge_qid"] == qid
    batch = world.http.post(
        "/access/v1/evaluations",
        json={"subject": human("ana"), "evaluations": [z, {**z, "resource": doc("g2")}]},
    ).json()["evaluations"]
    assert batch[0]["context"]["challenge_qid"] == qid
    assert batch[1]["context"]["challenge_qid"] not in ("", qid)

    world.justify(qid, "ana")
    passed = world.authz.WaitForChallenge(
        authz_pb2.WaitForChallengeRequest(challenge_qid=qid, principal=ana, wait_secs=25),
        timeout=60,
    )
    assert passed.outcome == authz_pb2.CHALLENGE_OUTCOME_PASSED
    assert passed.retry
    assert passed.HasField("grant_expires_at")
    again = world.authz.Check(
        authz_pb2.CheckRequest(
            principal=ana, action="delete", resource=authz_pb2.EntityRef(type="Document", id="g1")
        ),
        timeout=60,
    )
    assert again.verdict == authz_pb2.VERDICT_ALLOW
    assert again.challenge_qid == qid
    assert world.http.post("/access/v1/evaluation", json=z).json()["decision"] is True
    # In a short-circuiting batch, the passed challenge's allow lets the batch go on, and the
    # next item's open challenge stops it.
    short = world.http.post(
        "/access/v1/evaluations",
        json={
            "subject": human("ana"),
            "evaluations": [z, {**z, "resource": doc("g2")}, z],
            "options": {"evaluations_semantic": "deny_on_first_deny"},
        },
    ).json()["evaluations"]
    assert [e["decision"] for e in short] == [True, False]
    assert short[0]["context"]["challenge_qid"] == qid
    assert short[1]["context"]["verdict"] == "challenge"


def test_rejected_and_waited_on_another_decision_point(world: World) -> None:
    # A second decision point, which resolved nothing: it asks the service for the challenge.
    other = Pdp(
        "--bundle", str(world.bundle), "--port", "0", "--no-watch",
        "--challenge", world.challenge.url, "--challenge-timeout-ms", "30000",
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{other.port()}"
        with httpx.Client(base_url=base, timeout=60) as http:
            shared = world.check("ana", "share", "s1")
            assert shared["verdict"] == "challenge"
            assert shared["challenges"] == ["approval"]
            qid = shared["challenge_qid"]

            def wait(who: str, secs: int) -> httpx.Response:
                body = {"challenge_qid": qid, "principal": human(who), "wait_secs": secs}
                return http.post(WAIT, json=body)

            # The service answers GetChallenge to ana only.
            assert wait("bo", 0).status_code == 404
            r = wait("ana", 0)
            assert r.status_code == 200, r.text
            assert r.json()["outcome"] == "pending"

            async def held_then_rejected() -> httpx.Response:
                async with httpx.AsyncClient(base_url=base, timeout=60) as c:
                    body = {"challenge_qid": qid, "principal": human("ana"), "wait_secs": 25}
                    task = asyncio.create_task(c.post(WAIT, json=body))
                    while _metric(http, "svc_pdp_challenge_waits") < 1:
                        await asyncio.sleep(0.05)
                    # ana's manager (the test directory's) rejects it.
                    await asyncio.to_thread(
                        world.stub.Decide,
                        pb.DecideRequest(qid=qid, approver="bo", approve=False, reason="no"),
                        timeout=30,
                    )
                    return await task

            r = asyncio.run(held_then_rejected())
            assert r.status_code == 200, r.text
            rejected = r.json()
            assert rejected["outcome"] == "rejected"
            assert rejected["retry"] is False
            assert rejected["expires_at"]
            assert _metric(http, "svc_pdp_challenge_calls_total") == 2  # two GetChallenge

        # Rejected: the same request is denied until the challenge expires, on both.
        again = world.check("ana", "share", "s1")
        assert again["verdict"] == "deny"
        assert "svc:challenge_rejected" in again["policies"]
        assert again["challenge_qid"] == qid
    finally:
        assert other.stop() == 0, other.log


def _metric(http: httpx.Client, name: str) -> float:
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.split()[-1])
    return total
