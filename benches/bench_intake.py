"""Audit intake throughput: 1,000-event batches over HTTP into Kafka transactions.

Runs `svc intake` under uvicorn in a subprocess against the local broker of
scripts/dev-kafka.sh (or `--kafka`), on a topic of its own (3 partitions, deleted afterwards).
Concurrent clients (one thread and one keep-alive httpx connection each) post pre-built
`POST /v1/events` bodies of 1,000 events for a fixed time; the intake validates each batch,
normalizes it, and answers 202 only after the broker committed the batch's transaction
(`acks=all`).

Printed per configuration (producers x clients): sustained events/s (events acknowledged with
202 divided by the measured time), requests/s, and request latency percentiles (p50, p90, p99,
max) of a 1,000-event request. `--verify` (default) then counts the committed records on the
topic (`read_committed`) and checks they match the events acknowledged.

    .venv/bin/python benches/bench_intake.py          # producers 1,2,4 x clients 1,4,8: ~6 min
    .venv/bin/python benches/bench_intake.py --quick  # one 8 s run, ~30 s in all
    .venv/bin/python benches/bench_intake.py --producers 1,2,4 --clients 4 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-intake-token-0123456789"
PARTITIONS = 3
BATCH = 1000
ACTIONS = ["view", "download", "edit", "share_external", "list", "export", "search", "comment"]
SYSTEMS = ["drive", "crm", "wiki", "tracker", "mail"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_bootstrap(arg: str | None) -> str:
    if arg:
        return arg
    subprocess.run(
        [str(REPO / "scripts" / "dev-kafka.sh"), "start"], check=True, capture_output=True
    )
    return subprocess.run(
        [str(REPO / "scripts" / "dev-kafka.sh"), "url"], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_bodies(count: int, seed: int = 7) -> list[bytes]:
    """`count` distinct bodies of 1,000 events, with every event field of docs/intake.md in use."""
    rng = random.Random(seed)
    bodies = []
    base = time.time() - 3600
    for b in range(count):
        events = []
        for i in range(BATCH):
            n = b * BATCH + i
            agent = rng.random() < 0.3
            ev: dict[str, Any] = {
                "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + n % 3000))
                + f".{n % 1000:03d}+00:00",
                "system": rng.choice(SYSTEMS),
                "principal": (
                    {"type": "ServiceAccount", "id": f"agent.{rng.randrange(50)}"}
                    if agent
                    else {"type": "Human", "id": f"user{rng.randrange(2000)}"}
                ),
                "action": rng.choice(ACTIONS),
                "resource": {"type": "Document", "id": f"doc-{rng.randrange(100_000)}"},
                "outcome": rng.choice(["success", "success", "success", "failure"]),
                "source_ip": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
                "attributes": {"request_id": uuid.UUID(int=rng.getrandbits(128)).hex, "n": n},
            }
            if agent:
                ev["on_behalf_of"] = {"type": "Human", "id": f"user{rng.randrange(2000)}"}
                ev["tool"] = "search_documents"
                ev["action_class"] = "read"
            if ev["action"] in ("list", "search", "export"):
                ev["access"] = "exported" if ev["action"] == "export" else "listed"
                ev["count"] = rng.randrange(1, 500)
            events.append(ev)
        bodies.append(json.dumps({"events": events}).encode())
    return bodies


class Server:
    """`svc intake` in a subprocess."""

    def __init__(self, bootstrap: str, topic: str, producers: int) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "SVC_KAFKA_URL": bootstrap,
            "SVC_INTAKE_TOPIC": topic,
            "SVC_INTAKE_TOKEN": TOKEN,
            "SVC_INTAKE_PRODUCERS": str(producers),
            "SVC_INTAKE_TRANSACTIONAL_ID": f"bench-intake-{uuid.uuid4().hex[:8]}",
        }
        svc = Path(sys.executable).parent / "svc"
        self.proc = subprocess.Popen(
            [str(svc), "intake", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"svc intake exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("svc intake not ready after 120 s")
            time.sleep(0.2)
        # Every producer initialised (readyz needs one).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = httpx.get(f"{self.url}/metrics", timeout=5).text
            line = next(
                x for x in metrics.splitlines() if x.startswith("svc_intake_producers_ready")
            )
            if float(line.split()[-1]) >= producers:
                break
            time.sleep(0.2)

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    accepted: int = 0
    accepted_all: int = 0  # warm-up included: what the topic must hold
    lock: threading.Lock = field(default_factory=threading.Lock)


def client_loop(
    url: str,
    bodies: list[bytes],
    start: float,
    warm_until: float,
    stop_at: float,
    run: Run,
    seed: int,
) -> None:
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
        while time.monotonic() < start:
            time.sleep(0.001)
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                return
            r = client.post("/v1/events", content=rng.choice(bodies))
            t1 = time.monotonic()
            with run.lock:
                if r.status_code == 202:
                    run.accepted_all += BATCH
                if t0 < warm_until:
                    continue
                run.statuses[r.status_code] = run.statuses.get(r.status_code, 0) + 1
                if r.status_code == 202:
                    run.accepted += BATCH
                    run.latencies.append(t1 - t0)
                # Requests that end after stop_at count: the window is [warm_until, last end).


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def count_committed(bootstrap: str, topic: str, timeout: float = 120) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.max.bytes": 50 * 1024 * 1024,
        }
    )
    consumer.assign(
        [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)]
    )
    n = 0
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                err = m.error()
                if err is None:
                    n += 1
                    eof.discard(m.partition() or 0)
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition() or 0)
        return n
    finally:
        consumer.close()


def bench(
    bootstrap: str,
    producers: int,
    clients: int,
    seconds: float,
    warmup: float,
    bodies: list[bytes],
    verify: bool,
) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"bench.events.{uuid.uuid4().hex[:8]}"
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(60)
    server = Server(bootstrap, topic, producers)
    try:
        run = Run()
        start = time.monotonic() + 0.5
        warm_until = start + warmup
        stop_at = warm_until + seconds
        threads = [
            threading.Thread(
                target=client_loop, args=(server.url, bodies, start, warm_until, stop_at, run, i)
            )
            for i in range(clients)
        ]
        for t in threads:
            t.start()
        while time.monotonic() < warm_until:
            time.sleep(0.01)
        cpu0 = server.cpu_seconds()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - warm_until
        cpu = server.cpu_seconds() - cpu0
        out: dict[str, Any] = {
            "producers": producers,
            "clients": clients,
            "seconds": round(elapsed, 2),
            "events_per_s": round(run.accepted / elapsed),
            "requests_per_s": round(len(run.latencies) / elapsed, 1),
            "p50_ms": round(pct(run.latencies, 50) * 1000, 1),
            "p90_ms": round(pct(run.latencies, 90) * 1000, 1),
            "p99_ms": round(pct(run.latencies, 99) * 1000, 1),
            "max_ms": round(max(run.latencies, default=float("nan")) * 1000, 1),
            "statuses": dict(sorted(run.statuses.items())),
            "server_cpu_pct": round(100 * cpu / elapsed),
        }
    finally:
        server.stop()
    if verify:
        total = count_committed(bootstrap, topic)
        out["committed_on_topic"] = total
        out["accepted_all"] = run.accepted_all
    admin.delete_topics([topic])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kafka", help="bootstrap servers (default: scripts/dev-kafka.sh)")
    ap.add_argument("--producers", default="1,2,4", help="comma list of pool sizes")
    ap.add_argument("--clients", default="1,4,8", help="comma list of concurrent clients")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--bodies", type=int, default=8, help="distinct 1,000-event bodies")
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    ap.add_argument(
        "--quick", action="store_true", help="one short run: 2 producers, 4 clients, 8 s"
    )
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    if args.quick:
        args.producers, args.clients, args.seconds, args.warmup = "2", "4", 8.0, 2.0
    bootstrap = kafka_bootstrap(args.kafka)
    bodies = make_bodies(args.bodies)
    size_kib = statistics.mean(map(len, bodies)) / 1024
    print(f"bodies: {len(bodies)} x {BATCH} events, {size_kib:.0f} KiB each")
    load = os.getloadavg()[0]
    print(f"broker {bootstrap}; {os.cpu_count()} CPUs; load average {load:.2f} at start")
    columns = [
        ("producers", "producers", 9),
        ("clients", "clients", 7),
        ("events/s", "events_per_s", 9),
        ("req/s", "requests_per_s", 6),
        ("p50 ms", "p50_ms", 7),
        ("p90 ms", "p90_ms", 7),
        ("p99 ms", "p99_ms", 7),
        ("max ms", "max_ms", 7),
        ("cpu %", "server_cpu_pct", 6),
    ]
    print(" ".join(f"{title:>{w}}" for title, _, w in columns) + "  statuses / on topic")
    results = []
    for producers in [int(x) for x in args.producers.split(",")]:
        for clients in [int(x) for x in args.clients.split(",")]:
            r = bench(bootstrap, producers, clients, args.seconds, args.warmup, bodies, args.verify)
            results.append(r)
            row = " ".join(f"{r[key]:>{w}}" for _, key, w in columns)
            topic = f"{r.get('committed_on_topic', '-')} of {r.get('accepted_all', '-')}"
            print(f"{row}  {r['statuses']} / {topic}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
