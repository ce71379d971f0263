"""History loader benchmark: rows per second loaded into chDB (issue "Decision log and history").

What is measured
----------------
Realistic broker records, generated from a fixed seed: decision-log records as the decision
point writes them (``Decision::to_record`` / ``plan_record``: 5,000 people and 500 service
accounts, a third of service-account checks on behalf of a person, 100,000 resources of 4 types,
about 80% allow / 15% deny / 5% challenge, 20% in monitor mode, 5% plans; about 560 bytes of JSON
each) and intake events (the fields of docs/intake.md plus ``received_at`` / ``ingest_id``, a
quarter with ``access``/``count``, about 420 bytes), times spread over the last 7 days, in time
order.

(a) Insert path alone: ``svc.history.store`` on pre-made (topic, partition, offset, key, value)
    tuples, in batches of ``--batch`` records (the loader's default batch): RowBinary encoding in
    Python, one INSERT into the ``Null`` intake table, the engine's JSON parsing and checks, and
    the writes of both tables (principal-ordered and resource-ordered copies). Decisions and
    events are timed separately, each into a fresh database.
(b) End to end from Kafka: the records are first produced to two fresh topics (3 partitions;
    not timed), then a ``Loader`` with a new consumer group runs until it has stored and
    committed everything (``run(until_caught_up=True)``). Reported: from ``run()`` to caught
    up (includes joining the group), and from the first stored batch to the end (steady rate).

After each run the rows are counted with ``FINAL``: they must equal the records sent.

Target: at least 50,000 rows/s loaded. ``MISS`` is printed under the target; the script exits 0
(benches report, they do not assert).

Run: ``.venv/bin/python benches/bench_history.py`` (300,000 decisions + 100,000 events; about 2
minutes; needs the broker of ``scripts/dev-kafka.sh`` or ``--kafka``; ``--no-kafka`` skips
(b)), or ``--quick`` (60,000 + 20,000).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from svc import history

REPO = Path(__file__).resolve().parent.parent
TARGET = 50_000
NOW = datetime.now(UTC)
ACTIONS = ["view", "edit", "download", "share", "delete", "comment", "list"]
RESOURCE_TYPES = ["Document", "Folder", "Ticket", "Customer"]
POLICIES = [f"policy{i}" for i in range(40)]
SYSTEMS = ["drive", "tracker", "crm", "aws", "mail"]


def uuid7(ms: int, rnd: random.Random) -> str:
    """A UUIDv7 string for epoch milliseconds `ms` (the decision point's qid shape)."""
    value = (ms << 80) | (0x7 << 76) | (rnd.getrandbits(12) << 64) | (0b10 << 62)
    value |= rnd.getrandbits(62)
    return str(uuid.UUID(int=value))


def rfc3339(ms: int) -> str:
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def principal(rnd: random.Random) -> dict[str, str]:
    if rnd.random() < 0.1:
        return {"type": "ServiceAccount", "id": f"agents/bot-{rnd.randrange(500)}"}
    return {"type": "Human", "id": f"user{rnd.randrange(5000)}@example.com"}


def times(n: int, days: int = 7) -> Iterator[int]:
    start = int((NOW - timedelta(days=days)).timestamp() * 1000)
    step = days * 86_400_000 // max(n, 1)
    for i in range(n):
        yield start + i * step


def decisions(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for ms in times(n):
        p = principal(rnd)
        obo = None
        if p["type"] == "ServiceAccount" and rnd.random() < 0.33:
            obo = {"type": "Human", "id": f"user{rnd.randrange(5000)}@example.com"}
        rtype = rnd.choice(RESOURCE_TYPES)
        mode = "monitor" if rnd.random() < 0.2 else "enforce"
        common = {
            "qid": uuid7(ms, rnd),
            "at": rfc3339(ms),
            "transport": rnd.choice(["grpc", "http", "authzen"]),
            "principal": p,
            "on_behalf_of": obo,
            "action": rnd.choice(ACTIONS),
            "policies": rnd.sample(POLICIES, rnd.randint(1, 3)),
            "mode": mode,
            "challenge_qid": None,
            "policy_version": 42,
            "principals_version": 1234,
            "latency_us": rnd.randint(15, 400),
            "pdp": f"svc-pdp-{rnd.randrange(3)}",
        }
        if rnd.random() < 0.05:
            rec = {
                **common,
                "call": "plan",
                "resource": {"type": rtype, "id": None},
                "verdict": None,
                "outcome": rnd.choice(["conditional", "always_allowed", "always_denied"]),
                "challenges": [],
                "pinned": False,
                "needs_row_checks": rnd.random() < 0.1,
                "attributes": ["owner", "dept"],
            }
        else:
            r = rnd.random()
            verdict = "allow" if r < 0.8 else "deny" if r < 0.95 else "challenge"
            rec = {
                **common,
                "call": "check",
                "resource": {"type": rtype, "id": f"{rtype.lower()}-{rnd.randrange(100_000)}"},
                "verdict": verdict,
                "challenges": ["verification"] if verdict == "challenge" else [],
                "on_behalf_of_outcome": None
                if obo is None
                else {"verdict": "allow", "challenges": [], "policies": ["policy1"]},
                "work_item": f"JIRA-{rnd.randrange(9000)}" if rnd.random() < 0.1 else None,
                "assigned": False,
                "risk_score": rnd.randrange(100) if rnd.random() < 0.5 else None,
            }
        out.append(rec)
    return out


def events(n: int, seed: int = 8) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for ms in times(n):
        system = rnd.choice(SYSTEMS)
        rec: dict[str, Any] = {
            "ingest_id": uuid7(ms, rnd),
            "at": rfc3339(ms),
            "received_at": rfc3339(ms + rnd.randrange(2000)),
            "system": system,
            "principal": principal(rnd),
            "on_behalf_of": None,
            "action": rnd.choice(["download", "view", "export", "share_external", "login"]),
            "resource": {"type": "File", "id": f"file-{rnd.randrange(100_000)}"},
            "outcome": "success" if rnd.random() < 0.97 else "failure",
            "source_ip": f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(256)}",
            "attributes": {"client": "web", "session": f"s{rnd.randrange(10**6)}"},
        }
        if rnd.random() < 0.25:
            rec.update(access=rnd.choice(["listed", "read", "exported"]), count=rnd.randrange(500))
        if rnd.random() < 0.1:
            rec.update(tool="search_files", action_class="read")
        if system == "aws":
            rec["role_arn"] = "arn:aws:iam::123456789012:role/analyst"
        out.append(rec)
    return out


def encode(topic: str, recs: list[dict[str, Any]]) -> list[history.Record]:
    out: list[history.Record] = []
    for i, r in enumerate(recs):
        p = r["principal"]
        out.append(
            (topic, i % 3, i // 3, f"{p['type']}::{p['id']}".encode(), json.dumps(r).encode())
        )
    return out


def fmt(rate: float) -> str:
    return f"{rate:,.0f} rows/s" + ("" if rate >= TARGET else f"  MISS (< {TARGET:,})")


def count(client: Any, table: str) -> int:
    return int(client.query(f"SELECT count() FROM {table} FINAL").result_rows[0][0])


class Rate:
    """Rows per wall-clock second, and per CPU second of this process (all its threads, chDB's
    included): the second is what a core of one's own would give, whatever else runs."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def stop(self) -> tuple[float, float]:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        return self.rows / wall, self.rows / cpu


def insert_path(
    root: str, kind: history.Kind, records: list[history.Record], batch: int, rnd: int
) -> tuple[float, float]:
    client = history.connect(f"chdb://{root}?database=bench_{kind}_{rnd}", create_database=True)
    history.migrate(client)
    history.store(client, kind, records[:1000])  # warm-up (not timed)
    client.command(f"TRUNCATE TABLE {kind}")
    client.command(f"TRUNCATE TABLE {kind}_by_resource")
    rate = Rate(len(records))
    for i in range(0, len(records), batch):
        history.store(client, kind, records[i : i + batch])
    got = rate.stop()
    for table in (kind, f"{kind}_by_resource"):
        assert count(client, table) == len(records), table
    assert count(client, "rejected") == 0
    client.command(f"DROP DATABASE bench_{kind}_{rnd}")
    return got


def kafka_bootstrap(arg: str | None) -> str | None:
    if arg:
        return arg
    if os.environ.get("SVC_KAFKA_URL"):
        return os.environ["SVC_KAFKA_URL"].removeprefix("kafka://")
    script = REPO / "scripts" / "dev-kafka.sh"
    try:
        subprocess.run([str(script), "start"], check=True, capture_output=True, timeout=600)
        url = subprocess.run([str(script), "url"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"(b) skipped: no broker ({e})")
        return None
    return url.stdout.strip()


def produce(bootstrap: str, topic: str, records: list[history.Record]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 50,
            "compression.type": "lz4",
            "batch.size": 1_000_000,
        }
    )
    for _, _, _, key, value in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.2)
    assert producer.flush(300) == 0


def end_to_end(
    root: str, bootstrap: str, dec: list[history.Record], ev: list[history.Record], batch: int
) -> tuple[tuple[float, float], float]:
    tag = uuid.uuid4().hex[:8]
    topics = (f"bench.history.decisions.{tag}", f"bench.history.events.{tag}")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
        f.result(60)
    produce(bootstrap, topics[0], dec)
    produce(bootstrap, topics[1], ev)
    client = history.connect(f"chdb://{root}?database=bench_e2e_{tag}", create_database=True)
    history.migrate(client)
    first: list[float] = []
    sizes: list[int] = []

    def mark(b: history.Batch) -> None:
        if not first:
            first.append(time.perf_counter())
        sizes.append(len(b))

    loader = history.Loader(
        client,
        bootstrap,
        decisions_topic=topics[0],
        events_topic=topics[1],
        group_id=f"bench-history-{tag}",
        batch_records=batch,
        after_store=mark,
    )
    n = len(dec) + len(ev)
    rate = Rate(n)
    stats = loader.run(until_caught_up=True)
    t1 = time.perf_counter()
    total = rate.stop()
    assert stats.records == n, stats
    assert count(client, "decisions") == len(dec) and count(client, "events") == len(ev)
    steady = (n - sizes[0]) / (t1 - first[0]) if len(sizes) > 1 else total[0]
    for f in admin.delete_topics(list(topics)).values():
        f.result(60)
    client.command(f"DROP DATABASE bench_e2e_{tag}")
    return total, steady


def summary(label: str, runs: list[tuple[float, float]]) -> None:
    walls = sorted(w for w, _ in runs)
    cpus = sorted(c for _, c in runs)
    each = ", ".join(f"{w:,.0f}" for w, _ in runs)
    print(f"{label}: median {fmt(statistics.median(walls))}")
    cpu = statistics.median(cpus)
    print(f"    runs {each} rows/s; best {walls[-1]:,.0f}; per CPU second {cpu:,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decisions", type=int, default=300_000)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--kafka", help="bootstrap servers (default: scripts/dev-kafka.sh)")
    ap.add_argument("--no-kafka", action="store_true", help="skip the end-to-end run")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each measure")
    ap.add_argument("--quick", action="store_true", help="60,000 + 20,000 records, 1 round")
    args = ap.parse_args()
    if args.quick:
        args.decisions, args.events, args.rounds = 60_000, 20_000, 1
    print(f"generating {args.decisions:,} decisions and {args.events:,} events ...")
    dec = encode("svc.decisions.v1", decisions(args.decisions))
    ev = encode("svc.events.v1", events(args.events))
    avg = sum(len(r[4]) for r in dec) / len(dec), sum(len(r[4]) for r in ev) / len(ev)
    print(f"  mean record: decision {avg[0]:.0f} B, event {avg[1]:.0f} B; batch {args.batch:,}")
    root = tempfile.mkdtemp(prefix="bench-history-")
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    try:
        for kind, recs in (("decisions", dec), ("events", ev)):
            runs = [insert_path(root, kind, recs, args.batch, r) for r in range(args.rounds)]
            summary(f"(a) insert path, {kind}", runs)
        bootstrap = None if args.no_kafka else kafka_bootstrap(args.kafka)
        if bootstrap:
            e2e = [end_to_end(root, bootstrap, dec, ev, args.batch) for _ in range(args.rounds)]
            summary("(b) end to end from Kafka, run() to caught up", [t for t, _ in e2e])
            steady = sorted(st for _, st in e2e)
            print(f"    after the first batch: median {fmt(statistics.median(steady))}")
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
