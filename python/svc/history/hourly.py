"""The overview's hourly rollups: settling and reading them (docs/history.md#hourly-rollups).

Schema version 7 (``svc.history.schema``) keeps, per UTC hour, the decisions by verdict and the
events (``decisions_hourly``), and the denials of each principal and resource
(``denied_principals_hourly``, ``denied_resources_hourly``), fed by materialized views on
every insert into ``decisions`` and ``events``: a late (backfilled) record lands in its own
hour, and retention drops the rollups' day partitions with the raw tables'
(``RETAINED_TABLES``).

The views count what is inserted, so a record delivered twice (docs/history.md#dedup) counts
twice until its day is rebuilt. Answers stay exact at any time because an hour is read from
the rollups only while it is **settled**: ``decisions_hourly_settled`` holds, per hour, when
the rollup was last found equal to the raw rows (each record once), and ``decisions_hourly``
holds, per hour, when a view last wrote to it (``inserted_at``). An hour written after its mark,
or never marked, is read from the raw rows (without ``FINAL``: one row per ``qid`` /
``ingest_id`` with ``LIMIT 1 BY``, so the decisions' ``by_time`` projection serves the time
range). Under live load that is the current hour and the one before until the next pass.

* ``settle(client)``: compares the hours written since their mark with the raw rows, marks the
  equal ones, and rebuilds the days of the others (``REPLACE PARTITION`` from a staging copy).
  The loader runs it every ``hourly_interval`` seconds (``svc.history.loader``).
* ``read_stats(client, start, end, bucket, top)``: the overview's figures
  (``svc.history.queries.decision_stats``): settled hours from the rollups, the rest
  (the range's partial hours, hours not settled) from the raw rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from svc.history.schema import (
    DENIED_PRINCIPALS_TABLE,
    DENIED_RESOURCES_TABLE,
    HOURLY_SETTLED_TABLE,
    HOURLY_STAGING,
    HOURLY_TABLE,
    HOURLY_TABLES,
    PRINCIPAL_DENIED,
    RESOURCE_DENIED,
    hourly_rebuild_statements,
)

__all__ = ["MAX_CANDIDATES", "SETTLE_MARGIN", "STATS_KEYS", "Settled", "read_stats", "settle"]

log = logging.getLogger("svc.history.hourly")

#: Seconds an hour's last write must lie in the past before ``settle`` marks it: an INSERT
#: whose views ran before a mark but whose parts appear after the comparison read them would
#: otherwise be taken as compared. A batch's INSERT takes well under this.
SETTLE_MARGIN = 60.0

#: The per-bucket counters ``read_stats`` returns, in order.
STATS_KEYS: tuple[str, ...] = (
    "allow",
    "deny",
    "challenge",
    "would_deny",
    "would_challenge",
    "plans",
    "events",
)

#: Most candidate groups a ranking reads the names of (the top's ties included); past that
#: it reads the names of every group.
MAX_CANDIDATES = 10_000

_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS


@dataclass(frozen=True)
class Settled:
    """What one ``settle`` pass did.

    Attributes:
        marked: hours found equal to the raw rows and marked settled.
        rebuilt: the days rebuilt (a record counted twice, or rows the rollup lacks on a day
            that is over), oldest first; their hours are compared again by the next pass.
        pending: hours left for a later pass (written less than the margin ago, or the
            current day's rollup a moment behind its raw rows).

    """

    marked: int = 0
    rebuilt: list[date] = field(default_factory=list)
    pending: int = 0


def _runs(hours_ms: list[int]) -> list[tuple[int, int]]:
    """Sorted hour starts (ms) as half-open ranges of consecutive hours."""
    out: list[tuple[int, int]] = []
    for h in sorted(hours_ms):
        if out and out[-1][1] == h:
            out[-1] = (out[-1][0], h + _HOUR_MS)
        else:
            out.append((h, h + _HOUR_MS))
    return out


def _within(column: str, ranges: list[tuple[int, int]], params: dict[str, Any], tag: str) -> str:
    """SQL: `column` in one of the half-open ms `ranges` (``0`` when there is none)."""
    parts = []
    for k, (a, b) in enumerate(ranges):
        params[f"{tag}{k}a"], params[f"{tag}{k}b"] = a, b
        parts.append(
            f"({column} >= fromUnixTimestamp64Milli({{{tag}{k}a:Int64}}, 'UTC') "
            f"AND {column} < fromUnixTimestamp64Milli({{{tag}{k}b:Int64}}, 'UTC'))"
        )
    return "(" + " OR ".join(parts) + ")" if parts else "0"


def _raw_days(client: Client) -> list[int]:
    """The UTC days (ms at midnight) the raw tables hold, from ``system.parts``."""
    rows = client.query(
        "SELECT DISTINCT partition_id FROM system.parts WHERE database = currentDatabase() "
        "AND active AND table IN ('decisions', 'events')"
    ).result_rows
    out = []
    for (pid,) in rows:
        try:
            d = datetime.strptime(str(pid), "%Y%m%d").replace(tzinfo=UTC)
        except ValueError:
            continue
        out.append(int(d.timestamp() * 1000))
    return out


def _rebuild(client: Client, day: date) -> None:
    """Rebuilds one day of the hourly rollups from the raw rows read with ``FINAL``."""
    for staging in HOURLY_STAGING.values():
        client.command(f"TRUNCATE TABLE {staging}")
    for stmt in hourly_rebuild_statements(f"toDate(at) = '{day.isoformat()}'", staging=True):
        client.command(stmt)
    pid = day.strftime("%Y%m%d")
    for table in HOURLY_TABLES:  # decisions_hourly (its inserted_at) last
        staging = HOURLY_STAGING[table]
        if int(client.query(f"SELECT count() FROM {staging}").result_rows[0][0]) == 0:
            # No such rows that day (no denial): ClickHouse refuses to replace from nothing.
            client.command(f"ALTER TABLE {table} DROP PARTITION ID '{pid}'")
        else:
            client.command(f"ALTER TABLE {table} REPLACE PARTITION ID '{pid}' FROM {staging}")


def settle(client: Client, *, margin: float = SETTLE_MARGIN) -> Settled:
    """One pass that makes the hours written since their mark exact and marks them settled.

    Reads the marks and each hour's last write (small tables: one row per hour), and the days
    the raw tables hold. An hour needs a look when it was written after its mark or has no
    mark on a day the raw tables hold; it is looked at once its last write is `margin` seconds
    old. For those hours it reads the rollup's counts, then the raw rows' (distinct ``qid`` and
    ``ingest_id`` per hour, without ``FINAL``), and:

    * equal: marks the hour settled as of the pass's start less `margin`;
    * the rollup counts more (a record counted twice), or fewer on a day that is over: rebuilds
      the day (``REPLACE PARTITION`` of the three rollups from a staging copy filled from the
      raw rows read with ``FINAL``), compared again by the next pass;
    * fewer on the current UTC day (the raw rows a moment ahead): left for the next pass.

    Readers never see a wrong answer meanwhile: ``read_stats`` reads an hour written after its
    mark from the raw rows.

    Args:
        client: a client from ``svc.history.connect`` on a database migrated to version 7 or
            later. One settler at a time (the loader): the staging tables are shared.
        margin: seconds, at least 0 (the engine's clock: ``now64()``).

    Returns:
        What the pass did (``Settled``).

    Raises:
        ValueError: `margin` is negative.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query or a rebuild failed; the
            marks and days done before it stay done.

    """
    if margin < 0:
        raise ValueError(f"margin {margin}: must be 0 or more")
    t0 = int(client.query("SELECT toUnixTimestamp64Milli(now64(3))").result_rows[0][0])
    mark = t0 - int(margin * 1000)
    marks = {
        int(h) * 1000: int(s)
        for h, s in client.query(
            f"SELECT toUnixTimestamp(hour), toUnixTimestamp64Milli(max(settled_at)) "
            f"FROM {HOURLY_SETTLED_TABLE} GROUP BY hour"
        ).result_rows
    }
    written = {
        int(h) * 1000: int(i)
        for h, i in client.query(
            f"SELECT toUnixTimestamp(hour), toUnixTimestamp64Milli(max(inserted_at)) "
            f"FROM {HOURLY_TABLE} GROUP BY hour"
        ).result_rows
    }
    look = {h for h, i in written.items() if i > marks.get(h, -1)}
    for d in _raw_days(client):
        look.update(h for h in range(d, d + _DAY_MS, _HOUR_MS) if h not in marks)
    ready = sorted(h for h in look if written.get(h, -1) <= mark)
    pending = len(look) - len(ready)
    if not ready:
        return Settled(pending=pending)
    params: dict[str, Any] = {}
    rolled_where = _within("hour", _runs(ready), params, "h")
    raw_where = _within("at", _runs(ready), params, "h")
    # The rollup first, then the raw rows: a record stored in between can make the raw count
    # the larger, never the rollup's.
    rolled = {
        int(h) * 1000: (int(n_d), int(n_e))
        for h, n_d, n_e in client.query(
            f"SELECT toUnixTimestamp(hour), sum(decisions), sum(events) FROM {HOURLY_TABLE} "
            f"WHERE {rolled_where} GROUP BY hour",
            parameters=params,
        ).result_rows
    }
    raw: dict[str, dict[int, int]] = {}
    for table, key in (("decisions", "qid"), ("events", "ingest_id")):
        raw[table] = {
            int(h) * 1000: int(n)
            for h, n in client.query(
                f"SELECT toUnixTimestamp(toStartOfHour(at)) AS h, uniqExact({key}) FROM {table} "
                f"WHERE {raw_where} GROUP BY h",
                parameters=params,
            ).result_rows
        }
    today = t0 - t0 % _DAY_MS
    equal: list[int] = []
    rebuild: set[int] = set()
    for h in ready:
        r = rolled.get(h, (0, 0))
        w = (raw["decisions"].get(h, 0), raw["events"].get(h, 0))
        if r == w:
            equal.append(h)
        elif any(a > b for a, b in zip(r, w, strict=True)) or h < today:
            rebuild.add(h - h % _DAY_MS)
        else:
            pending += 1
    if equal:
        client.command(
            f"INSERT INTO {HOURLY_SETTLED_TABLE} (hour, settled_at) "
            "SELECT toDateTime(intDiv(arrayJoin({hs:Array(Int64)}), 1000), 'UTC'), "
            "fromUnixTimestamp64Milli({m:Int64}, 'UTC')",
            parameters={"hs": equal, "m": mark},
        )
    days = [datetime.fromtimestamp(d / 1000, UTC).date() for d in sorted(rebuild)]
    for day in days:
        log.info("history hourly rollups: rebuilding %s", day)
        _rebuild(client, day)
    return Settled(marked=len(equal), rebuilt=days, pending=pending)


def _hour_ms(t: datetime, up: bool) -> int:
    ms = int(t.timestamp() * 1000)
    down = ms - ms % _HOUR_MS
    return down + _HOUR_MS if up and down != ms else down


def _settled_hours(client: Client, first: int, end: int) -> list[int]:
    """The hours in ``[first, end)`` (ms) marked settled and not written since their mark."""
    if end <= first:
        return []
    params = {"a": first, "b": end}
    window = (
        "hour >= fromUnixTimestamp64Milli({a:Int64}, 'UTC') "
        "AND hour < fromUnixTimestamp64Milli({b:Int64}, 'UTC')"
    )
    # A mark without a rollup row joins the default inserted_at (1970): an empty hour.
    rows = client.query(
        "SELECT toUnixTimestamp(m.hour) FROM "
        f"(SELECT hour, max(settled_at) AS s FROM {HOURLY_SETTLED_TABLE} WHERE {window} "
        "GROUP BY hour) AS m LEFT JOIN "
        f"(SELECT hour, max(inserted_at) AS i FROM {HOURLY_TABLE} WHERE {window} "
        "GROUP BY hour) AS r ON m.hour = r.hour WHERE r.i <= m.s",
        parameters=params,
    ).result_rows
    return sorted(int(h) * 1000 for (h,) in rows)


def _minus(start: int, end: int, hours: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` less the given whole hours, as sorted half-open ranges (ms)."""
    out = []
    at = start
    for a, b in _runs(hours):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end:
        out.append((at, end))
    return out


def read_stats(
    client: Client, start: datetime, end: datetime, bucket: str, top: int
) -> dict[str, Any]:
    """Decisions and events per bucket and the most denied, from the rollups where settled.

    The whole UTC hours of ``[start, end)`` that are settled (``settle``) are read from the
    rollups; the rest (the partial hours at either end, the current hour, hours written since
    their mark) from the raw rows, each record once (``LIMIT 1 BY qid`` / ``ingest_id``). Each
    figure is one query that adds the two parts in the engine. The answer is the one the raw
    rows read with ``FINAL`` give (``svc.history.queries.decision_stats_raw``).

    Args:
        client: a client from ``svc.history.connect`` on a database migrated to version 7 or
            later.
        start: first instant included (aware).
        end: first instant excluded (aware), after `start`.
        bucket: ``"hour"`` or ``"day"``.
        top: how many principals and resources to rank, 0 (none: no query of the denials) to
            100 (checked by the caller).

    Returns:
        ``{"buckets": [{"at", ...STATS_KEYS}], "top_denied_principals": [{"type", "id",
        "count"}], "top_denied_resources": [...]}`` as ``decision_stats`` documents.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    s_ms, e_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    settled = _settled_hours(client, _hour_ms(start, up=True), _hour_ms(end, up=False))
    params: dict[str, Any] = {"n": top}
    rolled = _within("hour", _runs(settled), params, "s") if settled else ""
    raw_ranges = _minus(s_ms, e_ms, settled)
    raw = _within("at", raw_ranges, params, "r") if raw_ranges else ""

    def trunc(col: str) -> str:
        f = "toStartOfHour" if bucket == "hour" else "toStartOfDay"
        return f"toDateTime({f}({col}), 'UTC')"

    def dedup(table: str, key: str, cols: str, only: str = "") -> str:
        # A record's copies are identical rows: the first of each key is the record (and a
        # condition on the record holds for all its copies, so it may come first).
        where = f"({raw}) AND {only}" if only else raw
        return f"(SELECT {key}, {cols} FROM {table} WHERE {where} LIMIT 1 BY {key})"

    zero = "toUInt64(0)"
    parts = []
    if rolled:
        sums = ", ".join(f"sum({c}) AS {c}" for c in ("decisions", *STATS_KEYS))
        parts.append(
            f"SELECT {trunc('hour')} AS b, {sums} FROM {HOURLY_TABLE} WHERE {rolled} GROUP BY b"
        )
    if raw:
        counts = (
            "count() AS decisions, countIf(call != 'plan' AND verdict = 'allow') AS allow, "
            "countIf(call != 'plan' AND verdict = 'deny') AS deny, "
            "countIf(call != 'plan' AND verdict = 'challenge') AS challenge, "
            "countIf(mode = 'monitor' AND (verdict = 'deny' OR outcome = 'always_denied')) "
            "AS would_deny, "
            "countIf(mode = 'monitor' AND (verdict = 'challenge' OR outcome = 'challenge')) "
            "AS would_challenge, countIf(call = 'plan') AS plans"
        )
        parts.append(
            f"SELECT {trunc('at')} AS b, {counts}, {zero} AS events FROM "
            f"{dedup('decisions', 'qid', 'at, call, verdict, outcome, mode')} GROUP BY b"
        )
        nothing = ", ".join(f"{zero} AS {c}" for c in ("decisions", *STATS_KEYS[:-1]))
        parts.append(
            f"SELECT {trunc('at')} AS b, {nothing}, count() AS events FROM "
            f"{dedup('events', 'ingest_id', 'at')} GROUP BY b"
        )
    totals = ", ".join(f"sum({c})" for c in STATS_KEYS)
    buckets = client.query(
        f"SELECT toUnixTimestamp(b), {totals} FROM ("
        + " UNION ALL ".join(parts)
        + ") GROUP BY b HAVING sum(decisions) > 0 OR sum(events) > 0 ORDER BY b",
        parameters=params,
    ).result_rows

    def ranking(table: str, prefix: str, denied: str) -> list[dict[str, Any]]:
        if top == 0:
            return []
        # Two steps. The counts are summed by ``key``, the 64-bit hash of
        # (type, id), reading integers only; the groups as large as the `top`-th (ties
        # included) are the candidates, and only their rows are read again with the names to
        # order them by count, then type and id. A group returned holding two names (a hash
        # clash) makes the ranking run again by name: two that share a hash only add up, so a
        # clash that changes the answer is a group in the answer (docs/history.md).
        raw_key = f"cityHash64({prefix}_type, {prefix}_id)"
        cols = f"{prefix}_type, {prefix}_id, verdict, outcome"

        def rows(names: bool, among: str = "") -> str:
            # among: an expression of the keys to keep (empty: every key)
            parts = []
            if rolled:
                parts.append(
                    "SELECT key AS g, denies AS n"
                    + (", type AS t, id AS i" if names else "")
                    + f" FROM {table} WHERE {rolled}"
                    + (f" AND key IN ({among})" if among else "")
                )
            if raw:
                parts.append(
                    f"SELECT {raw_key} AS g, toUInt64(1) AS n"
                    + (f", {prefix}_type AS t, {prefix}_id AS i" if names else "")
                    + f" FROM {dedup('decisions', 'qid', cols, denied)}"
                    + (f" WHERE {raw_key} IN ({among})" if among else "")
                )
            return " UNION ALL ".join(parts)

        candidates = [
            int(g)
            for (g,) in client.query(
                f"SELECT g FROM (SELECT g, sum(n) AS c FROM ({rows(False)}) GROUP BY g "
                f"ORDER BY c DESC LIMIT {{n:UInt32}} WITH TIES) LIMIT {MAX_CANDIDATES + 1}",
                parameters=params,
            ).result_rows
        ]
        # More ties than that (counts of 1 everywhere, say): every group with its names.
        among = "{ks:Array(UInt64)}" if len(candidates) <= MAX_CANDIDATES else ""
        top_rows = client.query(
            "SELECT sum(n) AS c, any(t) AS name_t, any(i) AS name_i, uniqExact(t, i) "
            f"FROM ({rows(True, among)}) GROUP BY g ORDER BY c DESC, name_t, name_i "
            "LIMIT {n:UInt32}",
            parameters={**params, "ks": candidates},
        ).result_rows
        if any(int(row[3]) > 1 for row in top_rows):
            log.warning("history stats: a hash clash among the most denied; ranking by name")
            top_rows = client.query(
                f"SELECT sum(n) AS c, t, i FROM ({rows(True)}) "
                "GROUP BY t, i ORDER BY c DESC, t, i LIMIT {n:UInt32}",
                parameters=params,
            ).result_rows
        return [{"type": row[1], "id": row[2], "count": int(row[0])} for row in top_rows]

    return {
        "buckets": [
            {
                "at": datetime.fromtimestamp(int(b), UTC),
                **dict(zip(STATS_KEYS, map(int, counts), strict=True)),
            }
            for b, *counts in buckets
        ],
        "top_denied_principals": ranking(DENIED_PRINCIPALS_TABLE, "principal", PRINCIPAL_DENIED),
        "top_denied_resources": ranking(DENIED_RESOURCES_TABLE, "resource", RESOURCE_DENIED),
    }
