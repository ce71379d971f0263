"""Policy service benchmark (docs/policy.md, docs/benchmarks.md).

What is measured
----------------
(a) Publish to served: one svc-policy (SQLite in a temporary directory, in this process) and 4
    ``svc pdp --policy URL --public-key FILE`` processes following it (``--workers 1`` each).
    Each round drafts a bundle whose one policy has a new name (``gen-<k>``), then times from
    just before ``Publish`` until each decision point answers a check with that policy: the
    publish (signing and the database), the ``WatchActive`` push, the signature check, the
    swap, and up to one poll interval (``--poll-ms``, 5 ms) of the thread that asks each
    decision point. Reported: p50, p99 and max over rounds x 4 decision points. Target: p99
    under 1 s.
(b) ``CreateDraft`` + ``Publish`` of a 1,000-policy bundle over gRPC (the bundle of (a)'s schema,
    one ``permit`` per user): validation through the decision core, storage, signing.
(c) Dry run over 100,000 recorded decisions: the records (decided by the decision core under
    one bundle, 100 users x 100 documents) are stored in chDB through ``svc.history.store``, then
    ``PolicyService.dry_run`` decides them all again under another bundle. Reported: decisions
    re-decided per second (reading from chDB included).

Run: ``.venv/bin/python benches/bench_policy.py`` (about a minute), or ``--quick``. Needs the
release build of the extension (``make build``). Benches report; they do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import httpx

from svc import history
from svc.policy import signing
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService, bundle_engine
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.v1 import policy_pb2_grpc as pb_grpc

SVC = Path(sys.executable).parent / "svc"
SERVING = re.compile(r"svc-pdp serving .* on http://127\.0\.0\.1:(\d+) ")
SCHEMA = """entity User;
entity Doc = { public: Bool, owner: User };
action view appliesTo { principal: [User], resource: [Doc] };
"""
USERS = 100
DOCS = 100


def entities() -> str:
    """100 users and 100 documents, every other one public, each owned by a user."""
    users = [
        {"uid": {"type": "User", "id": f"u{i}"}, "attrs": {}, "parents": []} for i in range(USERS)
    ]
    docs = [
        {
            "uid": {"type": "Doc", "id": f"d{i}"},
            "attrs": {
                "public": i % 2 == 0,
                "owner": {"__entity": {"type": "User", "id": f"u{i % USERS}"}},
            },
            "parents": [],
        }
        for i in range(DOCS)
    ]
    return json.dumps(users + docs)


def bundle(policies: str) -> dict[str, str]:
    """A bundle of the benchmark's schema and entities with these policies."""
    return {"s.cedarschema": SCHEMA, "entities.json": entities(), "p.cedar": policies}


def generation(k: int) -> dict[str, str]:
    """(a)'s bundle number `k`: one policy named ``gen-<k>`` allowing public documents."""
    return bundle(
        f'@id("gen-{k}")\npermit (principal, action == Action::"view", resource)\n'
        "when { resource.public };\n"
    )


def thousand() -> dict[str, str]:
    """(b)'s bundle: 1,000 policies (10 per user), each naming a user and a condition."""
    out = []
    for i in range(1000):
        out.append(
            f'@id("p{i}")\npermit (principal == User::"u{i % USERS}", action == Action::"view", '
            f"resource) when {{ resource.public || resource.owner == principal }};\n"
        )
    return bundle("".join(out))


class Pdp:
    """One ``svc pdp --policy`` process; ``port`` once it listens."""

    def __init__(self, policy_url: str, key: Path) -> None:
        self.proc = subprocess.Popen(
            [
                str(SVC),
                "pdp",
                "--policy",
                policy_url,
                "--public-key",
                str(key),
                "--port",
                "0",
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            m = SERVING.search(line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise RuntimeError("svc pdp exited before it listened")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()


#: (a)'s check: allowed by every generation (d0 is public), naming the policy that allowed it.
CHECK = {
    "principal": {"type": "User", "id": "u1"},
    "action": "view",
    "resource": {"type": "Doc", "id": "d0"},
}


class Watcher:
    """Asks one decision point every `poll` seconds which generation allows; notes when each
    generation is first seen (``time.perf_counter``)."""

    def __init__(self, port: int, poll: float) -> None:
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        self.poll = poll
        self.first_seen: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopped:
            r = self.client.post("/v1/access/evaluation", json=CHECK)
            t = time.perf_counter()
            policies = r.json().get("policies", []) if r.status_code == 200 else []
            with self.cond:
                for p in policies:
                    self.first_seen.setdefault(p, t)
                self.cond.notify_all()
            time.sleep(self.poll)

    def wait(self, name: str) -> float:
        with self.cond:
            self.cond.wait_for(lambda: name in self.first_seen)
            return self.first_seen[name]


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def publish_to_served(root: Path, rounds: int, poll_ms: float, points: int) -> None:
    settings = PolicySettings(port=0, data_dir=root, database_url=f"sqlite:///{root / 'p.db'}")
    server = PolicyServer(settings).start()
    service = server.service
    key = root / "policy.pub"
    key.write_text(signing.public_key_text(service.public_key))
    service.publish(service.create_draft(generation(0), "bench").version, "bench")
    pdps = [Pdp(server.url, key) for _ in range(points)]
    watchers = [Watcher(p.port, poll_ms / 1000) for p in pdps]
    try:
        for w in watchers:
            w.wait("gen-0")
        latencies: list[float] = []
        for k in range(1, rounds + 1):
            v = service.create_draft(generation(k), "bench").version
            t0 = time.perf_counter()
            service.publish(v, "bench")
            latencies += [w.wait(f"gen-{k}") - t0 for w in watchers]
            time.sleep(0.2)
        ms = [x * 1000 for x in latencies]
        print(
            f"(a) publish to served, {points} decision points x {rounds} publishes: "
            f"p50 {pct(ms, 0.5):.1f} ms, p99 {pct(ms, 0.99):.1f} ms, max {max(ms):.1f} ms "
            f"(poll every {poll_ms:g} ms); target p99 < 1000 ms: "
            f"{'met' if pct(ms, 0.99) < 1000 else 'MISS'}"
        )
    finally:
        for w in watchers:
            w.stopped = True
        for p in pdps:
            p.stop()
        server.stop()
        service.close()


def draft_and_publish(root: Path, rounds: int) -> None:
    settings = PolicySettings(port=0, data_dir=root, database_url=f"sqlite:///{root / 'b.db'}")
    server = PolicyServer(settings).start()
    channel = grpc.insecure_channel(server.target)
    stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
    files = [pb.BundleFile(name=n, content=t) for n, t in thousand().items()]
    size = sum(len(f.content) for f in files)
    drafts, publishes = [], []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            v = stub.CreateDraft(pb.CreateDraftRequest(files=files, author="bench")).bundle
            t1 = time.perf_counter()
            stub.Publish(pb.PublishRequest(version=v.version, author="bench"))
            t2 = time.perf_counter()
            assert len(v.policies) == 1000
            drafts.append((t1 - t0) * 1000)
            publishes.append((t2 - t1) * 1000)
        print(
            f"(b) 1,000-policy bundle ({size / 1024:,.0f} KiB), median of {rounds}: "
            f"CreateDraft {statistics.median(drafts):.0f} ms, Publish "
            f"{statistics.median(publishes):.0f} ms, together "
            f"{statistics.median(d + p for d, p in zip(drafts, publishes, strict=True)):.0f} ms"
        )
    finally:
        channel.close()
        server.stop()
        server.service.close()


def dry_run(root: Path, n: int) -> None:
    dsn = f"chdb://{root / 'chdb'}?database=bench_dry"
    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    recorded = bundle(
        '@id("public")\npermit (principal, action == Action::"view", resource)\n'
        "when { resource.public };\n"
    )
    draft = bundle(
        '@id("owner")\npermit (principal, action == Action::"view", resource)\n'
        "when { resource.owner == principal };\n"
    )
    engine = bundle_engine(recorded)
    t0 = time.perf_counter()
    batch: list[history.Record] = []
    for i in range(n):
        rec = engine.decide(
            {
                "principal": {"type": "User", "id": f"u{i % USERS}"},
                "action": "view",
                "resource": {"type": "Doc", "id": f"d{(i // USERS) % DOCS}"},
            }
        )
        batch.append(("d", 0, i, f"User::u{i % USERS}".encode(), json.dumps(rec).encode()))
        if len(batch) == 50_000:
            history.store(client, "decisions", batch)
            batch = []
    if batch:
        history.store(client, "decisions", batch)
    print(f"    {n:,} decisions recorded and stored in {time.perf_counter() - t0:.1f} s")
    settings = PolicySettings(
        port=0, data_dir=root, database_url=f"sqlite:///{root / 'd.db'}", history_dsn=dsn
    )
    service = PolicyService(settings)
    try:
        v = service.create_draft(draft, "bench").version
        since = datetime.now(UTC) - timedelta(hours=1)
        t0 = time.perf_counter()
        r = service.dry_run(v, since, limit=n)
        secs = time.perf_counter() - t0
        print(
            f"(c) dry run over {r.decisions:,} recorded decisions: {secs:.2f} s, "
            f"{r.decisions / secs:,.0f} decisions re-decided per second ({r.allow_to_deny:,} "
            f"allow->deny, {r.deny_to_allow:,} deny->allow, {r.unchanged:,} unchanged, "
            f"{r.errors} errors{', range cut' if r.truncated else ''})"
        )
    finally:
        service.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--publishes", type=int, default=50, help="(a): publishes timed")
    ap.add_argument("--points", type=int, default=4, help="(a): decision points")
    ap.add_argument("--poll-ms", type=float, default=5.0, help="(a): each watcher's interval")
    ap.add_argument("--rounds", type=int, default=5, help="(b): draft + publish rounds")
    ap.add_argument("--decisions", type=int, default=100_000, help="(c): recorded decisions")
    ap.add_argument("--quick", action="store_true", help="10 publishes, 2 rounds, 10,000")
    args = ap.parse_args()
    if args.quick:
        args.publishes, args.rounds, args.decisions = 10, 2, 10_000
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp:
        root = Path(tmp)
        for sub in ("a", "b", "c"):
            (root / sub).mkdir()
        publish_to_served(root / "a", args.publishes, args.poll_ms, args.points)
        draft_and_publish(root / "b", args.rounds)
        dry_run(root / "c", args.decisions)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
