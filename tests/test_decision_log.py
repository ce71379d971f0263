"""The decision log against a real Kafka broker (docs/history.md, "Durability of the decision log").

Every decision the server makes, over HTTP, gRPC or AuthZEN, check or plan, is one record on
the topic; with the broker stopped mid-run and started again there are still exactly as many
records as decisions, none lost and none doubled. A `kill -9` of the decision point under load
loses no answered decision in durable mode, and in window mode only decisions of the last
commit window; durable mode refuses to answer (503 / UNAVAILABLE) what it cannot log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import grpc
import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_fixture import create_topics
from serverkit import assert_problem, metric, serve, wait_until
from svc._pdp_core import DecisionLog, Engine, Server
from svc.authz.v1 import authz_pb2, authz_pb2_grpc
from svc.common.topics import bootstrap_servers
from svc.pdp.decision_log import Shipper

CORP = Path(__file__).parent / "testdata" / "bundles" / "corp"
PARTITIONS = 3

ALICE = {"type": "Human", "id": "alice"}
DESIGN_DOC = {"type": "Document", "id": "design"}


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = f"test.decisions.{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, name, partitions=PARTITIONS)
    return name


def read_all(bootstrap: str, topic: str, count: int, timeout: float = 60) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign(
            [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.key(), json.loads(msg.value())))
        # Anything past `count` would be a duplicate.
        out += [
            (m.key(), json.loads(m.value()))
            for m in consumer.consume(num_messages=1000, timeout=2.0)
            if m.error() is None
        ]
        return out
    finally:
        consumer.close()


class Pdp:
    """A served engine with a decision log shipped to `topic`."""

    def __init__(self, tmp: Path, bootstrap: str, topic: str, buffer_messages: int) -> None:
        self.log = DecisionLog(tmp / "spool", queue_bound=10_000)
        self.engine = Engine.from_bundle_dir(CORP)
        self.server = Server(self.engine, port=0, decision_log=self.log, pdp_name="pdp-test")
        self.port = self.server.start()
        self.server.set_ready(bundle=True, containments=True)
        self.shipper = Shipper(
            self.log, bootstrap, topic, buffer_messages=buffer_messages, flush_timeout=5
        )
        self.shipper.start()
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.grpc = authz_pb2_grpc.AuthorizerStub(self.channel)
        self.qids: list[str] = []

    def traffic(self, rounds: int) -> None:
        """Per round: an HTTP check, a gRPC check, an AuthZEN single, a 2-item AuthZEN batch
        and an HTTP plan: six records."""
        for _ in range(rounds):
            r = self.http.post(
                "/v1/access/evaluation",
                json={"principal": ALICE, "action": "view", "resource": DESIGN_DOC},
            )
            assert r.status_code == 200, r.text
            self.qids.append(r.json()["qid"])
            g = self.grpc.Check(
                authz_pb2.CheckRequest(
                    principal=authz_pb2.EntityRef(**ALICE),
                    action="delete",
                    resource=authz_pb2.EntityRef(**DESIGN_DOC),
                )
            )
            self.qids.append(g.decision_qid)
            a = self.http.post(
                "/access/v1/evaluation",
                json={"subject": ALICE, "action": {"name": "view"}, "resource": DESIGN_DOC},
            )
            self.qids.append(a.json()["context"]["qid"])
            b = self.http.post(
                "/access/v1/evaluations",
                json={
                    "subject": ALICE,
                    "resource": DESIGN_DOC,
                    "evaluations": [{"action": {"name": "view"}}, {"action": {"name": "edit"}}],
                },
            )
            self.qids += [e["context"]["qid"] for e in b.json()["evaluations"]]
            p = self.http.post(
                "/v1/access/plan",
                json={"principal": ALICE, "action": "view", "resource_type": "Document"},
            )
            assert p.status_code == 200, p.text
            self.qids.append(p.json()["qid"])

    def wait_shipped(self, timeout: float = 60) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.log.stats
            if s["queued_now"] == 0 and s["spool_pending"] == 0 and s["sent"] >= len(self.qids):
                return s
            time.sleep(0.1)
        raise AssertionError(f"records not shipped in {timeout}s: {self.log.stats}")

    def close(self) -> None:
        self.http.close()
        self.channel.close()
        self.server.stop()
        self.shipper.stop()


@pytest.fixture
def pdp(tmp_path: Path, kafka_bootstrap: str, topic: str) -> Iterator[Pdp]:
    p = Pdp(tmp_path, bootstrap_servers(kafka_bootstrap), topic, buffer_messages=10_000)
    yield p
    p.close()


@pytest.fixture
def small_buffer_pdp(tmp_path: Path, kafka_bootstrap: str, topic: str) -> Iterator[Pdp]:
    """A producer buffer of 40 records: an outage spills to the spool quickly."""
    p = Pdp(tmp_path, bootstrap_servers(kafka_bootstrap), topic, buffer_messages=40)
    yield p
    p.close()


def test_every_decision_is_exactly_one_record(pdp: Pdp, kafka_bootstrap: str, topic: str) -> None:
    pdp.traffic(20)
    stats = pdp.wait_shipped()
    records = read_all(kafka_bootstrap, topic, len(pdp.qids))
    assert len(records) == len(pdp.qids) == 120
    assert sorted(r["qid"] for _, r in records) == sorted(pdp.qids)
    # Every record went through the spool (the write-ahead log), and none was dropped.
    assert stats["dropped"] == 0 and stats["spooled"] == 120
    for key, rec in records:
        assert key == b"Human::alice"
        assert rec["pdp"] == "pdp-test"
        assert rec["principal"] == ALICE
    calls = {(r["call"], r["transport"]) for _, r in records}
    assert calls == {("check", "http"), ("check", "grpc"), ("check", "authzen"), ("plan", "http")}
    check = next(r for _, r in records if r["call"] == "check" and r["transport"] == "grpc")
    assert check["verdict"] == "challenge" and check["challenges"] == ["verification"]
    plan = next(r for _, r in records if r["call"] == "plan")
    assert plan["outcome"] in {"conditional", "always_allowed", "always_denied", "challenge"}
    metrics = pdp.http.get("/metrics").text
    assert 'svc_pdp_decision_log_records_total{state="sent"} 120' in metrics


def test_broker_stopped_mid_run_still_exactly_one_record_each(
    small_buffer_pdp: Pdp,
    kafka_bootstrap: str,
    topic: str,
    dev_kafka,
) -> None:
    pdp = small_buffer_pdp
    pdp.traffic(10)
    pdp.wait_shipped()
    dev_kafka.stop()
    try:
        # 40 rounds = 240 records with the broker away: more than the producer's buffer (40),
        # so most wait in the spool, on disk.
        pdp.traffic(40)
        deadline = time.monotonic() + 30
        while pdp.log.stats["spool_pending"] <= 40 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pdp.log.stats["spool_pending"] > 40
    finally:
        dev_kafka.start()
    pdp.traffic(5)
    stats = pdp.wait_shipped(timeout=120)
    records = read_all(kafka_bootstrap, topic, len(pdp.qids), timeout=120)
    qids = [r["qid"] for _, r in records]
    assert len(qids) == len(pdp.qids) == 330
    assert sorted(qids) == sorted(pdp.qids)
    assert stats["dropped"] == 0
    assert stats["spooled"] == stats["pushed"] == stats["sent"] == 330


def test_records_spooled_at_shutdown_are_replayed_by_the_next_shipper(
    tmp_path: Path,
    kafka_bootstrap: str,
    topic: str,
    dev_kafka,
) -> None:
    boot = bootstrap_servers(kafka_bootstrap)
    log = DecisionLog(tmp_path / "spool")
    dev_kafka.stop()
    try:
        shipper = Shipper(log, boot, topic, buffer_messages=1000, flush_timeout=1)
        shipper.start()
        for i in range(25):
            log.push(b"Human::bob", json.dumps({"qid": f"q{i}"}).encode())
        time.sleep(0.5)
        shipper.stop()
        assert log.stats["spool_pending"] == 25
        log.close()
    finally:
        dev_kafka.start()
    # A new process: the spool on disk is all that is left.
    log2 = DecisionLog(tmp_path / "spool")
    assert log2.stats["spool_pending"] == 25
    shipper2 = Shipper(log2, boot, topic)
    shipper2.start()
    deadline = time.monotonic() + 60
    while log2.stats["spool_pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    shipper2.stop()
    assert log2.stats["replayed"] == 25
    records = read_all(kafka_bootstrap, topic, 25)
    assert sorted(r["qid"] for _, r in records) == sorted(f"q{i}" for i in range(25))


# chDB hosts one engine per process, on one directory, and other tests open theirs: the loader
# and the queries run in a child process of their own (as in test_intake.py).
LOAD_AND_COUNT = """
import json, sys, time
from datetime import UTC, datetime, timedelta
from svc import history

dsn, bootstrap, topic, expect = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = history.connect(dsn, create_database=True)
history.migrate(client)
loader = history.Loader(client, bootstrap, decisions_topic=topic, events_topic=None,
                        group_id="test-decision-log-" + topic, batch_ms=500)
now = datetime.now(UTC)
start, end = now - timedelta(hours=1), now + timedelta(hours=1)
deadline = time.monotonic() + 120
while True:
    loader.poll()
    loader.flush()
    by_principal = history.decisions_of_principal(client, "Human::alice", start, end)
    by_resource = history.decisions_of_resource(client, "Document::design", start, end)
    if len(by_principal) >= expect or time.monotonic() > deadline:
        break
loader.consumer.close()
print(json.dumps({"principal": [d["qid"] for d in by_principal],
                  "resource": [d["qid"] for d in by_resource]}))
"""


def test_every_decision_is_one_row_in_clickhouse(
    pdp: Pdp, kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    pdp.traffic(5)
    pdp.wait_shipped()
    # Redelivery must not add rows: the same records produced a second time.
    records = read_all(kafka_bootstrap, topic, len(pdp.qids))
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
    for key, rec in records[:5]:
        producer.produce(topic, key=key, value=json.dumps(rec).encode())
    assert producer.flush(30) == 0
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_COUNT,
            f"chdb://{tmp_path / 'chdb'}?database=decisions",
            kafka_bootstrap,
            topic,
            str(len(pdp.qids)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    # 30 decisions: checks and plans of alice; the plans have no resource id.
    assert sorted(got["principal"]) == sorted(pdp.qids)
    assert len(got["resource"]) == len(pdp.qids) - 5  # the 5 plans name only a type
    assert set(got["resource"]) <= set(pdp.qids)


# ---------------------------------------------------------------------------------- kill -9
#
# docs/history.md, "Durability of the decision log": every record is written to the spool (a
# write-ahead log) by a group commit every `--log-commit-ms`; a killed process loses at most
# the records of the last commit window, and with `--log-durability durable` none at all, since
# an answer waits for its record's commit. The settings go in as environment variables, so that
# a decision point that does not know them runs with its defaults instead of refusing to start.

SVC = Path(sys.executable).parent / "svc"
SERVING = re.compile(r"svc-pdp serving .* on http://127\.0\.0\.1:(\d+) ")


class PdpProcess:
    """`svc pdp --kafka` over the corp bundle as a child process, logging to `topic`."""

    def __init__(self, tmp: Path, bootstrap: str, topic: str, env: dict[str, str]) -> None:
        self.stderr = (tmp / f"pdp-{uuid.uuid4().hex[:6]}.log").open("w+")
        self.proc = subprocess.Popen(
            [
                str(SVC),
                "pdp",
                "--bundle",
                str(CORP),
                "--port",
                "0",
                "--no-watch",
                "--kafka",
                bootstrap,
                "--spool-dir",
                str(tmp / "spool"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env={**os.environ, "SVC_PDP_DECISIONS_TOPIC": topic, **env},
        )
        deadline = time.monotonic() + 60
        while True:
            m = SERVING.search(self.log())
            if m:
                self.port = int(m.group(1))
                break
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
        self.stderr.close()


def _hammer(url: str, answered: list[tuple[str, float]], stop: threading.Event) -> None:
    """Sends checks one after the other until `stop` or until the server is gone; records the
    qid of every answered check with the (monotonic) time its answer arrived."""
    body = {"principal": ALICE, "action": "view", "resource": DESIGN_DOC}
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            try:
                r = client.post("/v1/access/evaluation", json=body)
            except httpx.HTTPError:
                return
            if r.status_code != 200:
                return
            answered.append((r.json()["qid"], time.monotonic()))


def _kill_under_load(
    tmp: Path, bootstrap: str, topic: str, env: dict[str, str], answers: int = 300
) -> tuple[list[tuple[str, float]], float, str]:
    """Starts `svc pdp`, loads it from 8 clients, kills it (SIGKILL) once `answers` checks
    were answered, restarts it on the same spool so it ships what the spool holds, and stops it.

    Returns every answered (qid, time), the time of the kill, and the first run's metrics as
    they were just before the kill.
    """
    first = PdpProcess(tmp, bootstrap, topic, env)
    answered: list[tuple[str, float]] = []
    stop = threading.Event()
    clients = [
        threading.Thread(target=_hammer, args=(first.url, answered, stop), daemon=True)
        for _ in range(8)
    ]
    try:
        for c in clients:
            c.start()
        while len(answered) < answers:
            assert first.proc.poll() is None, first.log()
            assert any(c.is_alive() for c in clients), first.log()
            time.sleep(0.001)
        metrics = first.metrics()
        killed_at = time.monotonic()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
    finally:
        stop.set()
        for c in clients:
            c.join(60)
        first.stop()
    second = PdpProcess(tmp, bootstrap, topic, env)
    try:
        deadline = time.monotonic() + 120
        while True:
            text = second.metrics()
            if (
                metric(text, "svc_pdp_decision_log_spool_pending") == 0
                and metric(text, "svc_pdp_decision_log_queued") == 0
            ):
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
    finally:
        second.stop()
    return answered, killed_at, metrics


def test_kill_9_loses_no_answered_decision_in_durable_mode(
    tmp_path: Path, kafka_bootstrap: str, topic: str
) -> None:
    env = {"SVC_PDP_LOG_DURABILITY": "durable", "SVC_PDP_LOG_COMMIT_MS": "5"}
    answered, _, _ = _kill_under_load(tmp_path, bootstrap_servers(kafka_bootstrap), topic, env)
    on_topic = {r["qid"] for _, r in read_all(kafka_bootstrap, topic, len(answered), timeout=30)}
    missing = [q for q, _ in answered if q not in on_topic]
    assert len(answered) >= 300
    assert missing == [], f"{len(missing)} of {len(answered)} answered checks are not logged"


def test_kill_9_loses_at_most_the_last_commit_window(
    tmp_path: Path, kafka_bootstrap: str, topic: str
) -> None:
    window_ms = 50
    env = {"SVC_PDP_LOG_DURABILITY": "window", "SVC_PDP_LOG_COMMIT_MS": str(window_ms)}
    answered, killed_at, before = _kill_under_load(
        tmp_path, bootstrap_servers(kafka_bootstrap), topic, env
    )
    # The setting is what the decision point reports.
    assert metric(before, "svc_pdp_decision_log_commit_window_seconds") == window_ms / 1000
    on_topic = {r["qid"] for _, r in read_all(kafka_bootstrap, topic, len(answered), timeout=30)}
    missing = [(q, t) for q, t in answered if q not in on_topic]
    # A record still in memory at the kill was pushed within the last window (plus the time its
    # group's write took: a commit's duration, which the window doubles as an allowance for
    # on this shared machine); its answer came after the push.
    cutoff = killed_at - 2 * window_ms / 1000
    assert [q for q, t in answered if t < cutoff], "no answers before the last window"
    early = [q for q, t in missing if t < cutoff]
    assert early == [], f"{len(early)} records lost from before the last commit window"


# ------------------------------------------------------------------- durable mode, in process


def test_durable_answers_come_after_their_record_is_written(tmp_path: Path) -> None:
    # A window of 200 ms asked for: durable mode writes at once instead of gathering one.
    log = DecisionLog(tmp_path / "spool", commit_ms=200, durability="durable")
    assert log.commit_ms == 0
    engine = Engine.from_bundle_dir(CORP)
    with serve(engine, decision_log=log) as s:
        body = {"principal": ALICE, "action": "view", "resource": DESIGN_DOC}
        for n in range(1, 4):
            r = s.post("/v1/access/evaluation", body)
            assert r.status_code == 200, r.text
            assert log.stats["spooled"] == n and log.stats["queued_now"] == 0
        g = s.stub.Check(
            authz_pb2.CheckRequest(
                principal=authz_pb2.EntityRef(**ALICE),
                action="view",
                resource=authz_pb2.EntityRef(**DESIGN_DOC),
            )
        )
        assert g.decision_qid and log.stats["spooled"] == 4
        b = s.post(
            "/access/v1/evaluations",
            {
                "subject": ALICE,
                "resource": DESIGN_DOC,
                "evaluations": [{"action": {"name": "view"}}] * 3,
            },
        )
        assert b.status_code == 200 and log.stats["spooled"] == 7
        text = s.metrics()
        assert metric(text, "svc_pdp_decision_log_durable") == 1
        assert metric(text, "svc_pdp_decision_log_commit_window_seconds") == 0
        # One wait per record: 3 checks, 1 gRPC check, 3 in the batch.
        assert metric(text, "svc_pdp_decision_log_wait_seconds_count") == 7
        # 3 + 1 + at least 1 group commits; a commit's duration is recorded once its waiters
        # are released, so the last one may land a moment after the answer.
        wait_until(
            lambda: metric(s.metrics(), "svc_pdp_decision_log_commit_duration_seconds_count") >= 5,
            timeout=10,
        )
    log.close()


def test_durable_mode_refuses_to_answer_what_it_cannot_log(tmp_path: Path) -> None:
    # Room for about one record: nothing acknowledges (no shipper), so the spool fills.
    log = DecisionLog(tmp_path / "spool", spool_max_bytes=600, commit_ms=0, durability="durable")
    engine = Engine.from_bundle_dir(CORP)
    with serve(engine, decision_log=log) as s:
        body = {"principal": ALICE, "action": "view", "resource": DESIGN_DOC}
        statuses = [s.post("/v1/access/evaluation", body).status_code for _ in range(3)]
        assert statuses[0] == 200 and statuses[-1] == 503, statuses
        r = s.post("/v1/access/evaluation", body)
        problem = assert_problem(r, 503)
        assert problem["type"] == "urn:svc:problem:decision-log-unavailable"
        assert "spool_max_bytes=600" in problem["detail"]
        assert "log_durability=durable" in problem["detail"]
        with pytest.raises(grpc.RpcError) as e:
            s.stub.Check(
                authz_pb2.CheckRequest(
                    principal=authz_pb2.EntityRef(**ALICE),
                    action="view",
                    resource=authz_pb2.EntityRef(**DESIGN_DOC),
                )
            )
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == problem["detail"]
        assert log.stats["dropped"] >= 3
    # The Python API follows the same rule: a durable push that was dropped raises.
    with pytest.raises(OSError, match="spool_max_bytes=600"):
        log.push(b"Human::alice", b"x" * 1000)
    log.close()


def test_window_mode_answers_at_once_and_counts_what_it_drops(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "spool", spool_max_bytes=600, commit_ms=0)
    engine = Engine.from_bundle_dir(CORP)
    with serve(engine, decision_log=log) as s:
        body = {"principal": ALICE, "action": "view", "resource": DESIGN_DOC}
        assert [s.post("/v1/access/evaluation", body).status_code for _ in range(3)] == [200] * 3
        log.flush()
        assert log.stats["dropped"] >= 1
        assert metric(s.metrics(), "svc_pdp_decision_log_durable") == 0
    log.close()


def test_log_settings_out_of_range_are_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log_commit_ms=5000 is over the limit of 1000 ms"):
        DecisionLog(tmp_path / "a", commit_ms=5000)
    with pytest.raises(ValueError, match="log_durability=`sometimes`"):
        DecisionLog(tmp_path / "b", durability="sometimes")
    r = subprocess.run(
        [str(SVC), "pdp", "--bundle", str(CORP), "--log-commit-ms", "5000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--log-commit-ms" in r.stderr and "1000" in r.stderr, r.stderr
