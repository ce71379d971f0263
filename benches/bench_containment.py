"""Containment to denied across 4 decision points (docs/challenges.md, docs/benchmarks.md).

The challenge service runs as a ``svc challenge serve`` process of its own, as in production, on
PostgreSQL (``SVC_TEST_POSTGRES_URL``, else ``scripts/dev-postgres.sh start``, as
tests/conftest.py does) in a schema of its own dropped at the end. Four decision points run in
this process, each a real ``Engine`` behind a real ``Server`` (1 worker thread) following the
service with ``svc.pdp.containment_follower.follow_containments``, as ``svc pdp --challenge URL``
does.

What is measured
----------------
``--rounds`` rounds (default 200), each: ``Contain`` one of ``--people`` people through the
service's gRPC API, then ``Lift`` it. For each call, every decision point is asked over HTTP
(``POST /v1/access/evaluation``, every ``--poll-ms``, one client thread per decision point)
until its answer changes: denied ``svc:contained`` after ``Contain``, allowed after ``Lift``.
Reported per direction: p50, p99 and max over every (round, decision point) pair of the time
from the moment the call is sent until that decision point's answer changed, and the call's
own latency. Target: p99 under 1 s.

Run: ``.venv/bin/python benches/bench_containment.py`` (about half a minute), ``--rounds 20``
for a smoke run. Needs the release build of the extension (``make build``). Benches report;
they do not assert, but for the sanity checks they make on their own setup.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx

from _support import Schema, ServiceProcess, free_port, pct, postgres_url
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from svc.pdp import Engine, Server
from svc.pdp.containment_follower import ContainmentFollower, follow_containments

SCHEMA = """
entity Human;
entity Document;
action read appliesTo { principal: [Human], resource: [Document] };
"""
POLICIES = '@id("people-read") permit (principal is Human, action == Action::"read", resource);'
PDPS = 4


class ChallengeProcess(ServiceProcess):
    """``svc challenge serve`` on a free port, no caller auth (loopback); ``url`` once ready."""

    def __init__(self, database_url: str) -> None:
        port = free_port()
        args = ["challenge", "serve", "--port", str(port), "--database-url", database_url]
        super().__init__(args, port)


class Pdp:
    """An engine behind a listener, following the service's containments."""

    def __init__(self, url: str) -> None:
        self.engine = Engine(POLICIES, SCHEMA)
        self.server = Server(self.engine, port=0, workers=1)
        self.server.start()
        self.server.set_ready(bundle=True)
        self.follower: ContainmentFollower = follow_containments(self.engine, self.server, url)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.server.port}", timeout=30)

    def contained(self, user: str) -> bool:
        r = self.http.post(
            "/v1/access/evaluation",
            json={
                "principal": {"type": "Human", "id": user},
                "action": "read",
                "resource": {"type": "Document", "id": "d1"},
            },
        )
        r.raise_for_status()
        a = r.json()
        return bool(a["verdict"] == "deny" and "svc:contained" in a["policies"])

    def stop(self) -> None:
        self.follower.stop()
        self.http.close()
        self.server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200, help="contain/lift rounds")
    ap.add_argument("--people", type=int, default=10, help="people contained in turn")
    ap.add_argument("--poll-ms", type=float, default=2.0, help="pause between checks")
    args = ap.parse_args()
    poll = args.poll_ms / 1000

    schema = Schema(postgres_url(), "chbench")
    service = ChallengeProcess(schema.url_text)
    pdps = [Pdp(service.url) for _ in range(PDPS)]
    channel = grpc.insecure_channel(service.url.removeprefix("http://"))
    stub = pb_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
    pool = ThreadPoolExecutor(PDPS)
    denied: list[float] = []
    allowed: list[float] = []
    calls: dict[str, list[float]] = {"Contain": [], "Lift": []}
    try:
        for p in pdps:
            p.follower.loaded.wait()
            assert p.server.ready, "a decision point is not ready after its list loaded"
        print(
            f"{PDPS} decision points following {service.url}; {args.rounds} rounds, "
            f"checks every {args.poll_ms:g} ms"
        )

        def until(p: Pdp, user: str, want: bool, t0: float) -> float:
            while p.contained(user) != want:
                time.sleep(poll)
            return time.monotonic() - t0

        for i in range(args.rounds):
            user = f"person-{i % args.people}"
            who = pb.EntityRef(type="Human", id=user)
            for name, want, out in (("Contain", True, denied), ("Lift", False, allowed)):
                t0 = time.monotonic()
                futures = [pool.submit(until, p, user, want, t0) for p in pdps]
                if name == "Contain":
                    r = stub.Contain(
                        pb.ContainRequest(principal=who, reason="bench", author="bench"),
                        timeout=30,
                    )
                else:
                    r = stub.Lift(pb.LiftRequest(principal=who, author="bench"), timeout=30)
                calls[name].append(time.monotonic() - t0)
                assert r.changed, f"{name} {user} changed nothing"
                out.extend(f.result() for f in futures)
        print("| measure | p50 | p99 | max |\n|---|---|---|---|")
        for label, xs in (
            (f"`Contain` sent -> denied `svc:contained`, {len(denied)} (round, PDP)", denied),
            (f"`Lift` sent -> allowed, {len(allowed)} (round, PDP)", allowed),
            ("`Contain` call", calls["Contain"]),
            ("`Lift` call", calls["Lift"]),
        ):
            print(
                f"| {label} | {pct(xs, 0.5) * 1000:.1f} ms | {pct(xs, 0.99) * 1000:.1f} ms "
                f"| {max(xs) * 1000:.1f} ms |"
            )
        print(
            f"mean containment to denied {statistics.mean(denied) * 1000:.1f} ms; target p99 "
            f"< 1 s: {'met' if pct(denied, 0.99) < 1.0 else 'NOT met'}"
        )
        print(
            "followers: "
            + ", ".join(
                f"lists={p.follower.status.lists} applied={p.follower.status.applied} "
                f"reconnects={p.follower.status.reconnects}"
                for p in pdps
            )
        )
    finally:
        pool.shutdown()
        channel.close()
        for p in pdps:
            p.stop()
        service.stop()
        schema.drop()


if __name__ == "__main__":
    main()
