"""The reasoner's daily rollups in the history store (docs/history.md#daily-rollups), on chDB.

chDB hosts one engine per process on one directory: these tests reuse the directory an earlier
module of the same run opened (tests/test_history.py), else open one of their own, and give
every test a database of its own.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from svc import history
from svc.history import rollups, schema
from svc.history.store import _clients

NOW = datetime(2026, 11, 22, 10, 30, tzinfo=UTC)
TODAY = NOW.date()


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def decision(who: str = "alice", at: datetime = NOW, **kw: Any) -> dict[str, Any]:
    """A decision record as the decision point logs it (docs/history.md#schema)."""
    rec: dict[str, Any] = {
        "qid": str(uuid.uuid4()),
        "at": rfc3339(at),
        "call": "check",
        "transport": "http",
        "principal": {"type": kw.pop("ptype", "Human"), "id": who},
        "on_behalf_of": kw.pop("on_behalf_of", None),
        "action": kw.pop("action", "view"),
        "resource": {"type": "Document", "id": kw.pop("resource", "design")},
        "verdict": kw.pop("verdict", "allow"),
        "policies": kw.pop("policies", ["p0"]),
        "mode": "enforce",
    }
    rec.update(kw)
    return rec


def event(who: str = "alice", at: datetime = NOW, **kw: Any) -> dict[str, Any]:
    """An intake record (docs/intake.md) as the history loads it."""
    rec: dict[str, Any] = {
        "ingest_id": str(uuid.uuid4()),
        "at": rfc3339(at),
        "system": kw.pop("system", "drive"),
        "principal": {"type": kw.pop("ptype", "Human"), "id": who},
        "action": kw.pop("action", "view"),
        "resource": {"type": kw.pop("rtype", "File"), "id": kw.pop("resource", "budget.xlsx")},
        "source_ip": kw.pop("source_ip", "10.0.0.7"),
    }
    rec.update(kw)
    return rec


def records(topic: str, values: list[dict[str, Any]], start: int = 0) -> list[history.Record]:
    return [(topic, 0, start + n, b"", json.dumps(v).encode()) for n, v in enumerate(values)]


@pytest.fixture
def db(chdb_root: str) -> Client:
    client = history.connect(
        f"{chdb_root}?database=r_{uuid.uuid4().hex[:12]}", create_database=True
    )
    assert history.migrate(client) == [m.version for m in schema.MIGRATIONS]
    return client


def rollup(db: Client, who: str = "alice") -> dict[date, dict[str, Any]]:
    cols = [c for c, _ in schema.ROLLUP_COLUMNS if c.startswith(("rows_", "moved", "den"))]
    sums = ", ".join(f"sum({c})" for c in ("decisions", "events", "failures", *cols))
    rows = db.query(
        f"SELECT day, {sums}, uniqExactMerge(resources), sumMap(hours), "
        "groupUniqArrayMerge(256)(source_ips), groupUniqArrayMerge(1024)(acted_for) "
        "FROM principal_daily WHERE principal_id = {w:String} GROUP BY day ORDER BY day",
        parameters={"w": who},
    ).result_rows
    names = ["decisions", "events", "failures", *cols, "resources", "hours", "ips", "acted_for"]
    return {r[0]: dict(zip(names, r[1:], strict=True)) for r in rows}


def test_the_views_roll_each_principal_s_day_up_by_kind_of_access(db: Client) -> None:
    evs = [
        event(access="listed", count=400, action="search", resource=""),
        event(access="read", count=10),
        event(access="read"),  # an access without a count is one row
        event(access="written", count=3, action="edit"),
        event(access="exported", count=50, action="export"),
        event(action="download", resource="plan.pdf", source_ip="203.0.113.9"),
        event(action="send_external", count=7, access="read", outcome="failure"),
        event(who="bot", ptype="ServiceAccount", on_behalf_of={"type": "Human", "id": "bo"}),
    ]
    decs = [
        decision(),
        decision(verdict="deny"),
        decision(verdict="deny", policies=["svc:contained"]),  # the containment, not evidence
        decision(verdict="challenge", at=NOW - timedelta(hours=9)),
    ]
    history.store(db, "events", records("e", evs))
    history.store(db, "decisions", records("d", decs))
    day = rollup(db)[TODAY]
    assert day["decisions"] == 4 and day["events"] == 7 and day["failures"] == 1
    assert day["denies"] == 1
    assert (day["rows_listed"], day["rows_read"], day["rows_written"]) == (400, 18, 3)
    assert day["rows_exported"] == 50
    # export (50 rows), download (no count: 1), send_external (7)
    assert (day["moved_out"], day["moved_out_rows"]) == (3, 58)
    assert day["hours"] == {10: 10, 1: 1}
    assert set(day["ips"]) == {"10.0.0.7", "203.0.113.9"}
    assert day["resources"] == 3  # budget.xlsx, plan.pdf, Document::design (lists not counted)
    assert rollup(db, "bot")[TODAY]["acted_for"] == ["bo"]


def test_a_backfilled_record_lands_in_its_own_day(db: Client) -> None:
    history.store(db, "events", records("e", [event(access="read", count=5)]))
    old = NOW - timedelta(days=20)
    history.store(db, "events", records("e", [event(at=old, access="exported", count=9)], 1))
    days = rollup(db)
    assert days[TODAY]["rows_read"] == 5 and days[TODAY]["rows_exported"] == 0
    assert days[old.date()]["rows_exported"] == 9 and days[old.date()]["events"] == 1


def test_migrating_a_database_with_history_fills_the_rollups_once(db: Client) -> None:
    fresh = history.connect(f"{_root(db)}?database=m_{uuid.uuid4().hex[:8]}", create_database=True)
    history.migrate(fresh, schema.MIGRATIONS[:3])
    history.store(fresh, "events", records("e", [event(access="read", count=4)] * 1))
    history.store(fresh, "decisions", records("d", [decision(), decision(verdict="deny")]))
    # The same records again (at least once delivery): FINAL collapses them.
    history.store(fresh, "decisions", records("d", [decision()]))
    # A run that died after its first statements, then the whole version again.
    for stmt in schema.MIGRATIONS[3].statements[:4]:
        fresh.command(stmt)
    assert history.migrate(fresh) == [m.version for m in schema.MIGRATIONS[3:]]
    day = rollup(fresh)[TODAY]
    assert (day["decisions"], day["denies"], day["events"], day["rows_read"]) == (3, 1, 1, 4)


def _root(db: Client) -> str:
    for dsn, client in _clients.items():
        if client is db:
            return dsn.split("?", 1)[0]
    raise AssertionError("not a chdb client of this process")


def test_settle_counts_a_record_delivered_twice_once(db: Client) -> None:
    once = records("d", [decision(), decision(verdict="deny")])
    history.store(db, "decisions", once)
    history.store(db, "decisions", once)  # redelivered: the views count it again
    history.store(db, "events", records("e", [event(access="read", count=6)]))
    yesterday = NOW - timedelta(days=1)
    history.store(db, "events", records("e", [event(at=yesterday, access="read", count=2)], 1))
    assert rollup(db)[TODAY]["decisions"] == 4
    days = rollups.changed_days(db, None)
    assert days == [yesterday.date(), TODAY]
    assert rollups.settle(db, days) == [TODAY]
    day = rollup(db)[TODAY]
    assert (day["decisions"], day["denies"], day["events"], day["rows_read"]) == (2, 1, 1, 6)
    assert rollup(db)[yesterday.date()]["rows_read"] == 2
    assert rollups.settle(db, days) == []  # exact now: nothing to rebuild
    later = datetime.now(UTC) + timedelta(hours=1)
    assert rollups.changed_days(db, later) == []


def test_retention_drops_the_rollup_days_with_the_raw_days(db: Client) -> None:
    evs = [event(at=NOW - timedelta(days=n), access="read", count=1) for n in range(10)]
    history.store(db, "events", records("e", evs))
    dropped = history.apply_retention(db, 3, now=NOW)
    assert {d for t, d in dropped if t == "principal_daily"} == {
        f"2026-11-{d:02d}" for d in range(13, 19)
    }
    assert sorted(rollup(db)) == [TODAY - timedelta(days=n) for n in (3, 2, 1, 0)]
    raw = db.query("SELECT DISTINCT toDate(at) FROM events ORDER BY 1").result_rows
    assert [r[0] for r in raw] == sorted(rollup(db))


def test_read_days_and_sets_give_a_window_per_principal(db: Client) -> None:
    evs = []
    for n in range(1, 10):
        evs.append(event(at=NOW - timedelta(days=n), access="read", count=10 * n))
    evs.append(event(access="exported", count=500, action="export", source_ip="198.51.100.4"))
    evs.append(event(who="bob", access="listed", count=8, tool="crm.search"))
    history.store(db, "events", records("e", evs))
    first = TODAY - timedelta(days=29)
    got = rollups.read_days(db, first, TODAY)
    assert len(got.days) == 30 and got.days[-1] == TODAY
    a = got.principals.index(("Human", "alice"))
    b = got.principals.index(("Human", "bob"))
    assert got.counters["rows_read"][a, -10:].tolist() == [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
    assert got.counters["rows_exported"][a, -1] == 500
    assert got.counters["moved_out_rows"][a, -1] == 500
    assert got.active[a].sum() == 10 and got.active[b].sum() == 1
    sets = rollups.read_sets(db, first, TODAY, TODAY)
    alice = sets[("Human", "alice")]
    assert alice.base_count["source_ips"] == 1
    assert alice.new["source_ips"] == {"198.51.100.4"}  # today's address, new to her
    assert alice.new["actions"] == {"export"} and alice.base_count["actions"] == 1
    assert alice.base_resources == 1 and alice.new_resources == 0
    assert sets[("Human", "bob")].new["tools"] == {"crm.search"}  # no baseline: all new
    assert alice.recent_hours.sum() == 1 and alice.base_hours.sum() == 9
    # who used each new value anywhere in the window (its rarity among peers)
    assert sets.users["source_ips"]["198.51.100.4"] == [("Human", "alice")]
    assert sets.users["tools"]["crm.search"] == [("Human", "bob")]
    with pytest.raises(ValueError):
        rollups.read_days(db, TODAY, first)


def test_rare_resources_are_counted_among_the_principal_s_peers(db: Client) -> None:
    """A resource first touched on the recent days that fewer than 10% of the principal's peer
    group touched in the window is rare; a peer of another group does not make it common."""
    old = NOW - timedelta(days=12)
    decs = [decision(at=old, resource=f"old{n}") for n in range(3)]  # alice's usual, unshared
    decs += [decision(at=old, resource="shared")]
    evs = [event(resource=f"new{n}", rtype="File") for n in range(4)]  # today, new to alice
    evs.append(event(resource="shared", rtype="Document"))  # recent, but seen by a peer
    decs += [decision(who=w, at=old, resource="shared") for w in ("bob", "carol", "dan")]
    decs.append(decision(who="bob", at=old, resource="old0"))  # a peer used one of her olds
    evs.append(event(who="erin", resource="new0", rtype="File"))  # another group's
    history.store(db, "decisions", records("d", decs))
    history.store(db, "events", records("e", evs))
    first, recent = TODAY - timedelta(days=29), TODAY - timedelta(days=6)
    groups = {("Human", w): ("department:Eng", 4) for w in ("alice", "bob", "carol", "dan")} | {
        ("Human", "erin"): ("department:Ops", 1)
    }
    got = rollups.read_rare_resources(db, first, TODAY, recent, groups)
    alice = got[("Human", "alice")]
    # new0..new3 are new and no Eng peer touched them (erin is not a peer); "shared" is not
    # new to her (her baseline had it); of her baseline resources old1 and old2 are rare
    # (old0: bob, 1 of 4 peers = 25%; "shared": everyone).
    assert (alice.new_rare, alice.new_unshared, alice.base_rare) == (4, 4, 2)
    assert sorted(alice.examples) == [f"File::new{n}" for n in range(4)]
    assert ("Human", "bob") not in got  # nothing new to him
    assert got[("Human", "erin")].new_rare == 1  # alone in Ops: new0 is new and unshared
    assert rollups.read_rare_resources(db, first, TODAY, recent, {}) == {}
    with pytest.raises(ValueError):
        rollups.read_rare_resources(db, first, TODAY, TODAY + timedelta(days=1), groups)


def test_settle_refills_a_past_day_the_rollup_lacks_and_lets_today_be(db: Client) -> None:
    now = datetime.now(UTC)
    today, yesterday = now.date(), now.date() - timedelta(days=1)
    evs = [event(at=now - timedelta(minutes=1), access="read", count=3)]
    evs.append(event(at=now - timedelta(days=1), access="read", count=4))
    history.store(db, "events", records("e", evs))
    for d in (today, yesterday):
        db.command(f"ALTER TABLE principal_daily DROP PARTITION ID '{d:%Y%m%d}'")
    # Fewer rows in the rollup than in the raw table: on a day that is over, rows it lacks;
    # on the current day, maybe the loader's writes still landing.
    assert rollups.settle(db, [yesterday, today]) == [yesterday]
    assert rollup(db)[yesterday]["rows_read"] == 4 and today not in rollup(db)
