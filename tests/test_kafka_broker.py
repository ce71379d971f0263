"""The real broker the decision log and audit intake run against
(docs/architecture.md#embedded-defaults-and-production-parts).

Proves from Python (`confluent-kafka`) what the service relies on: an idempotent producer with
acks=all, transactions that commit or abort a whole batch, read_committed consumers, and a producer
that keeps records queued while the broker is down and delivers them, once each, when it is back.
Needs the `kafka_bootstrap` fixture (tests/kafka_fixture.py).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

if os.environ.get("CI"):
    import confluent_kafka
else:
    confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_fixture import DevKafka

PARTITIONS = 3


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    """A fresh topic with PARTITIONS partitions (the dev broker does not auto-create topics)."""
    name = f"test.{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(name, num_partitions=PARTITIONS)]).values():
        fut.result(30)
    yield name
    for fut in admin.delete_topics([name]).values():
        try:
            fut.result(30)
        except Exception:  # the broker may be down after a failed restart test; not our concern
            pass


class Deliveries:
    """Delivery reports of a producer: (key, value, partition, offset) or the error."""

    def __init__(self) -> None:
        self.ok: list[tuple[bytes, bytes, int, int]] = []
        self.errors: list[KafkaError] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.ok.append((msg.key(), msg.value(), msg.partition(), msg.offset()))


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    isolation: str = "read_committed",
    timeout: float = 30,
) -> list[tuple[bytes, bytes]]:
    """Read `count` records of `topic` from the beginning (all partitions); fail on timeout."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        consumer.assign(
            [TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        records: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + timeout
        while len(records) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            records.append((msg.key(), msg.value()))
        # Anything beyond `count` would be a duplicate or a record that should not be visible.
        extra = consumer.consume(num_messages=100, timeout=1.0)
        records += [(m.key(), m.value()) for m in extra if m.error() is None]
        return records
    finally:
        consumer.close()


def batch(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 7}".encode(), f"{prefix}-{i}".encode()) for i in range(n)]


def test_idempotent_producer_acks_all(kafka_bootstrap: str, topic: str) -> None:
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    reports = Deliveries()
    records = batch("idem", 200)
    for key, value in records:
        producer.produce(topic, value, key, on_delivery=reports)
    assert producer.flush(30) == 0
    assert reports.errors == []
    assert len(reports.ok) == len(records)
    # Same key, same partition, in order.
    by_key: dict[bytes, list[tuple[int, int]]] = {}
    for key, _value, partition, offset in reports.ok:
        by_key.setdefault(key, []).append((partition, offset))
    for places in by_key.values():
        assert len({p for p, _ in places}) == 1
        assert [o for _, o in places] == sorted(o for _, o in places)
    assert sorted(consume(kafka_bootstrap, topic, len(records))) == sorted(records)


def test_transactions_commit_batches_and_hide_aborted_ones(
    kafka_bootstrap: str, topic: str
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"test-tx-{uuid.uuid4().hex[:8]}",
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    producer.init_transactions(30)
    aborted, committed = batch("aborted", 50), batch("committed", 50)

    producer.begin_transaction()
    for key, value in aborted:
        producer.produce(topic, value, key)
    producer.flush(30)  # the records reach the log, then the batch is abandoned
    producer.abort_transaction(30)

    producer.begin_transaction()
    for key, value in committed:
        producer.produce(topic, value, key)
    producer.commit_transaction(30)

    assert sorted(consume(kafka_bootstrap, topic, len(committed))) == sorted(committed)
    # The aborted records are in the log: a read_uncommitted consumer sees both batches.
    everything = consume(kafka_bootstrap, topic, 100, isolation="read_uncommitted")
    assert sorted(everything) == sorted(aborted + committed)


def test_create_topics_is_idempotent(dev_kafka: DevKafka) -> None:
    dev_kafka.create_topics()
    out = dev_kafka.create_topics()
    assert "exists  svc.decisions.v1 partitions=3" in out
    assert "exists  svc.events.v1 partitions=3" in out
    meta = AdminClient({"bootstrap.servers": dev_kafka.bootstrap}).list_topics(timeout=10)
    for name in ("svc.decisions.v1", "svc.events.v1"):
        assert len(meta.topics[name].partitions) == 3


def test_records_wait_while_broker_is_down_and_are_delivered_once_after(
    dev_kafka: DevKafka,
    topic: str,
) -> None:
    """The building block for 'broker killed mid-run': nothing lost, nothing doubled."""
    fatal: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": dev_kafka.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 180_000,  # longer than the restart takes
            "reconnect.backoff.max.ms": 1000,
            "error_cb": lambda err: fatal.append(err) if err.fatal() else None,
        }
    )
    reports = Deliveries()
    before = batch("before", 10)
    for key, value in before:
        producer.produce(topic, value, key, on_delivery=reports)
    assert producer.flush(30) == 0 and len(reports.ok) == len(before)

    dev_kafka.stop()
    try:
        during = batch("during", 40)
        for key, value in during:
            producer.produce(topic, value, key, on_delivery=reports)
        assert producer.flush(3) == len(during)  # queued, not delivered, not failed
        assert len(reports.ok) == len(before) and reports.errors == []
    finally:
        dev_kafka.start()

    assert producer.flush(120) == 0
    assert reports.errors == [] and fatal == []
    assert len(reports.ok) == len(before) + len(during)
    assert sorted(consume(dev_kafka.bootstrap, topic, len(before) + len(during))) == sorted(
        before + during
    )
