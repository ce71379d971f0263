"""Does the decision log keep up with the decision point at its maximum rate? (issue: Decision log)

``svc pdp --kafka`` over the load bench's TinyTodo workload, pinned to core 0, with wrk on core 1
posting evaluations as fast as the server answers (closed loop, as in run.py). After the run it
waits for the shipper, then reads the server's own counters (``/metrics``) and counts the records
on the topic: the log keeps up when records on the topic == decisions made, with nothing dropped.

Usage (needs scripts/dev-kafka.sh's broker or SVC_KAFKA_URL, and benches/load/setup.sh's wrk)::

    .venv/bin/python benches/load/decision_log.py [--seconds 20] [--connections 16]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import confluent_kafka
import httpx
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import workload  # noqa: E402
from run import Server, free_port, wrk  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--kafka", default=None, help="bootstrap servers (default: dev-kafka url)")
    args = ap.parse_args()
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
    topic = f"bench.decisions.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": boot})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(30)

    tmp = Path(tempfile.mkdtemp(prefix="svc-logbench-"))
    world = workload.build_world()
    mix = workload.build_mix(world)
    bundle = tmp / "bundle"
    bundle.mkdir()
    examples = REPO.parent / "shared" / "data" / "cedar-examples"
    shutil.copy(examples / "tinytodo" / "tinytodo.cedarschema", bundle / "tinytodo.cedarschema")
    shutil.copy(HERE / "tinytodo.cedar", bundle / "policies.cedar")
    (bundle / "entities.json").write_text(json.dumps(world.entities))
    bodies = tmp / "svc.jsonl"
    bodies.write_text(workload.jsonl([c.svc_json() for c in mix]))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [
        str(Path(sys.executable).parent / "svc"),
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
        str(tmp / "spool"),
    ]
    # The shipper's topic: the bench's own, so the count is exact.
    env = {**os.environ, "SVC_PDP_DECISIONS_TOPIC": topic}
    srv = Server("svc", argv, f"{base}/readyz", tmp / "svc.log", env)
    try:
        run = wrk(f"{base}/v1/access/evaluation", bodies, args.connections, args.seconds)
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
        spooled = metric(text, "svc_pdp_decision_log_records_total", 'state="spooled"')
        dropped = metric(text, "svc_pdp_decision_log_records_total", 'state="dropped"')
    finally:
        srv.stop()
    on_topic = count_topic(boot, topic, int(decisions))
    log_text = (tmp / "svc.log").read_text()
    if re.search(r"Traceback", log_text):
        print(log_text[-3000:])
    print(f"wrk: {run['rps']:,.0f} decisions/s over {run['seconds']:.1f} s, {run['requests']:,}")
    print(
        f"decisions {decisions:,.0f}  records pushed {pushed:,.0f}  sent {sent:,.0f}  "
        f"spooled {spooled:,.0f}  dropped {dropped:,.0f}  on topic {on_topic:,}"
    )
    keeps_up = on_topic == decisions == pushed and dropped == 0
    print(f"log keeps up: {'yes' if keeps_up else 'NO'} (records on topic == decisions)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
