"""The history store (issue: Decision log and history, item 3): schema, loader, retention, queries.

chDB (the real ClickHouse engine, in process) in a temporary directory, one database per test;
the loader tests read a real Kafka broker (tests/kafka_fixture.py) on topics of their own.

chDB hosts one engine per process on one directory, so every test of this process shares one
directory; the kill test runs its loaders in child processes, on a directory of their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import apifuzz
from kafka_fixture import create_topics, dev_kafka, kafka_bootstrap  # noqa: F401  (fixtures)
from serverkit import serve, wait_until
from svc import history
from svc._pdp_core import DecisionLog
from svc.cli import app
from svc.common.auth import HistoryAuthSettings
from svc.history import queries
from svc.history.service import create_app as create_history_app
from svc.pdp import Engine

PARTITIONS = 3
REPO = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 22, 10, 30, tzinfo=UTC)
#: The history routes without caller authentication (tests/test_auth.py covers it).
OPEN = HistoryAuthSettings(auth="none")
#: Every schema version this release applies to a new database, oldest first.
ALL_VERSIONS = [m.version for m in history.MIGRATIONS]


# -- records


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def decision(
    *,
    principal: tuple[str, str] = ("Human", "alice"),
    resource: tuple[str, str | None] = ("Document", "design"),
    at: datetime = NOW,
    verdict: str | None = "allow",
    mode: str = "enforce",
    call: str = "check",
    outcome: str | None = None,
    on_behalf_of: tuple[str, str] | None = None,
    qid: str | None = None,
    action: str = "view",
) -> dict[str, Any]:
    """A decision-log record as the decision point writes it (to_record / plan_record)."""
    rec: dict[str, Any] = {
        "qid": qid or str(uuid.uuid4()),
        "at": rfc3339(at),
        "call": call,
        "transport": "grpc",
        "principal": {"type": principal[0], "id": principal[1]},
        "on_behalf_of": None
        if on_behalf_of is None
        else {"type": on_behalf_of[0], "id": on_behalf_of[1]},
        "action": action,
        "resource": {"type": resource[0], "id": resource[1]},
        "verdict": verdict,
        "challenges": ["verification"] if verdict == "challenge" else [],
        "policies": ["policy0"],
        "mode": mode,
        "challenge_qid": None,
        "policy_version": 3,
        "principals_version": 7,
        "latency_us": 41,
        "pdp": "svc-pdp-0",
    }
    if call == "plan":
        rec.update(
            outcome=outcome or "conditional",
            pinned=False,
            needs_row_checks=False,
            attributes=["owner"],
        )
    else:
        rec.update(
            on_behalf_of_outcome=None,
            work_item=None,
            assigned=False,
            risk_score=12,
        )
    return rec


def event(
    *,
    principal: tuple[str, str] = ("Human", "alice"),
    resource: tuple[str, str] = ("File", "budget.xlsx"),
    at: datetime = NOW,
    action: str = "download",
    ingest_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An intake record: an event (docs/intake.md) plus received_at and ingest_id."""
    rec: dict[str, Any] = {
        "ingest_id": ingest_id or str(uuid.uuid4()),
        "at": rfc3339(at),
        "received_at": rfc3339(at + timedelta(seconds=1)),
        "system": "drive",
        "principal": {"type": principal[0], "id": principal[1]},
        "on_behalf_of": None,
        "action": action,
        "resource": {"type": resource[0], "id": resource[1]},
        "source_ip": "10.0.0.7",
        "attributes": {},
    }
    rec.update(extra)
    return rec


def key_of(rec: dict[str, Any]) -> bytes:
    p = rec.get("principal") or {}
    return f"{p.get('type')}::{p.get('id')}".encode()


def as_records(topic: str, values: list[Any], partition: int = 0) -> list[history.Record]:
    out: list[history.Record] = []
    for i, v in enumerate(values):
        raw = v if isinstance(v, bytes) else json.dumps(v).encode()
        out.append((topic, partition, i, key_of(v) if isinstance(v, dict) else b"", raw))
    return out


JUNK: list[bytes] = [
    b"not json",
    b"",
    b"[1, 2, 3]",
    b"\xff\xfe\x00garbage",
    b'{"qid": "x"',  # cut short
    json.dumps({"qid": "no-time", "principal": {"type": "Human", "id": "a"}}).encode(),
    json.dumps({**decision(), "at": "yesterday"}).encode(),
    json.dumps({**decision(), "principal": "Human::alice"}).encode(),
    json.dumps({**decision(), "resource": {"type": "Document", "id": None}}).encode(),
    json.dumps({**decision(), "mode": None}).encode(),
]
JUNK_EVENTS: list[bytes] = [
    b"{}",
    json.dumps({**event(), "ingest_id": ""}).encode(),
    json.dumps({**event(), "resource": {"type": "File"}}).encode(),
    json.dumps({**event(), "received_at": "soon"}).encode(),
]


# -- fixtures


@pytest.fixture(scope="session")
def chdb_dir(chdb_root: str) -> Path:
    """The process's chDB directory (conftest's ``chdb_root``), which every module shares."""
    return Path(chdb_root.removeprefix("chdb://"))


@pytest.fixture
def dsn(chdb_dir: Path) -> str:
    return f"chdb://{chdb_dir}?database=t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def db(dsn: str) -> Client:
    client = history.connect(dsn, create_database=True)
    assert history.migrate(client) == ALL_VERSIONS
    return client


def retry(what: str, fn: Callable[[], Any], attempts: int = 8) -> Any:
    """Setup steps against the shared broker, which other work may restart briefly."""
    for n in range(attempts):
        try:
            return fn()
        except KafkaException as e:
            if n == attempts - 1:
                raise
            print(f"{what}: {e}; retrying")
            time.sleep(3)
    raise AssertionError("unreachable")


@pytest.fixture
def topics(kafka_bootstrap: str) -> tuple[str, str]:  # noqa: F811
    tag = uuid.uuid4().hex[:10]
    names = (f"test.history.decisions.{tag}", f"test.history.events.{tag}")
    create_topics(kafka_bootstrap, *names, partitions=PARTITIONS)
    return names


def produce(bootstrap: str, topic: str, values: list[Any]) -> None:
    """Produces every value (dict as JSON, bytes as is), keyed by principal; waits for acks."""
    failed: list[Any] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    for v in values:
        raw = v if isinstance(v, bytes) else json.dumps(v).encode()
        key = key_of(v) if isinstance(v, dict) else None
        while True:
            try:
                producer.produce(
                    topic, raw, key, on_delivery=lambda err, _m: err and failed.append(err)
                )
                break
            except BufferError:
                producer.poll(0.5)
    assert producer.flush(120) == 0
    assert not failed, failed


def with_duplicates(values: list[Any], every: int = 7) -> list[Any]:
    """`values` with every `every`-th one sent again later (as a producer retry would)."""
    return values + values[::every]


def loader_for(
    client: Client, bootstrap: str, topics: tuple[str, str], group: str | None = None, **kw: Any
) -> Any:
    kw.setdefault("batch_records", 1000)
    kw.setdefault("batch_ms", 300)
    return history.Loader(
        client,
        bootstrap,
        decisions_topic=topics[0],
        events_topic=topics[1],
        group_id=group or f"test-history-{uuid.uuid4().hex[:8]}",
        consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        **kw,
    )


def run_until_caught_up(loader: Any, timeout: float = 180) -> Any:
    """loader.run(until_caught_up=True) with a watchdog; returns its stats."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["stats"] = loader.run(until_caught_up=True)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        loader.stop()
        t.join(30)
        pytest.fail(f"loader not caught up after {timeout}s: {loader.stats}")
    if "error" in out:
        raise out["error"]
    return out["stats"]


def count(client: Client, sql: str) -> int:
    return int(client.query(sql).result_rows[0][0])


def counts(client: Client) -> dict[str, int]:
    return {
        "decisions": count(client, "SELECT count() FROM decisions FINAL"),
        "decisions_qids": count(client, "SELECT uniqExact(qid) FROM decisions"),
        "decisions_by_resource": count(client, "SELECT count() FROM decisions_by_resource FINAL"),
        "events": count(client, "SELECT count() FROM events FINAL"),
        "events_ids": count(client, "SELECT uniqExact(ingest_id) FROM events"),
        "events_by_resource": count(client, "SELECT count() FROM events_by_resource FINAL"),
        "rejected": count(client, "SELECT count() FROM rejected FINAL"),
    }


def expected(n_decisions: int, n_events: int, n_rejected: int) -> dict[str, int]:
    return {
        "decisions": n_decisions,
        "decisions_qids": n_decisions,
        "decisions_by_resource": n_decisions,
        "events": n_events,
        "events_ids": n_events,
        "events_by_resource": n_events,
        "rejected": n_rejected,
    }


def spread(n: int, start: datetime = NOW - timedelta(hours=6)) -> Iterator[datetime]:
    for i in range(n):
        yield start + timedelta(milliseconds=997 * i)


# -- schema


def test_migrate_twice_is_a_noop(dsn: str) -> None:
    client = history.connect(dsn, create_database=True)
    assert history.migrate(client) == ALL_VERSIONS
    tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
    assert history.migrate(client) == []
    assert {r[0] for r in client.query("SHOW TABLES").result_rows} == tables
    assert set(history.RETAINED_TABLES) | {"schema_migrations", "decisions_intake"} <= tables
    versions = client.query("SELECT version FROM schema_migrations FINAL ORDER BY version")
    assert versions.result_rows == [(v,) for v in ALL_VERSIONS]
    assert history.applied_versions(client) == set(ALL_VERSIONS)


def test_migrate_finishes_a_run_that_failed_midway(dsn: str) -> None:
    client = history.connect(dsn, create_database=True)
    # The first statements ran, then the job died before recording the version.
    for stmt in history.MIGRATIONS[0].statements[:4]:
        client.command(stmt)
    assert history.migrate(client) == ALL_VERSIONS
    assert history.migrate(client) == []


def test_a_decision_record_keeps_what_the_directory_did_not_hold(db: Client) -> None:
    """A real record (the engine's, through the decision log) with a principal the directory
    does not hold and inline entities it ignored: both lists are kept and queried back."""
    engine = Engine.from_bundle_dir(REPO / "tests/testdata/bundles/corp")
    log = DecisionLog(Path(tempfile.mkdtemp()) / "spool")
    forged = {"uid": {"type": "Human", "id": "mallory"}, "attrs": {}, "parents": []}
    with serve(engine, decision_log=log) as s:
        r = s.post(
            "/v1/access/evaluation",
            {
                "principal": {"type": "Human", "id": "mallory"},
                "action": "view",
                "resource": {"type": "Document", "id": "design"},
                "entities": [forged],
            },
        )
        assert r.status_code == 200, r.text
        s.post(
            "/v1/access/evaluation",
            {
                "principal": {"type": "Human", "id": "alice"},
                "action": "view",
                "resource": {"type": "Document", "id": "design"},
            },
        )
        # Both answers were given, so both records are in the log (read it until they are).
        got: list[tuple[bytes, bytes]] = []
        wait_until(lambda: got.extend(log.read(10, 0.2)[0]) or len(got) == 2, timeout=10)
    assert len(got) == 2
    history.store(
        db, "decisions", [("svc.decisions.v1", 0, i, k, v) for i, (k, v) in enumerate(got)]
    )
    mallory = {"type": "Human", "id": "mallory"}
    rows = queries.decisions_of_principal(
        db, mallory, NOW - timedelta(days=3650), datetime.now(UTC) + timedelta(days=1)
    )
    assert [(d["not_in_directory"], d["inline_ignored"]) for d in rows] == [([mallory], [mallory])]
    alice = queries.decisions_of_resource(
        db,
        {"type": "Document", "id": "design"},
        NOW - timedelta(days=3650),
        datetime.now(UTC) + timedelta(days=1),
    )
    assert sorted((d["principal"]["id"], len(d["not_in_directory"])) for d in alice) == [
        ("alice", 0),
        ("mallory", 1),
    ]


def test_search_records_are_kept_with_their_kind_and_count(db: Client) -> None:
    """One record per AuthZEN search (docs/search.md): the engine's own records, through the
    decision log, are stored (not rejected) and read back with what was searched and how many
    results the page had."""
    engine = Engine.from_bundle_dir(REPO / "tests/testdata/bundles/corp")
    log = DecisionLog(Path(tempfile.mkdtemp()) / "spool")
    alice = {"type": "Human", "id": "alice"}
    design = {"type": "Document", "id": "design"}
    bodies = {
        "resource": {
            "subject": alice,
            "action": {"name": "view"},
            "resource": {"type": "Document"},
        },
        "subject": {"subject": {"type": "Human"}, "action": {"name": "view"}, "resource": design},
        "action": {"subject": alice, "resource": design},
    }
    counts: dict[str, int] = {}
    with serve(engine, decision_log=log) as s:
        for kind, body in bodies.items():
            r = s.post(f"/access/v1/search/{kind}", body)
            assert r.status_code == 200, r.text
            counts[kind] = len(r.json()["results"])
        got: list[tuple[bytes, bytes]] = []
        wait_until(lambda: got.extend(log.read(10, 0.2)[0]) or len(got) == 3, timeout=10)
    assert len(got) == 3 and all(counts.values()), counts
    history.store(
        db, "decisions", [("svc.decisions.v1", 0, i, k, v) for i, (k, v) in enumerate(got)]
    )
    assert history.rejected_count(db) == 0
    by_kind = {}
    for _, v in got:
        rec = json.loads(v)
        stored = queries.decision_by_qid(db, rec["qid"])
        assert stored is not None
        by_kind[stored["search"]] = stored
    assert set(by_kind) == set(bodies)
    for kind, d in by_kind.items():
        assert (d["call"], d["verdict"], d["count"]) == ("search", None, counts[kind])
    assert by_kind["resource"]["principal"] == alice
    assert by_kind["resource"]["resource"] == {"type": "Document", "id": None}
    assert by_kind["subject"]["principal"] == {"type": "Human", "id": None}
    assert by_kind["subject"]["resource"] == design
    assert (by_kind["action"]["action"], by_kind["action"]["resource"]) == (None, design)
    # A record that says it is a search but not which kind is rejected, naming the field.
    bad = dict(json.loads(next(v for _, v in got if json.loads(v)["search"] == "resource")))
    bad.update(qid="bad-search", search="everything", resource=design)
    history.store(db, "decisions", [("svc.decisions.v1", 0, 99, b"k", json.dumps(bad).encode())])
    assert history.rejected_count(db) == 1
    reasons = db.query("SELECT reason FROM rejected FINAL").result_rows
    assert reasons == [("`search`: missing or not subject, resource or action",)]


def test_cli_migrate_is_idempotent(chdb_dir: Path) -> None:
    dsn = f"chdb://{chdb_dir}?database=cli_{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    first = runner.invoke(app, ["history", "migrate", "--dsn", dsn])
    assert first.exit_code == 0, first.output
    assert f"applied versions {ALL_VERSIONS}" in first.output
    again = runner.invoke(app, ["history", "migrate"], env={"SVC_HISTORY_DSN": dsn})
    assert again.exit_code == 0, again.output
    assert "up to date" in again.output
    bad = runner.invoke(app, ["history", "migrate", "--dsn", "mysql://x"])
    assert bad.exit_code == 2


# -- storing (no broker)


def test_store_keeps_each_record_once_and_rejects_junk(db: Client) -> None:
    decisions = [decision(at=t) for t in spread(200)]
    events = [event(at=t) for t in spread(50)]
    d = as_records("d", decisions + JUNK)
    e = as_records("e", events + JUNK_EVENTS)
    history.store(db, "decisions", d)
    history.store(db, "events", e)
    # The same batches again (a retry after a failure), and part of them a third time.
    history.store(db, "decisions", d)
    history.store(db, "events", e)
    history.store(db, "decisions", d[:50])
    assert counts(db) == expected(200, 50, len(JUNK) + len(JUNK_EVENTS))
    assert count(db, "SELECT count() FROM decisions") > 200  # copies are there until a merge
    reasons = dict(
        db.query("SELECT offset, reason FROM rejected FINAL WHERE topic = 'd'").result_rows
    )
    base = len(decisions)
    assert reasons[base + 0] == "not JSON"
    assert reasons[base + 2] == "not a JSON object"
    assert reasons[base + 5] == "`at`: missing or not an RFC 3339 time"
    assert reasons[base + 7] == "`principal`: missing type or id"
    assert reasons[base + 8] == "`resource`: missing type or id"
    assert reasons[base + 9] == "`mode`: missing"
    assert history.rejected_count(db, "e") == len(JUNK_EVENTS)


def test_stored_rows_keep_every_field(db: Client) -> None:
    check = decision(
        verdict="challenge", mode="monitor", on_behalf_of=("Human", "bob"), principal=("Agent", "x")
    )
    check["on_behalf_of_outcome"] = {"verdict": "allow", "challenges": [], "policies": ["p"]}
    check["work_item"] = "JIRA-7"
    check["assigned"] = True
    plan = decision(call="plan", verdict=None, outcome="always_denied", resource=("Doc", None))
    ev = event(
        at=datetime(2026, 11, 22, 11, 30, tzinfo=UTC),
        access="listed",
        count=40,
        tool="search_files",
        action_class="read",
        outcome="failure",
        role_arn="arn:aws:iam::1:role/reader",
        attributes={"plan_qid": plan["qid"], "query": "q3"},
    )
    ev["at"] = "2026-11-22T12:30:00.250+01:00"  # any offset; stored in UTC
    history.store(db, "decisions", as_records("d", [check, plan]))
    history.store(db, "events", as_records("e", [ev]))

    got = history.decision_by_qid(db, check["qid"])
    assert got is not None
    assert got["at"] == NOW
    assert got["principal"] == {"type": "Agent", "id": "x"}
    assert got["on_behalf_of"] == {"type": "Human", "id": "bob"}
    assert got["on_behalf_of_outcome"] == check["on_behalf_of_outcome"]
    assert (got["verdict"], got["mode"], got["would"]) == ("challenge", "monitor", "challenge")
    assert got["challenges"] == ["verification"]
    assert (got["work_item"], got["assigned"], got["risk_score"]) == ("JIRA-7", True, 12)
    assert (got["policy_version"], got["principals_version"], got["latency_us"]) == (3, 7, 41)
    assert got["challenge_qid"] is None and got["pdp"] == "svc-pdp-0"

    p = history.decision_by_qid(db, plan["qid"])
    assert p is not None
    assert p["resource"] == {"type": "Doc", "id": None}
    assert (p["call"], p["verdict"], p["outcome"], p["would"]) == (
        "plan",
        None,
        "always_denied",
        None,
    )
    assert p["attributes"] == ["owner"] and p["pinned"] is False
    assert history.decision_by_qid(db, "no-such-qid") is None

    (e,) = history.events_of_principal(db, "Human::alice", NOW, NOW + timedelta(hours=2))
    assert e["at"] == datetime(2026, 11, 22, 11, 30, 0, 250_000, tzinfo=UTC)
    assert e["received_at"] == datetime(2026, 11, 22, 11, 30, 1, tzinfo=UTC)
    assert (e["access"], e["count"], e["tool"], e["action_class"]) == (
        "listed",
        40,
        "search_files",
        "read",
    )
    assert e["plan_qid"] == plan["qid"]
    assert e["attributes"] == {"plan_qid": plan["qid"], "query": "q3"}
    assert (e["outcome"], e["role_arn"]) == ("failure", "arn:aws:iam::1:role/reader")


# -- queries


def test_queries_by_principal_resource_time_and_monitor_mode(db: Client) -> None:
    t0 = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)
    alice, bob, agent = ("Human", "alice"), ("Human", "bob"), ("ServiceAccount", "bot")
    design, budget = ("Document", "design"), ("Document", "budget")
    recs = [
        decision(principal=alice, resource=design, at=t0, verdict="allow"),
        decision(principal=alice, resource=design, at=t0 + timedelta(hours=1), verdict="deny"),
        decision(
            principal=alice,
            resource=budget,
            at=t0 + timedelta(hours=2),
            verdict="deny",
            mode="monitor",
        ),
        decision(
            principal=alice,
            resource=budget,
            at=t0 + timedelta(hours=3),
            verdict="challenge",
            mode="monitor",
        ),
        decision(
            principal=alice, resource=budget, at=t0 + timedelta(hours=4), mode="monitor"
        ),  # allow in monitor: not a would-anything
        decision(
            principal=alice,
            resource=("Document", None),
            at=t0 + timedelta(hours=5),
            call="plan",
            verdict=None,
            outcome="always_denied",
            mode="monitor",
        ),
        decision(principal=bob, resource=design, at=t0 + timedelta(hours=1, minutes=1)),
        decision(
            principal=agent,
            on_behalf_of=alice,
            resource=design,
            at=t0 + timedelta(days=1),
            verdict="allow",
        ),
    ]
    # Stored twice: the queries still return each once.
    history.store(db, "decisions", as_records("d", recs))
    history.store(db, "decisions", as_records("d", recs))
    evs = [
        event(principal=alice, resource=("File", "a"), at=t0 + timedelta(minutes=5)),
        event(principal=alice, resource=("File", ""), at=t0 + timedelta(minutes=6)),
        event(principal=bob, resource=("File", "a"), at=t0 + timedelta(days=1)),
    ]
    history.store(db, "events", as_records("e", evs))
    history.store(db, "events", as_records("e", evs))
    end = t0 + timedelta(days=2)

    def qids(rows: list[dict[str, Any]]) -> list[str]:
        return [r["qid"] for r in rows]

    assert qids(history.decisions_of_principal(db, "Human::alice", t0, end)) == qids(
        [r for r in recs[:6]]
    )
    # Half-open range: [t0 + 1h, t0 + 3h) holds the 1h and 2h decisions only.
    got = history.decisions_of_principal(
        db, alice, t0 + timedelta(hours=1), t0 + timedelta(hours=3)
    )
    assert qids(got) == [recs[1]["qid"], recs[2]["qid"]]
    # Monitor mode: would-deny, would-challenge, and the plan enforcement would have denied.
    monitor = history.decisions_of_principal(db, alice, t0, end, monitor_only=True)
    assert [(r["qid"], r["would"]) for r in monitor] == [
        (recs[2]["qid"], "deny"),
        (recs[3]["qid"], "challenge"),
        (recs[5]["qid"], "deny"),
    ]
    assert all(r["verdict"] != "allow" for r in monitor)
    # As the person an agent acted for.
    with_agent = history.decisions_of_principal(db, alice, t0, end, include_on_behalf_of=True)
    assert qids(with_agent) == [*qids(recs[:6]), recs[7]["qid"]]
    assert qids(history.decisions_of_principal(db, alice, t0, end, limit=2)) == qids(recs[:2])

    by_design = history.decisions_of_resource(db, {"type": "Document", "id": "design"}, t0, end)
    assert qids(by_design) == [recs[0]["qid"], recs[1]["qid"], recs[6]["qid"], recs[7]["qid"]]
    assert qids(history.decisions_of_resource(db, budget, t0, end, monitor_only=True)) == [
        recs[2]["qid"],
        recs[3]["qid"],
    ]
    assert history.decisions_of_resource(db, design, end, end + timedelta(days=1)) == []

    assert history.verdict_counts(db, alice, t0, end) == {
        "allow": 2,
        "deny": 2,
        "challenge": 1,
        "would_deny": 2,
        "would_challenge": 1,
        "plans": 1,
    }

    ev_alice = history.events_of_principal(db, alice, t0, end)
    assert [e["ingest_id"] for e in ev_alice] == [evs[0]["ingest_id"], evs[1]["ingest_id"]]
    ev_file = history.events_of_resource(db, "File::a", t0, end)
    assert [e["ingest_id"] for e in ev_file] == [evs[0]["ingest_id"], evs[2]["ingest_id"]]
    listing = history.events_of_resource(db, ("File", ""), t0, end)
    assert [e["ingest_id"] for e in listing] == [evs[1]["ingest_id"]]

    with pytest.raises(ValueError):
        history.decisions_of_principal(db, alice, end, t0)
    with pytest.raises(ValueError):
        history.decisions_of_principal(db, "alice", t0, end)


def test_daily_counts_for_the_reasoner(db: Client) -> None:
    alice = ("Human", "alice")
    today = NOW
    recs = [
        decision(principal=alice, at=today, verdict="allow"),
        decision(principal=alice, at=today - timedelta(hours=1), verdict="deny"),
        decision(principal=alice, at=today - timedelta(days=2), verdict="deny", mode="monitor"),
        decision(principal=alice, at=today - timedelta(days=2), verdict="challenge"),
        decision(principal=alice, at=today - timedelta(days=40), verdict="deny"),  # too old
        decision(principal=("Human", "bob"), at=today, verdict="deny"),
    ]
    evs = [
        event(principal=alice, at=today, access="listed", count=40),
        event(principal=alice, at=today, access="exported", count=3, action="export"),
        event(principal=alice, at=today - timedelta(days=1), outcome="failure", action="view"),
    ]
    history.store(db, "decisions", as_records("d", recs + recs))
    history.store(db, "events", as_records("e", evs + evs))
    days = history.daily_counts(db, "Human::alice", 30, now=NOW)
    assert len(days) == 30
    assert days[0].day == date(2026, 10, 24) and days[-1].day == date(2026, 11, 22)
    by_day = {d.day: d for d in days}
    assert by_day[date(2026, 11, 22)] == history.DailyCounts(
        day=date(2026, 11, 22),
        allow=1,
        deny=1,
        events=2,
        moved_out=2,
        rows_listed=40,
        rows_exported=3,
    )
    assert by_day[date(2026, 11, 21)] == history.DailyCounts(
        day=date(2026, 11, 21), events=1, failures=1
    )
    assert by_day[date(2026, 11, 20)] == history.DailyCounts(
        day=date(2026, 11, 20), deny=1, challenge=1, would_deny=1
    )
    assert sum(d.deny for d in days) == 2


def test_dsn_database_is_split_off() -> None:
    from svc.history.store import _split_database

    assert _split_database("chdb:///var/lib/h?database=svc") == ("chdb:///var/lib/h", "svc")
    assert _split_database("chdb:///var/lib/h") == ("chdb:///var/lib/h", None)
    assert _split_database("https://u:p@ch:8443/svc_history?secure=1") == (
        "https://u:p@ch:8443?secure=1",
        "svc_history",
    )
    assert _split_database("http://ch:8123") == ("http://ch:8123", None)
    with pytest.raises(ValueError):
        history.connect("chdb:///tmp/x?database=no;drop")


def test_parse_ref() -> None:
    assert history.parse_ref("Human::alice") == ("Human", "alice")
    assert history.parse_ref('Human::"al::ice"') == ("Human", "al::ice")
    assert history.parse_ref(("File", "")) == ("File", "")
    assert history.parse_ref({"type": "Human", "id": "bob"}) == ("Human", "bob")
    for bad in ("alice", "::x", {"type": "Human"}):
        with pytest.raises(ValueError):
            history.parse_ref(bad)  # type: ignore[arg-type]


# -- retention


def test_retention_cutoff_keeps_whole_days_within_the_setting() -> None:
    assert history.retention_cutoff(0, NOW) is None
    assert history.retention_cutoff(3, NOW) == date(2026, 11, 19)
    assert history.retention_cutoff(1, datetime(2026, 11, 22, 0, 0, tzinfo=UTC)) == date(
        2026, 11, 21
    )
    with pytest.raises(ValueError):
        history.retention_cutoff(-1, NOW)


def test_retention_drops_only_whole_days_older_than_the_setting(db: Client) -> None:
    # Ten days of data, with rows at each day's first and last millisecond.
    recs, evs = [], []
    for n in range(10):
        day = datetime(2026, 11, 22, tzinfo=UTC) - timedelta(days=n)
        for t in (day, day + timedelta(hours=12), day + timedelta(days=1, milliseconds=-1)):
            recs.append(decision(at=t))
            evs.append(event(at=t))
    history.store(db, "decisions", as_records("d", recs))
    history.store(db, "events", as_records("e", evs))

    def days_left(table: str) -> list[str]:
        rows = db.query(f"SELECT DISTINCT toString(toDate(at)) FROM {table} ORDER BY 1")
        return [r[0] for r in rows.result_rows]

    assert history.apply_retention(db, 0, now=NOW) == []
    assert count(db, "SELECT count() FROM decisions FINAL") == 30

    dropped = history.apply_retention(db, 3, now=NOW)
    # 3 days at 10:30 on 11-22: every row of 11-18 and before is older than 3 days (dropped);
    # 11-19 has rows younger than that (kept whole).
    want = ["2026-11-19", "2026-11-20", "2026-11-21", "2026-11-22"]
    for table in ("decisions", "decisions_by_resource", "events", "events_by_resource"):
        assert days_left(table) == want, table
        assert {d for t, d in dropped if t == table} == {f"2026-11-{d:02d}" for d in range(13, 19)}
    assert count(db, "SELECT count() FROM decisions FINAL") == 12
    assert count(db, "SELECT count() FROM events_by_resource FINAL") == 12
    oldest_kept = history.decisions_of_principal(
        db, "Human::alice", datetime(2026, 11, 19, tzinfo=UTC), NOW
    )[0]
    assert oldest_kept["at"] == datetime(2026, 11, 19, tzinfo=UTC)
    # Again: nothing more to drop. A larger setting brings nothing back.
    assert history.apply_retention(db, 3, now=NOW) == []
    assert history.apply_retention(db, 30, now=NOW) == []
    assert days_left("decisions") == want


def test_retention_setting_changed_at_runtime_takes_effect(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    recs = [decision(at=NOW - timedelta(days=n)) for n in range(8)]
    history.store(db, "decisions", as_records("d", recs))
    setting = {"days": 0}
    loader = loader_for(
        db,
        kafka_bootstrap,
        topics,
        retention_days=lambda: setting["days"],
        retention_interval=0.2,
        now=lambda: NOW,
    )
    thread = threading.Thread(target=loader.run, daemon=True)
    thread.start()
    try:

        def wait_for(n_days: int) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = count(db, "SELECT uniqExact(toDate(at)) FROM decisions FINAL")
                if got == n_days:
                    return
                time.sleep(0.2)
            pytest.fail(f"expected {n_days} days left, have {got}")

        time.sleep(1.0)  # several passes with 0: nothing dropped
        assert count(db, "SELECT count() FROM decisions FINAL") == 8
        setting["days"] = 5
        wait_for(6)  # 11-17 .. 11-22
        setting["days"] = 2
        wait_for(3)  # 11-20 .. 11-22
        setting["days"] = 0
        time.sleep(0.6)
        assert count(db, "SELECT count() FROM decisions FINAL") == 3
    finally:
        loader.stop()
        thread.join(30)
    assert loader.stats.retention_runs >= 5
    # decisions, decisions_by_resource, the daily rollup (principal_daily) and the hourly one
    # (decisions_hourly; no denial, no settle pass yet: the loader's first is a minute in)
    assert loader.stats.dropped_partitions == 5 * 4


# -- the loader against Kafka


Offset = tuple[str, int, int]


def offsets_of(batch: history.Batch) -> set[Offset]:
    return {(t, p, o) for records in batch.records.values() for t, p, o, _, _ in records}


def everything(topics: tuple[str, str]) -> dict[Any, int]:
    return {(t, p): 0 for t in topics for p in range(PARTITIONS)}


def committed_offsets(bootstrap: str, group: str, topics: tuple[str, str]) -> dict[Any, int]:
    """The group's committed offset per (topic, partition); 0 where nothing is committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        got = retry("committed offsets", lambda: consumer.committed(parts, timeout=20))
        return {(tp.topic, tp.partition): max(tp.offset, 0) for tp in got}
    finally:
        consumer.close()


def uncommitted(bootstrap: str, topics: tuple[str, str], committed: dict[Any, int]) -> set[Offset]:
    """Every record offset at or after the committed offset, up to the end of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-history-watermarks"})
    try:
        out: set[Offset] = set()
        for (t, p), start in committed.items():
            _, end = retry(
                "watermarks",
                lambda t=t, p=p: consumer.get_watermark_offsets(TopicPartition(t, p), timeout=20),
            )
            out |= {(t, p, o) for o in range(start, end)}
        return out
    finally:
        consumer.close()


def test_loader_stores_n_records_exactly_once_despite_duplicates(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    people = [("Human", f"user{i}") for i in range(40)] + [("ServiceAccount", "bot")]
    decisions = [
        decision(
            principal=people[i % len(people)],
            resource=("Document", f"doc{i % 97}"),
            at=t,
            verdict=("allow", "deny", "challenge")[i % 3],
            mode=("enforce", "monitor")[i % 2],
        )
        for i, t in enumerate(spread(3000))
    ]
    events = [
        event(principal=people[i % len(people)], resource=("File", f"f{i % 13}"), at=t)
        for i, t in enumerate(spread(800))
    ]
    produce(kafka_bootstrap, topics[0], with_duplicates(decisions))
    produce(kafka_bootstrap, topics[1], with_duplicates(events))
    read: list[Offset] = []
    loader = loader_for(
        db, kafka_bootstrap, topics, after_store=lambda b: read.extend(offsets_of(b))
    )
    stats = run_until_caught_up(loader)
    assert counts(db) == expected(3000, 800, 0)
    # Every record of both topics was read (some twice if the broker went away mid-run).
    assert set(read) == uncommitted(kafka_bootstrap, topics, everything(topics))
    assert (stats.records, stats.rejected) == (len(read), 0)
    monitor_denies = sum(1 for d in decisions if d["mode"] == "monitor" and d["verdict"] != "allow")
    got = count(
        db,
        "SELECT count() FROM decisions FINAL "
        "WHERE mode = 'monitor' AND verdict IN ('deny', 'challenge')",
    )
    assert got == monitor_denies


def test_junk_records_do_not_stop_the_loader(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    good = [decision(at=t) for t in spread(300)]
    good_events = [event(at=t) for t in spread(100)]
    # Junk before, between and after the good records.
    produce(kafka_bootstrap, topics[0], JUNK[:5] + good[:150] + JUNK[5:] + good[150:] + JUNK)
    produce(kafka_bootstrap, topics[1], JUNK_EVENTS + good_events)
    junk = set(JUNK) | set(JUNK_EVENTS)
    junk_read: list[Offset] = []

    def note_junk(batch: history.Batch) -> None:
        for records in batch.records.values():
            junk_read.extend((t, p, o) for t, p, o, _, v in records if v in junk)

    loader = loader_for(db, kafka_bootstrap, topics, batch_records=100, after_store=note_junk)
    stats = run_until_caught_up(loader)
    n_junk = 2 * len(JUNK) + len(JUNK_EVENTS)
    assert counts(db) == expected(300, 100, n_junk)
    assert len(set(junk_read)) == n_junk
    assert stats.rejected == len(junk_read)  # each read of a junk record is counted
    assert history.rejected_count(db, topics[0]) == 2 * len(JUNK)


def test_loader_crash_between_store_and_commit_restarts_exactly(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    decisions = [decision(at=t) for t in spread(2000)]
    events = [event(at=t) for t in spread(500)]
    produce(kafka_bootstrap, topics[0], with_duplicates(decisions))
    produce(kafka_bootstrap, topics[1], with_duplicates(events))
    group = f"test-history-crash-{uuid.uuid4().hex[:8]}"
    stored: list[set[Offset]] = []

    class Crash(Exception):
        pass

    def crash_on_third(batch: history.Batch) -> None:
        stored.append(offsets_of(batch))
        if len(stored) == 3:
            raise Crash

    first = loader_for(
        db, kafka_bootstrap, topics, group=group, batch_records=400, after_store=crash_on_third
    )
    with pytest.raises(Crash):
        first.run()
    committed = committed_offsets(kafka_bootstrap, group, topics)
    to_read = uncommitted(kafka_bootstrap, topics, committed)
    # The third batch was stored, then the loader died before committing it.
    assert stored[2] and stored[2] <= to_read

    read: set[Offset] = set()
    second = loader_for(
        db,
        kafka_bootstrap,
        topics,
        group=group,
        batch_records=400,
        after_store=lambda batch: read.update(offsets_of(batch)),
    )
    run_until_caught_up(second)
    # The restarted loader read again everything not committed, the third batch included,
    # and the tables still hold each record once.
    assert read == to_read
    assert counts(db) == expected(2000, 500, 0)


CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from svc import history

    dsn, bootstrap, dtopic, etopic, group, kill_after, progress = sys.argv[1:8]
    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    batches = 0

    def hook(batch):
        global batches
        batches += 1
        with open(progress, "a") as f:
            offsets = [[t, p, o] for rs in batch.records.values() for t, p, o, _, _ in rs]
            f.write(json.dumps(offsets) + "\\n")
        if batches == int(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-batch: stored, not committed

    loader = history.Loader(
        client, bootstrap, decisions_topic=dtopic, events_topic=etopic, group_id=group,
        batch_records=500, batch_ms=500, after_store=hook,
        consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )
    stats = loader.run(until_caught_up=True)
    q = lambda sql: client.query(sql).result_rows[0][0]
    print(json.dumps({
        "decisions": q("SELECT count() FROM decisions FINAL"),
        "decisions_qids": q("SELECT uniqExact(qid) FROM decisions"),
        "decisions_by_resource": q("SELECT count() FROM decisions_by_resource FINAL"),
        "events": q("SELECT count() FROM events FINAL"),
        "events_ids": q("SELECT uniqExact(ingest_id) FROM events"),
        "events_by_resource": q("SELECT count() FROM events_by_resource FINAL"),
        "rejected": q("SELECT count() FROM rejected FINAL"),
    }))
    """
)


def read_progress(path: Path) -> list[set[Offset]]:
    return [{(t, p, o) for t, p, o in json.loads(line)} for line in path.read_text().splitlines()]


def test_loader_killed_mid_batch_and_restarted_still_exactly_n(
    tmp_path: Path,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    decisions = [decision(at=t) for t in spread(3000)]
    events = [event(at=t) for t in spread(700)]
    produce(kafka_bootstrap, topics[0], with_duplicates(decisions) + JUNK)
    produce(kafka_bootstrap, topics[1], with_duplicates(events))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    group = f"test-history-kill-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def child(kill_after: int, progress: Path) -> subprocess.CompletedProcess[str]:
        args = [dsn, kafka_bootstrap, *topics, group, str(kill_after), str(progress)]
        return subprocess.run(
            [sys.executable, "-c", CHILD, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=REPO,
        )

    killed = child(3, tmp_path / "killed.jsonl")
    assert killed.returncode == -9, killed.stderr[-2000:]
    stored = read_progress(tmp_path / "killed.jsonl")
    assert len(stored) == 3
    committed = committed_offsets(kafka_bootstrap, group, topics)
    to_read = uncommitted(kafka_bootstrap, topics, committed)
    # Killed after storing its third batch and before committing it.
    assert stored[2] and stored[2] <= to_read

    restarted = child(0, tmp_path / "restarted.jsonl")
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    read = set().union(*read_progress(tmp_path / "restarted.jsonl"))
    assert read == to_read  # everything not committed was read again, the third batch too
    assert json.loads(restarted.stdout.strip().splitlines()[-1]) == expected(3000, 700, len(JUNK))


def test_cli_load_until_caught_up(
    chdb_dir: Path,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    dsn = f"chdb://{chdb_dir}?database=cli_{uuid.uuid4().hex[:8]}"
    recent = datetime.now(UTC) - timedelta(hours=1)  # within the 30 days of retention
    produce(kafka_bootstrap, topics[0], [decision(at=t) for t in spread(120, recent)])
    produce(kafka_bootstrap, topics[1], [event(at=t) for t in spread(30, recent)] + [b"junk"])
    result = CliRunner().invoke(
        app,
        [
            "history",
            "load",
            "--dsn",
            dsn,
            "--kafka",
            f"kafka://{kafka_bootstrap}",
            "--decisions-topic",
            topics[0],
            "--events-topic",
            topics[1],
            "--group",
            f"test-history-cli-{uuid.uuid4().hex[:8]}",
            "--migrate",
            "--until-caught-up",
            "--batch-ms",
            "300",
        ],
        env={"SVC_ANALYTICS_RETENTION_DAYS": "30"},
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output.strip().splitlines()[-1])
    assert (stats["records"], stats["rejected"], stats["retention_runs"]) == (151, 1, 1)
    client = history.connect(dsn)
    assert counts(client) == expected(120, 30, 1)


# -- the history never stalls silently (issue: hardening, item 4)


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 120) -> Any:
    """Polls `fn` until it returns something truthy (returned); fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout} s (last: {got!r})")
        time.sleep(0.2)


def running_loader(loader: history.Loader) -> threading.Thread:
    thread = threading.Thread(target=loader.run, name="test-history-loader", daemon=True)
    thread.start()
    return thread


def test_intake_backfill_over_1000_days_then_a_later_event_are_found(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    """A valid intake batch over 1,000 days (ClickHouse refuses one INSERT into more than 100
    partitions) is stored, and so is an event sent after it: nothing is stuck behind it."""
    from test_intake import running_intake

    now = datetime.now(UTC).replace(microsecond=0)
    people = [{"type": "Human", "id": f"user{i}"} for i in range(5)]
    backfill = [
        {
            "at": rfc3339(now - timedelta(days=1000 - i, hours=1)),
            "system": "drive",
            "principal": people[i % len(people)],
            "action": "download",
            "resource": {"type": "File", "id": f"old-{i}"},
        }
        for i in range(1000)
    ]
    later = {**backfill[0], "at": rfc3339(now), "resource": {"type": "File", "id": "later"}}
    with running_intake(kafka_bootstrap, topics[1]) as intake:
        r = intake.ship("/v1/events", {"events": backfill})
        assert (r.status_code, r.json()) == (202, {"accepted": 1000}), r.text
        r = intake.ship("/v1/events", {"events": [later]})
        assert (r.status_code, r.json()) == (202, {"accepted": 1}), r.text

    loader = loader_for(db, kafka_bootstrap, topics, batch_records=5000, batch_ms=1000)
    thread = running_loader(loader)
    try:
        found = wait_for(
            f"the later event in history (loader: {loader.stats})",
            lambda: history.events_of_resource(
                db, ("File", "later"), now - timedelta(hours=1), now + timedelta(hours=1)
            ),
        )
        wait_for(
            "every backfilled event in history",
            lambda: count(db, "SELECT count() FROM events FINAL") == 1001,
        )
    finally:
        loader.stop()
        thread.join(60)
    assert [e["at"] for e in found] == [now]
    assert count(db, "SELECT uniqExact(toDate(at)) FROM events FINAL") == 1001
    assert count(db, "SELECT count() FROM events_by_resource FINAL") == 1001
    oldest = history.events_of_resource(
        db, ("File", "old-0"), now - timedelta(days=1001), now - timedelta(days=999)
    )
    assert [e["at"] for e in oldest] == [now - timedelta(days=1000, hours=1)]
    assert count(db, "SELECT count() FROM rejected FINAL") == 0
    # Split by day partition, not retried as a failure and nothing refused.
    assert loader.stats.split_inserts >= 1
    assert (loader.stats.store_failures, loader.stats.refused) == (0, 0)


def test_a_record_the_store_refuses_goes_to_rejected_and_later_records_load(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
) -> None:
    """The engine refuses one record for good (here a CHECK constraint on ``events``, as an
    operator may add; the schema's own views route what they cannot read to ``rejected``
    themselves): it lands in ``rejected`` with the engine's reason, the rest of its batch is
    stored, and later records load."""
    db.command(
        "ALTER TABLE events ADD CONSTRAINT no_quarantined CHECK resource_id != 'quarantined'"
    )
    before = [event(at=t, resource=("File", f"before-{i}")) for i, t in enumerate(spread(60))]
    poison = event(resource=("File", "quarantined"))
    after = [event(at=t, resource=("File", f"after-{i}")) for i, t in enumerate(spread(60))]
    produce(kafka_bootstrap, topics[1], [*before, poison, *after, *JUNK_EVENTS])
    group = f"test-history-poison-{uuid.uuid4().hex[:8]}"
    stats = run_until_caught_up(loader_for(db, kafka_bootstrap, topics, group=group), 120)

    assert count(db, "SELECT count() FROM events FINAL") == 120
    assert count(db, "SELECT count() FROM events_by_resource FINAL") == 120
    assert (
        history.events_of_resource(
            db, ("File", "quarantined"), NOW - timedelta(days=1), NOW + timedelta(days=1)
        )
        == []
    )
    rows = db.query(
        "SELECT value, reason FROM rejected FINAL WHERE topic = {t:String} "
        "AND reason LIKE 'refused%'",
        parameters={"t": topics[1]},
    ).result_rows
    assert len(rows) == 1
    value, reason = rows[0]
    assert json.loads(value)["ingest_id"] == poison["ingest_id"]
    assert reason.startswith("refused by the history store: ")
    assert "VIOLATED_CONSTRAINT" in reason or "no_quarantined" in reason, reason
    assert history.rejected_count(db, topics[1]) == 1 + len(JUNK_EVENTS)
    assert stats.refused == 1
    assert stats.rejected == 1 + len(JUNK_EVENTS)
    assert stats.store_failures == 0  # refused for good: never retried as a failure

    # Later records load, and the refused one is not read again (its offset is committed).
    more = [event(at=t, resource=("File", f"more-{i}")) for i, t in enumerate(spread(30))]
    produce(kafka_bootstrap, topics[1], more)
    again = run_until_caught_up(loader_for(db, kafka_bootstrap, topics, group=group), 120)
    assert (again.records, again.refused) == (30, 0)
    assert count(db, "SELECT count() FROM events FINAL") == 150


def test_readyz_reports_a_failing_and_behind_loader_and_ready_again_after(
    db: Client,
    kafka_bootstrap: str,  # noqa: F811
    topics: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the store refuses every INSERT for a reason that is not the records' (a table is
    detached), /readyz is 503 with the reasons and /metrics says so; nothing is lost or moved
    to ``rejected``, and once the table is back every record loads and /readyz is 200."""
    from fastapi.testclient import TestClient

    from svc.history.service import create_app

    monkeypatch.setenv("SVC_HISTORY_FAILING_AFTER", "2")
    monkeypatch.setenv("SVC_HISTORY_BEHIND_AFTER_SECS", "1")
    monkeypatch.setenv("SVC_HISTORY_MAX_LAG_RECORDS", "10")
    loader = loader_for(db, kafka_bootstrap, topics)
    thread = running_loader(loader)

    def metric(text: str, name: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith(f"svc_history_loader_{name} "))
        return float(line.split()[1])

    try:
        with TestClient(create_app(db, loader, auth=OPEN, ready=thread.is_alive)) as http:
            first = [event(at=t, resource=("File", f"first-{i}")) for i, t in enumerate(spread(20))]
            produce(kafka_bootstrap, topics[1], first)
            wait_for(
                "the first events stored and /readyz 200",
                lambda: (
                    count(db, "SELECT count() FROM events FINAL") == 20
                    and http.get("/readyz").status_code == 200
                ),
            )
            ok = http.get("/readyz").json()
            assert ok["ready"] is True and ok["events"] == 20

            db.command("DETACH TABLE events_intake")
            try:
                second = [
                    event(at=t, resource=("File", f"second-{i}")) for i, t in enumerate(spread(50))
                ]
                produce(kafka_bootstrap, topics[1], second)

                def not_ready() -> Any:
                    r = http.get("/readyz")
                    detail = r.json().get("detail", "") if r.status_code == 503 else ""
                    wanted = (
                        "SVC_HISTORY_FAILING_AFTER = 2",
                        "SVC_HISTORY_BEHIND_AFTER_SECS = 1",
                        "SVC_HISTORY_MAX_LAG_RECORDS = 10",
                    )
                    return r if all(w in detail for w in wanted) else None

                r = wait_for("/readyz 503 naming every reason", not_ready, timeout=90)
                assert r.headers["content-type"] == "application/problem+json"
                body = r.json()
                assert (body["type"], body["title"], body["status"]) == (
                    "urn:svc:problem:not-ready",
                    "Not ready",
                    503,
                )
                assert "UNKNOWN_TABLE" in body["detail"]  # the last error, named
                assert body["loader"]["ready"] is False
                assert body["loader"]["consecutive_failures"] >= 2
                assert body["loader"]["lag_records"] >= 50
                assert body["loader"]["oldest_unstored_age_secs"] > 1
                m = http.get("/metrics").text
                assert metric(m, "ready") == 0
                assert metric(m, "consecutive_failures") >= 2
                assert metric(m, "lag_records") >= 50
                assert metric(m, "oldest_unstored_age_seconds") > 1
                # Not the records' fault: none moved to rejected, none refused.
                assert count(db, "SELECT count() FROM rejected FINAL") == 0
                assert loader.stats.refused == 0
            finally:
                db.command("ATTACH TABLE events_intake")

            wait_for(
                "every event stored and /readyz 200 again",
                lambda: (
                    count(db, "SELECT count() FROM events FINAL") == 70
                    and http.get("/readyz").status_code == 200
                ),
            )
            ok = http.get("/readyz").json()
            assert ok["loader"]["ready"] is True and ok["loader"]["reasons"] == []
            assert ok["loader"]["consecutive_failures"] == 0 and ok["loader"]["last_success"]
            m = http.get("/metrics").text
            assert metric(m, "ready") == 1
            assert metric(m, "consecutive_failures") == 0
            assert metric(m, "lag_records") == 0
            assert metric(m, "last_success_timestamp_seconds") > time.time() - 3600
            assert metric(m, "store_failures") >= 2
    finally:
        loader.stop()
        thread.join(60)
    assert count(db, "SELECT count() FROM events_by_resource FINAL") == 70
    assert count(db, "SELECT count() FROM rejected FINAL") == 0


def test_failed_inserts_are_told_apart_by_the_engine_error(db: Client) -> None:
    """The engine's own errors, classified: too many partitions (split), a refused record
    (bisect), anything else (retry); and the split by day keeps under the engine's limit."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from svc.history.store import partition_day, partition_limit, refusal, split_by_partition

    days = as_records("e", [event(at=NOW - timedelta(days=i)) for i in range(150)])
    with pytest.raises(ClickHouseError) as too_many:
        history.store(db, "events", days)
    assert refusal(too_many.value) == "partitions"
    assert partition_limit(db) == 100
    groups = split_by_partition(days, 100)
    assert [len(g) for g in groups] == [100, 50]
    assert sorted(r for g in groups for r in g) == sorted(days)
    for g in groups:
        history.store(db, "events", g)
    assert count(db, "SELECT uniqExact(toDate(at)) FROM events FINAL") == 150

    db.command("ALTER TABLE decisions ADD CONSTRAINT no_x CHECK action != 'x'")
    with pytest.raises(ClickHouseError) as refused:
        history.store(db, "decisions", as_records("d", [decision(action="x")]))
    assert refusal(refused.value) == "record"

    db.command("DETACH TABLE decisions_intake")
    try:
        with pytest.raises(ClickHouseError) as missing:
            history.store(db, "decisions", as_records("d", [decision()]))
        assert refusal(missing.value) == "transient"
    finally:
        db.command("ATTACH TABLE decisions_intake")

    # The day of a record, as the schema partitions it (UTC).
    def day_of(at: Any) -> date | None:
        return partition_day(json.dumps({**event(), "at": at}).encode())

    assert day_of("2026-11-22T00:30:00+01:00") == date(2026, 11, 21)
    assert day_of("2026-11-22T23:30:00-01:00") == date(2026, 11, 23)
    assert day_of("2026-11-22T10:00:00") == date(2026, 11, 22)
    assert day_of("2026-11-22T10:00:00.123456789Z") == date(2026, 11, 22)
    assert day_of("yesterday") is None and day_of(12) is None
    assert partition_day(b"not json") is None and partition_day(b"[1]") is None
    # Unknown days count one each, so no group passes the limit.
    mixed = as_records(
        "e", [b"junk", b"{}", *(event(at=NOW - timedelta(days=i)) for i in range(3)), b"x"]
    )
    for g in split_by_partition(mixed, 2):
        assert 1 <= len({partition_day(r[4]) or i for i, r in enumerate(g)}) <= 2
    assert sum(len(g) for g in split_by_partition(mixed, 2)) == len(mixed)


# -- the HTTP routes: bad input is a 400 naming the parameter, never a 503 or a driver's text

PARAM_ROUTES = ["/v1/history/decisions", "/v1/history/events", "/v1/history/counts"]


@pytest.fixture
def routes(db: Client) -> Iterator[TestClient]:
    """The history routes over a store holding a few rows (one with a non-ASCII id)."""
    history.store(
        db,
        "decisions",
        as_records("d", [decision(), decision(principal=("Human", "zoë 日本"), qid="q-1")]),
    )
    history.store(db, "events", as_records("e", [event(), event(principal=("Human", "zoë 日本"))]))
    with TestClient(create_history_app(db, auth=OPEN, now=lambda: NOW)) as client:
        yield client


def assert_names(r: Any, param: str) -> None:
    """A 400 problem naming `param`, with nothing of the store's driver in it."""
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["type"] == "urn:svc:problem:invalid-parameter"
    assert p["title"] == f"Invalid parameter `{param}`"
    assert p["errors"][0]["field"] == param, p
    for leak in ("pybind11", "C++", "DB::Exception", "Unable to cast"):
        assert leak not in r.text


@pytest.mark.parametrize("route", PARAM_ROUTES)
@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("principal=Human::%ED%A0%80", "principal"),  # a UTF-8-encoded surrogate
        ("principal=%ED%A0%80::alice", "principal"),
        ("principal=Human::%FF", "principal"),
        ("principal=Human::%C3", "principal"),  # cut short
        ('principal=Human::"%5Cud800"', "principal"),  # a JSON-quoted id with a lone surrogate
        ('principal=Human::"%5CudC00x"', "principal"),
        ("principal=Human::alice&since=%ED%A0%80", "since"),
        ("principal=Human::alice&until=%80", "until"),
    ],
)
def test_undecodable_query_text_is_a_400_naming_the_parameter(
    routes: TestClient, route: str, query: str, param: str
) -> None:
    assert_names(routes.get(f"{route}?{query}"), param)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("resource=Document::%ED%A0%80", "resource"),
        ('resource=Document::"%5Cud800"', "resource"),
        ("qid=%ED%A0%80", "qid"),
        ("principal=Human::alice&limit=%FF", "limit"),
        ("principal=Human::alice&monitor_only=%ED%A0%80", "monitor_only"),
    ],
)
def test_undecodable_decision_query_is_a_400(routes: TestClient, query: str, param: str) -> None:
    assert_names(routes.get(f"/v1/history/decisions?{query}"), param)


@pytest.mark.parametrize("route", PARAM_ROUTES)
@pytest.mark.parametrize("char", ["%00", "%01", "%1F", "%7F", "%C2%80", "%C2%85", "%C2%9F"])
@pytest.mark.parametrize("where", ["type", "id", "quoted id"])
def test_control_characters_in_references_are_refused(
    routes: TestClient, route: str, char: str, where: str
) -> None:
    ref = {
        "type": f"Hu{char}man::alice",
        "id": f"Human::al{char}ice",
        "quoted id": 'Human::"al' + char + 'ice"',
    }[where]
    r = routes.get(f"{route}?principal={ref}")
    assert_names(r, "principal")
    assert "control character" in r.json()["detail"]


@pytest.mark.parametrize("escaped", ["%5Cu0000", "%5Cu001b", "%5Cu007f", "%5Cu0085"])
def test_json_escaped_control_characters_are_refused(routes: TestClient, escaped: str) -> None:
    r = routes.get(f'/v1/history/events?resource=File::"a{escaped}b"')
    assert_names(r, "resource")
    assert "control character" in r.json()["detail"]


def test_control_characters_in_a_qid_are_refused(routes: TestClient) -> None:
    for char in ("%00", "%0A", "%7F", "%C2%9B"):
        assert_names(routes.get(f"/v1/history/decisions?qid=q{char}1"), "qid")


def test_bad_parameters_are_named(routes: TestClient) -> None:
    assert_names(routes.get("/v1/history/events?principal=Human::alice&limit=x"), "limit")
    assert_names(routes.get("/v1/history/events?principal=Human::alice&limit=0"), "limit")
    assert_names(routes.get("/v1/history/events?principal=Human::alice&limit=10001"), "limit")
    assert_names(
        routes.get("/v1/history/decisions?principal=Human::alice&monitor_only=maybe"),
        "monitor_only",
    )
    assert_names(routes.get("/v1/history/counts?principal=alice"), "principal")
    assert_names(routes.get("/v1/history/counts?principal=Human::a&since=yesterday"), "since")
    # Times are pydantic's AwareDatetime: an offset is required, and a bare number (which
    # pydantic would read as a Unix time) is not RFC 3339.
    no_offset = routes.get("/v1/history/counts?principal=Human::a&since=2026-11-21T00:00:00")
    assert_names(no_offset, "since")
    assert "timezone" in no_offset.json()["detail"]
    number = routes.get("/v1/history/events?principal=Human::a&until=1700000000")
    assert_names(number, "until")
    assert "not an RFC 3339 time" in number.json()["detail"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("until=0001-01-01T00:01:00Z", "until"),  # its default `since` would be before year 1
        ("until=0001-01-01T00:30:00%2B01:00", "until"),  # before year 1 in UTC
        ("since=9999-12-31T23:00:00-14:00", "since"),  # after year 9999 in UTC
        ("since=1899-12-31T23:59:59Z", "since"),
        ("until=2300-01-01T00:00:00Z", "until"),
    ],
)
def test_times_outside_the_store_are_named(routes: TestClient, query: str, param: str) -> None:
    for route in PARAM_ROUTES:
        r = routes.get(f"{route}?principal=Human::alice&{query}")
        assert_names(r, param)
        assert "1900 to 2299" in r.json()["detail"]


def test_printable_unicode_is_searched_as_sent(routes: TestClient) -> None:
    # Letters of any script and spaces are identifiers like any other.
    for route in ("decisions", "events"):
        r = routes.get(
            f"/v1/history/{route}",
            params={"principal": "Human::zoë 日本", "since": "2026-11-21T00:00:00Z"},
        )
        assert r.status_code == 200, r.text
        assert [row["principal"]["id"] for row in r.json()] == ["zoë 日本"]
    assert routes.get("/v1/history/decisions", params={"qid": "q-1"}).json()["qid"] == "q-1"


def test_a_store_error_is_a_503_without_the_drivers_text(db: Client) -> None:
    db.command("DROP TABLE events")  # the store cannot answer this query
    with TestClient(create_history_app(db, auth=OPEN, now=lambda: NOW)) as client:
        r = client.get("/v1/history/events?principal=Human::alice", headers={"X-Request-ID": "r-7"})
    assert r.status_code == 503, r.text
    p = r.json()
    assert p["type"] == "urn:svc:problem:history-unavailable"
    assert "request r-7" in p["detail"]
    for leak in ("DB::Exception", "UNKNOWN_TABLE", "events", "Code:"):
        assert leak not in p["detail"], p


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("req-1", True),
        ("a.b_c:d-E9", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("has space", False),
        ("semi;colon", False),
        ("slash/", False),
        ("quote'", False),
        ("", False),
    ],
)
def test_request_id_is_bounded_and_echoed(routes: TestClient, sent: str, kept: bool) -> None:
    for path in ("/healthz", "/v1/history/events?principal=alice", "/nope"):
        r = routes.get(path, headers={"X-Request-ID": sent})
        got = r.headers["x-request-id"]
        if kept:
            assert got == sent
        else:
            assert got != sent
            assert re.fullmatch(
                r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", got
            )
    assert routes.get("/healthz").headers["x-request-id"]


def test_head_works_where_get_does(routes: TestClient) -> None:
    for path in (
        "/healthz",
        "/readyz",
        "/version",
        "/metrics",
        "/openapi.json",
        "/v1/history/totals",
        "/v1/history/events?principal=Human::alice&since=2026-11-21T00:00:00Z",
        "/v1/history/decisions?qid=q-1",
        "/v1/history/counts?principal=Human::alice",
        "/v1/history/counts?principal=alice",
        "/nope",
    ):
        get, head = routes.get(path), routes.head(path)
        assert head.status_code == get.status_code, (path, head.status_code, get.status_code)
        assert head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
        assert head.headers["content-length"] == str(len(get.content)), path


# -- schemathesis over the history routes' OpenAPI document, served by uvicorn


@pytest.fixture(scope="module")
def history_url(chdb_dir: Path) -> Iterator[str]:
    """The history routes served by uvicorn over a store with a few rows; the base URL."""
    client = history.connect(
        f"chdb://{chdb_dir}?database=t_http_{uuid.uuid4().hex[:8]}", create_database=True
    )
    history.migrate(client)
    history.store(client, "decisions", as_records("d", [decision(), decision(qid="q-1")]))
    history.store(client, "events", as_records("e", [event()]))
    with apifuzz.serve(create_history_app(client, auth=OPEN, now=lambda: NOW)) as base:
        yield base


# The document does not depend on the store; the served app's is compared with it below.
HISTORY_OPENAPI = create_history_app(None, auth=OPEN).openapi()  # type: ignore[arg-type]
history_schema = apifuzz.load(HISTORY_OPENAPI)


def test_history_serves_its_openapi(history_url: str) -> None:
    assert httpx.get(f"{history_url}/openapi.json").json() == HISTORY_OPENAPI


@history_schema.parametrize()
@apifuzz.FUZZ_SETTINGS
def test_history_api_fuzz(case: Any, history_url: str) -> None:
    case.call_and_validate(base_url=history_url)


# -- decision searches (queries.search_decisions, schema version 5)


def _search_all(db: Client, start: datetime, end: datetime, **kw: Any) -> tuple[list[str], int]:
    """Every page of a search, following ``end``: the qids in order and the pages read."""
    seen: list[str] = []
    after = None
    for pages in range(1, 200):
        page = queries.search_decisions(db, start, end, after=after, **kw)
        seen += [d["qid"] for d in page.decisions]
        assert len(page.decisions) <= kw.get("limit", 50)
        if not page.more:
            return seen, pages
        assert page.end is not None and (after is None or page.end > after)
        after = page.end
    raise AssertionError("the search did not end")


def test_search_filters_pushed_into_the_query_and_copies_dropped(db: Client) -> None:
    """Every filter, alone and together, with and without a subject; a record stored twice
    (at least once delivery, in two parts) is found once, and a plan is never a resource's."""
    t0 = NOW - timedelta(days=2)
    recs = [
        decision(qid=f"s-{i:02d}", at=t0 + timedelta(minutes=7 * i), **kw)
        for i, kw in enumerate(
            [
                {},
                {"verdict": "deny"},
                {"verdict": "deny", "mode": "monitor"},
                {"principal": ("Human", "bob"), "verdict": "challenge", "action": "edit"},
                {"resource": ("Document", "other"), "verdict": "deny"},
                {"call": "plan", "verdict": None, "outcome": "always_denied",
                 "resource": ("Document", None)},
            ]
        )
    ]  # fmt: skip
    recs[3]["policies"] = ["needs-approval", "policy0"]
    history.store(db, "decisions", as_records("d", recs))
    history.store(db, "decisions", as_records("d", recs[:3]))  # redelivered
    start, end = t0, t0 + timedelta(hours=1)  # one window, with or without a subject

    def qids(**kw: Any) -> list[str]:
        page = queries.search_decisions(db, start, end, **kw)
        assert not page.more
        return [d["qid"] for d in page.decisions]

    alice = ("Human", "alice")
    assert qids(principal=alice) == ["s-00", "s-01", "s-02", "s-04", "s-05"]
    assert qids(principal=alice, verdict="deny") == ["s-01", "s-02", "s-04"]
    assert qids(principal=alice, verdict="always_denied") == ["s-05"]  # a plan's outcome
    assert qids(principal=alice, verdict="deny", mode="monitor") == ["s-02"]
    assert qids(resource="Document::design") == ["s-00", "s-01", "s-02", "s-03"]
    assert qids(resource="Document::design", verdict="deny") == ["s-01", "s-02"]
    assert qids(verdict="deny") == ["s-01", "s-02", "s-04"]
    assert qids(policy="needs-approval") == ["s-03"]
    assert qids(action="edit", verdict="challenge") == ["s-03"]
    assert qids(mode="monitor") == ["s-02"]
    assert qids(policy="policy0", principal=("Human", "bob")) == ["s-03"]
    assert qids(verdict="allow", action="edit") == []
    (row,) = queries.search_decisions(db, start, end, verdict="challenge").decisions
    assert row == queries.decision_by_qid(db, "s-03")
    with pytest.raises(ValueError, match="not both"):
        queries.search_decisions(db, start, end, principal=alice, resource="Document::design")
    with pytest.raises(ValueError, match="limit"):
        queries.search_decisions(db, start, end, limit=0)


def test_search_pages_neither_repeat_nor_skip_across_windows(db: Client) -> None:
    """Keyset paging over records spread across days and sharing milliseconds: every page
    follows the last, whatever the page size, and a search with no subject whose windows end
    before the range does stops early with a cursor where they ended."""
    base = NOW - timedelta(days=5)
    recs = []
    for i in range(60):
        # Three records per instant, instants 97 minutes apart (five days), some redelivered.
        at = base + timedelta(minutes=97 * (i // 3))
        recs.append(decision(qid=f"p-{i:03d}", at=at, verdict="deny" if i % 4 else "allow"))
    history.store(db, "decisions", as_records("d", recs))
    history.store(db, "decisions", as_records("d", recs[10:40:3]))
    start, end = base - timedelta(hours=1), NOW
    want = [r["qid"] for r in recs]
    denied = [r["qid"] for r in recs if r["verdict"] == "deny"]
    for limit in (1, 4, 7, 50):
        assert _search_all(db, start, end, principal="Human::alice", limit=limit)[0] == want
        assert _search_all(db, start, end, resource="Document::design", limit=limit)[0] == want
        assert _search_all(db, start, end, verdict="deny", limit=limit)[0] == denied
    # One page with no subject reads 31 hours at most: over five days, pages end early.
    first = queries.search_decisions(db, start, end, verdict="deny", limit=50)
    assert first.more and first.reads == len(queries.SEARCH_WINDOWS["any"])
    assert 0 < len(first.decisions) < len(denied) and first.end is not None
    assert first.end[1] == "\uffff"
    assert _search_all(db, start, end, verdict="deny", limit=50)[1] >= 4
    # A principal's search reads the days its daily rollup says hold a page (the rollup counts
    # the redelivered copies too, so the first window may fall short), then the rest.
    one = queries.search_decisions(db, start, end, principal="Human::alice", limit=60)
    assert [d["qid"] for d in one.decisions] == want and not one.more and one.reads <= 2
    page = queries.search_decisions(db, start, end, principal="Human::alice", limit=3)
    assert [d["qid"] for d in page.decisions] == want[:3] and page.more and page.reads == 1
    # A principal the rollup does not know (no rows): the whole range in one read.
    none = queries.search_decisions(db, start, end, principal="Human::nobody")
    assert none.decisions == [] and not none.more and none.reads == 1
    # A resource's reads the whole range at once.
    one = queries.search_decisions(db, start, end, resource="Document::design", limit=60)
    assert [d["qid"] for d in one.decisions] == want and not one.more and one.reads == 1


def test_migrate_builds_the_search_projection_for_rows_already_stored(dsn: str) -> None:
    """A history made by version 4 with rows in it: version 5 builds the ``by_time``
    projection of the parts already stored, and a search with no subject reads it."""
    client = history.connect(dsn, create_database=True)
    assert history.migrate(client, history.MIGRATIONS[:4]) == [1, 2, 3, 4]
    recs = [decision(at=NOW - timedelta(minutes=i), verdict="deny") for i in range(20)]
    history.store(client, "decisions", as_records("d", recs))
    assert history.migrate(client) == ALL_VERSIONS[4:]
    rows = client.query(
        "SELECT sum(rows) FROM system.projection_parts WHERE database = currentDatabase() "
        "AND table = 'decisions' AND name = 'by_time' AND active"
    ).result_rows
    assert rows == [(20,)]
    plan = "\n".join(
        r[0]
        for r in client.query(
            "EXPLAIN SELECT qid FROM decisions WHERE verdict = 'deny' "
            "AND at >= fromUnixTimestamp64Milli({t:Int64}, 'UTC') "
            "ORDER BY at, qid LIMIT 1 BY qid LIMIT 10",
            parameters={"t": queries._ms(NOW - timedelta(hours=1))},
        ).result_rows
    )
    assert "ReadFromMergeTree (by_time)" in plan, plan
    page = queries.search_decisions(
        client, NOW - timedelta(hours=1), NOW + timedelta(seconds=1), verdict="deny"
    )
    assert sorted(d["qid"] for d in page.decisions) == sorted(r["qid"] for r in recs)


def test_search_route_pages_and_refuses_bad_parameters(db: Client) -> None:
    t0 = NOW - timedelta(hours=3)
    recs = [decision(qid=f"r-{i}", at=t0 + timedelta(minutes=i)) for i in range(5)]
    history.store(db, "decisions", as_records("d", recs))
    http = TestClient(create_history_app(db, auth=OPEN, now=lambda: NOW))
    q = {"principal": "Human::alice", "since": rfc3339(t0), "limit": 3}
    first = http.get("/v1/history/decisions/search", params=q)
    assert first.status_code == 200, first.text
    body = first.json()
    assert [d["qid"] for d in body["decisions"]] == ["r-0", "r-1", "r-2"] and body["more"]
    assert body["end"] == {"at": queries._ms(t0 + timedelta(minutes=2)), "qid": "r-2"}
    after = {"after_at": body["end"]["at"], "after_qid": body["end"]["qid"]}
    rest = http.get("/v1/history/decisions/search", params={**q, **after}).json()
    assert [d["qid"] for d in rest["decisions"]] == ["r-3", "r-4"] and not rest["more"]
    for bad, param in (
        ({**q, "resource": "Document::design"}, "resource"),
        ({**q, "after_at": 5}, "after_at"),
        ({**q, "verdict": "de\x00ny"}, "verdict"),
        ({**q, "limit": 0}, "limit"),
    ):
        r = http.get("/v1/history/decisions/search", params=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["errors"][0]["field"] == param, r.text
