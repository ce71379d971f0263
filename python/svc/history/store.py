"""Connecting to the history store, writing batches into it, and retention (docs/history.md).

* ``connect(dsn)``: a ``clickhouse-connect`` client for a ``chdb://`` DSN (the embedded engine,
  docs/history.md#engines-and-dsns) or an ``http(s)://`` DSN (a ClickHouse server). chDB hosts
  one engine per process,
  on one data directory, so chDB clients are shared: every ``connect`` of the same DSN in a
  process returns the same client (calls on it are serialized by the client's own lock).
* ``store(client, kind, records)``: one INSERT of raw broker records into the intake table of
  ``kind``; the engine parses, checks and routes them (``svc.history.schema``).
* ``refusal(error)``: what a failed INSERT means for the loader: too many day partitions for one
  INSERT (split it), a record the engine refuses for good (find it, move it to ``rejected``), or
  anything else (retry). ``split_by_partition``, ``partition_limit`` and ``reject`` are the
  pieces the loader uses for the first two (docs/history.md, "When an INSERT fails").
* ``apply_retention(client, days)``: drops whole day partitions older than the setting
  (``analytics.retentionDays``, docs/history.md#retention).
"""

from __future__ import annotations

import json
import logging
import re
import struct
import threading
from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from svc.history.schema import INTAKE_COLUMNS, RETAINED_TABLES

__all__ = [
    "DEFAULT_PARTITION_LIMIT",
    "INSERT_SETTINGS",
    "RECORD_ERROR_CODES",
    "Kind",
    "Record",
    "Refusal",
    "apply_retention",
    "connect",
    "encode_rowbinary",
    "partition_day",
    "partition_limit",
    "refusal",
    "reject",
    "retention_cutoff",
    "split_by_partition",
    "store",
]

log = logging.getLogger("svc.history.store")

#: Which topic a record came from: ``decisions`` (``svc.decisions.v1``) or ``events``.
Kind = Literal["decisions", "events"]

#: One broker record: (topic, partition, offset, key, value); key and value as bytes.
Record = tuple[str, int, int, bytes, bytes]

_INTAKE_NAMES = [name for name, _ in INTAKE_COLUMNS]
_PARTITION_OFFSET = struct.Struct("<IQ")
_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def _split_database(dsn: str) -> tuple[str, str | None]:
    """(the DSN without its database, the database or None).

    ``chdb:///path?database=db`` and ``http(s)://host:port/db`` (or ``?database=db``).
    """
    u = urlparse(dsn)
    query = parse_qsl(u.query, keep_blank_values=True)
    db = next((v for k, v in query if k == "database"), None)
    rest = urlencode([(k, v) for k, v in query if k != "database"])
    path = u.path
    if u.scheme in ("http", "https") and path.strip("/"):
        db = db or path.strip("/")
        path = ""
    # urlunparse would drop the empty authority of chdb:///dir.
    base = f"{u.scheme}://{u.netloc}{path}" + (f"?{rest}" if rest else "")
    return base, db


def connect(dsn: str, *, create_database: bool = False) -> Client:
    """A ``clickhouse-connect`` client on the history database named by `dsn` (docs/history.md).

    Args:
        dsn: ``chdb:///abs/dir`` (embedded chDB keeping its data in that directory; add
            ``?database=NAME`` for another database than ``default``), ``chdb://memory``
            (in memory, for tests), or ``http(s)://user:password@host:port/DATABASE`` (a
            ClickHouse server).
        create_database: create the DSN's database first when it does not exist (the migrate
            job does; the loader and queries expect it).

    Returns:
        The client. For ``chdb://`` the same client for the same DSN across the process.

    Raises:
        ValueError: the scheme is not ``chdb``, ``http`` or ``https``, or the database name is
            not a plain identifier.
        clickhouse_connect.driver.exceptions.ProgrammingError: a chDB engine is already open on
            another directory in this process (chDB allows one).
        clickhouse_connect.driver.exceptions.DatabaseError: the engine or server refused (for
            example the database does not exist and `create_database` is false).

    """
    scheme = dsn.partition("://")[0].lower()
    if scheme not in ("chdb", "http", "https"):
        raise ValueError(f"history DSN `{dsn}`: expected chdb://, http:// or https://")
    base, db = _split_database(dsn)
    if db is not None and not _DB_NAME.match(db):
        raise ValueError(f"history DSN `{dsn}`: database `{db}` is not a plain identifier")
    with _clients_lock:
        if scheme == "chdb" and dsn in _clients:
            return _clients[dsn]
        if create_database and db is not None:
            admin = _clients.get(base) if scheme == "chdb" else None
            admin = admin or clickhouse_connect.get_client(dsn=base)
            admin.command(f"CREATE DATABASE IF NOT EXISTS `{db}`")
            if scheme == "chdb":
                _clients[base] = admin
            else:
                admin.close()
        client = clickhouse_connect.get_client(dsn=base, database=db)
        if scheme == "chdb":
            _clients[dsn] = client
        return client


def _varint(n: int) -> bytes:
    """LEB128, the length prefix of RowBinary strings."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_VARINTS = [_varint(n) for n in range(16384)]


def encode_rowbinary(records: Iterable[Record]) -> bytes:
    """Records in the RowBinary layout of the intake tables (topic, partition, offset, key, value).

    Args:
        records: (topic, partition, offset, key, value) tuples; key and value are bytes.

    Returns:
        The bytes of one ``INSERT ... FORMAT RowBinary``.

    """
    parts: list[bytes] = []
    add = parts.append
    pack = _PARTITION_OFFSET.pack
    varints = _VARINTS
    small = len(varints)
    topics: dict[str, bytes] = {}
    for topic, partition, offset, key, value in records:
        t = topics.get(topic)
        if t is None:
            raw = topic.encode()
            t = topics[topic] = _varint(len(raw)) + raw
        nk = len(key)
        nv = len(value)
        add(t)
        add(pack(partition, offset))
        add(varints[nk] if nk < small else _varint(nk))
        add(key)
        add(varints[nv] if nv < small else _varint(nv))
        add(value)
    return b"".join(parts)


#: Insert settings: skip the ReplacingMergeTree collapse at insert time (reads use FINAL and
#: merges collapse later; this alone makes inserts about 1.5 times as fast).
INSERT_SETTINGS: dict[str, Any] = {"optimize_on_insert": 0}


def store(client: Client, kind: Kind, records: Collection[Record]) -> int:
    """Writes broker records into the history with one INSERT (docs/history.md#how-a-batch-gets-in).

    The engine parses each record, writes valid ones to `kind` and its ``_by_resource`` copy
    and the others to ``rejected`` (``svc.history.schema``). Storing the same record again
    adds a duplicate that reads collapse (``FINAL``), so a batch may be stored again after a
    failure.

    Args:
        client: a client from ``connect`` on a migrated database.
        kind: ``decisions`` or ``events``.
        records: (topic, partition, offset, key, value) tuples.

    Returns:
        The number of records sent.

    Raises:
        ValueError: `kind` is not ``decisions`` or ``events``.
        clickhouse_connect.driver.exceptions.ClickHouseError: the insert failed; nothing of it
            may be assumed stored.

    """
    if kind not in ("decisions", "events"):
        raise ValueError(f"kind `{kind}`: expected decisions or events")
    if not records:
        return 0
    client.raw_insert(
        f"{kind}_intake",
        _INTAKE_NAMES,
        encode_rowbinary(records),
        fmt="RowBinary",
        settings=INSERT_SETTINGS,
    )
    return len(records)


#: What a failed INSERT means (``refusal``): ``partitions`` (more day partitions than one INSERT
#: may touch: split it), ``record`` (the engine refuses something in the data, for good: find the
#: record), ``transient`` (anything else: retry the same INSERT).
Refusal = Literal["partitions", "record", "transient"]

#: ClickHouse error codes that blame the data of an INSERT, not the engine's state: a block that
#: fails with one of these fails again with the same rows, whenever it is retried. Names from
#: ClickHouse's ``src/Common/ErrorCodes.cpp`` (``SELECT errorCodeToName(code)``).
RECORD_ERROR_CODES: frozenset[int] = frozenset(
    {
        6,  # CANNOT_PARSE_TEXT
        26,  # CANNOT_PARSE_QUOTED_STRING
        27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        38,  # CANNOT_PARSE_DATE
        41,  # CANNOT_PARSE_DATETIME
        53,  # TYPE_MISMATCH
        69,  # ARGUMENT_OUT_OF_BOUND
        70,  # CANNOT_CONVERT_TYPE
        72,  # CANNOT_PARSE_NUMBER
        117,  # INCORRECT_DATA
        128,  # TOO_LARGE_ARRAY_SIZE
        131,  # TOO_LARGE_STRING_SIZE
        190,  # SIZES_OF_ARRAYS_DONT_MATCH
        306,  # TOO_DEEP_RECURSION
        321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        395,  # FUNCTION_THROW_IF_VALUE_IS_NON_ZERO
        407,  # DECIMAL_OVERFLOW
        469,  # VIOLATED_CONSTRAINT
    }
)

#: ``TOO_MANY_PARTS``: both "too many partitions for single INSERT block" (the rows of one
#: INSERT span more than ``max_partitions_per_insert_block`` partitions) and "too many parts"
#: (merges are behind: a transient state); the message tells them apart.
_TOO_MANY_PARTS = 252
_TOO_MANY_PARTITIONS_TEXT = "too many partitions for single insert block"

#: ClickHouse's default ``max_partitions_per_insert_block``, used when the engine's value
#: cannot be read.
DEFAULT_PARTITION_LIMIT = 100


def refusal(error: ClickHouseError) -> Refusal:
    """Classifies a failed INSERT (docs/history.md, "When an INSERT fails").

    Args:
        error: what ``store`` raised.

    Returns:
        ``partitions`` when the rows span more day partitions than one INSERT may touch
        (ClickHouse's ``max_partitions_per_insert_block``); ``record`` when the engine answered
        with a code of ``RECORD_ERROR_CODES`` (something in the rows, refused whenever it is
        sent); ``transient`` for anything else: a connection or server failure, or the engine's
        state (a missing table, no permission, too many parts), which a retry of the same rows
        may get past once it is fixed, so no record is blamed for it.

    """
    code = getattr(error, "code", None)
    if code == _TOO_MANY_PARTS and _TOO_MANY_PARTITIONS_TEXT in str(error).lower():
        return "partitions"
    if code in RECORD_ERROR_CODES:
        return "record"
    return "transient"


def partition_limit(client: Client) -> int:
    """The most day partitions one INSERT may write (``max_partitions_per_insert_block``).

    Args:
        client: a client from ``connect``.

    Returns:
        The engine's setting for this client (``0`` means no limit), or
        ``DEFAULT_PARTITION_LIMIT`` (ClickHouse's default, 100) when it cannot be read.

    """
    try:
        rows = client.query("SELECT getSetting('max_partitions_per_insert_block')").result_rows
        return int(rows[0][0])
    except (ClickHouseError, IndexError, TypeError, ValueError) as e:
        log.warning(
            "max_partitions_per_insert_block unreadable (%s); assuming %d",
            e,
            DEFAULT_PARTITION_LIMIT,
        )
        return DEFAULT_PARTITION_LIMIT


_DATE_PREFIX = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})")


def partition_day(value: bytes) -> date | None:
    """The UTC day a record's ``at`` falls on: its partition in ``decisions`` / ``events``.

    Mirrors the schema's reading of ``at`` (RFC 3339, any offset, none meaning UTC; the
    partition is ``toDate(at)``, ``svc.history.schema``) closely enough to group records by
    partition; where the engine reads a time this does not, the loader's split falls back to
    halving.

    Args:
        value: the broker record's value (a JSON object with ``at``).

    Returns:
        The day, or None when the value is not JSON, has no string ``at``, or ``at`` does not
        start with a date.

    """
    try:
        at = json.loads(value).get("at")
    except (ValueError, AttributeError):  # not JSON (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(at, str):
        return None
    try:
        t = datetime.fromisoformat(at)
    except ValueError:
        m = _DATE_PREFIX.match(at)
        if m is None:
            return None
        try:
            return date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            return None
    if t.tzinfo is None:
        return t.date()
    try:
        return t.astimezone(UTC).date()
    except OverflowError:  # 0001-01-01 with a positive offset
        return t.date()


def split_by_partition(records: Sequence[Record], limit: int) -> list[list[Record]]:
    """Groups records into INSERTs that each touch at most `limit` day partitions.

    Records are grouped by ``partition_day`` (oldest day first) and groups are filled up to
    `limit` distinct days. A record whose day is unknown counts as a day of its own, so even
    then no group can span more than `limit` partitions.

    Args:
        records: broker records of one kind.
        limit: most partitions per INSERT (``partition_limit``); below 1 is taken as 1.

    Returns:
        The groups, together holding every record once, none empty.

    """
    limit = max(1, limit)
    keyed = sorted(
        ((partition_day(r[4]), i) for i, r in enumerate(records)),
        key=lambda k: (k[0] is None, k[0] or date.min, k[1]),
    )
    groups: list[list[Record]] = []
    days: set[date] = set()
    unknown = 0
    for day, i in keyed:
        new_day = day is None or day not in days
        if not groups or (new_day and len(days) + unknown >= limit):
            groups.append([])
            days = set()
            unknown = 0
        if day is None:
            unknown += 1
        else:
            days.add(day)
        groups[-1].append(records[i])
    return groups


#: Longest reason kept in ``rejected`` for a record the engine refused.
_REASON_CHARS = 1000

_REJECTED_COLUMNS = ["topic", "partition", "offset", "key", "value", "reason"]
_REJECTED_TYPES = ["String", "UInt32", "UInt64", "String", "String", "String"]


def reject(client: Client, refused: Sequence[tuple[Record, str]]) -> int:
    """Writes records the engine refused into ``rejected``, each with its reason.

    The row has the shape the schema's reject views write (``svc.history.schema``): topic,
    partition, offset, key, the first 64 KiB of the value, and the reason (cut to 1,000
    characters). ``rejected`` drops copies by (topic, partition, offset), so writing a record
    again is harmless.

    Args:
        client: a client from ``connect`` on a migrated database.
        refused: (record, reason) pairs.

    Returns:
        The number of rows written.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the insert failed.

    """
    if not refused:
        return 0
    rows = [
        [topic, partition, offset, key, value[:65536], reason[:_REASON_CHARS]]
        for (topic, partition, offset, key, value), reason in refused
    ]
    client.insert(
        "rejected", rows, column_names=_REJECTED_COLUMNS, column_type_names=_REJECTED_TYPES
    )
    return len(rows)


def retention_cutoff(days: int, now: datetime | None = None) -> date | None:
    """The first UTC day retention keeps; partitions of earlier days are dropped.

    A day is dropped only when all of it is older than `days` days: with `days` = 3 at
    2026-11-22T10:00Z the cutoff is 2026-11-19, so the history keeps at least 3 days and at most
    4 (whole days only; docs/history.md#retention).

    Args:
        days: ``analytics.retentionDays``; ``0`` keeps everything.
        now: the current time (default: the clock), aware or naive UTC.

    Returns:
        The cutoff day, or None when `days` is 0.

    Raises:
        ValueError: `days` is negative.

    """
    if days < 0:
        raise ValueError(f"retention days {days}: must be 0 (keep all) or more")
    if days == 0:
        return None
    now = now or datetime.now(UTC)
    if now.tzinfo is not None:
        now = now.astimezone(UTC)
    return now.date() - timedelta(days=days)


def apply_retention(
    client: Client, days: int, *, now: datetime | None = None
) -> list[tuple[str, str]]:
    """Drops the day partitions older than `days` from every history table.

    Reads the partitions present (``system.parts``) and runs ``ALTER TABLE ... DROP PARTITION
    ID`` for each day before ``retention_cutoff(days, now)``. Call it with the setting as it is
    now: it may change at any time, and a larger value later cannot bring back dropped days
    (docs/history.md#retention).

    Args:
        client: a client from ``connect`` on a migrated database.
        days: ``analytics.retentionDays``; ``0`` drops nothing.
        now: the current time (default: the clock).

    Returns:
        The (table, day as ``YYYY-MM-DD``) pairs dropped, sorted.

    Raises:
        ValueError: `days` is negative.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query or drop failed (the
            partitions dropped before it stay dropped).

    """
    cutoff = retention_cutoff(days, now)
    if cutoff is None:
        return []
    tables = ", ".join(f"'{t}'" for t in RETAINED_TABLES)
    rows = client.query(
        "SELECT DISTINCT table, partition_id FROM system.parts "
        f"WHERE database = currentDatabase() AND active AND table IN ({tables})"
    ).result_rows
    dropped: list[tuple[str, str]] = []
    for table, pid in sorted((str(t), str(p)) for t, p in rows):
        try:
            day = datetime.strptime(pid, "%Y%m%d").date()
        except ValueError:
            log.warning("history retention: %s has partition %r, not a day; kept", table, pid)
            continue
        if day < cutoff:
            client.command(f"ALTER TABLE `{table}` DROP PARTITION ID '{pid}'")
            dropped.append((table, day.isoformat()))
    if dropped:
        log.info(
            "history retention (%d days, keeping from %s): dropped %d partitions",
            days,
            cutoff.isoformat(),
            len(dropped),
        )
    return dropped
