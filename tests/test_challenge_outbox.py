"""The challenge service's notifications (docs/challenges.md#notifications): the outbox written
with each challenge change, sent by the worker to a local Slack-compatible webhook that fails its
first tries, one that is down for a while, and a worker killed mid-round."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from svc.challenge.models import OutboxRow
from svc.challenge.notify import IDEMPOTENCY_HEADER, OutboxWorker
from svc.challenge.service import ChallengeError, ChallengeService, Ref
from svc.common.net import tcp_listener
from test_challenge import database_url, make_service  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
DOC = Ref("Document", "d1")


class Receiver:
    """A local incoming webhook: records every POST (key, body) and answers ``fail`` with 503
    for the first ``fail_first`` of them."""

    def __init__(self, port: int = 0, fail_first: int = 0, status: int = 503) -> None:
        self.posts: list[tuple[str, dict[str, Any], int]] = []
        self.fail_first = fail_first
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                code = outer.status if len(outer.posts) < outer.fail_first else 200
                outer.posts.append((self.headers.get(IDEMPOTENCY_HEADER, ""), body, code))
                self.send_response(code)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/T0/B0/x"

    def delivered(self) -> dict[str, int]:
        """Idempotency key -> how many times it was answered 200."""
        out: dict[str, int] = {}
        for key, _, code in self.posts:
            if code == 200:
                out[key] = out.get(key, 0) + 1
        return out

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with tcp_listener("127.0.0.1", 0) as s:
        return int(s.getsockname()[1])


def until(check: Callable[[], bool], what: str, secs: float = 60.0) -> None:
    """Polls ``check`` (a safety net against a hang, not a timing assertion)."""
    end = time.monotonic() + secs
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


def outbox(service: ChallengeService) -> list[OutboxRow]:
    with Session(service.db) as s:
        return list(s.exec(select(OutboxRow).order_by(col(OutboxRow.id))).all())


def three_changes(service: ChallengeService) -> None:
    """Opens a challenge, forwards it to the approver, passes it: three notifications."""
    info, _, _ = service.resolve(
        Ref("ServiceAccount", "copilot.assistant"),
        Ref("Human", "ana"),
        "delete",
        DOC,
        ["approval", "justification"],
    )
    service.justify(info.qid, "ana", "tidying up")
    service.decide(info.qid, "bo", True)


@pytest.fixture
def fast() -> dict[str, Any]:
    return {
        "webhook_attempts": 3,
        "webhook_backoff_secs": 0.05,
        "webhook_backoff_max_secs": 0.2,
        "outbox_poll_secs": 0.1,
    }


def test_outbox_rows_are_written_with_the_change(database_url: str) -> None:  # noqa: F811
    service = make_service(database_url)
    try:
        three_changes(service)
        rows = outbox(service)
        assert [r.event for r in rows] == ["opened", "forwarded", "passed"]
        assert len({r.key for r in rows}) == 3 and all(r.sent_at is None for r in rows)
        assert "`ana`, please answer" in rows[0].payload["text"]
        assert '"tidying up"' in rows[1].payload["text"] and "`bo`" in rows[1].payload["text"]
        # A refused answer writes nothing.
        with pytest.raises(ChallengeError):
            service.justify(rows[0].challenge_qid, "ana", "again")
        assert len(outbox(service)) == 3
        # Without a webhook, the worker leaves them be.
        assert OutboxWorker(service).run_once() is False
    finally:
        service.close()


def test_a_webhook_failing_its_first_tries_sees_each_change_once(
    database_url: str,  # noqa: F811
    fast: dict[str, Any],
) -> None:
    receiver = Receiver(fail_first=2)
    service = make_service(database_url, webhook_url=receiver.url, **fast)
    waits: list[float] = []
    worker = OutboxWorker(service, sleep=lambda s: (waits.append(s), time.sleep(s))[0])
    try:
        three_changes(service)
        while worker.run_once():
            pass
        rows = outbox(service)
        assert all(r.sent_at is not None for r in rows)
        assert [r.attempts for r in rows] == [3, 1, 1]  # two 503s, then 200
        assert receiver.delivered() == {r.key: 1 for r in rows}
        assert [p[0] for p in receiver.posts] == [rows[0].key] * 3 + [rows[1].key, rows[2].key]
        assert waits == [0.05, 0.1]  # exponential backoff between the tries
        assert receiver.posts[-1][1]["text"].startswith("`copilot.assistant` acting for `ana`")
        assert worker.pending() == 0
    finally:
        receiver.stop()
        service.close()


def test_a_webhook_down_for_a_while_gets_everything_once_it_is_back(
    database_url: str,  # noqa: F811
    fast: dict[str, Any],
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    service = make_service(database_url, webhook_url=url, **fast)
    worker = OutboxWorker(service).start()
    receiver: Receiver | None = None
    try:
        three_changes(service)
        until(lambda: outbox(service)[0].attempts >= 6, "two rounds against the closed port")
        rows = outbox(service)
        assert all(r.sent_at is None for r in rows)  # kept, in order: nothing after the first
        assert rows[0].last_error.startswith("ConnectError")
        assert [r.attempts for r in rows[1:]] == [0, 0]
        receiver = Receiver(port=port)
        until(lambda: worker.pending() == 0, "delivery once the webhook is back")
        rows = outbox(service)
        assert receiver.delivered() == {r.key: 1 for r in rows}
        assert [p[0] for p in receiver.posts] == [r.key for r in rows]  # in order
    finally:
        worker.stop()
        if receiver is not None:
            receiver.stop()
        service.close()


def test_a_refusal_for_good_is_marked_and_the_rest_go_on(
    database_url: str,  # noqa: F811
    fast: dict[str, Any],
) -> None:
    receiver = Receiver(fail_first=1, status=400)
    service = make_service(database_url, webhook_url=receiver.url, **fast)
    worker = OutboxWorker(service)
    try:
        three_changes(service)
        while worker.run_once():
            pass
        rows = outbox(service)
        assert rows[0].failed_at is not None and rows[0].sent_at is None
        assert rows[0].attempts == 1 and rows[0].last_error.startswith("HTTP 400")
        assert all(r.sent_at is not None for r in rows[1:])
        assert worker.failed == 1 and worker.sent == 2
    finally:
        receiver.stop()
        service.close()


WORKER = textwrap.dedent(
    """
    import sys, time
    from svc.challenge.notify import OutboxWorker
    from svc.challenge.service import ChallengeService
    from svc.challenge.settings import ChallengeSettings

    settings = ChallengeSettings(
        database_url=sys.argv[1], webhook_url=sys.argv[2], webhook_attempts=20,
        webhook_backoff_secs=0.05, webhook_backoff_max_secs=0.1, outbox_poll_secs=0.1,
    )
    worker = OutboxWorker(ChallengeService(settings))
    print("running", flush=True)
    worker.run()
    """
)


def test_a_killed_worker_loses_nothing(database_url: str, fast: dict[str, Any]) -> None:  # noqa: F811
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    service = make_service(database_url, webhook_url=url, **fast)
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, database_url, url],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    receiver: Receiver | None = None
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        three_changes(service)
        # The worker holds the first row (locked, retrying against the closed port) ...
        until(
            lambda: _locked(service),
            "the worker claims the first notification",
        )
        os.kill(proc.pid, signal.SIGKILL)  # ... and dies mid-round
        proc.wait()
        rows = outbox(service)
        assert all(r.sent_at is None for r in rows)
        receiver = Receiver(port=port)
        worker = OutboxWorker(service)
        until(lambda: (worker.run_once() or True) and worker.pending() == 0, "redelivery")
        assert receiver.delivered() == {r.key: 1 for r in outbox(service)}
        assert len(receiver.delivered()) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if receiver is not None:
            receiver.stop()
        service.close()


def _locked(service: ChallengeService) -> bool:
    """Whether another connection holds the first outbox row (``FOR UPDATE NOWAIT`` fails)."""
    from sqlalchemy.exc import OperationalError

    with Session(service.db) as s:
        try:
            s.exec(
                select(OutboxRow).order_by(col(OutboxRow.id)).limit(1).with_for_update(nowait=True)
            ).all()
        except OperationalError:
            return True
        return False
