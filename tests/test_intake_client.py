"""``svc.common.intake_client.IntakeSender``: batches, retries and refusals against a real server.

A FastAPI app served by uvicorn on a free port stands in for the intake's ``POST /v1/events``
(the real intake is exercised end to end in tests/test_reasoner_challenges.py and
tests/test_portal_mcp.py); its answers are scripted per request, so each branch of the module
docs is met: 202 counts as sent; no answer, 5xx, 401 and 429 send the same batch again; another
4xx drops it (counted); a full queue drops new events; ``close`` sends what is queued.
And ``svc challenge serve``'s wiring: with ``intake_url`` set, a rejected challenge reaches it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from serverkit import wait_until
from svc.challenge.app import ChallengeServer
from svc.challenge.service import Ref
from svc.common.inprocess import serve_http
from svc.common.intake_client import IntakeSender
from test_challenge import make_service


class FakeIntake:
    """Records each ``POST /v1/events`` and answers the next scripted status (then 202)."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.batches: list[list[dict[str, Any]]] = []
        self.tokens: list[str | None] = []
        self.lock = threading.Lock()
        self.app = FastAPI()

        @self.app.post("/v1/events")
        async def events(request: Request) -> Response:
            body = await request.json()
            with self.lock:
                status = self.script.pop(0) if self.script else 202
                self.tokens.append(request.headers.get("authorization"))
                if status == 202:
                    self.batches.append(body["events"])
            return Response(status_code=status, content=b'{"detail": "scripted"}')

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for b in self.batches for e in b]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def intake() -> Iterator[tuple[FakeIntake, str]]:
    fake = FakeIntake()
    port = _free_port()
    with serve_http(fake.app, "127.0.0.1", port, "fake-intake"):
        yield fake, f"http://127.0.0.1:{port}"


def _event(i: int) -> dict[str, Any]:
    return {"system": "test", "action": "a", "n": i}


def test_batches_carry_the_token_and_count_as_sent(intake: tuple[FakeIntake, str]) -> None:
    fake, url = intake
    sender = IntakeSender(url, lambda: "tok", what="tests", batch_max=3, flush_secs=0.2).start()
    try:
        for i in range(7):
            sender.put(_event(i))
        wait_until(lambda: sender.sent == 7)
        assert [e["n"] for e in fake.events()] == list(range(7))
        assert all(len(b) <= 3 for b in fake.batches)
        assert set(fake.tokens) == {"Bearer tok"}
        assert sender.dropped == 0
    finally:
        sender.close()


def test_unavailable_and_unauthorized_answers_send_the_same_batch_again(
    intake: tuple[FakeIntake, str],
) -> None:
    fake, url = intake
    fake.script = [503, 401, 429]
    sender = IntakeSender(url, lambda: "tok", what="tests", flush_secs=0.05).start()
    try:
        sender.put(_event(1))
        wait_until(lambda: sender.sent == 1, timeout=30)
        assert [e["n"] for e in fake.events()] == [1]
        assert len(fake.tokens) == 4  # three refusals, then taken
        assert sender.dropped == 0
    finally:
        sender.close()


def test_a_token_file_not_there_yet_is_waited_for(intake: tuple[FakeIntake, str]) -> None:
    fake, url = intake
    tokens = iter([OSError("no such file"), "tok"])

    def token() -> str:
        got = next(tokens)
        if isinstance(got, OSError):
            raise got
        return got

    sender = IntakeSender(url, token, what="tests", flush_secs=0.05).start()
    try:
        sender.put(_event(1))
        wait_until(lambda: sender.sent == 1, timeout=30)
        assert fake.tokens == ["Bearer tok"]
    finally:
        sender.close()


def test_a_refusal_for_good_drops_the_batch_and_goes_on(intake: tuple[FakeIntake, str]) -> None:
    fake, url = intake
    fake.script = [400]
    sender = IntakeSender(url, lambda: None, what="tests", flush_secs=0.05).start()
    try:
        sender.put(_event(1))
        wait_until(lambda: sender.dropped == 1)
        sender.put(_event(2))
        wait_until(lambda: sender.sent == 1)
        assert [e["n"] for e in fake.events()] == [2]
        assert fake.tokens == [None, None]  # no token: no Authorization header
    finally:
        sender.close()


def test_a_full_queue_drops_new_events_and_close_sends_what_waits(
    intake: tuple[FakeIntake, str],
) -> None:
    fake, url = intake
    sender = IntakeSender(url, lambda: "tok", what="tests", bound=2)  # not started: nothing leaves
    for i in range(3):
        sender.put(_event(i))
    assert sender.dropped == 1
    sender.start()
    sender.close()
    assert sender.sent == 2
    assert [e["n"] for e in fake.events()] == [0, 1]


def test_svc_challenge_serve_posts_how_a_challenge_ended(
    intake: tuple[FakeIntake, str], tmp_path: Path
) -> None:
    fake, url = intake
    token_file = tmp_path / "intake.token"
    token_file.write_text("intake-secret\n", encoding="utf-8")
    service = make_service(
        f"sqlite:///{tmp_path / 'challenge.db'}",
        intake_url=url,
        intake_token_file=str(token_file),
    )
    server = ChallengeServer(service.settings, service, outbox=False)
    server.start()
    try:
        ana, doc = Ref("Human", "ana"), Ref("Document", "d1")
        c, _, _ = service.resolve(ana, None, "export", doc, ["approval"], decision_qid="q-1")
        service.decide(c.qid, "bo", approve=False, reason="no")
        got = wait_until(lambda: fake.events(), timeout=30)
        assert got[0]["system"] == "svc-challenge"
        assert got[0]["action"] == "challenge.rejected"
        assert got[0]["attributes"]["decision_qid"] == "q-1"
        assert fake.tokens == ["Bearer intake-secret"]
    finally:
        server.stop()
        service.close()
    assert service.audit is None  # the server's sender is gone with it
