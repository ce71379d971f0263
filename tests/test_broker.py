"""The embedded topic log of `svc up` (svc.broker): Kafka's contract as the callers use it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from svc.broker import (
    Consumer,
    LocalConsumer,
    LocalLog,
    LocalProducer,
    Producer,
    is_local,
    local_path,
)
from svc.common.topics import bootstrap_servers

TOPIC = "svc.events.v1"


@pytest.fixture
def url(tmp_path: Path) -> str:
    log = LocalLog.open(tmp_path / "broker.db")
    log.create_topics([TOPIC, "other"])
    yield f"local://{tmp_path / 'broker.db'}"
    log.close()


def consumer(url: str, group: str = "g") -> Any:
    c = Consumer({"bootstrap.servers": url, "group.id": group, "enable.auto.commit": False})
    c.subscribe([TOPIC])
    return c


def values(msgs: list[Any]) -> list[bytes]:
    return [m.value() for m in msgs]


def test_urls() -> None:
    assert is_local("local:///x/y.db") and not is_local("localhost:9092")
    assert local_path("local:///x/y.db") == Path("/x/y.db")
    assert bootstrap_servers("local:///x/y.db") == "local:///x/y.db"
    with pytest.raises(ValueError, match="names no file"):
        bootstrap_servers("local://")
    assert type(Producer({"bootstrap.servers": "local:///tmp/svc-broker-test.db"})) is LocalProducer


def test_delivery_at_poll_with_offsets_in_order(url: str) -> None:
    p = Producer({"bootstrap.servers": url})
    got: list[tuple[Any, int]] = []
    for i in range(5):
        p.produce(
            TOPIC,
            value=f"v{i}".encode(),
            key=b"k",
            on_delivery=lambda e, m: got.append((e, m.offset())),
        )
    assert len(p) == 5 and got == []
    assert p.poll(0) == 5
    assert got == [(None, i) for i in range(5)] and len(p) == 0
    c = consumer(url)
    assert values(c.consume(10, 0.1)) == [f"v{i}".encode() for i in range(5)]


def test_transaction_all_or_nothing(url: str) -> None:
    p = Producer({"bootstrap.servers": url, "transactional.id": "t1"})
    with pytest.raises(KafkaException):
        p.produce(TOPIC, b"outside")  # no transaction open
    p.init_transactions(1)
    p.begin_transaction()
    p.produce(TOPIC, b"a1")
    p.produce(TOPIC, b"a2")
    assert p.flush(1) == 0
    c = consumer(url)
    assert c.consume(10, 0.05) == []  # not visible before the commit
    p.abort_transaction(1)
    p.begin_transaction()
    p.produce(TOPIC, b"b1")
    p.produce(TOPIC, b"b2")
    p.commit_transaction(1)
    assert values(c.consume(10, 0.5)) == [b"b1", b"b2"]


def test_transaction_with_unknown_topic_writes_nothing(url: str) -> None:
    p = Producer({"bootstrap.servers": url, "transactional.id": "t2"})
    p.init_transactions(1)
    p.begin_transaction()
    p.produce(TOPIC, b"x")
    p.produce("missing", b"y")
    with pytest.raises(KafkaException) as e:
        p.commit_transaction(1)
    assert e.value.args[0].txn_requires_abort()
    assert consumer(url).consume(10, 0.05) == []
    md = p.list_topics("missing", 1)
    assert md.topics["missing"].error is not None
    assert p.list_topics(TOPIC, 1).topics[TOPIC].error is None


def test_group_offsets_survive_reopen(url: str) -> None:
    p = Producer({"bootstrap.servers": url})
    for i in range(10):
        p.produce(TOPIC, str(i).encode())
    p.flush(1)
    c = consumer(url)
    first = c.consume(4, 0.5)
    assert values(first) == [b"0", b"1", b"2", b"3"]
    c.commit(offsets=[TopicPartition(TOPIC, 0, 4)], asynchronous=False)
    c.consume(3, 0.5)  # read past the commit, then "crash"
    c.close()
    with pytest.raises(RuntimeError):
        c.consume(1, 0)
    again = consumer(url)
    assert values(again.consume(100, 0.5))[0] == b"4"
    assert again.committed([TopicPartition(TOPIC, 0)])[0].offset == 4
    assert again.get_watermark_offsets(TopicPartition(TOPIC, 0)) == (0, 10)
    other_group = consumer(url, "h")
    assert len(other_group.consume(100, 0.5)) == 10


def test_buffer_full_and_purge(url: str) -> None:
    p = Producer({"bootstrap.servers": url, "queue.buffering.max.messages": 2})
    errors: list[KafkaError | None] = []
    p.produce(TOPIC, b"1", on_delivery=lambda e, m: errors.append(e))
    p.produce(TOPIC, b"2", on_delivery=lambda e, m: errors.append(e))
    with pytest.raises(BufferError):
        p.produce(TOPIC, b"3")
    p.purge()
    p.poll(0)
    assert [e.code() for e in errors if e is not None] == [KafkaError._PURGE_QUEUE] * 2
    assert consumer(url).consume(10, 0.05) == []


def test_trim_by_age(url: str) -> None:
    p = Producer({"bootstrap.servers": url})
    p.produce(TOPIC, b"old", timestamp=1_000)
    p.produce(TOPIC, b"new")
    p.flush(1)
    log = LocalLog.open(local_path(url))
    assert log.trim(retention_ms=60_000) == 1
    assert values(consumer(url).consume(10, 0.5)) == [b"new"]
    assert log.watermarks(TOPIC) == (1, 2)


def test_another_process_writes_are_seen(url: str) -> None:
    code = (
        "from svc.broker import Producer\n"
        f"p = Producer({{'bootstrap.servers': {url!r}, 'transactional.id': 'x'}})\n"
        "p.init_transactions(1); p.begin_transaction()\n"
        f"[p.produce({TOPIC!r}, str(i).encode()) for i in range(100)]\n"
        "p.commit_transaction(1)\n"
    )
    c = consumer(url)
    subprocess.run([sys.executable, "-c", code], check=True)
    got: list[Any] = []
    while len(got) < 100:
        batch = c.consume(1000, 2.0)
        assert batch, "records written by another process never arrived"
        got += batch
    assert [m.offset() for m in got] == list(range(100))


def test_consumer_needs_group(url: str) -> None:
    with pytest.raises(ValueError, match=r"group\.id"):
        LocalConsumer({"bootstrap.servers": url})
