"""The context service's per-day risk history (docs/context.md#risk-scores), on PostgreSQL and SQLite.

Scores published over several days (the service's clock set per step) read back as one value
per UTC day, a day without a score keeping the day before's; the day's highest kept beside its
last; old days dropped but for the newest, which still holds the score in force; the bound on
`days` refused with a problem; the migration fills the history from the scores already stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import create_engine, text

import svc.context.service as context_service
from svc.context.migrate import MIGRATIONS
from test_context import Live, database_url  # noqa: F401  (the fixture, on the suite's PostgreSQL)

TODAY = datetime(2026, 11, 28, 15, 0, tzinfo=UTC)


def at(days_ago: int, hour: int = 12) -> datetime:
    return (TODAY - timedelta(days=days_ago)).replace(hour=hour)


def day(days_ago: int) -> str:
    return (TODAY - timedelta(days=days_ago)).date().isoformat()


@pytest.fixture(params=["postgresql", "sqlite"])
def live(
    request: pytest.FixtureRequest,
    database_url: str,  # noqa: F811
    tmp_path: Path,
) -> Iterator[Live]:
    """A live service on PostgreSQL, and on SQLite (``svc up``'s store)."""
    url = database_url if request.param == "postgresql" else f"sqlite:///{tmp_path / 'ctx.db'}"
    svc = Live(url, risk_history_days=30)
    yield svc
    svc.stop()


def publish(
    live: Live, monkeypatch: pytest.MonkeyPatch, when: datetime, scores: dict[str, int]
) -> None:
    """``POST /v1/risk`` with the service's clock at `when`."""
    monkeypatch.setattr(context_service, "_now", lambda: when)
    body = {
        "scores": [
            {"principal": {"type": "Human", "id": who}, "score": s} for who, s in scores.items()
        ]
    }
    r = live.http.post("/v1/risk", json=body)
    assert r.status_code == 200, r.text


def history(live: Live, who: str, days: int, now: datetime = TODAY) -> list[dict[str, Any]]:
    out = live.service.risk_history(context_service.Ref(type="Human", id=who), days, now=now)
    assert out["principal"] == {"type": "Human", "id": who}
    days_: list[dict[str, Any]] = out["days"]
    return days_


def test_a_score_per_day_carried_over_days_without_one(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(live, monkeypatch, at(10, 8), {"ana": 40, "bo": 10})
    publish(live, monkeypatch, at(10, 9), {"ana": 80})
    publish(live, monkeypatch, at(10, 20), {"ana": 60})
    publish(live, monkeypatch, at(5), {"ana": 95})
    publish(live, monkeypatch, at(5, 23), {"ana": 20})
    days = history(live, "ana", 14)
    assert [d["day"] for d in days] == [day(n) for n in range(13, -1, -1)]
    known = {d["day"]: (d["score"], d["high"], d["published"]) for d in days}
    for n in (13, 12, 11):
        assert known[day(n)] == (None, None, False)  # nothing known yet
    assert known[day(10)] == (60, 80, True)  # the last of the day, and its highest
    for n in (9, 8, 7, 6):
        assert known[day(n)] == (60, 60, False)  # kept
    assert known[day(5)] == (20, 95, True)  # 60 in force until the 95, then 20
    for n in (4, 3, 2, 1, 0):
        assert known[day(n)] == (20, 20, False)
    # A window starting after the last change carries the score in force into it.
    assert [(d["score"], d["high"]) for d in history(live, "ana", 3)] == [(20, 20)] * 3
    # The carried score is the day's start: a rise the same day is its high.
    publish(live, monkeypatch, at(0, 14), {"bo": 30})
    assert [(d["score"], d["high"]) for d in history(live, "bo", 2)] == [(10, 10), (30, 30)]
    # Over HTTP, with the route's default of 30 days; an unknown principal has none.
    r = live.http.get("/v1/risk-history/Human/ana")
    assert r.status_code == 200 and len(r.json()["days"]) == 30, r.text
    assert all(d["score"] is None for d in history(live, "nobody", 5))


def test_old_days_go_but_the_newest_of_them_holds_the_score(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(live, monkeypatch, at(70), {"ana": 50})
    publish(live, monkeypatch, at(50), {"ana": 30})
    publish(live, monkeypatch, at(2), {"ana": 70})  # prunes: older than 30 days before day -2
    with live.service.engine.connect() as conn:
        kept = conn.execute(
            text("SELECT day, score FROM risk_score_days WHERE principal = :p ORDER BY day"),
            {"p": 'Human::"ana"'},
        ).fetchall()
    assert [(str(d), s) for d, s in kept] == [(day(50), 30), (day(2), 70)]
    days = history(live, "ana", 30)
    assert days[0]["score"] == 30 and days[-3]["high"] == 70 and days[-1]["score"] == 70


def test_days_out_of_range_are_refused(live: Live) -> None:
    r = live.http.get("/v1/risk-history/Human/ana", params={"days": 31})
    assert r.status_code == 400, r.text
    problem = r.json()
    assert "SVC_CONTEXT_RISK_HISTORY_DAYS" in problem["detail"]
    for bad in ("0", "x", "-3"):
        r = live.http.get("/v1/risk-history/Human/ana", params={"days": bad})
        assert 400 <= r.status_code < 500, (bad, r.text)


def test_the_migration_starts_the_history_with_the_stored_scores(database_url: str) -> None:  # noqa: F811
    engine = create_engine(database_url)
    try:
        MIGRATIONS.upgrade(engine)
        cfg = MIGRATIONS._config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO risk_scores (principal, score, reason, updated_at) "
                    "VALUES (:p, 77, '', :t)"
                ),
                {"p": 'Human::"cy"', "t": at(3)},
            )
        MIGRATIONS.upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT principal, day, score, high FROM risk_score_days"))
            assert [(p, d.isoformat(), s, h) for p, d, s, h in rows] == [
                ('Human::"cy"', day(3), 77, 77)
            ]
    finally:
        engine.dispose()
