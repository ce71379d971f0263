"""Challenges as a decision point sees them (docs/challenges.md, docs/benchmarks.md#challenges).

The challenge service runs as a ``svc challenge serve`` process on PostgreSQL
(``SVC_TEST_POSTGRES_URL``, else ``scripts/dev-postgres.sh start``) in a schema of its own,
dropped at the end; the decision point is a real ``svc pdp --bundle DIR --challenge URL``
process, whose bundle lets people ``read`` documents and makes ``delete`` step up with
``@challenge("justification")``.

What is measured
----------------
1. **Resolve as the decision point sees it.** ``--checks`` checks (default 2,000) over HTTP
   (``POST /v1/access/evaluation``, one keep-alive client) of each: ``read`` (allowed, no
   challenge: the baseline), ``delete`` of a new document each time (a ``challenge`` verdict:
   the decision point calls ``Resolve``, which opens a challenge), and ``delete`` of documents
   already challenged (``Resolve`` finds the pending challenge). Reported: p50, p99 and max of
   each, and the added time of a challenge verdict over an allowed check at p50 and p99. Then
   the service's ``Resolve`` alone: as many gRPC calls straight to the service (new
   fingerprints).
2. **Waits held at once.** One challenge; ``--waits`` (default 5,000) HTTP long-polls
   ``POST /v1/access/challenge`` with ``wait_secs`` 25, each on a connection of its own (raw
   HTTP/1.1 over asyncio streams, so no client pool is measured), held by the decision point
   at once (its ``svc_pdp_challenge_waits`` gauge). Reported:
   the decision point's RSS before and while they are held (``/proc/<pid>/status``), its CPU
   while they are held (``/proc/<pid>/stat`` over ``--hold-secs``), and, once the person
   justifies (``Justify`` sent to the service), the time until the last wait is answered
   ``passed``.

Run: ``.venv/bin/python benches/bench_challenge.py`` (about a minute), ``--checks 200 --waits
500`` for a smoke run. Needs the release build (``make build``) and a descriptor limit above
twice ``--waits`` (``ulimit -n``). Benches report; they do not assert, but for the sanity
checks they make on their own setup.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import grpc
import httpx

from _support import Schema, ServiceProcess, free_port, pct, postgres_url
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc

SCHEMA = """
entity Human;
entity Document;
action read, delete appliesTo { principal: [Human], resource: [Document] };
"""
POLICIES = """
@id("people-read")
permit (principal is Human, action == Action::"read", resource is Document);

@id("delete-needs-reason") @challenge("justification")
permit (principal is Human, action == Action::"delete", resource is Document);
"""
EVAL = "/v1/access/evaluation"
WAIT = "/v1/access/challenge"
TICKS = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` in MiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_secs(pid: int) -> float:
    """User plus system CPU seconds `pid` used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def check_body(who: str, action: str, doc: str) -> dict[str, object]:
    return {
        "principal": {"type": "Human", "id": who},
        "action": action,
        "resource": {"type": "Document", "id": doc},
    }


def ms_row(label: str, xs: list[float]) -> str:
    return (
        f"| {label} | {len(xs):,} | {pct(xs, 0.5) * 1000:.2f} ms | {pct(xs, 0.99) * 1000:.2f} ms "
        f"| {max(xs) * 1000:.2f} ms |"
    )


def resolve_latency(pdp: ServiceProcess, stub: pb_grpc.ChallengeServiceStub, n: int) -> None:
    """Part 1 (module docs)."""
    timed: dict[str, list[float]] = {"allow": [], "opened": [], "found": [], "service": []}
    with httpx.Client(base_url=pdp.url, timeout=60) as http:
        for i in range(100):  # warm up the connection and both paths
            http.post(EVAL, json=check_body("warm", "read", f"w{i}"))
            http.post(EVAL, json=check_body("warm", "delete", f"w{i}"))
        for i in range(n):
            for label, body in (
                ("allow", check_body("ana", "read", f"d{i}")),
                ("opened", check_body("ana", "delete", f"d{i}")),
                ("found", check_body("warm", "delete", f"w{i % 100}")),
            ):
                t0 = time.perf_counter()
                r = http.post(EVAL, json=body)
                timed[label].append(time.perf_counter() - t0)
                a = r.json()
                want = "allow" if label == "allow" else "challenge"
                assert a["verdict"] == want, a
                assert label == "allow" or a.get("challenge_qid"), f"no challenge_qid: {a}"
    for i in range(n):
        req = pb.ResolveRequest(
            principal=pb.EntityRef(type="Human", id="bo"),
            action="delete",
            resource=pb.EntityRef(type="Document", id=f"s{i}"),
            challenges=["justification"],
            decision_qid=f"bench-{i}",
        )
        t0 = time.perf_counter()
        stub.Resolve(req, timeout=30)
        timed["service"].append(time.perf_counter() - t0)
    print("\n| request | n | p50 | p99 | max |\n|---|---|---|---|---|")
    print(ms_row("check, `allow` (no challenge)", timed["allow"]))
    print(ms_row("check, `challenge`: `Resolve` opens a challenge", timed["opened"]))
    print(ms_row("check, `challenge`: `Resolve` finds the pending one", timed["found"]))
    print(ms_row("the service's `Resolve` alone (gRPC, opens)", timed["service"]))
    for label in ("opened", "found"):
        d50 = (pct(timed[label], 0.5) - pct(timed["allow"], 0.5)) * 1000
        d99 = (pct(timed[label], 0.99) - pct(timed["allow"], 0.99)) * 1000
        print(f"added by a challenge verdict ({label}): p50 {d50:+.2f} ms, p99 {d99:+.2f} ms")


def metric(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def held_waits(
    pdp: ServiceProcess, stub: pb_grpc.ChallengeServiceStub, n: int, hold_secs: float
) -> None:
    """Part 2 (module docs)."""
    with httpx.Client(base_url=pdp.url, timeout=60) as http:
        first = http.post(EVAL, json=check_body("cy", "delete", "held")).json()
        qid = first["challenge_qid"]
        assert qid, first
        rss_before = rss_mib(pdp.pid)
        body = {"challenge_qid": qid, "principal": {"type": "Human", "id": "cy"}, "wait_secs": 25}

        payload = json.dumps(body).encode()
        request = (
            f"POST {WAIT} HTTP/1.1\r\nHost: 127.0.0.1:{pdp.port}\r\n"
            "Content-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload

        async def run() -> tuple[float, float, float, float, list[str]]:
            ends: list[float] = []

            async def one() -> str:
                # Raw HTTP/1.1 over asyncio streams: one connection per wait, no client pool.
                reader, writer = await asyncio.open_connection("127.0.0.1", pdp.port)
                writer.write(request)
                await writer.drain()
                answer = await reader.read()  # Connection: close: read to the end
                ends.append(time.perf_counter())
                writer.close()
                head, _, text = answer.partition(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    return head.decode(errors="replace")
                return str(json.loads(text).get("outcome"))

            t_open = time.perf_counter()
            tasks = []
            for _ in range(n):
                tasks.append(asyncio.create_task(one()))
                if len(tasks) % 500 == 0:  # let the connections open in steps
                    await asyncio.sleep(0.05)
            while await asyncio.to_thread(metric, http, "svc_pdp_challenge_waits") < n:
                assert not any(t.done() for t in tasks), "a wait ended before all were held"
                await asyncio.sleep(0.1)
            opened = time.perf_counter() - t_open
            rss_held = rss_mib(pdp.pid)
            c0, t0 = cpu_secs(pdp.pid), time.perf_counter()
            await asyncio.sleep(hold_secs)
            cpu = (cpu_secs(pdp.pid) - c0) / (time.perf_counter() - t0)
            sent = time.perf_counter()
            await asyncio.to_thread(
                stub.Justify,
                pb.JustifyRequest(qid=qid, person="cy", text="bench"),
                timeout=30,
            )
            outcomes = await asyncio.gather(*tasks)
            return opened, rss_held, cpu, max(ends) - sent, outcomes

        opened, rss_held, cpu, last, outcomes = asyncio.run(run())
    passed = sum(o == "passed" for o in outcomes)
    print(
        f"\n{n:,} waits held at once on one decision point (opened in {opened:.1f} s): "
        f"RSS {rss_before:.1f} MiB before, {rss_held:.1f} MiB held "
        f"(+{(rss_held - rss_before) * 1024 / n:.1f} KiB a wait); "
        f"CPU while held {cpu * 100:.1f} % of a core over {hold_secs:g} s; "
        f"Justify sent -> last wait answered {last * 1000:.0f} ms; {passed:,}/{n:,} passed"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", type=int, default=2000, help="checks of each kind")
    ap.add_argument("--waits", type=int, default=5000, help="waits held at once")
    ap.add_argument("--hold-secs", type=float, default=5.0, help="CPU sampled over this long")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.waits * 2 + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.waits * 2 + 100), hard))

    schema = Schema(postgres_url(), "chalbench")
    tmp = tempfile.TemporaryDirectory(prefix="svc-bench-challenge-")
    bundle = Path(tmp.name)
    (bundle / "schema.cedarschema").write_text(SCHEMA)
    (bundle / "policies.cedar").write_text(POLICIES)
    port = free_port()
    service = ServiceProcess(
        ["challenge", "serve", "--port", str(port), "--database-url", schema.url_text], port
    )
    pdp_port = free_port()
    pdp: ServiceProcess | None = None
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        pdp = ServiceProcess(
            [
                "pdp", "--bundle", str(bundle), "--port", str(pdp_port), "--no-watch",
                "--challenge", service.url, "--challenge-timeout-ms", "30000",
            ],
            pdp_port,
        )  # fmt: skip
        stub = pb_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
        print(
            f"svc pdp (pid {pdp.pid}) with --challenge {service.url} on PostgreSQL; "
            f"{args.checks:,} checks of each kind, {args.waits:,} waits"
        )
        resolve_latency(pdp, stub, args.checks)
        held_waits(pdp, stub, args.waits, args.hold_secs)
    finally:
        channel.close()
        if pdp is not None:
            pdp.stop()
        service.stop()
        schema.drop()
        tmp.cleanup()


if __name__ == "__main__":
    main()
