"""How challenges end, from the challenge service to the reasoner's family (c).

A real challenge service (SQLite) whose audit hook is ``svc.common.intake_client.IntakeSender``
posting to a real intake on Kafka: a rejected and an expired challenge become intake events
(``system`` ``svc-challenge``, the decision's qid in ``attributes``); those records, stored in
the history (chDB), are counted per principal and day by the rollups
(``principal_daily.challenges_failed``, not again as ``failures``); and the score shows a day of
many failed challenges beyond the principal's and its peers' baselines as the factor
``challenges_failed`` (docs/reasoner.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from clickhouse_connect.driver.client import Client

from kafka_fixture import create_topics
from svc import history
from svc.challenge.service import Ref
from svc.common.inprocess import serve_http
from svc.common.intake_client import IntakeSender
from svc.common.net import tcp_listener
from svc.history import rollups
from svc.intake import IntakeSettings, create_app
from svc.reasoner.scoring import Directory, score_window
from test_challenge import Clock, make_service
from test_intake import read_topic
from test_reasoner_rollups import event

TOKEN = "t" * 40


@pytest.fixture
def db(chdb_root: str) -> Client:
    client = history.connect(
        f"{chdb_root}?database=rc_{uuid.uuid4().hex[:12]}", create_database=True
    )
    history.migrate(client)
    return client


@pytest.fixture
def intake(kafka_bootstrap: str) -> Iterator[tuple[str, str]]:
    """A real intake on its own topic: (url, topic)."""
    topic = f"challenge-audit-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, topic)
    settings = IntakeSettings(
        kafka_url=kafka_bootstrap,
        topic=topic,
        token=TOKEN,
        transactional_id=f"test-intake-{uuid.uuid4().hex[:8]}",
        broker_timeout_secs=3.0,
        retry_after_secs=1,
    )
    sock = tcp_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    with serve_http(create_app(settings), "127.0.0.1", port, "intake"):
        yield f"http://127.0.0.1:{port}", topic


def test_rejected_and_expired_challenges_reach_the_history_and_the_score(
    tmp_path: Path, kafka_bootstrap: str, intake: tuple[str, str], db: Client
) -> None:
    url, topic = intake
    audit = IntakeSender(url, lambda: TOKEN, what="challenge outcomes").start()
    clock = Clock()
    service = make_service(f"sqlite:///{tmp_path / 'challenge.db'}", clock)
    service.audit = audit.put
    ana, doc = Ref("Human", "ana"), Ref("Document", "d1")
    try:
        # Rejected by the manager.
        c, created, _ = service.resolve(
            ana, None, "export", doc, ["approval"], decision_qid="q-rejected"
        )
        assert created
        service.decide(c.qid, "bo", approve=False, reason="no")
        # Left unanswered until it expired; the retry finds it expired and opens another.
        e, _, _ = service.resolve(ana, None, "view", doc, ["justification"], decision_qid="q-1")
        clock.advance(601)
        again, created, _ = service.resolve(
            ana, None, "view", doc, ["justification"], decision_qid="q-2"
        )
        assert created and again.qid != e.qid
        # Passed: nothing to tell.
        ok, _, _ = service.resolve(ana, None, "edit", doc, ["justification"], decision_qid="q-3")
        service.justify(ok.qid, "ana", "needed for the audit")
    finally:
        audit.close(timeout=30)
        service.close()
    assert audit.sent == 2 and audit.dropped == 0

    got = [v for _, v in read_topic(kafka_bootstrap, topic, expect=2)]
    by_action = {v["action"]: v for v in got}
    assert set(by_action) == {"challenge.rejected", "challenge.expired"}
    rejected = by_action["challenge.rejected"]
    assert rejected["system"] == "svc-challenge" and rejected["outcome"] == "failure"
    assert rejected["principal"] == {"type": "Human", "id": "ana"}
    assert rejected["resource"] == {"type": "Document", "id": "d1"}
    assert rejected["attributes"]["decision_qid"] == "q-rejected"
    assert rejected["attributes"]["challenge_qid"] == c.qid
    expired = by_action["challenge.expired"]
    assert expired["attributes"]["challenge_qid"] == e.qid
    assert expired["attributes"]["decision_qid"] == "q-1"
    assert datetime.fromisoformat(expired["at"].replace("Z", "+00:00")) == e.expires_at

    # The history keeps them as events of ana's day, counted as challenges failed.
    records = [(topic, 0, n, b"", json.dumps(v).encode()) for n, v in enumerate(got)]
    records.append(
        (topic, 0, 99, b"", json.dumps(event("ana", at=clock.now, outcome="failure")).encode())
    )
    history.store(db, "events", records)
    day = clock.now.date()
    rows = rollups.read_days(db, day - timedelta(days=29), day)
    i = rows.principals.index(("Human", "ana"))
    assert rows.counters["challenges_failed"][i, -1] == 2
    assert rows.counters["failures"][i, -1] == 1  # the other failure only


def _rows(days: list[date], failed_today: float) -> rollups.DayRows:
    """Five people active every day of the window; p0 has `failed_today` challenges failed."""
    n = 5
    counters = {c: np.zeros((n, len(days))) for c in rollups.DAY_COUNTERS}
    counters["decisions"][:] = 20
    counters["challenges_failed"][:, ::9] = 1  # now and then one, for everyone
    counters["challenges_failed"][0, -1] = failed_today
    principals = [("Human", f"p{k}") for k in range(n)]
    return rollups.DayRows(principals, days, counters, counters["decisions"] > 0)


def test_many_failed_challenges_in_a_day_are_a_family_c_factor() -> None:
    today = datetime.now(UTC).date()
    days = [today - timedelta(days=29 - k) for k in range(30)]
    directory = Directory({("Human", f"p{k}"): ["department:Eng"] for k in range(5)})
    sets = rollups.WindowSets({}, {})
    scores = {s.principal: s for s in score_window(_rows(days, 25), sets, directory)}
    p0 = scores[("Human", "p0")]
    (f,) = [f for f in p0.factors if f.name == "challenges_failed"]
    assert f.family == "c" and f.observed == 25 and f.day == today
    assert f.contribution == pytest.approx(35.0)  # full strength
    assert p0.score >= 35 and all(s.score == 0 for p, s in scores.items() if p != p0.principal)
    # Below the floor (3 a day) or within the usual, nothing.
    quiet = {s.principal: s for s in score_window(_rows(days, 2), sets, directory)}
    assert quiet[("Human", "p0")].score == 0
