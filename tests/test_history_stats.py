"""The history's aggregate for the portal's overview charts (``queries.decision_stats``,
``GET /v1/history/stats``; docs/portal.md#the-web-app) on chDB, the real ClickHouse engine.

Covered: decisions by verdict, monitor mode's would-deny/would-challenge, plans and events per
hour and per day, each record counted once though stored twice; the most denied principals
(a plan ``always_denied`` counts) and resources (checks only); the route's defaults and its
bad parameters named. The hourly rollups (schema version 7, ``svc.history.hourly``): the same
answers from the rollups once settled as from the raw rows before, equal to a raw count with
``FINAL`` (``decision_stats_raw``, and ``count()``) through copies, a late row, a row past
retention and a partial hour; a store of version 6 migrated in place is backfilled and settled.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from clickhouse_connect.driver.client import Client
from fastapi.testclient import TestClient

from kafka_fixture import dev_kafka, kafka_bootstrap  # noqa: F401  (fixtures)
from svc import history
from svc.history import hourly, queries, schema
from svc.history.service import create_app as create_history_app
from test_history import (
    OPEN,
    as_records,
    decision,
    event,
    loader_for,
    produce,
    topics,  # noqa: F401  (fixture)
    with_duplicates,
)

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def _store_rows(client: Client) -> None:
    """The rows of the tests, each stored twice (at least once delivery)."""
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


def _new_store(chdb_root: str) -> Client:
    return history.connect(f"{chdb_root}?database=s_{uuid.uuid4().hex[:12]}", create_database=True)


@pytest.fixture
def db(chdb_root: str) -> Client:
    """A store in the process's chDB directory (conftest's ``chdb_root``), rows stored twice."""
    client = _new_store(chdb_root)
    history.migrate(client)
    _store_rows(client)
    return client


@pytest.fixture
def settled(db: Client) -> Client:
    """``db`` with its hourly rollups settled: the first pass rebuilds the days the copies
    counted twice, the second marks every hour equal to the raw rows."""
    first = hourly.settle(db, margin=0)
    assert first.rebuilt == [T0.date(), T0.date() + timedelta(days=1)]
    second = hourly.settle(db, margin=0)
    assert second.rebuilt == [] and second.marked >= 1 and second.pending == 0
    day = T0.replace(hour=0)
    assert len(_rollup_read(db, day, day + timedelta(days=2))) == 48
    return db


@pytest.fixture(params=["raw rows", "settled rollups"])
def store(request: pytest.FixtureRequest, db: Client) -> Client:
    """The same rows read before settling (every hour from the raw rows) and after."""
    if request.param == "settled rollups":
        return request.getfixturevalue("settled")
    return db


def test_hourly_and_daily_buckets_and_the_most_denied(store: Client) -> None:
    db = store
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
        queries.decision_stats(db, T0, T0 + timedelta(days=1), top=101)
    # top 0: the buckets alone (the rankings' denials not read).
    bare = queries.decision_stats(db, T0, T0 + timedelta(days=2), "hour", top=0)
    assert bare == {"buckets": out["buckets"], "top_denied_principals": [],
                    "top_denied_resources": []}  # fmt: skip


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
            ({"top": "-1"}, "top"),
            ({"top": "101"}, "top"),
            ({"since": "yesterday"}, "since"),
            ({"since": "2026-11-21T00:00:00Z", "until": "2026-11-20T00:00:00Z"}, "since"),
        ):
            r = client.get("/v1/history/stats", params=params)
            assert r.status_code == 400, r.text
            assert r.json()["errors"][0]["field"] == name, r.json()


def _rollup_read(db: Client, start: datetime, end: datetime) -> list[int]:
    """The whole hours of ``[start, end)`` that ``decision_stats`` reads from the rollups."""
    return hourly._settled_hours(db, int(start.timestamp() * 1000), int(end.timestamp() * 1000))


def _raw_counts(db: Client, start: datetime, end: datetime) -> tuple[int, int, int]:
    """Decisions, denied checks and events of ``[start, end)`` counted from the raw rows."""
    params = {"a": start, "b": end}
    where = "at >= {a:DateTime64(3, 'UTC')} AND at < {b:DateTime64(3, 'UTC')}"
    n_d, n_deny = db.query(
        f"SELECT count(), countIf(call != 'plan' AND verdict = 'deny') FROM decisions FINAL "
        f"WHERE {where}",
        parameters=params,
    ).result_rows[0]
    n_e = db.query(f"SELECT count() FROM events FINAL WHERE {where}", parameters=params)
    return int(n_d), int(n_deny), int(n_e.result_rows[0][0])


def test_the_rollups_equal_a_raw_count_through_late_rows_and_retention(
    settled: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = settled
    start, end = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 23, tzinfo=UTC)

    def same(bucket: str = "hour") -> dict[str, object]:
        got = queries.decision_stats(db, start, end, bucket, top=10)
        assert got == queries.decision_stats_raw(db, start, end, bucket, top=10)
        buckets = got["buckets"]
        assert isinstance(buckets, list)
        n_d, n_deny, n_e = _raw_counts(db, start, end)
        assert sum(b["deny"] for b in buckets) == n_deny
        assert sum(b["events"] for b in buckets) == n_e
        rolled = db.query(
            f"SELECT sum(decisions) FROM {schema.HOURLY_TABLE} "
            "WHERE hour >= {a:DateTime('UTC')} AND hour < {b:DateTime('UTC')}",
            parameters={"a": start, "b": end},
        ).result_rows[0][0]
        assert int(rolled) >= n_d  # the rollup may count a copy until settled, never fewer
        return got

    # Settled: every whole hour with rows is read from the rollups, and they hold each record
    # once (the copies' days were rebuilt).
    assert T0 in {datetime.fromtimestamp(h / 1000, UTC) for h in _rollup_read(db, start, end)}
    assert len(_rollup_read(db, T0.replace(hour=0), T0.replace(hour=0) + timedelta(days=2))) == 48
    before = same()
    assert _raw_counts(db, start, end)[0] == int(
        db.query(f"SELECT sum(decisions) FROM {schema.HOURLY_TABLE}").result_rows[0][0]
    )

    # A late row (backfilled into a settled hour of the day before) and a row older than the
    # retention below, each delivered twice: the view counts both copies, so their hours are
    # read from the raw rows until settled, and the answer counts each once.
    late_at = T0 - timedelta(days=1, minutes=-30)
    old_at = datetime(2026, 11, 10, 8, 15, tzinfo=UTC)
    late = [
        decision(principal=("Human", "carol"), resource=("Document", "plan"), at=late_at,
                 verdict="deny"),
        decision(principal=("Human", "carol"), resource=("Document", "old"), at=old_at,
                 verdict="deny"),
    ]  # fmt: skip
    for _ in range(2):
        history.store(db, "decisions", as_records("d", late))
    hour_of_late = int(late_at.replace(minute=0).timestamp() * 1000)
    assert hour_of_late not in _rollup_read(db, start, end)
    after_late = same()
    assert sum(b["deny"] for b in after_late["buckets"]) == (  # type: ignore[union-attr]
        sum(b["deny"] for b in before["buckets"]) + 2  # type: ignore[union-attr]
    )
    assert {"type": "Human", "id": "carol", "count": 2} in after_late["top_denied_principals"]  # type: ignore[operator]
    first = hourly.settle(db, margin=0)
    assert first.rebuilt == [old_at.date(), late_at.date()]  # each late copy counted twice
    assert hourly.settle(db, margin=0).marked >= 1
    assert hour_of_late in _rollup_read(db, start, end)
    assert same() == after_late
    with monkeypatch.context() as m:  # more tied candidates than read by key: all by name
        m.setattr(hourly, "MAX_CANDIDATES", 0)
        assert same() == after_late
    assert same("day") == queries.decision_stats_raw(db, start, end, "day", top=10)

    # Retention drops the old row's day from the raw tables and the rollups alike.
    dropped = history.apply_retention(db, 3, now=datetime(2026, 11, 22, 10, 30, tzinfo=UTC))
    for table in (*schema.HOURLY_TABLES, schema.HOURLY_SETTLED_TABLE, "decisions"):
        assert (table, "2026-11-10") in dropped, table
    after_retention = same()
    assert {"type": "Document", "id": "old", "count": 1} not in after_retention[
        "top_denied_resources"
    ]  # type: ignore[operator]
    assert {"type": "Document", "id": "plan", "count": 1} in after_retention["top_denied_resources"]  # type: ignore[operator]
    assert hourly.settle(db, margin=0).rebuilt == []

    # A range with partial hours at both ends reads them from the raw rows.
    mid = (T0 + timedelta(minutes=7), T0 + timedelta(hours=1, minutes=1))
    assert queries.decision_stats(db, *mid) == queries.decision_stats_raw(db, *mid)
    # An hour written after its mark (a new decision now) is read from the raw rows again.
    history.store(db, "decisions", as_records("d", [decision(at=T0 + timedelta(minutes=50))]))
    assert int(T0.timestamp() * 1000) not in _rollup_read(db, start, end)

    def allowed_at_t0() -> int:
        buckets = same()["buckets"]
        assert isinstance(buckets, list)
        return int(next(b["allow"] for b in buckets if b["at"] == T0))

    assert allowed_at_t0() == 2
    assert hourly.settle(db, margin=0).marked >= 1
    assert int(T0.timestamp() * 1000) in _rollup_read(db, start, end)
    assert allowed_at_t0() == 2
    with pytest.raises(ValueError, match="margin"):
        hourly.settle(db, margin=-1)

    # The rankings group by a 64-bit hash of (type, id): a clash (made here by a rollup row
    # that gives another resource the hash of Document::budget) is caught, and the ranking is
    # made again by name.
    key = db.query(
        f"SELECT any(key) FROM {schema.DENIED_RESOURCES_TABLE} WHERE id = 'budget'"
    ).result_rows[0][0]
    db.command(
        f"INSERT INTO {schema.DENIED_RESOURCES_TABLE} (hour, type, id, denies, key) "
        "VALUES ({h:DateTime('UTC')}, 'Document', 'clash', 5, {k:UInt64})",
        parameters={"h": T0, "k": key},
    )
    ranked = queries.decision_stats(db, start, end, top=2)["top_denied_resources"]
    assert ranked == [
        {"type": "Document", "id": "clash", "count": 5},
        {"type": "Document", "id": "budget", "count": 2},
    ]


def test_a_store_of_version_6_is_migrated_in_place_and_backfilled(chdb_root: str) -> None:
    client = _new_store(chdb_root)
    assert history.migrate(client, schema.MIGRATIONS[:6]) == [1, 2, 3, 4, 5, 6]
    _store_rows(client)  # copies included
    assert history.migrate(client) == [7]
    assert history.migrate(client) == []
    start, end = T0 - timedelta(days=1), T0 + timedelta(days=2)
    # Backfilled from the rows read with FINAL and marked settled: read from the rollups.
    assert len(_rollup_read(client, start, end)) == 72 - 24  # the day before holds no rows
    n_d, _, n_e = _raw_counts(client, start, end)
    rolled = client.query(
        f"SELECT sum(decisions), sum(events) FROM {schema.HOURLY_TABLE}"
    ).result_rows[0]
    assert (int(rolled[0]), int(rolled[1])) == (n_d, n_e) == (7, 2)
    assert queries.decision_stats(client, start, end, top=10) == queries.decision_stats_raw(
        client, start, end, top=10
    )
    assert hourly.settle(client, margin=0) == hourly.Settled()


def test_the_loader_settles_the_hourly_rollups(
    chdb_root: str,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],  # noqa: F811
) -> None:
    client = _new_store(chdb_root)
    history.migrate(client)
    verdicts = ("allow", "deny", "challenge")
    recs = [decision(at=T0 + timedelta(minutes=11 * k), verdict=verdicts[k % 3]) for k in range(20)]
    produce(kafka_bootstrap, topics[0], with_duplicates(recs))  # copies count once
    loader = loader_for(client, kafka_bootstrap, topics, hourly_interval=0.2, settle_margin=0)
    thread = threading.Thread(target=loader.run, daemon=True)
    thread.start()
    start, end = T0.replace(hour=0), T0.replace(hour=0) + timedelta(days=1)
    try:
        deadline = time.monotonic() + 120
        while len(_rollup_read(client, start, end)) < 24:
            assert time.monotonic() < deadline, loader.stats
            time.sleep(0.2)
    finally:
        loader.stop()
        thread.join(30)
    assert loader.stats.settle_runs >= 1 and loader.stats.hours_settled >= 24
    got = queries.decision_stats(client, start, end, top=3)
    assert got == queries.decision_stats_raw(client, start, end, top=3)
    assert sum(b["allow"] + b["deny"] + b["challenge"] for b in got["buckets"]) == 20
    assert got["top_denied_resources"] == [{"type": "Document", "id": "design", "count": 7}]
