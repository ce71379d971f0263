"""The history's aggregate for the portal's overview charts (``queries.decision_stats``,
``GET /v1/history/stats``; docs/portal.md#the-web-app) on chDB, the real ClickHouse engine.

Covered: decisions by verdict, monitor mode's would-deny/would-challenge, plans and events per
hour and per day, each record counted once though stored twice; the most denied principals
(a plan ``always_denied`` counts) and resources (checks only); the route's defaults and its
bad parameters named.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from clickhouse_connect.driver.client import Client
from fastapi.testclient import TestClient

from svc import history
from svc.history import queries
from svc.history.service import create_app as create_history_app
from test_history import OPEN, as_records, decision, event

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


@pytest.fixture
def db(chdb_root: str) -> Client:
    """A store in the process's chDB directory (conftest's ``chdb_root``), rows stored twice."""
    client = history.connect(
        f"{chdb_root}?database=s_{uuid.uuid4().hex[:12]}", create_database=True
    )
    history.migrate(client)
    alice, bob = ("Human", "alice"), ("Human", "bob")
    design, budget = ("Document", "design"), ("Document", "budget")
    recs = [
        decision(principal=alice, resource=design, at=T0, verdict="allow"),
        decision(principal=alice, resource=design, at=T0 + timedelta(minutes=5), verdict="deny"),
        decision(principal=bob, resource=budget, at=T0 + timedelta(minutes=9), verdict="deny"),
        decision(principal=bob, resource=budget, at=T0 + timedelta(minutes=30), verdict="deny"),
        decision(
            principal=alice,
            resource=budget,
            at=T0 + timedelta(hours=1),
            verdict="challenge",
            mode="monitor",
        ),
        decision(
            principal=alice,
            resource=("Document", None),
            at=T0 + timedelta(hours=1, minutes=2),
            call="plan",
            verdict=None,
            outcome="always_denied",
            mode="monitor",
        ),
        decision(principal=bob, resource=design, at=T0 + timedelta(days=1), verdict="allow"),
    ]
    evs = [
        event(principal=alice, resource=("File", "a"), at=T0 + timedelta(minutes=1)),
        event(principal=bob, resource=("File", "b"), at=T0 + timedelta(hours=3)),
    ]
    for _ in range(2):  # at least once delivery: each counted once
        history.store(client, "decisions", as_records("d", recs))
        history.store(client, "events", as_records("e", evs))
    return client


def test_hourly_and_daily_buckets_and_the_most_denied(db: Client) -> None:
    out = queries.decision_stats(db, T0, T0 + timedelta(days=2), "hour", top=5)
    zero = {
        "allow": 0, "deny": 0, "challenge": 0, "would_deny": 0, "would_challenge": 0,
        "plans": 0, "events": 0,
    }  # fmt: skip
    assert out["buckets"] == [
        {**zero, "at": T0, "allow": 1, "deny": 3, "events": 1},
        {
            **zero,
            "at": T0 + timedelta(hours=1),
            "challenge": 1,
            "would_deny": 1,
            "would_challenge": 1,
            "plans": 1,
        },
        {**zero, "at": T0 + timedelta(hours=3), "events": 1},
        {**zero, "at": T0 + timedelta(days=1), "allow": 1},
    ]
    assert out["top_denied_principals"] == [
        {"type": "Human", "id": "alice", "count": 2},
        {"type": "Human", "id": "bob", "count": 2},
    ]
    assert out["top_denied_resources"] == [
        {"type": "Document", "id": "budget", "count": 2},
        {"type": "Document", "id": "design", "count": 1},
    ]
    daily = queries.decision_stats(db, T0 - timedelta(hours=10), T0 + timedelta(days=2), "day", 1)
    assert [(b["at"], b["allow"], b["deny"], b["events"]) for b in daily["buckets"]] == [
        (T0.replace(hour=0), 1, 3, 2),
        (T0.replace(hour=0) + timedelta(days=1), 1, 0, 0),
    ]
    assert daily["top_denied_principals"] == [{"type": "Human", "id": "alice", "count": 2}]
    # The range is half-open: a bucket's rows before `start` are not counted.
    late = queries.decision_stats(db, T0 + timedelta(minutes=6), T0 + timedelta(hours=1))
    assert late["buckets"][0]["deny"] == 2 and late["buckets"][0]["allow"] == 0
    with pytest.raises(ValueError, match="bucket"):
        queries.decision_stats(db, T0, T0 + timedelta(days=1), "minute")
    with pytest.raises(ValueError, match="top"):
        queries.decision_stats(db, T0, T0 + timedelta(days=1), top=0)


def test_the_stats_route(db: Client) -> None:
    now = T0 + timedelta(hours=2)
    with TestClient(create_history_app(db, auth=OPEN, now=lambda: now)) as client:
        r = client.get("/v1/history/stats")  # default: the day before now + 5 minutes
        assert r.status_code == 200, r.text
        body = r.json()
        assert [datetime.fromisoformat(b["at"]) for b in body["buckets"]] == [
            T0,
            T0 + timedelta(hours=1),
        ]
        assert body["top_denied_principals"][0] == {"type": "Human", "id": "alice", "count": 2}
        r = client.get(
            "/v1/history/stats",
            params={"since": "2026-11-19T00:00:00Z", "until": "2026-11-22T00:00:00Z",
                    "bucket": "day", "top": 1},
        )  # fmt: skip
        assert [b["allow"] for b in r.json()["buckets"]] == [1, 1]
        assert len(r.json()["top_denied_resources"]) == 1
        for params, name in (
            ({"bucket": "minute"}, "bucket"),
            ({"top": "0"}, "top"),
            ({"since": "yesterday"}, "since"),
            ({"since": "2026-11-21T00:00:00Z", "until": "2026-11-20T00:00:00Z"}, "since"),
        ):
            r = client.get("/v1/history/stats", params=params)
            assert r.status_code == 400, r.text
            assert r.json()["errors"][0]["field"] == name, r.json()
