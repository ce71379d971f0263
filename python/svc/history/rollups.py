"""The reasoner's per-principal daily rollups: settling and reading them (docs/history.md).

``principal_daily`` (``svc.history.schema``, version 4) holds one aggregate row per principal
and UTC day, fed by materialized views on every insert into ``decisions`` and ``events``: a
late (backfilled) record lands in its own day's row, and retention drops the rollup's day
partitions with the raw tables' (``RETAINED_TABLES``). The reasoner reads 30 rows per principal
instead of every decision and event.

The views count what is inserted. A record delivered twice (the delivery is at least once:
docs/history.md#dedup) is one row in the raw tables once merges or ``FINAL`` collapse it, but two
in the rollup. ``settle`` repairs that: for each day it compares the rollup's totals with the raw
tables read with ``FINAL`` and, where they differ, rebuilds the day's partition from the raw rows
(``REPLACE PARTITION`` from a staging table, so readers never see the day half written).

* ``changed_days(client, since)``: the days whose raw partitions changed since a time.
* ``settle(client, days)``: makes those days' rollups exact; returns the days rebuilt.
* ``read_days(client, first, last)``: per principal and day, the counters (numpy arrays).
* ``read_sets(client, first, last, recent)``: per principal, the values of the recent days its
  baseline days lack, the hours of activity, distinct resources; and who used those values.
* ``read_rare_resources(client, first, last, recent, groups)``: per principal, the resources
  first touched on the recent days that few of its peers touched in the window, and how many
  such resources its baseline days held (Sentinel's "uncommon among peers").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from svc.history.schema import ROLLUP_STAGING, ROLLUP_TABLE, rollup_rebuild_statements

__all__ = [
    "DAY_COUNTERS",
    "SET_DIMENSIONS",
    "DayRows",
    "PrincipalSets",
    "RareResources",
    "WindowSets",
    "changed_days",
    "day_totals",
    "read_days",
    "read_rare_resources",
    "read_sets",
    "settle",
]

log = logging.getLogger("svc.history.rollups")

#: The counters of a principal's day, in the order ``read_days`` returns them.
DAY_COUNTERS: tuple[str, ...] = (
    "decisions",
    "denies",
    "challenges",
    "events",
    "failures",
    "moved_out",
    "moved_out_rows",
    "rows_listed",
    "rows_read",
    "rows_written",
    "rows_exported",
    "cloud_failures",
    "sensitive",
    "challenges_failed",
)

#: The distinct-value states ``read_sets`` returns (baseline and recent).
SET_DIMENSIONS: tuple[tuple[str, int], ...] = (
    ("source_ips", 256),
    ("actions", 256),
    ("resource_types", 256),
    ("tools", 256),
    ("acted_for", 1024),
)


def _day(d: date) -> str:
    return d.isoformat()


def changed_days(client: Client, since: datetime | None) -> list[date]:
    """The UTC days whose ``decisions`` or ``events`` partitions got a new part since `since`.

    Reads ``system.parts`` (cheap: one row per part). A merge also makes a new part, so a day
    may be named without new rows; settling it again costs a comparison, nothing more.

    Args:
        client: a client from ``svc.history.connect`` on a migrated database.
        since: aware or naive-UTC time; None names every day present.

    Returns:
        The days, oldest first.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    cond = ""
    params: dict[str, Any] = {}
    if since is not None:
        t = since.astimezone(UTC) if since.tzinfo else since.replace(tzinfo=UTC)
        cond = " AND modification_time >= {t:DateTime('UTC')}"
        params["t"] = t.replace(tzinfo=None)
    rows = client.query(
        "SELECT DISTINCT partition_id FROM system.parts WHERE database = currentDatabase() "
        f"AND active AND table IN ('decisions', 'events'){cond}",
        parameters=params,
    ).result_rows
    out = []
    for (pid,) in rows:
        try:
            out.append(datetime.strptime(str(pid), "%Y%m%d").date())
        except ValueError:
            continue
    return sorted(out)


def day_totals(client: Client, days: Iterable[date]) -> dict[date, tuple[tuple[int, int], ...]]:
    """For each day: ((raw decisions, rollup decisions), (raw events, rollup events)).

    Raw counts read with ``FINAL`` (each record once; decisions without a principal id, the
    subject searches, are not in the rollup and not counted).

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    ds = sorted(set(days))
    if not ds:
        return {}
    params = {"a": ds[0], "b": ds[-1]}
    # The rollup first, then the raw rows: a record stored in between can make the raw
    # count the larger, never the rollup's (``settle`` relies on it).
    rolled = {
        d: (int(n_d), int(n_e))
        for d, n_d, n_e in client.query(
            f"SELECT day, sum(decisions), sum(events) FROM {ROLLUP_TABLE} "
            "WHERE day BETWEEN {a:Date} AND {b:Date} GROUP BY day",
            parameters=params,
        ).result_rows
    }
    raw_d: dict[date, int] = {
        d: int(n)
        for d, n in client.query(
            "SELECT toDate(at) AS d, count() FROM decisions FINAL "
            "WHERE toDate(at) BETWEEN {a:Date} AND {b:Date} AND principal_id != '' GROUP BY d",
            parameters=params,
        ).result_rows
    }
    raw_e: dict[date, int] = {
        d: int(n)
        for d, n in client.query(
            "SELECT toDate(at) AS d, count() FROM events FINAL "
            "WHERE toDate(at) BETWEEN {a:Date} AND {b:Date} GROUP BY d",
            parameters=params,
        ).result_rows
    }
    return {
        d: (
            (int(raw_d.get(d, 0)), rolled.get(d, (0, 0))[0]),
            (int(raw_e.get(d, 0)), rolled.get(d, (0, 0))[1]),
        )
        for d in ds
    }


def _rebuild(client: Client, day: date) -> None:
    """Rebuilds one day's rollup partition from the raw rows read with ``FINAL``."""
    client.command(f"TRUNCATE TABLE {ROLLUP_STAGING}")
    for stmt in rollup_rebuild_statements(f"toDate(at) = '{_day(day)}'", into=ROLLUP_STAGING):
        client.command(stmt)
    pid = day.strftime("%Y%m%d")
    client.command(f"ALTER TABLE {ROLLUP_TABLE} REPLACE PARTITION ID '{pid}' FROM {ROLLUP_STAGING}")


def settle(client: Client, days: Iterable[date], *, attempts: int = 3) -> list[date]:
    """Makes the rollups of `days` exact: rebuilds each day whose totals differ from the raw rows.

    A record stored twice (at least once delivery) is counted twice by the views; the rebuild
    counts it once. A day is rebuilt when its rollup counts more than the raw rows (a record
    counted twice), or fewer on a day that is over (the current UTC day is still being
    written: its raw rows may be ahead of the rollup for a moment). A record inserted into a day
    while it is being rebuilt may be left out of the staging copy, so each rebuilt day is
    compared again and rebuilt again (up to `attempts` times).

    Args:
        client: a client from ``svc.history.connect`` on a migrated database. One settler at a
            time (the reasoner is one replica): the staging table is shared.
        days: the days to check (``changed_days``).
        attempts: rebuilds per day at most.

    Returns:
        The days rebuilt, oldest first.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: a query or rebuild failed; the
            days rebuilt before it stay rebuilt, the others are as they were.

    """
    todo = sorted(set(days))
    today = datetime.now(UTC).date()
    rebuilt: list[date] = []

    def wrong(d: date, pairs: tuple[tuple[int, int], ...]) -> bool:
        # More in the rollup than in the raw rows: a record counted twice. Fewer: rows the
        # rollup lacks, which on the current day is only the loader's writes still landing
        # (the rollup is read first), so that day waits until it is over.
        return any(rolled > raw or (rolled < raw and d < today) for raw, rolled in pairs)

    for _ in range(max(1, attempts)):
        if not todo:
            break
        totals = day_totals(client, todo)
        off = [d for d, pairs in totals.items() if wrong(d, pairs)]
        for d in off:
            log.info("history rollups: rebuilding %s (%s)", d, totals[d])
            _rebuild(client, d)
            if d not in rebuilt:
                rebuilt.append(d)
        todo = off
    return sorted(rebuilt)


@dataclass(frozen=True)
class DayRows:
    """Per principal and day, the rollup counters of a window (``read_days``).

    Attributes:
        principals: the principals, ``(type, id)``, index ``i`` of the arrays.
        days: the window's days, oldest first, index ``d`` of the arrays.
        counters: name (``DAY_COUNTERS``) -> float array of shape (principals, days); a day
            without activity is 0.
        active: bool array (principals, days): the principal made a decision or an event.

    """

    principals: list[tuple[str, str]]
    days: list[date]
    counters: dict[str, np.ndarray]
    active: np.ndarray


def read_days(client: Client, first: date, last: date) -> DayRows:
    """The counters of every principal active in ``[first, last]`` (days), one row per day.

    One aggregate query over ``principal_daily``; the columns come back through Arrow and are
    laid into dense (principals x days) arrays.

    Raises:
        ValueError: `last` is before `first`.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    if last < first:
        raise ValueError(f"window {first}..{last}: the last day is before the first")
    sums = ", ".join(f"toFloat64(sum({c})) AS {c}" for c in DAY_COUNTERS)
    table = client.query_arrow(
        "SELECT principal_type, principal_id, toInt32(day - {a:Date}) AS d, "
        f"{sums} FROM {ROLLUP_TABLE} WHERE day BETWEEN {{a:Date}} AND {{b:Date}} "
        "GROUP BY principal_type, principal_id, day",
        parameters={"a": first, "b": last},
    )
    n_days = (last - first).days + 1
    days = [date.fromordinal(first.toordinal() + k) for k in range(n_days)]
    if table.num_rows == 0:
        empty = np.zeros((0, n_days))
        return DayRows([], days, {c: empty.copy() for c in DAY_COUNTERS}, empty.astype(bool))
    index: dict[tuple[str, str], int] = {}
    keys = zip(
        table.column("principal_type").to_pylist(),
        table.column("principal_id").to_pylist(),
        strict=True,
    )
    rows = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64)
    day_idx = table.column("d").to_numpy()
    shape = (len(index), n_days)
    counters: dict[str, np.ndarray] = {}
    for name in DAY_COUNTERS:
        arr = np.zeros(shape)
        arr[rows, day_idx] = table.column(name).to_numpy()
        counters[name] = arr
    active = (counters["decisions"] + counters["events"]) > 0
    return DayRows(list(index), days, counters, active)


@dataclass(frozen=True)
class PrincipalSets:
    """One principal's distinct values over a window, baseline days apart from recent ones.

    Attributes:
        new: dimension (``SET_DIMENSIONS``) -> values of the recent days never seen on the
            baseline days (empty for most principals on most days).
        base_count: dimension -> how many distinct values the baseline days hold.
        base_hours: float array (24,): decisions plus events per UTC hour on the baseline days.
        recent_hours: the same on the recent days.
        base_resources: distinct resources on the baseline days.
        new_resources: distinct resources of the recent days not seen on the baseline days.

    """

    new: dict[str, frozenset[str]]
    base_count: dict[str, int]
    base_hours: np.ndarray
    recent_hours: np.ndarray
    base_resources: int
    new_resources: int


@dataclass(frozen=True)
class WindowSets:
    """The window's distinct values of every principal (``read_sets``).

    Attributes:
        by_principal: ``(type, id)`` -> its ``PrincipalSets``.
        users: dimension -> each value new to some principal -> every principal that used it
            anywhere in the window (its peers' use of it is how rare it is among them).

    """

    by_principal: dict[tuple[str, str], PrincipalSets]
    users: dict[str, dict[str, list[tuple[str, str]]]]

    def get(self, principal: tuple[str, str]) -> PrincipalSets | None:
        """The principal's sets, or None when it was not active in the window."""
        return self.by_principal.get(principal)

    def __getitem__(self, principal: tuple[str, str]) -> PrincipalSets:
        return self.by_principal[principal]


def _hours(column: Any) -> np.ndarray:
    """An Arrow list column of 24-long arrays as a (rows, 24) float array."""
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=float).reshape(-1, 24)


def read_sets(client: Client, first: date, last: date, recent: date) -> WindowSets:
    """Each principal's new values, hours and resources over ``[first, last]``, split at `recent`.

    Days before `recent` are the baseline; `recent` and later the recent days. Two aggregate
    queries over ``principal_daily``: per principal, the values of the recent days the baseline
    days lack (the set difference is made in the engine, so only what is new comes back), the
    baseline's distinct counts, the hours of activity (24 counts each) and the distinct
    resources; then, for the values new to someone, every principal that used them in the
    window. Columns come back through Arrow.

    Raises:
        ValueError: `recent` is outside the window.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    if not first <= recent <= last:
        raise ValueError(f"recent day {recent} outside the window {first}..{last}")
    params = {"a": first, "b": last, "r": recent}
    inner = []
    outer = []
    for name, cap in SET_DIMENSIONS:
        inner.append(f"groupUniqArrayMergeIf({cap})({name}, day < {{r:Date}}) AS b_{name}")
        inner.append(f"groupUniqArrayMergeIf({cap})({name}, day >= {{r:Date}}) AS r_{name}")
        outer.append(f"length(b_{name}) AS nb_{name}")
        outer.append(f"arrayFilter(x -> NOT has(b_{name}, x), r_{name}) AS new_{name}")
    hours = "arrayMap(h -> toFloat64({m}[toUInt8(h)]), range(24))"
    table = client.query_arrow(
        "SELECT principal_type, principal_id, "
        + hours.format(m="bh")
        + " AS base_hours, "
        + hours.format(m="rh")
        + " AS recent_hours, base_res, all_res, "
        + ", ".join(outer)
        + " FROM (SELECT principal_type, principal_id, "
        "sumMapIf(hours, day < {r:Date}) AS bh, sumMapIf(hours, day >= {r:Date}) AS rh, "
        "uniqExactMergeIf(resources, day < {r:Date}) AS base_res, "
        "uniqExactMerge(resources) AS all_res, "
        + ", ".join(inner)
        + f" FROM {ROLLUP_TABLE} WHERE day BETWEEN {{a:Date}} AND {{b:Date}} "
        "GROUP BY principal_type, principal_id)",
        parameters=params,
    )
    n = table.num_rows
    if n == 0:
        return WindowSets({}, {name: {} for name, _ in SET_DIMENSIONS})
    types = table.column("principal_type").to_pylist()
    ids = table.column("principal_id").to_pylist()
    bh = _hours(table.column("base_hours"))
    rh = _hours(table.column("recent_hours"))
    base_res = table.column("base_res").to_numpy()
    all_res = table.column("all_res").to_numpy()
    counts = {name: table.column(f"nb_{name}").to_numpy() for name, _ in SET_DIMENSIONS}
    new_lists = {name: table.column(f"new_{name}").to_pylist() for name, _ in SET_DIMENSIONS}
    out: dict[tuple[str, str], PrincipalSets] = {}
    wanted: dict[str, set[str]] = {name: set() for name, _ in SET_DIMENSIONS}
    empty: frozenset[str] = frozenset()
    for k in range(n):
        new = {}
        for name, _ in SET_DIMENSIONS:
            values = new_lists[name][k]
            new[name] = frozenset(values) if values else empty
            if values:
                wanted[name].update(values)
        out[(types[k], ids[k])] = PrincipalSets(
            new=new,
            base_count={name: int(counts[name][k]) for name, _ in SET_DIMENSIONS},
            base_hours=bh[k],
            recent_hours=rh[k],
            base_resources=int(base_res[k]),
            new_resources=int(all_res[k]) - int(base_res[k]),
        )
    users: dict[str, dict[str, list[tuple[str, str]]]] = {name: {} for name, _ in SET_DIMENSIONS}
    for name, cap in SET_DIMENSIONS:
        values = sorted(wanted[name])
        if not values:
            continue
        rows = client.query(
            f"SELECT principal_type, principal_id, arrayIntersect(v, {{w:Array(String)}}) FROM "
            f"(SELECT principal_type, principal_id, groupUniqArrayMerge({cap})({name}) AS v "
            f"FROM {ROLLUP_TABLE} WHERE day BETWEEN {{a:Date}} AND {{b:Date}} "
            "GROUP BY principal_type, principal_id) WHERE hasAny(v, {w:Array(String)})",
            parameters={**params, "w": values},
        ).result_rows
        dim = users[name]
        for t, i, used in rows:
            for v in used:
                dim.setdefault(v, []).append((t, i))
    return WindowSets(out, users)


#: The table ``read_rare_resources`` loads the peer groups into (one reader at a time: the
#: reasoner is one replica), an in-memory table made when missing.
PEER_GROUPS_TABLE = "reasoner_peer_groups"

#: A resource is rare among a principal's peers when fewer than this share of them touched it.
RARE_SHARE = 0.10


@dataclass(frozen=True)
class RareResources:
    """One principal's resources that are uncommon among its peers (``read_rare_resources``).

    Attributes:
        new_rare: distinct resources first touched on the recent days (never on the baseline
            days of the window) that fewer than ``RARE_SHARE`` of the peers touched in the
            window.
        new_unshared: of those, the ones no peer touched at all.
        base_rare: distinct resources first touched on the baseline days that are rare among
            the peers in the same sense (the principal's usual pace of rare resources).
        examples: up to 10 of the new rare resources, ``Type::id``.

    """

    new_rare: int
    new_unshared: int
    base_rare: int
    examples: tuple[str, ...]


def read_rare_resources(
    client: Client,
    first: date,
    last: date,
    recent: date,
    groups: dict[tuple[str, str], tuple[str, int]],
) -> dict[tuple[str, str], RareResources]:
    """Per principal, the resources it touched that few of its peers touched in the window.

    The distinct (principal, resource) pairs of ``[first, last]`` come from the raw
    ``decisions`` and ``events`` (the rollups hold a distinct count of resources, not the
    resources); each pair is joined with the principal's peer group (loaded into
    ``PEER_GROUPS_TABLE``), and a window function counts the group's members that touched the
    same resource. Everything is aggregated in the engine: one row per principal with a rare
    new resource comes back. Duplicated records do not matter (distinct pairs).

    Args:
        client: a client from ``svc.history.connect`` on a migrated database.
        first: the window's first day.
        last: its last day (today).
        recent: the first recent day; a pair whose first day is `recent` or later is new.
        groups: principal ``(type, id)`` -> (its peer group's name, the group's size): the
            principals of another group are not its peers; principals not named are skipped.

    Returns:
        ``(type, id)`` -> ``RareResources``, only for principals with at least one new rare
        resource.

    Raises:
        ValueError: `recent` is outside the window.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    if not first <= recent <= last:
        raise ValueError(f"recent day {recent} outside the window {first}..{last}")
    if not groups:
        return {}
    client.command(
        f"CREATE TABLE IF NOT EXISTS {PEER_GROUPS_TABLE} (principal_type String, "
        "principal_id String, pk UInt64 DEFAULT cityHash64(principal_type, principal_id), "
        "grp UInt32, size UInt32) ENGINE = Memory"
    )
    client.command(f"TRUNCATE TABLE {PEER_GROUPS_TABLE}")
    names: dict[str, int] = {}
    client.insert(
        PEER_GROUPS_TABLE,
        [
            [t, i, names.setdefault(g, len(names)), max(1, int(n))]
            for (t, i), (g, n) in groups.items()
        ],
        column_names=["principal_type", "principal_id", "grp", "size"],
        column_type_names=["String", "String", "UInt32", "UInt32"],
    )
    end = datetime.combine(last, datetime.min.time()) + timedelta(days=1)
    params = {
        "a": datetime.combine(first, datetime.min.time()),
        "b": end,
        "r": recent,
        "share": RARE_SHARE,
    }
    # Pairs keyed by 64-bit hashes of (type, id): grouping 40 million rows by two integers is
    # several times faster than by four strings; the names are kept with any().
    window = "at >= {a:DateTime64(3)} AND at < {b:DateTime64(3)} AND resource_id != ''"
    cols = (
        "cityHash64(principal_type, principal_id) AS pk, "
        "cityHash64(resource_type, resource_id) AS rk, toDate(at) AS d"
    )
    pairs = (
        "SELECT pk, rk, min(d) AS first_day FROM ("
        f"SELECT {cols} FROM decisions WHERE {window} AND principal_id != '' "
        f"UNION ALL SELECT {cols} FROM events WHERE {window}) GROUP BY pk, rk"
    )
    rare = "(users - 1) < {share:Float64} * size"
    found = client.query(
        "SELECT any(pt), any(pid), "
        f"countIf(first_day >= {{r:Date}} AND {rare}) AS new_rare, "
        "countIf(first_day >= {r:Date} AND users = 1) AS new_unshared, "
        f"countIf(first_day < {{r:Date}} AND {rare}) AS base_rare, "
        f"groupArrayIf(10)(rk, first_day >= {{r:Date}} AND {rare}) AS examples "
        "FROM (SELECT p.pk AS pk, p.rk AS rk, p.first_day AS first_day, g.size AS size, "
        "g.principal_type AS pt, g.principal_id AS pid, "
        "count() OVER (PARTITION BY g.grp, p.rk) AS users "
        f"FROM ({pairs}) AS p INNER JOIN {PEER_GROUPS_TABLE} AS g ON p.pk = g.pk) "
        "GROUP BY pk HAVING new_rare > 0",
        parameters=params,
    ).result_rows
    if not found:
        return {}
    # The names of the examples: one look-up of at most 10 resources per principal found.
    keys = sorted({int(k) for row in found for k in row[5]})
    named: dict[int, str] = {}
    for k in range(0, len(keys), 100_000):
        part = keys[k : k + 100_000]
        for rk, name in client.query(
            "SELECT rk, any(name) FROM (SELECT cityHash64(resource_type, resource_id) AS rk, "
            "concat(resource_type, '::', resource_id) AS name FROM events "
            f"WHERE {window} AND rk IN {{ks:Array(UInt64)}} UNION ALL "
            "SELECT cityHash64(resource_type, resource_id) AS rk, "
            "concat(resource_type, '::', resource_id) AS name FROM decisions "
            f"WHERE {window} AND rk IN {{ks:Array(UInt64)}}) GROUP BY rk",
            parameters={**params, "ks": part},
        ).result_rows:
            named[int(rk)] = str(name)
    rows = [
        (t, i, nr, nu, br, [named.get(int(x), str(x)) for x in ex])
        for t, i, nr, nu, br, ex in found
    ]
    return {
        (str(t), str(i)): RareResources(int(nr), int(nu), int(br), tuple(str(x) for x in ex))
        for t, i, nr, nu, br, ex in rows
    }
