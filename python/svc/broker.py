"""Broker clients: Kafka through ``confluent-kafka``, or the embedded topic log of ``svc up``.

Production and the test suite use a Kafka-protocol broker; ``svc up`` on a laptop uses an
in-process topic log with the same records, transactions and consumer offsets
(docs/architecture.md#embedded-defaults-and-production-parts). This module is that seam.
The decision log's shipper, the intake's transactional producers and the history loader build
their clients with ``Producer(conf)`` / ``Consumer(conf)`` from here, with the librdkafka
configuration they always used. When ``bootstrap.servers`` is a ``local://`` URL they get a
``LocalProducer`` / ``LocalConsumer`` on a ``LocalLog`` instead of a librdkafka handle; every
other value goes to ``confluent_kafka`` unchanged. Both kinds are typed as ``ProducerLike`` /
``ConsumerLike``: ``Protocol``s (PEP 544) of exactly the ``confluent_kafka`` calls svc makes,
which ``confluent_kafka.Producer`` / ``Consumer`` (their type stubs) and the local clients
both satisfy, as mypy checks.

The local log is one SQLite file (WAL) in the data directory, so it keeps records across
restarts like a broker does, and several processes may share it (SQLite's file locking). What it
keeps of Kafka's contract, and what it does not:

* a topic is one partition; offsets are dense from 0 and assigned when a write commits;
* a transaction (``begin_transaction`` .. ``commit_transaction``) is one SQLite transaction:
  the whole batch becomes visible at once or, after ``abort_transaction``, never (what
  ``read_committed`` consumers of Kafka see);
* a plain ``produce`` is delivered, and its delivery callback served, at the next ``poll`` or
  ``flush``, after the write committed (``acks=all`` on one replica: the fsync of the WAL);
* consumer groups keep committed offsets in the same file; a group has one member (no
  rebalancing: the member owns every partition of the topics it subscribed);
* records older than ``retention_ms`` are removed by ``LocalLog.trim`` (Kafka's
  ``retention.ms``; ``svc up`` calls it hourly);
* producers never see a broker outage (the file is local), so the outage paths of the callers
  are exercised against Kafka only.

Why not a library: the Python "Kafka mocks" on PyPI keep records in memory only (records would
be lost on restart) and are meant for unit tests; there is no maintained embeddable Kafka in
Python. See docs/dependencies.md.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

__all__ = [
    "LOCAL_SCHEME",
    "Consumer",
    "ConsumerLike",
    "LocalConsumer",
    "LocalLog",
    "LocalMessage",
    "LocalProducer",
    "MessageLike",
    "Producer",
    "ProducerLike",
    "is_local",
    "local_path",
]

#: ``bootstrap.servers`` (and broker URL) prefix of the embedded log: ``local:///abs/path.db``.
LOCAL_SCHEME = "local://"

#: librdkafka's "no offset" value (``OFFSET_INVALID``).
OFFSET_INVALID = -1001

#: Kafka's default ``retention.ms``: seven days.
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000

DeliveryCallback = Callable[[KafkaError | None, Any], None]


class MessageLike(Protocol):
    """The accessors of ``confluent_kafka.Message`` svc reads (``LocalMessage`` has them too)."""

    def topic(self) -> str | None:
        """The record's topic."""
        ...

    def partition(self) -> int | None:
        """The record's partition."""
        ...

    def offset(self) -> int | None:
        """The record's offset."""
        ...

    def key(self) -> bytes | None:
        """The record's key."""
        ...

    def value(self) -> bytes | None:
        """The record's value."""
        ...

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, epoch milliseconds)."""
        ...

    def error(self) -> KafkaError | None:
        """The error of an error event, None for a record."""
        ...


class ProducerLike(Protocol):
    """The ``confluent_kafka.Producer`` calls svc makes.

    The decision log's shipper produces and polls; the intake's producers also use the
    transactional calls (confluent-kafka's API reference:
    https://docs.confluent.io/platform/current/clients/confluent-kafka-python/html/index.html).
    ``Producer(conf)`` returns one.
    """

    def __len__(self) -> int:
        """Records queued and not delivered yet (with callbacks not served yet)."""
        ...

    def produce(
        self,
        topic: str,
        value: bytes | str | None = ...,
        key: bytes | str | None = ...,
        *,
        on_delivery: DeliveryCallback | None = ...,
    ) -> None:
        """Queues one record; `on_delivery` is served by ``poll``/``flush``."""
        ...

    def poll(self, timeout: float) -> int:
        """Serves delivery callbacks, waiting up to `timeout` s; returns how many."""
        ...

    def flush(self, timeout: float) -> int:
        """Waits up to `timeout` s for every queued record; returns how many are left."""
        ...

    def purge(self, in_queue: bool = ..., in_flight: bool = ..., blocking: bool = ...) -> None:
        """Drops queued (and in-flight) records; their callbacks report a purge."""
        ...

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any:
        """Cluster metadata (``.topics``: name -> metadata with ``.error``)."""
        ...

    def init_transactions(self, timeout: float) -> None:
        """Registers the ``transactional.id`` (fencing an older producer with it)."""
        ...

    def begin_transaction(self) -> None:
        """Starts a transaction."""
        ...

    def commit_transaction(self, timeout: float) -> None:
        """Commits the transaction, waiting up to `timeout` s."""
        ...

    def abort_transaction(self, timeout: float) -> None:
        """Aborts the transaction, waiting up to `timeout` s."""
        ...


class ConsumerLike(Protocol):
    """The ``confluent_kafka.Consumer`` calls svc makes (the history loader's).

    ``Consumer(conf)`` returns one.
    """

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Any, list[TopicPartition]], None] | None = ...,
        on_revoke: Callable[[Any, list[TopicPartition]], None] | None = ...,
        on_lost: Callable[[Any, list[TopicPartition]], None] | None = ...,
    ) -> None:
        """Joins the group for `topics`; the callbacks run inside ``consume``."""
        ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[MessageLike]:
        """Up to `num_messages` records (or error events), waiting up to `timeout` s."""
        ...

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition] | None:
        """Commits `offsets` synchronously."""
        ...

    def assignment(self) -> list[TopicPartition]:
        """The partitions assigned to this member."""
        ...

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The next offset to read per partition."""
        ...

    def committed(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]:
        """The group's committed offsets of `partitions`."""
        ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]:
        """(low, high) offsets of `partition`."""
        ...

    def close(self) -> None:
        """Leaves the group and closes the consumer."""
        ...


def is_local(bootstrap: str) -> bool:
    """Whether a bootstrap string (or broker URL) names the embedded log (``local://...``)."""
    return bootstrap.strip().startswith(LOCAL_SCHEME)


def local_path(bootstrap: str) -> Path:
    """The SQLite file of a ``local://`` bootstrap string.

    Args:
        bootstrap: ``local:///absolute/path`` or ``local://relative/path``.

    Raises:
        ValueError: not a ``local://`` URL, or the path is empty.

    """
    b = bootstrap.strip()
    if not b.startswith(LOCAL_SCHEME):
        raise ValueError(f"`{bootstrap}` is not a {LOCAL_SCHEME} broker URL")
    rest = b[len(LOCAL_SCHEME) :]
    if not rest:
        raise ValueError(
            f"broker URL `{bootstrap}` names no file; expected local:///path/to/log.db"
        )
    return Path(rest)


def Producer(conf: dict[str, Any]) -> ProducerLike:
    """A producer for ``conf``: ``LocalProducer`` for ``local://``, else ``confluent_kafka``'s.

    Args:
        conf: librdkafka producer settings (``bootstrap.servers`` decides which client).

    Raises:
        KafkaException: librdkafka refused the settings.
        sqlite3.Error: the local log file cannot be opened.

    """
    if is_local(str(conf.get("bootstrap.servers", ""))):
        return LocalProducer(conf)
    return confluent_kafka.Producer(conf)


def Consumer(conf: dict[str, Any]) -> ConsumerLike:
    """A consumer for ``conf``: ``LocalConsumer`` for ``local://``, else ``confluent_kafka``'s.

    Args:
        conf: librdkafka consumer settings (``bootstrap.servers`` decides which client).

    Raises:
        KafkaException: librdkafka refused the settings.
        ValueError: a local consumer without ``group.id``.
        sqlite3.Error: the local log file cannot be opened.

    """
    if is_local(str(conf.get("bootstrap.servers", ""))):
        return LocalConsumer(conf)
    return confluent_kafka.Consumer(conf)


# -- the log


_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    topic TEXT NOT NULL,
    offset INTEGER NOT NULL,
    key BLOB,
    value BLOB,
    ts_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS next_offsets (topic TEXT PRIMARY KEY, next INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic)
) WITHOUT ROWID;
"""


class LocalLog:
    """Topics in one SQLite file: append in transactions, read by offset, group offsets.

    One instance per file per process (``LocalLog.open``), shared by the producers and consumers
    of that process: a lock serialises its connection, and a condition wakes consumers when a
    write commits. Writers in other processes are seen by polling (every 50 ms).

    Args:
        path: the SQLite file (created with its parent directory when missing).

    Raises:
        sqlite3.Error: the file cannot be opened or is not a log.

    """

    _open: ClassVar[dict[Path, LocalLog]] = {}
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            str(path), timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self.appended = threading.Condition()

    @classmethod
    def open(cls, path: Path) -> LocalLog:
        """The process's shared instance for ``path`` (opened on first use)."""
        key = path.resolve()
        with cls._open_lock:
            log = cls._open.get(key)
            if log is None:
                log = cls._open[key] = cls(key)
            return log

    def close(self) -> None:
        """Closes the connection and forgets the shared instance."""
        with LocalLog._open_lock:
            if LocalLog._open.get(self.path) is self:
                del LocalLog._open[self.path]
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN IMMEDIATE``: committed at the end, rolled back on error.

        ``IMMEDIATE`` takes SQLite's write lock at once, so offsets read inside are not raced by
        another process's writer.
        """
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # -- topics

    def create_topics(self, names: Iterable[str]) -> None:
        """Creates topics that do not exist yet (idempotent)."""
        now = _now_ms()
        with self._lock:
            self._db.executemany(
                "INSERT OR IGNORE INTO topics (name, created_ms) VALUES (?, ?)",
                [(n, now) for n in names],
            )

    def topics(self) -> set[str]:
        """Names of the existing topics."""
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT name FROM topics")}

    # -- records

    def append(self, records: Sequence[tuple[str, bytes | None, bytes | None, int]]) -> list[int]:
        """Appends (topic, key, value, ts_ms) records in one transaction.

        Returns:
            The offset given to each record, in order.

        Raises:
            KafkaException: a topic does not exist (``UNKNOWN_TOPIC_OR_PART``); nothing is
                written.
            sqlite3.Error: the write failed; nothing is written.

        """
        if not records:
            return []
        offsets: list[int] = []
        with self._transaction() as db:
            known = {r[0] for r in db.execute("SELECT name FROM topics")}
            nexts: dict[str, int] = {}
            rows = []
            for topic, key, value, ts in records:
                if topic not in known:
                    raise KafkaException(
                        KafkaError(
                            KafkaError.UNKNOWN_TOPIC_OR_PART,
                            f"topic `{topic}` does not exist in {self.path}",
                        )
                    )
                n = nexts.get(topic)
                if n is None:
                    row = db.execute(
                        "SELECT next FROM next_offsets WHERE topic = ?", (topic,)
                    ).fetchone()
                    n = int(row[0]) if row else 0
                rows.append((topic, n, key, value, ts))
                offsets.append(n)
                nexts[topic] = n + 1
            db.executemany(
                "INSERT INTO records (topic, offset, key, value, ts_ms) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            db.executemany(
                "INSERT INTO next_offsets (topic, next) VALUES (?, ?) "
                "ON CONFLICT (topic) DO UPDATE SET next = excluded.next",
                list(nexts.items()),
            )
        with self.appended:
            self.appended.notify_all()
        return offsets

    def read(
        self, topic: str, offset: int, limit: int
    ) -> list[tuple[int, bytes | None, bytes | None, int]]:
        """Up to ``limit`` records of ``topic`` from ``offset`` on: (offset, key, value, ts_ms)."""
        with self._lock:
            return list(
                self._db.execute(
                    "SELECT offset, key, value, ts_ms FROM records "
                    "WHERE topic = ? AND offset >= ? ORDER BY offset LIMIT ?",
                    (topic, offset, limit),
                )
            )

    def watermarks(self, topic: str) -> tuple[int, int]:
        """(low, high) offsets of ``topic``: the first kept record and the next to be written."""
        with self._lock:
            row = self._db.execute(
                "SELECT next FROM next_offsets WHERE topic = ?", (topic,)
            ).fetchone()
            high = int(row[0]) if row else 0
            low_row = self._db.execute(
                "SELECT MIN(offset) FROM records WHERE topic = ?", (topic,)
            ).fetchone()
        low = int(low_row[0]) if low_row and low_row[0] is not None else high
        return low, high

    def trim(self, retention_ms: int = DEFAULT_RETENTION_MS, now_ms: int | None = None) -> int:
        """Removes records older than ``retention_ms`` (Kafka's time retention).

        Returns:
            The number of records removed.

        """
        cutoff = (now_ms if now_ms is not None else _now_ms()) - retention_ms
        with self._lock:
            cur = self._db.execute("DELETE FROM records WHERE ts_ms < ?", (cutoff,))
            return cur.rowcount

    # -- consumer groups

    def commit(self, group_id: str, offsets: Sequence[tuple[str, int]]) -> None:
        """Stores a group's next offset per topic (one transaction)."""
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO group_offsets (group_id, topic, offset) VALUES (?, ?, ?) "
                "ON CONFLICT (group_id, topic) DO UPDATE SET offset = excluded.offset",
                [(group_id, t, o) for t, o in offsets],
            )

    def committed(self, group_id: str, topic: str) -> int | None:
        """A group's committed next offset of ``topic``, or None when it has none."""
        with self._lock:
            row = self._db.execute(
                "SELECT offset FROM group_offsets WHERE group_id = ? AND topic = ?",
                (group_id, topic),
            ).fetchone()
        return int(row[0]) if row else None

    def wait_for_append(self, timeout: float) -> None:
        """Sleeps until a write of this process commits, at most ``timeout`` s.

        Never longer than 50 ms, so writes of other processes are seen soon.
        """
        with self.appended:
            self.appended.wait(min(timeout, 0.05))


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- clients


@dataclass
class _TopicMeta:
    """The part of ``confluent_kafka.admin.TopicMetadata`` callers read."""

    topic: str
    error: KafkaError | None


@dataclass
class _ClusterMeta:
    """The part of ``confluent_kafka.admin.ClusterMetadata`` callers read."""

    topics: dict[str, _TopicMeta]


class LocalMessage:
    """A record as ``confluent_kafka.Message`` presents it (the accessors callers use)."""

    __slots__ = ("_key", "_offset", "_topic", "_ts", "_value")

    def __init__(
        self, topic: str, offset: int, key: bytes | None, value: bytes | None, ts_ms: int
    ) -> None:
        self._topic = topic
        self._offset = offset
        self._key = key
        self._value = value
        self._ts = ts_ms

    def topic(self) -> str:
        """The topic."""
        return self._topic

    def partition(self) -> int:
        """Always 0: a local topic has one partition."""
        return 0

    def offset(self) -> int:
        """The record's offset (``-1001`` before the write committed)."""
        return self._offset

    def key(self) -> bytes | None:
        """The record's key."""
        return self._key

    def value(self) -> bytes | None:
        """The record's value."""
        return self._value

    def timestamp(self) -> tuple[int, int]:
        """(``TIMESTAMP_CREATE_TIME``, epoch milliseconds)."""
        return (confluent_kafka.TIMESTAMP_CREATE_TIME, self._ts)

    def headers(self) -> None:
        """Local records carry no headers."""
        return None

    def error(self) -> None:
        """Local records are never error events."""
        return None


class LocalProducer:
    """``confluent_kafka.Producer``'s interface over a ``LocalLog`` (see the module docs).

    Takes the same configuration dict; reads ``bootstrap.servers`` (``local://path``),
    ``transactional.id`` (makes it transactional), ``queue.buffering.max.messages`` (records
    held before ``produce`` raises ``BufferError``, default 100,000) and ``error_cb`` (never
    called: the log has no outages). Other settings are accepted and ignored.

    Raises:
        ValueError: ``bootstrap.servers`` is not a ``local://`` URL.
        sqlite3.Error: the log file cannot be opened.

    """

    def __init__(self, conf: dict[str, Any]) -> None:
        self._log = LocalLog.open(local_path(str(conf["bootstrap.servers"])))
        self._transactional = bool(conf.get("transactional.id"))
        self._max = int(conf.get("queue.buffering.max.messages", 100_000))
        self._pending: list[tuple[str, bytes | None, bytes | None, int, DeliveryCallback | None]]
        self._pending = []
        self._done: list[tuple[DeliveryCallback, LocalMessage]] = []
        self._in_txn = False
        self._inited = False

    def __len__(self) -> int:
        """Records produced and not delivered yet, plus callbacks not served yet."""
        return len(self._pending) + len(self._done)

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        callback: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """Queues one record (written at the next ``poll``/``flush``, or at the commit).

        Raises:
            BufferError: ``queue.buffering.max.messages`` records are waiting already.
            KafkaException: a transactional producer outside a transaction (``_STATE``).

        """
        if self._transactional and not self._in_txn:
            raise KafkaException(KafkaError(KafkaError._STATE, "produce outside a transaction"))
        if len(self._pending) >= self._max:
            raise BufferError("Local: Queue full")
        self._pending.append(
            (topic, _b(key), _b(value), timestamp or _now_ms(), on_delivery or callback)
        )

    def _write(self) -> None:
        """Writes every pending record in one transaction and queues their callbacks."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            offsets = self._log.append([(t, k, v, ts) for t, k, v, ts, _ in pending])
        except KafkaException as e:
            for t, k, v, ts, cb in pending:
                if cb is not None:
                    self._done.append((_failed(cb, e.args[0]), LocalMessage(t, -1001, k, v, ts)))
            return
        for (t, k, v, ts, cb), off in zip(pending, offsets, strict=True):
            if cb is not None:
                self._done.append((cb, LocalMessage(t, off, k, v, ts)))

    def _serve(self) -> int:
        done, self._done = self._done, []
        for cb, msg in done:
            cb(None, msg)
        return len(done)

    def poll(self, timeout: float | None = None) -> int:
        """Writes what is pending (outside a transaction) and serves delivery callbacks.

        Returns:
            The number of callbacks served.

        """
        if not self._in_txn:
            self._write()
        return self._serve()

    def flush(self, timeout: float | None = None) -> int:
        """Like ``poll``; inside a transaction the records wait for the commit.

        Returns:
            0: nothing is left undelivered (inside a transaction, nothing can fail any more).

        """
        self.poll(0)
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Drops the pending records; their callbacks get ``_PURGE_QUEUE`` at the next poll."""
        pending, self._pending = self._pending, []
        err = KafkaError(KafkaError._PURGE_QUEUE, "purged")
        for t, k, v, ts, cb in pending:
            if cb is not None:
                self._done.append((_failed(cb, err), LocalMessage(t, -1001, k, v, ts)))

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _ClusterMeta:
        """Topic metadata: every topic, or just ``topic`` (with an error when it is missing)."""
        names = self._log.topics()
        if topic is None:
            return _ClusterMeta({n: _TopicMeta(n, None) for n in names})
        err = (
            None
            if topic in names
            else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic `{topic}` does not exist")
        )
        return _ClusterMeta({topic: _TopicMeta(topic, err)})

    # -- transactions

    def init_transactions(self, timeout: float | None = None) -> None:
        """Marks the producer ready for transactions.

        Raises:
            KafkaException: the producer has no ``transactional.id`` (``_NOT_CONFIGURED``).

        """
        if not self._transactional:
            raise KafkaException(
                KafkaError(KafkaError._NOT_CONFIGURED, "no transactional.id configured")
            )
        self._inited = True

    def begin_transaction(self) -> None:
        """Opens a transaction.

        Raises:
            KafkaException: ``init_transactions`` was not called, or one is open (``_STATE``).

        """
        if not self._inited or self._in_txn:
            raise KafkaException(KafkaError(KafkaError._STATE, "cannot begin a transaction now"))
        self._in_txn = True

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Writes the transaction's records in one SQLite transaction and serves callbacks.

        Raises:
            KafkaException: no transaction is open (``_STATE``), or a topic is missing (the
                transaction is then aborted: nothing of it is written; ``txn_requires_abort``).

        """
        if not self._in_txn:
            raise KafkaException(KafkaError(KafkaError._STATE, "no transaction is open"))
        pending, self._pending = self._pending, []
        try:
            self._log.append([(t, k, v, ts) for t, k, v, ts, _ in pending])
        except KafkaException as e:
            self._in_txn = False
            raise KafkaException(
                KafkaError(e.args[0].code(), str(e.args[0]), txn_requires_abort=True)
            ) from None
        self._in_txn = False

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drops the open transaction's records (none of them is ever visible)."""
        self._pending = []
        self._in_txn = False


class LocalConsumer:
    """``confluent_kafka.Consumer``'s interface over a ``LocalLog`` (see the module docs).

    Reads ``bootstrap.servers`` (``local://path``), ``group.id`` (required),
    ``auto.offset.reset`` (``earliest``, the default here, or ``latest``) and
    ``enable.auto.commit`` (commits the position after each ``consume``/``poll`` when true).
    Local records are always committed ones, so ``isolation.level`` needs no handling.

    Raises:
        ValueError: no ``group.id``, or ``bootstrap.servers`` is not a ``local://`` URL.
        sqlite3.Error: the log file cannot be opened.

    """

    def __init__(self, conf: dict[str, Any]) -> None:
        group = conf.get("group.id")
        if not group:
            raise ValueError("a consumer needs group.id")
        self._group = str(group)
        self._log = LocalLog.open(local_path(str(conf["bootstrap.servers"])))
        self._latest = str(conf.get("auto.offset.reset", "earliest")) in ("latest", "largest")
        self._auto_commit = bool(conf.get("enable.auto.commit", False))
        self._positions: dict[str, int] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Consumer closed")

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., None] | None = None,
        on_revoke: Callable[..., None] | None = None,
        on_lost: Callable[..., None] | None = None,
    ) -> None:
        """Owns every topic in ``topics`` from its committed offset (or the reset point)."""
        self._check_open()
        self._positions = {}
        for t in topics:
            committed = self._log.committed(self._group, t)
            if committed is None:
                low, high = self._log.watermarks(t)
                committed = high if self._latest else low
            self._positions[t] = committed
        if on_assign is not None:
            on_assign(self, self.assignment())

    def assignment(self) -> list[TopicPartition]:
        """The partitions owned (partition 0 of each subscribed topic)."""
        return [TopicPartition(t, 0) for t in self._positions]

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[LocalMessage]:
        """Up to ``num_messages`` records, waiting at most ``timeout`` s for the first one.

        Raises:
            RuntimeError: the consumer is closed.

        """
        self._check_open()
        deadline = time.monotonic() + (timeout if timeout >= 0 else 1e9)
        while True:
            out: list[LocalMessage] = []
            for topic, pos in self._positions.items():
                room = num_messages - len(out)
                if room <= 0:
                    break
                rows = self._log.read(topic, pos, room)  # past trimmed records too
                for off, key, value, ts in rows:
                    out.append(LocalMessage(topic, off, key, value, ts))
                if rows:
                    self._positions[topic] = rows[-1][0] + 1
            if out:
                if self._auto_commit:
                    self.commit(asynchronous=False)
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            self._log.wait_for_append(left)

    def poll(self, timeout: float = -1) -> LocalMessage | None:
        """One record, or None after ``timeout`` s."""
        msgs = self.consume(1, timeout)
        return msgs[0] if msgs else None

    def commit(
        self,
        message: LocalMessage | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commits ``offsets``, the offset after ``message``, or the current positions.

        Returns:
            The committed partitions when ``asynchronous`` is false, else None.

        Raises:
            RuntimeError: the consumer is closed.

        """
        self._check_open()
        if offsets is not None:
            pairs = [(tp.topic, tp.offset) for tp in offsets]
        elif message is not None:
            pairs = [(message.topic(), message.offset() + 1)]
        else:
            pairs = list(self._positions.items())
        self._log.commit(self._group, pairs)
        if asynchronous:
            return None
        return [TopicPartition(t, 0, o) for t, o in pairs]

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """The group's committed offsets (``OFFSET_INVALID`` where none)."""
        out = []
        for tp in partitions:
            c = self._log.committed(self._group, tp.topic)
            out.append(TopicPartition(tp.topic, 0, OFFSET_INVALID if c is None else c))
        return out

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The next offset this consumer reads per partition."""
        return [
            TopicPartition(tp.topic, 0, self._positions.get(tp.topic, OFFSET_INVALID))
            for tp in partitions
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(low, high) offsets of the partition's topic."""
        return self._log.watermarks(partition.topic)

    def close(self) -> None:
        """Closes the consumer (commits nothing).

        Raises:
            RuntimeError: it was closed already (as ``confluent_kafka`` does).

        """
        self._check_open()
        self._closed = True


def _b(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def _failed(cb: DeliveryCallback, err: KafkaError) -> DeliveryCallback:
    def call(_: KafkaError | None, msg: Any) -> None:
        cb(err, msg)

    return call
