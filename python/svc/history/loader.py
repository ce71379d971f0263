"""The history loader: ``svc.decisions.v1`` and ``svc.events.v1`` into ClickHouse (SPEC 1, 6, 8).

A ``confluent-kafka`` consumer in group ``svc-history`` reads both topics in batches (up to
``batch_records`` records or ``batch_ms`` milliseconds), stores each batch with one INSERT per
topic (``svc.history.store.store``; the engine parses, checks and routes every record), and only
then commits the batch's offsets, synchronously. Delivery is at least once:

* a loader that dies after storing and before committing re-reads those records when it (or
  another member of the group) restarts; the tables drop the copies by ``qid`` / ``ingest_id``
  (``ReplacingMergeTree`` read with ``FINAL``), so counts stay exact;
* a batch whose INSERT fails is retried (with backoff) and never committed before it is stored;
* batches are stored by a worker thread while the next one is read (chDB and the HTTP client
  release the GIL while the engine works), and committed in order, each after its own store;
* before partitions are taken away in a rebalance, the batches read so far are stored and
  committed;
* after an unexpected error the pending batch is dropped uncommitted and the error propagates.

Junk never stops it: records that are not JSON or lack required fields go to ``rejected`` with
the reason (counted in ``LoaderStats.rejected`` and logged per batch).

Retention (SPEC 8: ``analytics.retentionDays``, 0 keeps all, may change at any time): at start
and every ``retention_interval`` seconds the loader reads the setting again (``retention_days``
may be a callable) and drops the whole day partitions older than it
(``svc.history.store.apply_retention``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import confluent_kafka
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from svc.broker import Consumer
from svc.history.store import Kind, Record, apply_retention, store
from svc.pdp.decision_log import DECISIONS_TOPIC

__all__ = [
    "DEFAULT_GROUP",
    "EVENTS_TOPIC",
    "Batch",
    "Loader",
    "LoaderStats",
    "consumer_config",
]

log = logging.getLogger("svc.history.loader")

#: The intake's topic (SPEC 6).
EVENTS_TOPIC = "svc.events.v1"

#: Consumer group of the history loader (offsets committed there).
DEFAULT_GROUP = "svc-history"


def consumer_config(bootstrap: str, group_id: str = DEFAULT_GROUP) -> dict[str, Any]:
    """The loader's consumer settings.

    Offsets are committed by the loader only (no auto commit, no auto offset store); a new
    group starts at the beginning of each topic; ``read_committed`` hides aborted intake
    transactions (DESIGN 2).

    Args:
        bootstrap: bootstrap servers (``host:port`` list; see
            ``svc.pdp.decision_log.bootstrap_servers``).
        group_id: consumer group.

    Returns:
        A librdkafka configuration dict.

    """
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        "client.id": "svc-history-loader",
    }


@dataclass
class LoaderStats:
    """Counters of one loader since it was made (all cumulative).

    Attributes:
        batches: batches stored and committed (or whose commit was attempted).
        records: broker records stored (valid and rejected; re-read copies count again).
        rejected: records the engine routed to ``rejected`` in those batches.
        commits: successful offset commits.
        commit_failures: commits that failed (the records stay stored; they are re-read).
        store_failures: INSERT attempts that failed and were retried.
        retention_runs: retention passes that completed.
        dropped_partitions: (table, day) partitions dropped by retention.

    """

    batches: int = 0
    records: int = 0
    rejected: int = 0
    commits: int = 0
    commit_failures: int = 0
    store_failures: int = 0
    retention_runs: int = 0
    dropped_partitions: int = 0


@dataclass
class Batch:
    """Records read but not yet committed.

    Attributes:
        records: per kind, the (topic, partition, offset, key, value) records in arrival order.
        next_offsets: per (topic, partition), the offset to commit (last offset read + 1).

    """

    records: dict[Kind, list[Record]] = field(
        default_factory=lambda: {"decisions": [], "events": []}
    )
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(r) for r in self.records.values())


class _Stopped(Exception):
    """The loader was asked to stop while a batch was still unstored."""


class Loader:
    """Consumes the decision and event topics into the history tables (see the module docs).

    Args:
        client: a client from ``svc.history.connect`` on a migrated database.
        bootstrap: Kafka bootstrap servers (``host:port`` list).
        decisions_topic: topic of decision records, or None to not read one.
        events_topic: topic of intake events, or None to not read one.
        group_id: consumer group (offsets are committed there).
        batch_records: most records per batch.
        batch_ms: longest time, in milliseconds, a batch collects records before it is stored.
        retention_days: ``analytics.retentionDays`` (0 keeps all), or a callable returning it,
            read again at each retention pass (SPEC 8: it may change at any time).
        retention_interval: seconds between retention passes (one also runs at start).
        consumer_overrides: more librdkafka settings (security, timeouts); they win.
        after_store: called with the batch after it is stored and before its offsets are
            committed (a test hook: raising there is a crash between store and commit).
        now: the clock retention uses (UTC).

    Raises:
        ValueError: neither topic is given, or a size is not positive.

    """

    def __init__(
        self,
        client: Client,
        bootstrap: str,
        *,
        decisions_topic: str | None = DECISIONS_TOPIC,
        events_topic: str | None = EVENTS_TOPIC,
        group_id: str = DEFAULT_GROUP,
        batch_records: int = 50_000,
        batch_ms: int = 1000,
        retention_days: int | Callable[[], int] = 0,
        retention_interval: float = 3600.0,
        consumer_overrides: dict[str, Any] | None = None,
        after_store: Callable[[Batch], None] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if decisions_topic is None and events_topic is None:
            raise ValueError("the loader needs a decisions topic, an events topic, or both")
        if batch_records <= 0 or batch_ms <= 0:
            raise ValueError("batch_records and batch_ms must be positive")
        self.client = client
        self.kinds: dict[str, Kind] = {}
        if decisions_topic is not None:
            self.kinds[decisions_topic] = "decisions"
        if events_topic is not None:
            self.kinds[events_topic] = "events"
        self.batch_records = batch_records
        self.batch_ms = batch_ms
        self.retention_days = retention_days
        self.retention_interval = retention_interval
        self.after_store = after_store
        self.now = now
        self.stats = LoaderStats()
        self._batch = Batch()
        self._inflight: tuple[Batch, Future[int]] | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._last_retention: float | None = None
        conf = consumer_config(bootstrap, group_id)
        conf["error_cb"] = self._on_error
        conf.update(consumer_overrides or {})
        self.consumer = Consumer(conf)
        self._subscribed = False

    # -- librdkafka callbacks (run inside consume() on the loader's thread)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
            log.debug("history loader: %s", err)
        else:
            log.warning("history loader: consumer error: %s", err)

    def _on_revoke(
        self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]
    ) -> None:
        """Stores and commits what was read before the partitions go to another member."""
        try:
            self._flush()
        except _Stopped:
            self._drop()

    def _on_lost(
        self, consumer: confluent_kafka.Consumer, partitions: list[TopicPartition]
    ) -> None:
        """Partitions lost without a clean revoke: their offsets can no longer be committed.

        The batch being stored is finished (its commit may fail; the records are then read
        again by whoever owns the partitions, and dropped there as copies).
        """
        lost = {(tp.topic, tp.partition) for tp in partitions}
        for records in self._batch.records.values():
            records[:] = [r for r in records if (r[0], r[1]) not in lost]
        for key in lost:
            self._batch.next_offsets.pop(key, None)

    # -- the loop

    def stop(self) -> None:
        """Asks ``run`` to store and commit what it holds and return (thread-safe)."""
        self._stop.set()

    def _subscribe(self) -> None:
        if not self._subscribed:
            self.consumer.subscribe(
                list(self.kinds), on_revoke=self._on_revoke, on_lost=self._on_lost
            )
            self._subscribed = True

    def poll(self) -> int:
        """Reads one batch into memory (not stored yet).

        Returns after ``batch_records`` records, ``batch_ms`` milliseconds, or a stop request.

        Returns:
            The number of records now pending.

        Raises:
            confluent_kafka.KafkaException: a fatal consumer error.

        """
        self._subscribe()
        deadline = time.monotonic() + self.batch_ms / 1000
        kinds = self.kinds
        while not self._stop.is_set():
            room = self.batch_records - len(self._batch)
            left = deadline - time.monotonic()
            if room <= 0 or left <= 0:
                break
            msgs = self.consumer.consume(num_messages=min(room, 10_000), timeout=min(left, 0.5))
            # After consume(): a rebalance callback inside it may have flushed the batch.
            batch = self._batch
            lists = {topic: batch.records[kind] for topic, kind in kinds.items()}
            next_offsets = batch.next_offsets
            for m in msgs:
                if m.error() is not None:
                    self._error(m)
                    continue
                topic = m.topic() or ""
                partition = m.partition() or 0
                offset = m.offset() or 0
                records = lists.get(topic)
                if records is not None:
                    records.append((topic, partition, offset, m.key() or b"", m.value() or b""))
                next_offsets[(topic, partition)] = offset + 1
        return len(self._batch)

    def _error(self, m: Message) -> None:
        err = m.error()
        if err is None:
            return
        if err.fatal():
            raise KafkaException(err)
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("history loader: %s", err)

    def _store(self, kind: Kind, records: list[Record]) -> None:
        """Stores `records`, retrying until it works or the loader is stopped."""
        delay = 0.2
        while True:
            try:
                store(self.client, kind, records)
                return
            except ClickHouseError as e:
                self.stats.store_failures += 1
                log.warning(
                    "history loader: storing %d %s failed (%s); retrying", len(records), kind, e
                )
            if self._stop.wait(delay):
                raise _Stopped
            delay = min(delay * 2, 10.0)

    def _count_rejected(self, batch: Batch) -> int:
        """Rejected rows of this batch's offsets (a lookup on the rejected key)."""
        ranges: dict[tuple[str, int], list[int]] = {}
        for records in batch.records.values():
            for topic, partition, offset, _, _ in records:
                r = ranges.setdefault((topic, partition), [offset, offset])
                r[0] = min(r[0], offset)
                r[1] = max(r[1], offset)
        if not ranges:
            return 0
        params: dict[str, Any] = {}
        conds = []
        for i, ((topic, partition), (lo, hi)) in enumerate(ranges.items()):
            params.update({f"t{i}": topic, f"p{i}": partition, f"lo{i}": lo, f"hi{i}": hi})
            conds.append(
                f"(topic = {{t{i}:String}} AND partition = {{p{i}:UInt32}} "
                f"AND offset BETWEEN {{lo{i}:UInt64}} AND {{hi{i}:UInt64}})"
            )
        where = " OR ".join(conds)
        rows = self.client.query(
            f"SELECT reason, count() FROM rejected FINAL WHERE {where} GROUP BY reason",
            parameters=params,
        ).result_rows
        n = sum(int(c) for _, c in rows)
        if n:
            reasons = ", ".join(f"{c} x {r}" for r, c in rows)
            log.warning("history loader: %d records rejected (%s); see table rejected", n, reasons)
        return n

    def _store_batch(self, batch: Batch) -> int:
        """Worker thread: stores `batch` (retrying), then counts its rejected records."""
        for kind, records in batch.records.items():
            if records:
                self._store(kind, records)
        try:
            return self._count_rejected(batch)
        except ClickHouseError as e:  # only a count: the rows are stored
            log.warning("history loader: counting rejected records failed: %s", e)
            return 0

    def _start(self) -> None:
        """Hands the pending batch to the worker (the previous one must be finished)."""
        assert self._inflight is None
        batch, self._batch = self._batch, Batch()
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="svc-history-store")
        self._inflight = (batch, self._worker.submit(self._store_batch, batch))

    def _finish(self) -> None:
        """Waits for the batch being stored, then commits its offsets (at least once).

        Raises:
            _Stopped: a stop request ended the store's retries (nothing committed).
            Exception: whatever ``after_store`` raised (nothing committed).

        """
        if self._inflight is None:
            return
        batch, done = self._inflight
        self._inflight = None
        rejected = done.result()
        if self.after_store is not None:
            self.after_store(batch)
        offsets = [TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
        self.stats.batches += 1
        self.stats.records += len(batch)
        self.stats.rejected += rejected
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
            self.stats.commits += 1
        except KafkaException as e:
            # Stored but not committed: the records are read again later and dropped as copies.
            self.stats.commit_failures += 1
            log.warning("history loader: commit failed (%s); the records will be re-read", e)

    def _flush(self) -> None:
        """Stores and commits the batch being stored and the pending one, in order."""
        self._finish()
        if self._batch.next_offsets:
            self._start()
            self._finish()

    def _drop(self) -> None:
        """Forgets the pending batch and the one being stored, uncommitted (as a crash would)."""
        self._batch = Batch()
        if self._inflight is not None:
            self._inflight[1].cancel()
            self._inflight = None

    def flush(self) -> None:
        """Stores and commits everything read so far (returns once committed or given up).

        Raises:
            Exception: whatever ``after_store`` raised. A failing INSERT is retried; a stop
                request during the retries drops the batch uncommitted.

        """
        try:
            self._flush()
        except _Stopped:
            self._drop()

    def apply_retention(self) -> list[tuple[str, str]]:
        """Runs a retention pass with the setting's current value (SPEC 8).

        Returns:
            The (table, day) partitions dropped.

        Raises:
            ValueError: the setting is negative.
            clickhouse_connect.driver.exceptions.ClickHouseError: a drop failed.

        """
        rd = self.retention_days
        days = rd() if callable(rd) else rd
        dropped = apply_retention(self.client, days, now=self.now())
        self.stats.retention_runs += 1
        self.stats.dropped_partitions += len(dropped)
        self._last_retention = time.monotonic()
        return dropped

    def _retention_due(self) -> bool:
        return self._last_retention is None or (
            time.monotonic() - self._last_retention >= self.retention_interval
        )

    def _maybe_retention(self) -> None:
        if not self._retention_due():
            return
        try:
            self.apply_retention()
        except (ClickHouseError, ValueError) as e:
            self._last_retention = time.monotonic()
            log.error(
                "history loader: retention pass failed (%s); next in %ss",
                e,
                self.retention_interval,
            )

    def lag(self) -> int | None:
        """Records on the assigned partitions not yet committed by this loader.

        Returns:
            The sum over assigned partitions of (high watermark - position), or None while no
            partition is assigned.

        Raises:
            confluent_kafka.KafkaException: the broker did not answer the watermark query.

        """
        assigned = self.consumer.assignment()
        if not assigned:
            return None
        positions = self.consumer.position(assigned)
        # Nothing read yet on a partition since it was assigned: start from its commit.
        unread = [TopicPartition(tp.topic, tp.partition) for tp in positions if tp.offset < 0]
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in (self.consumer.committed(unread, timeout=10) if unread else [])
        }
        total = 0
        for tp in positions:
            # The high watermark comes with every fetch response; ask the broker only for a
            # partition nothing was fetched from yet.
            low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                low, high = self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            pos = tp.offset if tp.offset >= 0 else committed.get((tp.topic, tp.partition), -1)
            total += max(0, high - max(pos, low))
        return total

    def _caught_up(self) -> bool:
        try:
            return self.lag() == 0
        except KafkaException as e:  # the broker is away: not known to be caught up
            log.debug("history loader: lag unknown: %s", e)
            return False

    def run(self, *, until_caught_up: bool = False) -> LoaderStats:
        """Loads batches until ``stop()`` (or, with `until_caught_up`, until no lag is left).

        Args:
            until_caught_up: return once every assigned partition is committed up to its end.

        Returns:
            ``self.stats``.

        Raises:
            confluent_kafka.KafkaException: a fatal consumer error.
            Exception: whatever ``after_store`` raised; the pending batch is then dropped
                uncommitted (as a crash would leave it) and the consumer closed.

        """
        try:
            self._maybe_retention()
            while not self._stop.is_set():
                n = self.poll()  # while the worker stores the previous batch
                self._finish()
                if n:
                    self._start()
                    if n < self.batch_records:
                        # The queue is drained: nothing to read meanwhile, so finish now.
                        self._finish()
                if self._retention_due():
                    self._finish()  # no drop while a batch may still write into a day
                    self._maybe_retention()
                if until_caught_up and self._inflight is None and self._caught_up():
                    break
            self._flush()
        except _Stopped:
            self._drop()
        except BaseException:
            self._drop()
            raise
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        """Leaves the group and closes the consumer (commits nothing that was not stored)."""
        try:
            self.consumer.close()
        except RuntimeError:  # already closed
            pass
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
