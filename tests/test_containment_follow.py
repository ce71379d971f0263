"""Decision points following the challenge service's containment list (svc.pdp.containment_follower).

A live challenge service on PostgreSQL (as tests/test_challenge.py starts it) and a real
in-process Engine served by a real decision-point listener (as tests/test_context_follow.py
does). Every wait is on what the follower has applied (``ContainmentFollower.wait_for``), never a
sleep.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from svc.challenge.app import ChallengeServer
from svc.challenge.service import ChallengeService, Ref
from svc.challenge.settings import ChallengeSettings
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from svc.common.net import tcp_listener
from svc.pdp import Engine, Server
from svc.pdp.containment_follower import ContainmentFollower, follow_containments
from test_context import database_url

__all__ = ["database_url"]  # the fixture, shared with tests/test_context.py

log = logging.getLogger("test_containment_follow")

SCHEMA = """
entity Human;
entity Document;
action read appliesTo { principal: [Human], resource: [Document] };
"""

POLICIES = '@id("people-read") permit (principal is Human, action == Action::"read", resource);'

BO = {"type": "Human", "id": "bo"}
CY = {"type": "Human", "id": "cy"}


def settings(database_url: str, port: int = 0) -> ChallengeSettings:
    """The service's settings with quick heartbeats (the follower's staleness is noticed)."""
    return ChallengeSettings(
        database_url=database_url, port=port, heartbeat_secs=0.2, watch_poll_secs=0.1
    )


class Pdp:
    """A real engine behind a real listener that waits for its containment list."""

    def __init__(self) -> None:
        self.engine = Engine(POLICIES, SCHEMA)
        self.server = Server(self.engine, port=0, workers=1)
        self.server.start()
        self.server.set_ready(bundle=True)  # the containment list is the follower's to mark
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.server.port}", timeout=60)

    def check(self, principal: dict[str, str]) -> dict[str, Any]:
        r = self.http.post(
            "/v1/access/evaluation",
            json={
                "principal": principal,
                "action": "read",
                "resource": {"type": "Document", "id": "d1"},
            },
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    def verdict(self, principal: dict[str, str]) -> str:
        """``allow``, ``deny``, or ``contained`` for a deny naming ``svc:contained``."""
        answer = self.check(principal)
        if answer["verdict"] == "deny" and "svc:contained" in answer["policies"]:
            return "contained"
        return str(answer["verdict"])

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


@pytest.fixture
def service(database_url: str) -> Iterator[ChallengeService]:
    s = ChallengeService(settings(database_url))
    yield s
    s.close()


@pytest.fixture
def live(service: ChallengeService) -> Iterator[ChallengeServer]:
    srv = ChallengeServer(service.settings, service, outbox=False).start()
    yield srv
    srv.stop()


@pytest.fixture
def stub(live: ChallengeServer) -> Iterator[pb_grpc.ChallengeServiceStub]:
    channel = grpc.insecure_channel(live.target)
    yield pb_grpc.ChallengeServiceStub(channel)
    channel.close()


def contain(stub: pb_grpc.ChallengeServiceStub, who: dict[str, str]) -> None:
    r = stub.Contain(
        pb.ContainRequest(principal=pb.EntityRef(**who), reason="odd downloads", author="reasoner"),
        timeout=30,
    )
    assert r.changed


def lift(stub: pb_grpc.ChallengeServiceStub, who: dict[str, str]) -> None:
    r = stub.Lift(pb.LiftRequest(principal=pb.EntityRef(**who), author="ana"), timeout=30)
    assert r.changed


def key(who: dict[str, str]) -> tuple[str, str]:
    return who["type"], who["id"]


def test_contain_denies_and_lift_allows_again(
    pdp: Pdp, live: ChallengeServer, stub: pb_grpc.ChallengeServiceStub
) -> None:
    contain(stub, CY)  # before the follower: comes with the whole list
    follower = follow_containments(pdp.engine, pdp.server, live.url)
    try:
        follower.wait_for(lambda s: s.loaded)
        assert pdp.readyz() == 200
        assert follower.status.contained == {key(CY)}
        assert pdp.verdict(CY) == "contained"
        assert pdp.verdict(BO) == "allow"

        t0 = time.monotonic()
        contain(stub, BO)
        status = follower.wait_for(lambda s: key(BO) in s.contained)
        denied = pdp.verdict(BO)
        took = time.monotonic() - t0
        log.info(
            "Contain -> denied at the decision point in %.1f ms (applied after %.1f ms)",
            took * 1000,
            (status.changed_at - t0) * 1000,
        )
        assert denied == "contained"

        lift(stub, BO)
        follower.wait_for(lambda s: key(BO) not in s.contained)
        assert pdp.verdict(BO) == "allow"
        assert pdp.verdict(CY) == "contained"
        assert follower.status.lists == 1 and follower.status.applied == 2
    finally:
        follower.stop()


def test_readyz_is_503_until_the_list_loads_and_a_restart_reloads_it(
    pdp: Pdp, service: ChallengeService
) -> None:
    """Nothing listens at first: /readyz stays 503 while the follower retries; once the service
    answers, the list loads. The service then stops; a containment made meanwhile (through
    another replica on the same database) arrives with the whole list of the next stream."""
    sock = tcp_listener("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    sock.close()  # a port nothing listens on, for now
    service.contain(Ref("Human", "cy"), "stolen laptop", "reasoner")
    follower = ContainmentFollower(
        pdp.engine,
        f"http://127.0.0.1:{port}",
        on_loaded=lambda: pdp.server.set_ready(containments=True),
        backoff_secs=0.05,
        max_backoff_secs=0.5,
        stale_secs=2.0,
    ).start()
    try:
        follower.wait_for(lambda s: s.reconnects >= 2)
        assert not follower.status.loaded and "UNAVAILABLE" in follower.status.error
        assert pdp.readyz() == 503 and "containment" in pdp.http.get("/readyz").text
        assert pdp.verdict(CY) == "allow"  # nothing loaded: the list is empty

        first = ChallengeServer(settings(service.settings.database_url, port), outbox=False)
        first.start()
        follower.wait_for(lambda s: s.loaded)
        assert pdp.readyz() == 200 and pdp.verdict(CY) == "contained"

        first.stop()
        first.service.close()
        follower.wait_for(lambda s: not s.connected)
        assert pdp.readyz() == 200  # the list in force keeps serving through the gap
        service.lift(Ref("Human", "cy"), "cleared", "ana")
        service.contain(Ref("Human", "bo"), "odd downloads", "reasoner")
        assert pdp.verdict(BO) == "allow"  # not known yet

        second = ChallengeServer(settings(service.settings.database_url, port), outbox=False)
        second.start()
        try:
            follower.wait_for(lambda s: s.lists >= 2)
            assert follower.status.contained == {key(BO)}
            assert pdp.verdict(BO) == "contained"
            assert pdp.verdict(CY) == "allow"
            assert follower.status.error == "" and follower.status.reconnects >= 3
        finally:
            second.stop()
            second.service.close()
    finally:
        follower.stop()


def test_a_contained_principal_gets_no_pinned_plan(
    pdp: Pdp, live: ChallengeServer, stub: pb_grpc.ChallengeServiceStub
) -> None:
    """docs/plans.md: a plan is pinned only while no principal of it is contained."""
    follower = follow_containments(pdp.engine, pdp.server, live.url)
    try:
        follower.wait_for(lambda s: s.loaded)
        ask = {"principal": BO, "action": "read", "resource_type": "Document", "context": {}}
        first = pdp.engine.plan(ask)
        assert first["outcome"] == "always_allowed"
        assert pdp.engine.plan({**ask, "plan_qid": first["qid"]})["pinned"] is True
        contain(stub, BO)
        follower.wait_for(lambda s: key(BO) in s.contained)
        again = pdp.engine.plan({**ask, "plan_qid": first["qid"]})
        assert again["pinned"] is False and again["outcome"] == "always_denied"
        assert "svc:contained" in again["policies"]
    finally:
        follower.stop()


def test_a_token_is_sent_with_each_stream(
    pdp: Pdp, live: ChallengeServer, stub: pb_grpc.ChallengeServiceStub
) -> None:
    """The token callable is asked at every (re)connect; a token that cannot be had is retried."""
    asked: list[int] = []

    def token() -> str | None:
        asked.append(1)
        if len(asked) == 1:
            raise OSError("the token file is not there yet")
        return None  # the service here checks no callers

    follower = follow_containments(
        pdp.engine, pdp.server, live.url, token, backoff_secs=0.05, max_backoff_secs=0.2
    )
    try:
        follower.wait_for(lambda s: s.loaded)
        assert len(asked) == 2 and follower.status.reconnects == 1
    finally:
        follower.stop()
