"""Decision log under load: does it keep up, and what does durable mode cost? (docs/benchmarks.md)

``svc pdp --kafka`` over the load bench's TinyTodo workload, pinned to core 0 with one worker
thread, with wrk on core 1 posting evaluations as fast as the server answers (closed loop, as in
run.py). Each run uses one decision-log mode (docs/history.md, "Durability of the decision log"):

* ``window``: the default; answers go out at once, records are written to the spool every
  ``--commit-ms``;
* ``durable``: ``--log-durability durable``: an answer waits for its record's group commit;
* ``durable-fsync``: the same with ``--log-fsync`` (fdatasync per group commit).

Per run: wrk's rate, p50 and p99 (closed loop, at the maximum rate), the server's CPU per request,
then, after the shipper has caught up, the server's own counters (``/metrics``: decisions,
records pushed, sent, dropped, group commits, mean commit duration and, in durable mode, mean
wait) and the records counted on the run's own topic. The log keeps up when records on the topic
== decisions, with nothing dropped. Modes alternate within a round, the order flipped every
round, so each durable/window ratio is of runs measured back to back.

Usage (needs scripts/dev-kafka.sh's broker or ``--kafka``, and wrk: ``bash benches/load/setup.sh``
or the ``wrk`` package)::

    .venv/bin/python benches/load/decision_log.py [--seconds 10] [--connections 16]
        [--modes window,durable] [--rounds 2] [--commit-ms 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import workload  # noqa: E402
from run import (  # noqa: E402
    CLIENT_CORE,
    DEFAULT_EXAMPLES,
    RESULTS,
    SERVER_CORE,
    Server,
    free_port,
    wrk,
)

from svc.pdp.log_settings import LOG_COMMIT_MS  # noqa: E402

PARTITIONS = 3


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of a metric's samples whose labels contain `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def count_topic(bootstrap: str, topic: str, expect: int, timeout: float = 120) -> int:
    """Records on `topic` (all partitions, from the start), read until `expect` or quiet."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)]
    )
    n = 0
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        msgs = consumer.consume(num_messages=10_000, timeout=0.5)
        got = sum(1 for m in msgs if m.error() is None)
        n += got
        if got:
            quiet_since = time.monotonic()
        elif n >= expect and time.monotonic() - quiet_since > 2:
            break
    consumer.close()
    return n


# Settings go in as environment variables, so that `--svc` can name an older build (one that
# knows no such setting runs as it always did: a baseline).
MODES = {
    "window": {"SVC_PDP_LOG_DURABILITY": "window"},
    "durable": {"SVC_PDP_LOG_DURABILITY": "durable"},
    "durable-fsync": {"SVC_PDP_LOG_DURABILITY": "durable", "SVC_PDP_LOG_FSYNC": "true"},
}


def run_mode(
    mode: str, args: argparse.Namespace, boot: str, tmp: Path, bundle: Path, bodies: Path
) -> dict[str, Any]:
    """One server in `mode`: a warm-up, a timed wrk run, then the log's counters and topic."""
    topic = f"bench.decisions.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": boot})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(30)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    spool = tmp / f"spool-{topic}"
    argv = [
        str(args.svc),
        "pdp",
        "--bundle",
        str(bundle),
        "--port",
        str(port),
        "--no-watch",
        "--workers",
        "1",
        "--kafka",
        boot,
        "--spool-dir",
        str(spool),
    ]
    # The shipper's topic: the run's own, so the count is exact.
    env = {
        **os.environ,
        "SVC_PDP_DECISIONS_TOPIC": topic,
        "SVC_PDP_LOG_COMMIT_MS": str(args.commit_ms),
        **MODES[mode],
    }
    log_file = tmp / f"svc-{mode}.log"
    srv = Server("svc", argv, f"{base}/readyz", log_file, env)
    try:
        wrk(f"{base}/v1/access/evaluation", bodies, args.connections, 2)
        c0, t0 = srv.cpu(), time.monotonic()
        run = wrk(f"{base}/v1/access/evaluation", bodies, args.connections, args.seconds)
        cpu = (srv.cpu() - c0) / max(1, run["requests"]) * 1e6
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 120
        while True:
            text = httpx.get(f"{base}/metrics").text
            decisions = metric(text, "svc_pdp_decisions_total")
            pushed = metric(text, "svc_pdp_decision_log_records_total", 'state="pushed"')
            sent = metric(text, "svc_pdp_decision_log_records_total", 'state="sent"')
            queued = metric(text, "svc_pdp_decision_log_queued")
            pending = metric(text, "svc_pdp_decision_log_spool_pending")
            if (queued == 0 and pending == 0 and sent >= pushed) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        srv.stop()
    on_topic = count_topic(boot, topic, int(decisions))
    log_text = log_file.read_text()
    if re.search(r"Traceback", log_text):
        print(log_text[-3000:])
    shutil.rmtree(spool, ignore_errors=True)

    def mean(name: str) -> float | None:
        n = metric(text, f"{name}_count")
        return metric(text, f"{name}_sum") / n * 1e3 if n else None

    return {
        "mode": mode,
        "rps": run["rps"],
        "requests": run["requests"],
        "seconds": wall,
        "errors": run["errors"],
        "p50_ms": run["p50_ms"],
        "p99_ms": run["p99_ms"],
        "server_us_per_req": cpu,
        "decisions": decisions,
        "pushed": pushed,
        "sent": sent,
        "dropped": metric(text, "svc_pdp_decision_log_records_total", 'state="dropped"'),
        "on_topic": on_topic,
        "commits": metric(text, "svc_pdp_decision_log_commit_duration_seconds_count"),
        "commit_ms_mean": mean("svc_pdp_decision_log_commit_duration_seconds"),
        "wait_ms_mean": mean("svc_pdp_decision_log_wait_seconds"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=10, help="seconds per timed run (10)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (16)")
    ap.add_argument(
        "--modes", default="window,durable", help=f"comma-separated: {', '.join(MODES)}"
    )
    ap.add_argument("--rounds", type=int, default=1, help="runs per mode, alternating (1)")
    ap.add_argument("--commit-ms", type=int, default=LOG_COMMIT_MS, help="--log-commit-ms")
    ap.add_argument("--kafka", default=None, help="bootstrap servers (default: dev-kafka url)")
    ap.add_argument(
        "--svc", type=Path, default=Path(sys.executable).parent / "svc", help="the svc to run"
    )
    ap.add_argument("--examples", type=Path, default=DEFAULT_EXAMPLES, help="Cedar's example apps")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"unknown mode(s) {', '.join(unknown)}; expected some of {', '.join(MODES)}")
    if shutil.which("wrk") is None:
        sys.exit("wrk missing: run `bash benches/load/setup.sh`")
    boot = (
        args.kafka
        or subprocess.run(
            [str(REPO / "scripts" / "dev-kafka.sh"), "url"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    tmp = Path(tempfile.mkdtemp(prefix="svc-logbench-"))
    world = workload.build_world()
    mix = workload.build_mix(world)
    bundle = tmp / "bundle"
    bundle.mkdir()
    shutil.copy(
        args.examples / "tinytodo" / "tinytodo.cedarschema", bundle / "tinytodo.cedarschema"
    )
    shutil.copy(HERE / "tinytodo.cedar", bundle / "policies.cedar")
    (bundle / "entities.json").write_text(json.dumps(world.entities))
    bodies = tmp / "svc.jsonl"
    bodies.write_text(workload.jsonl([c.svc_json() for c in mix]))
    print(
        f"svc pdp --workers 1 on core {SERVER_CORE}, wrk -t1 -c{args.connections} on core "
        f"{CLIENT_CORE}, {args.seconds} s per run, --log-commit-ms {args.commit_ms}, "
        f"{args.rounds} round(s); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            row = run_mode(mode, args, boot, tmp, bundle, bodies)
            row["round"] = r
            rows.append(row)
            wait = row["wait_ms_mean"]
            print(
                f"  {mode:<14} {row['rps']:>8,.0f} req/s  p50 {row['p50_ms']:.3f}  "
                f"p99 {row['p99_ms']:.3f} ms  {row['server_us_per_req']:.0f} us/req  "
                f"commits {row['commits']:,.0f} (mean {row['commit_ms_mean'] or 0:.3f} ms)  "
                f"wait {f'{wait:.3f} ms' if wait is not None else '-'}  "
                f"decisions {row['decisions']:,.0f} on topic {row['on_topic']:,} "
                f"dropped {row['dropped']:,.0f}",
                flush=True,
            )
    print()
    print(f"{'mode':<14} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'us/req':>7} {'keeps up':>9}")
    summary: dict[str, Any] = {}
    for mode in modes:
        runs = [x for x in rows if x["mode"] == mode]
        keeps = all(
            x["on_topic"] >= x["decisions"] == x["pushed"] and x["dropped"] == 0 for x in runs
        )
        summary[mode] = {
            "rps": statistics.median(x["rps"] for x in runs),
            "p50_ms": statistics.median(x["p50_ms"] for x in runs),
            "p99_ms": statistics.median(x["p99_ms"] for x in runs),
            "server_us_per_req": statistics.median(x["server_us_per_req"] for x in runs),
            "keeps_up": keeps,
        }
        m = summary[mode]
        print(
            f"{mode:<14} {m['rps']:>8,.0f} {m['p50_ms']:>8.3f} {m['p99_ms']:>8.3f} "
            f"{m['server_us_per_req']:>7.0f} {'yes' if keeps else 'NO':>9}"
        )
    if "window" in summary:
        base = summary["window"]
        for mode in modes:
            if mode != "window":
                print(
                    f"{mode} / window: throughput {summary[mode]['rps'] / base['rps']:.2f}, "
                    f"p99 {summary[mode]['p99_ms'] / base['p99_ms']:.2f}x"
                )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"decision-log-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "runs": rows,
                "summary": summary,
            },
            indent=2,
        )
    )
    print(f"results: {out.relative_to(REPO)}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
