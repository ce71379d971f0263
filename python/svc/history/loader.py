"""The history loader: ``svc.decisions.v1`` and ``svc.events.v1`` into ClickHouse (docs/history.md).

A ``confluent-kafka`` consumer in group ``svc-history`` reads both topics in batches (up to
``batch_records`` records or ``batch_ms`` milliseconds), stores each batch with one INSERT per
topic (``svc.history.store.store``; the engine parses, checks and routes every record), and only
then commits the batch's offsets, synchronously. Delivery is at least once:

* a loader that dies after storing and before committing re-reads those records when it (or
  another member of the group) restarts; the tables drop the copies by ``qid`` / ``ingest_id``
  (``ReplacingMergeTree`` read with ``FINAL``), so counts stay exact;
* a batch is never committed before every record of it is stored (or moved to ``rejected``);
* batches are stored by a worker thread while the next one is read (chDB and the HTTP client
  release the GIL while the engine works), and committed in order, each after its own store;
* before partitions are taken away in a rebalance, the batches read so far are stored and
  committed;
* after an unexpected error the pending batch is dropped uncommitted and the error propagates.

Junk never stops it: records that are not JSON or lack required fields go to ``rejected`` with
the reason (counted in ``LoaderStats.rejected`` and logged per batch).

Any valid batch is storable, and a failing INSERT is told apart by what it means
(``svc.history.store.refusal``; docs/history.md, "When an INSERT fails"):

* rows over more day partitions than one INSERT may touch (a backfill: ClickHouse's
  ``max_partitions_per_insert_block``, 100 by default): the records are grouped by day into
  INSERTs under that limit (``split_by_partition``), halving where that is not enough;
* a record the engine refuses for good (an error code that blames the data): the INSERT is
  halved until the record is alone, and it goes to ``rejected`` with the engine's message as
  the reason; the rest of the batch is stored;
* anything else (the server away, a table missing): the same INSERT is retried with backoff
  (full-jitter backoff up to 10 s, ``svc.common.retry.Reconnect``) until it works or the loader
  stops; nothing is lost or skipped.

It never falls behind silently: ``health()`` says whether the loader is failing (its INSERTs
failed ``failing_after`` times in a row) or behind (the oldest record read but not stored
reached the broker more than ``behind_after_secs`` ago, or more than ``max_lag_records``
records are not stored), with the reasons; the history service's ``/readyz`` and ``/metrics``
report it (``LoaderHealthSettings``: ``SVC_HISTORY_*``).

Retention (``analytics.retentionDays``, 0 keeps all, may change at any time;
docs/history.md#retention): at start
and every ``retention_interval`` seconds the loader reads the setting again (``retention_days``
may be a callable) and drops the whole day partitions older than it
(``svc.history.store.apply_retention``).

Hourly rollups (docs/history.md#hourly-rollups): every ``hourly_interval`` seconds (60) the
loader settles the overview's hourly rollups (``svc.history.hourly.settle``), so the hours
written since their last pass are read from the rollups again.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from pydantic import AliasChoices, Field

from svc.broker import Consumer, ConsumerLike, MessageLike
from svc.common.retry import Reconnect, Stopped
from svc.common.settings import ComponentSettings, kafka_url_field
from svc.common.topics import DECISIONS_TOPIC, EVENTS_TOPIC
from svc.history import hourly
from svc.history.store import (
    Kind,
    Record,
    Refusal,
    apply_retention,
    partition_limit,
    refusal,
    reject,
    split_by_partition,
    store,
)

__all__ = [
    "DEFAULT_GROUP",
    "EVENTS_TOPIC",
    "Batch",
    "HistoryStoreSettings",
    "Loader",
    "LoaderHealth",
    "LoaderHealthSettings",
    "LoaderSettings",
    "LoaderStats",
    "consumer_config",
]

log = logging.getLogger("svc.history.loader")

#: Consumer group of the history loader (offsets committed there).
DEFAULT_GROUP = "svc-history"


def consumer_config(bootstrap: str, group_id: str = DEFAULT_GROUP) -> dict[str, Any]:
    """The loader's consumer settings.

    Offsets are committed by the loader only (no auto commit, no auto offset store); a new
    group starts at the beginning of each topic; ``read_committed`` hides aborted intake
    transactions (docs/history.md#loader).

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
        store_failures: INSERT attempts that failed for a reason not blamed on the records
            (server away, table missing, ...) and were retried.
        split_inserts: INSERTs split in smaller ones (too many day partitions, or a record
            the engine refused somewhere in it).
        refused: records the engine refused for good, moved to ``rejected`` by the loader
            (also counted in ``rejected``).
        retention_runs: retention passes that completed.
        dropped_partitions: (table, day) partitions dropped by retention.
        settle_runs: passes of ``svc.history.hourly.settle`` that completed.
        hours_settled: hours those passes marked settled.

    """

    batches: int = 0
    records: int = 0
    rejected: int = 0
    commits: int = 0
    commit_failures: int = 0
    store_failures: int = 0
    split_inserts: int = 0
    refused: int = 0
    retention_runs: int = 0
    dropped_partitions: int = 0
    settle_runs: int = 0
    hours_settled: int = 0


class LoaderHealthSettings(ComponentSettings, component="history"):
    """When the loader counts as failing or behind (docs/history.md, "Readiness and metrics").

    Read from the environment (``SVC_HISTORY_<NAME>``) or given as keyword arguments.

    Raises:
        pydantic.ValidationError: a setting is not a number or is out of its range.

    """

    failing_after: int = Field(default=3, ge=1)
    """INSERTs failing in a row (with retries 0.2 s doubling to 10 s apart) before the loader
    counts as failing."""
    behind_after_secs: float = Field(default=300.0, gt=0)
    """The loader is behind when the oldest record it read but has not stored reached the broker
    more than this many seconds ago (the broker's record timestamp)."""
    max_lag_records: int = Field(default=1_000_000, ge=0)
    """The loader is behind when more records than this on its partitions are not stored yet
    (unread plus read but not stored); ``0`` turns this check off."""


class HistoryStoreSettings(ComponentSettings, component="history"):
    """Where the history is stored: ``SVC_HISTORY_DSN`` (``svc history migrate`` and ``load``).

    Raises:
        pydantic.ValidationError: the DSN is not set.

    """

    dsn: str
    """chdb:///DIR (embedded; ?database=NAME optional) or http(s)://HOST:8123/DATABASE."""


class LoaderSettings(HistoryStoreSettings, LoaderHealthSettings):
    """Settings of ``svc history load`` (docs/history.md#loader): ``SVC_HISTORY_<NAME>``.

    The store and the health settings it derives from, and what the loader reads. The broker
    comes from ``SVC_KAFKA_URL`` and the retention from ``SVC_ANALYTICS_RETENTION_*`` (the
    chart's ``analytics.retentionDays``).

    Raises:
        pydantic.ValidationError: the store or the broker is not set, the broker URL does
            not parse, or a setting is out of its range.

    """

    kafka_url: str = kafka_url_field(...)
    """Broker: kafka://host:port or host:port."""
    host: str = "127.0.0.1"
    """Address the HTTP port binds, with ``port`` (``0.0.0.0`` in a container)."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """Serve the probes and the history routes (``svc.history.service``) on this port while
    loading (8080 in a cluster; 0 picks a free one); unset: no HTTP port."""
    retention_days: int = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("SVC_ANALYTICS_RETENTION_DAYS", "retention_days"),
    )
    """analytics.retentionDays: drop whole days older than this (0 keeps all)."""
    retention_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("SVC_ANALYTICS_RETENTION_FILE", "retention_file"),
    )
    """File holding the retention days, re-read at each pass (a mounted setting); wins over
    --retention-days while readable."""
    retention_interval: float = Field(default=3600.0, ge=1)
    """Seconds between retention passes."""
    group: str = DEFAULT_GROUP
    """Consumer group."""
    decisions_topic: str = DECISIONS_TOPIC
    """Decision topic (empty: not read)."""
    events_topic: str = EVENTS_TOPIC
    """Event topic (empty: not read)."""
    batch_records: int = Field(default=50_000, ge=1)
    """Most records per batch."""
    batch_ms: int = Field(default=1000, ge=1)
    """Longest batch wait, in ms."""

    def current_retention(self) -> int:
        """The retention in days now: ``retention_file``'s while readable, else ``retention_days``.

        An unreadable file or one that holds no integer is logged and ``retention_days`` used
        (an empty file means 0).
        """
        if self.retention_file is not None:
            try:
                return int(self.retention_file.read_text().strip() or "0")
            except (OSError, ValueError) as e:
                log.warning(
                    "retention file %s unreadable (%s); using %d days",
                    self.retention_file,
                    e,
                    self.retention_days,
                )
        return self.retention_days


@dataclass(frozen=True)
class LoaderHealth:
    """What ``/readyz`` and ``/metrics`` report about a loader (``Loader.health``).

    Attributes:
        ready: no reason below holds.
        reasons: why the loader is not ready, each naming the setting it is past; empty when
            ready.
        consecutive_failures: INSERTs failed in a row (0 after one succeeds).
        last_error: the engine's or client's message of the last failure, while failing.
        last_success: when an INSERT last succeeded (UTC), None before the first.
        oldest_unstored_age: seconds since the oldest record read but not stored reached the
            broker; None when every record read is stored.
        lag: records on the assigned partitions not stored yet (unread plus read but not
            stored) at the last measurement; None before partitions are assigned.

    """

    ready: bool
    reasons: tuple[str, ...]
    consecutive_failures: int
    last_error: str | None
    last_success: datetime | None
    oldest_unstored_age: float | None
    lag: int | None

    def as_json(self) -> dict[str, Any]:
        """The health as a JSON object (times as RFC 3339 text, seconds as numbers)."""
        return {
            "ready": self.ready,
            "reasons": list(self.reasons),
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_success": None if self.last_success is None else self.last_success.isoformat(),
            "oldest_unstored_age_secs": self.oldest_unstored_age,
            "lag_records": self.lag,
        }


@dataclass
class Batch:
    """Records read but not yet committed.

    Attributes:
        records: per kind, the (topic, partition, offset, key, value) records in arrival order.
        next_offsets: per (topic, partition), the offset to commit (last offset read + 1).
        oldest_ms: the earliest broker timestamp (Unix milliseconds) of the first record read
            from each partition (records of a partition arrive in order); the time it was read
            where the broker gives none; None while empty.

    """

    records: dict[Kind, list[Record]] = field(
        default_factory=lambda: {"decisions": [], "events": []}
    )
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    oldest_ms: float | None = None

    def __len__(self) -> int:
        return sum(len(r) for r in self.records.values())


def _note_time(batch: Batch, m: MessageLike) -> None:
    """Lowers ``batch.oldest_ms`` to `m`'s broker timestamp (or now, when it has none)."""
    kind, ms = m.timestamp()
    t = float(ms) if kind != confluent_kafka.TIMESTAMP_NOT_AVAILABLE and ms > 0 else None
    if t is None:
        t = time.time() * 1000
    if batch.oldest_ms is None or t < batch.oldest_ms:
        batch.oldest_ms = t


class _Stopped(Exception):
    """The loader was asked to stop while a batch was still unstored."""


#: Seconds between two measurements of the lag while the loader runs.
_LAG_EVERY = 1.0

#: Longest error message kept for ``LoaderHealth.last_error``.
_ERROR_CHARS = 500


def _message(e: BaseException) -> str:
    """The first line of an error's message, cut to ``_ERROR_CHARS``."""
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:_ERROR_CHARS]


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
            read again at each retention pass (it may change at any time;
            docs/history.md#retention).
        retention_interval: seconds between retention passes (one also runs at start).
        hourly_interval: seconds between passes that settle the hourly rollups (the first
            one this long after start).
        settle_margin: seconds an hour's last write must be old before a pass compares it
            (``svc.history.hourly.SETTLE_MARGIN``).
        consumer_overrides: more librdkafka settings (security, timeouts); they win.
        after_store: called with the batch after it is stored and before its offsets are
            committed (a test hook: raising there is a crash between store and commit).
        now: the clock retention uses (UTC).
        health: when the loader counts as failing or behind (default: ``LoaderHealthSettings()``,
            read from ``SVC_HISTORY_*``).

    Raises:
        ValueError: neither topic is given, or a size is not positive.
        pydantic.ValidationError: `health` is not given and an ``SVC_HISTORY_*`` setting is
            malformed.

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
        hourly_interval: float = 60.0,
        settle_margin: float = hourly.SETTLE_MARGIN,
        consumer_overrides: dict[str, Any] | None = None,
        after_store: Callable[[Batch], None] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        health: LoaderHealthSettings | None = None,
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
        self.hourly_interval = hourly_interval
        self.settle_margin = settle_margin
        self.after_store = after_store
        self.now = now
        self.health_settings = health if health is not None else LoaderHealthSettings()
        self.stats = LoaderStats()
        self._batch = Batch()
        self._inflight: tuple[Batch, Future[int]] | None = None
        self._storing: Batch | None = None  # the batch the worker is storing
        self._failures = 0  # INSERTs failed in a row
        self._last_error: str | None = None
        self._last_success: float | None = None  # Unix time
        self._lag: int | None = None
        self._lag_at = 0.0  # monotonic time of the last lag measurement
        self._partition_limit: int | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._last_retention: float | None = None
        self._last_settle = time.monotonic()
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

    def _on_revoke(self, consumer: ConsumerLike, partitions: list[TopicPartition]) -> None:
        """Stores and commits what was read before the partitions go to another member."""
        try:
            self._flush()
        except _Stopped:
            self._drop()

    def _on_lost(self, consumer: ConsumerLike, partitions: list[TopicPartition]) -> None:
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
                tp = (topic, partition)
                if tp not in next_offsets:
                    _note_time(batch, m)
                next_offsets[tp] = offset + 1
        return len(self._batch)

    def _error(self, m: MessageLike) -> None:
        err = m.error()
        if err is None:
            return
        if err.fatal():
            raise KafkaException(err)
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("history loader: %s", err)

    def _attempt(
        self, what: str, fn: Callable[[], object], handled: set[Refusal]
    ) -> tuple[Refusal, ClickHouseError] | None:
        """Runs `fn` (an INSERT) until it succeeds or fails in a way the caller handles.

        A failure whose ``refusal`` is not in `handled` is retried on the shared reconnect
        policy (``svc.common.retry.Reconnect``: full-jitter backoff from 0.2 s to 10 s, one
        WARNING line per failure) and counted in ``store_failures`` and the health's
        consecutive failures.

        Returns:
            None once `fn` succeeded, else the refusal (one of `handled`) and the error.

        Raises:
            _Stopped: a stop request came during the retries.

        """

        def once() -> tuple[Refusal, ClickHouseError] | None:
            try:
                fn()
            except ClickHouseError as e:
                kind = refusal(e)
                if kind in handled:
                    return kind, e
                self.stats.store_failures += 1
                self._failures += 1
                self._last_error = _message(e)
                raise
            self._failures = 0
            self._last_error = None
            self._last_success = time.time()
            return None

        policy = Reconnect(f"history loader: {what}", log, retry_on=ClickHouseError)
        try:
            return policy.retrying(self._stop)(once)
        except Stopped as e:
            raise _Stopped from e

    def _store(self, kind: Kind, records: list[Record]) -> None:
        """Stores `records`, splitting and moving refused records as the module docs say.

        Every record ends up stored (the valid ones in `kind`, the invalid ones in ``rejected``
        by the schema's views) or, when the engine refuses it for good, in ``rejected`` with
        the engine's message. Failures not blamed on the records are retried until they pass.

        Raises:
            _Stopped: a stop request came while an INSERT was being retried.

        """
        # Chunks still to store, last first; the flag says it was grouped by day already.
        todo: list[tuple[list[Record], bool]] = [(records, False)]
        while todo:
            chunk, grouped = todo.pop()
            what = f"storing {len(chunk)} {kind}"
            handled: set[Refusal] = {"partitions", "record"} if len(chunk) > 1 else {"record"}
            got = self._attempt(what, functools.partial(store, self.client, kind, chunk), handled)
            if got is None:
                continue
            if len(chunk) == 1:  # refused for good (a lone record spans one partition)
                self._refuse(kind, chunk[0], f"refused by the history store: {_message(got[1])}")
                continue
            self.stats.split_inserts += 1
            if got[0] == "partitions" and not grouped:
                if self._partition_limit is None:
                    self._partition_limit = partition_limit(self.client)
                parts = split_by_partition(chunk, self._partition_limit or len(chunk))
                if len(parts) > 1:
                    log.info(
                        "history loader: %d %s span more day partitions than one INSERT may "
                        "write (max_partitions_per_insert_block = %d); storing them in %d INSERTs",
                        len(chunk),
                        kind,
                        self._partition_limit,
                        len(parts),
                    )
                    todo.extend((part, True) for part in reversed(parts))
                    continue
            # Halve: a record in it is refused, or the grouping by day was not enough.
            half = len(chunk) // 2
            todo.extend([(chunk[half:], grouped), (chunk[:half], grouped)])

    def _refuse(self, kind: Kind, record: Record, reason: str) -> None:
        """Moves a record the engine refuses for good to ``rejected`` with the reason.

        Raises:
            _Stopped: a stop request came while the insert into ``rejected`` was retried.

        """
        topic, partition, offset, _, _ = record
        log.warning(
            "history loader: %s record %s[%d]@%d moved to rejected: %s",
            kind,
            topic,
            partition,
            offset,
            reason,
        )
        self._attempt(
            "moving a refused record to rejected",
            lambda: reject(self.client, [(record, reason)]),
            set(),
        )
        self.stats.refused += 1

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
        self._storing = batch
        try:
            for kind, records in batch.records.items():
                if records:
                    self._store(kind, records)
        finally:
            self._storing = None
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

    def _finish(self, *, measure_lag: bool = False) -> None:
        """Waits for the batch being stored, then commits its offsets (at least once).

        Args:
            measure_lag: refresh the lag ``health()`` reports while waiting (the loop's own
                calls; not inside a rebalance callback).

        Raises:
            _Stopped: a stop request ended the store's retries (nothing committed).
            Exception: whatever ``after_store`` raised (nothing committed).

        """
        if self._inflight is None:
            return
        batch, done = self._inflight
        while True:
            try:
                rejected = done.result(timeout=_LAG_EVERY if measure_lag else None)
                break
            except TimeoutError:  # still storing (retrying, or a large batch)
                self._measure_lag()
        self._inflight = None
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
        """Runs a retention pass with the setting's current value (docs/history.md#retention).

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

    def settle_hourly(self) -> hourly.Settled:
        """Runs one pass of ``svc.history.hourly.settle`` (docs/history.md#hourly-rollups).

        Returns:
            What the pass did.

        Raises:
            clickhouse_connect.driver.exceptions.ClickHouseError: a query or rebuild failed.

        """
        self._last_settle = time.monotonic()
        done = hourly.settle(self.client, margin=self.settle_margin)
        self.stats.settle_runs += 1
        self.stats.hours_settled += done.marked
        return done

    def _maybe_settle(self) -> None:
        if time.monotonic() - self._last_settle < self.hourly_interval:
            return
        try:
            self.settle_hourly()
        except ClickHouseError as e:
            log.error(
                "history loader: settling the hourly rollups failed (%s); next in %ss",
                e,
                self.hourly_interval,
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

    def _unstored(self) -> list[Batch]:
        """The batches read and not yet stored (pending, handed to the worker, being stored)."""
        inflight = self._inflight
        batches = [self._batch, self._storing, None if inflight is None else inflight[0]]
        return [b for b in batches if b is not None]

    def _measure_lag(self) -> None:
        """Refreshes the lag ``health()`` reports (at most every ``_LAG_EVERY`` seconds)."""
        if time.monotonic() - self._lag_at < _LAG_EVERY:
            return
        self._lag_at = time.monotonic()
        try:
            unread = self.lag()
        except KafkaException as e:  # the broker is away: keep the last measurement
            log.debug("history loader: lag unknown: %s", e)
            return
        pending = {id(b): len(b) for b in self._unstored()}
        self._lag = None if unread is None else unread + sum(pending.values())

    def health(self) -> LoaderHealth:
        """Whether the loader is failing or behind, and why (thread-safe; module docs).

        Returns:
            The ``LoaderHealth`` as of now, judged by ``health_settings``: not ready while the
            last ``failing_after`` or more INSERTs failed in a row, while the oldest record read
            but not stored reached the broker more than ``behind_after_secs`` ago, or while
            more than ``max_lag_records`` records are not stored (when that is not 0).

        """
        s = self.health_settings
        reasons: list[str] = []
        failures, last_error = self._failures, self._last_error
        if failures >= s.failing_after:
            reasons.append(
                f"storing into the history failed {failures} times in a row "
                f"(SVC_HISTORY_FAILING_AFTER = {s.failing_after}); last error: {last_error}"
            )
        oldest = [b.oldest_ms for b in self._unstored() if b.oldest_ms is not None]
        age = max(0.0, time.time() - min(oldest) / 1000) if oldest else None
        if age is not None and age > s.behind_after_secs:
            reasons.append(
                f"the oldest record not stored yet reached the broker {age:.0f} s ago "
                f"(SVC_HISTORY_BEHIND_AFTER_SECS = {s.behind_after_secs:g})"
            )
        lag = self._lag
        if s.max_lag_records and lag is not None and lag > s.max_lag_records:
            reasons.append(
                f"{lag} records are not stored yet "
                f"(SVC_HISTORY_MAX_LAG_RECORDS = {s.max_lag_records})"
            )
        last = self._last_success
        return LoaderHealth(
            ready=not reasons,
            reasons=tuple(reasons),
            consecutive_failures=failures,
            last_error=last_error,
            last_success=None if last is None else datetime.fromtimestamp(last, UTC),
            oldest_unstored_age=age,
            lag=lag,
        )

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
                self._finish(measure_lag=True)
                if n:
                    self._start()
                    if n < self.batch_records:
                        # The queue is drained: nothing to read meanwhile, so finish now.
                        self._finish(measure_lag=True)
                if self._retention_due():
                    self._finish()  # no drop while a batch may still write into a day
                    self._maybe_retention()
                self._maybe_settle()
                self._measure_lag()
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
