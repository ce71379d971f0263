"""Reading the history: what the portal and the reasoner ask of it (docs/history.md#queries).

Every query reads with ``FINAL``, so a record stored more than once (at least once delivery)
is returned once; ``search_decisions`` instead keeps one row per ``qid`` with ``LIMIT 1 BY``
(docs/history.md#searching-decisions). Time ranges are half-open, ``[start, end)``, on the
record's ``at``; naive datetimes are taken as UTC. Principal and resource references are
``"Type::id"`` strings, ``(type, id)`` pairs or ``{"type", "id"}`` mappings
(docs/architecture.md#entities-and-the-base-schema).

Rows come back as dicts shaped like the broker records (docs/history.md#schema): ``principal``,
``on_behalf_of`` and ``resource`` as ``{"type", "id"}`` (``on_behalf_of`` None when absent),
``at`` as an aware UTC datetime, absent strings as None. Decision rows also carry ``would``:
``"deny"`` or ``"challenge"`` when the decision was made in monitor mode and enforcement would
have denied or challenged (mode is reported, never applied:
docs/architecture.md#monitor-and-enforce), else None.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client

from svc.history import hourly
from svc.history.schema import MOVING_OUT_ACTIONS, ROLLUP_TABLE

__all__ = [
    "MOVING_OUT_ACTIONS",
    "SEARCH_WINDOWS",
    "STATS_BUCKETS",
    "DailyCounts",
    "Ref",
    "SearchPage",
    "daily_counts",
    "decision_by_qid",
    "decision_stats",
    "decision_stats_raw",
    "decisions_between",
    "decisions_of_principal",
    "decisions_of_resource",
    "events_of_principal",
    "events_of_resource",
    "parse_ref",
    "rejected_count",
    "search_decisions",
    "verdict_counts",
]

#: A principal or resource: ``"Type::id"``, ``(type, id)`` or ``{"type": ..., "id": ...}``.
Ref = str | tuple[str, str] | Mapping[str, Any]


_DEFAULT_LIMIT = 10_000

# Decisions made in monitor mode that enforcement would have denied or challenged (checks by
# verdict, plans by outcome).
_WOULD_DENY = "mode = 'monitor' AND (verdict = 'deny' OR outcome = 'always_denied')"
_WOULD_CHALLENGE = "mode = 'monitor' AND (verdict = 'challenge' OR outcome = 'challenge')"
# Per-verdict counts of a principal's decisions, in the order of _VERDICT_KEYS (plans have no
# verdict and are counted apart); verdict_counts and daily_counts both select them.
_VERDICT_COUNTS = (
    "countIf(call != 'plan' AND verdict = 'allow'), "
    "countIf(call != 'plan' AND verdict = 'deny'), "
    "countIf(call != 'plan' AND verdict = 'challenge'), "
    f"countIf({_WOULD_DENY}), countIf({_WOULD_CHALLENGE}), countIf(call = 'plan')"
)
_VERDICT_KEYS: tuple[str, ...] = (
    "allow",
    "deny",
    "challenge",
    "would_deny",
    "would_challenge",
    "plans",
)
_MONITOR_ONLY = f"(({_WOULD_DENY}) OR ({_WOULD_CHALLENGE}))"

_DECISION_SELECT = (
    "qid, at, call, transport, principal_type, principal_id, on_behalf_of_type, "
    "on_behalf_of_id, action, resource_type, resource_id, verdict, outcome, challenges, "
    "policies, on_behalf_of_outcome, mode, challenge_qid, work_item, assigned, risk_score, "
    "policy_version, principals_version, latency_us, pdp, pinned, needs_row_checks, "
    "plan_attributes, not_in_directory, inline_ignored, search, result_count"
)

_EVENT_SELECT = (
    "ingest_id, at, received_at, system, principal_type, principal_id, on_behalf_of_type, "
    "on_behalf_of_id, action, resource_type, resource_id, outcome, source_ip, attributes, "
    "plan_qid, access, row_count, tool, action_class, role_arn"
)


def parse_ref(ref: Ref) -> tuple[str, str]:
    """A principal or resource reference as (type, id).

    Args:
        ref: ``"Human::alice"`` (split at the first ``::``; a Cedar-style quoted id
            ``Human::"alice"`` is unquoted), a (type, id) pair, or a mapping with ``type`` and
            ``id``.

    Returns:
        (type, id).

    Raises:
        ValueError: the reference has no type, or no ``::`` in the string form.

    """
    if isinstance(ref, str):
        t, sep, i = ref.partition("::")
        if not sep or not t:
            raise ValueError(f"reference `{ref}`: expected Type::id")
        if len(i) >= 2 and i[0] == i[-1] == '"':
            i = str(json.loads(i))
        return t, i
    pair: tuple[object, object] = (
        ref if isinstance(ref, tuple) else (ref.get("type"), ref.get("id"))
    )
    rtype, rid = pair
    if not isinstance(rtype, str) or not rtype or not isinstance(rid, str):
        raise ValueError(f"reference {ref!r}: expected a type and an id")
    return rtype, rid


def _ms(t: datetime) -> int:
    """Epoch milliseconds of `t` (naive = UTC)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1000)


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _or_none(s: str) -> str | None:
    return s if s else None


def _ref_or_none(t: str, i: str) -> dict[str, str] | None:
    return {"type": t, "id": i} if t else None


def _json_or_none(s: str) -> Any:
    if not s:
        return None
    try:
        return json.loads(s)
    except ValueError:
        return s


def _refs(values: Sequence[Any]) -> list[dict[str, str]]:
    """Entity references (``{type, id}``) from an ``Array(Tuple(type String, id String))`` column.

    The client returns its elements as dicts (named tuples) or as plain tuples; both are read.
    """
    return [
        {"type": v["type"], "id": v["id"]} if isinstance(v, dict) else {"type": v[0], "id": v[1]}
        for v in values
    ]


def _decision(row: Sequence[Any]) -> dict[str, Any]:
    (
        qid,
        at,
        call,
        transport,
        ptype,
        pid,
        otype,
        oid,
        action,
        rtype,
        rid,
        verdict,
        outcome,
        challenges,
        policies,
        obo_outcome,
        mode,
        challenge_qid,
        work_item,
        assigned,
        risk_score,
        policy_version,
        principals_version,
        latency_us,
        pdp,
        pinned,
        needs_row_checks,
        plan_attributes,
        not_in_directory,
        inline_ignored,
        search,
        result_count,
    ) = row
    is_plan = call == "plan"
    would = None
    if mode == "monitor":
        if verdict == "deny" or outcome == "always_denied":
            would = "deny"
        elif verdict == "challenge" or outcome == "challenge":
            would = "challenge"
    d: dict[str, Any] = {
        "qid": qid,
        "at": _utc(at),
        "call": call,
        "transport": _or_none(transport),
        "principal": {"type": ptype, "id": None if search == "subject" else pid},
        "on_behalf_of": _ref_or_none(otype, oid),
        "action": None if search == "action" else action,
        "resource": {"type": rtype, "id": None if is_plan or search == "resource" else rid},
        "verdict": _or_none(verdict),
        "outcome": _or_none(outcome),
        "challenges": list(challenges),
        "policies": list(policies),
        "on_behalf_of_outcome": _json_or_none(obo_outcome),
        "mode": mode,
        "would": would,
        "challenge_qid": _or_none(challenge_qid),
        "work_item": _or_none(work_item),
        "assigned": bool(assigned),
        "risk_score": risk_score,
        "policy_version": policy_version,
        "principals_version": principals_version,
        "latency_us": latency_us,
        "pdp": _or_none(pdp),
    }
    if call == "search":
        d["search"] = search
        d["count"] = result_count
    elif not is_plan:
        d["not_in_directory"] = _refs(not_in_directory)
        d["inline_ignored"] = _refs(inline_ignored)
    if is_plan:
        d["pinned"] = pinned
        d["needs_row_checks"] = needs_row_checks
        d["attributes"] = list(plan_attributes)
    return d


def _event(row: Sequence[Any]) -> dict[str, Any]:
    (
        ingest_id,
        at,
        received_at,
        system,
        ptype,
        pid,
        otype,
        oid,
        action,
        rtype,
        rid,
        outcome,
        source_ip,
        attributes,
        plan_qid,
        access,
        row_count,
        tool,
        action_class,
        role_arn,
    ) = row
    return {
        "ingest_id": ingest_id,
        "at": _utc(at),
        "received_at": _utc(received_at),
        "system": _or_none(system),
        "principal": {"type": ptype, "id": pid},
        "on_behalf_of": _ref_or_none(otype, oid),
        "action": action,
        "resource": {"type": rtype, "id": rid},
        "outcome": _or_none(outcome),
        "source_ip": _or_none(source_ip),
        "attributes": _json_or_none(attributes),
        "plan_qid": _or_none(plan_qid),
        "access": _or_none(access),
        "count": row_count,
        "tool": _or_none(tool),
        "action_class": _or_none(action_class),
        "role_arn": _or_none(role_arn),
    }


def _range_params(start: datetime, end: datetime) -> dict[str, Any]:
    if _ms(end) <= _ms(start):
        raise ValueError(f"time range [{start}, {end}): end must be after start")
    return {"start": _ms(start), "end": _ms(end)}


_RANGE = (
    "at >= fromUnixTimestamp64Milli({start:Int64}, 'UTC') "
    "AND at < fromUnixTimestamp64Milli({end:Int64}, 'UTC')"
)


def _who(prefix: str, include_on_behalf_of: bool) -> str:
    own = f"({prefix}_type = {{t:String}} AND {prefix}_id = {{i:String}})"
    if not include_on_behalf_of:
        return own
    return f"({own} OR (on_behalf_of_type = {{t:String}} AND on_behalf_of_id = {{i:String}}))"


def _range_rows(
    client: Client,
    select: str,
    table: str,
    where: str,
    order: str,
    ref: Ref,
    start: datetime,
    end: datetime,
    limit: int | None,
) -> Sequence[Sequence[Any]]:
    """Rows of ``table`` (read with ``FINAL``) for the entity ``ref`` in ``[start, end)``.

    ``where`` refers to the entity as ``{t}``/``{i}``; rows are sorted by ``order``. Raises
    ``ValueError`` for a bad reference, an empty range or a non-positive limit.
    """
    t, i = parse_ref(ref)
    return client.query(
        f"SELECT {select} FROM {table} FINAL WHERE {where} AND {_RANGE} "
        f"ORDER BY {order}{_limit(limit)}",
        parameters={"t": t, "i": i, **_range_params(start, end)},
    ).result_rows


def _limit(limit: int | None) -> str:
    if limit is None:
        return ""
    if limit <= 0:
        raise ValueError(f"limit {limit}: must be positive (or None for all)")
    return f" LIMIT {int(limit)}"


def decisions_of_principal(
    client: Client,
    principal: Ref,
    start: datetime,
    end: datetime,
    *,
    monitor_only: bool = False,
    include_on_behalf_of: bool = False,
    limit: int | None = _DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """A principal's decisions (checks and plans) in ``[start, end)``, oldest first.

    Reads ``decisions`` (ordered by principal, docs/history.md#schema).

    Args:
        client: a client from ``svc.history.connect``.
        principal: the principal (``"Human::alice"``, (type, id) or {type, id}).
        start: first instant included.
        end: first instant excluded.
        monitor_only: only decisions made in monitor mode that enforcement would have denied
            or challenged (``would`` is set; docs/architecture.md#monitor-and-enforce).
        include_on_behalf_of: also the decisions where the principal is ``on_behalf_of`` (an
            agent acting for this person).
        limit: most rows returned (None: all).

    Returns:
        Decision dicts (module docs), sorted by ``at`` then ``qid``.

    Raises:
        ValueError: a bad reference, an empty range, or a non-positive limit.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    where = _who("principal", include_on_behalf_of)
    if monitor_only:
        where += f" AND {_MONITOR_ONLY}"
    rows = _range_rows(
        client, _DECISION_SELECT, "decisions", where, "at, qid", principal, start, end, limit
    )
    return [_decision(r) for r in rows]


def decisions_between(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    call: str = "check",
    limit: int | None = _DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Every principal's decisions of one kind in ``[start, end)``, oldest first.

    What a dry run of the policy service decides again (docs/policy.md#dry-runs).

    Args:
        client: a client from ``svc.history.connect``.
        start: first instant included.
        end: first instant excluded.
        call: ``check`` or ``plan``.
        limit: most rows returned (None: all).

    Returns:
        Decision dicts (module docs), sorted by ``at`` then ``qid``.

    Raises:
        ValueError: an empty range or a non-positive limit.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    rows = client.query(
        f"SELECT {_DECISION_SELECT} FROM decisions FINAL WHERE call = {{call:String}} "
        f"AND {_RANGE} ORDER BY at, qid{_limit(limit)}",
        parameters={"call": call, **_range_params(start, end)},
    ).result_rows
    return [_decision(r) for r in rows]


def decisions_of_resource(
    client: Client,
    resource: Ref,
    start: datetime,
    end: datetime,
    *,
    monitor_only: bool = False,
    limit: int | None = _DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """The checks on one resource in ``[start, end)``, oldest first.

    Reads ``decisions_by_resource`` (ordered by resource type, id, at;
    docs/history.md#schema). Plans have no
    resource id and are not returned.

    Args:
        client: a client from ``svc.history.connect``.
        resource: the resource (``"Document::design"``, (type, id) or {type, id}).
        start: first instant included.
        end: first instant excluded.
        monitor_only: only monitor-mode decisions that would have been denied or challenged.
        limit: most rows returned (None: all).

    Returns:
        Decision dicts (module docs), sorted by ``at`` then ``qid``.

    Raises:
        ValueError: a bad reference, an empty range, or a non-positive limit.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    where = f"{_who('resource', False)} AND call != 'plan'"
    if monitor_only:
        where += f" AND {_MONITOR_ONLY}"
    rows = _range_rows(
        client,
        _DECISION_SELECT,
        "decisions_by_resource",
        where,
        "at, qid",
        resource,
        start,
        end,
        limit,
    )
    return [_decision(r) for r in rows]


_HOUR_MS = 3_600_000

#: The time windows one page of ``search_decisions`` reads, by what it searches for, in
#: milliseconds, one query each, each starting where the previous ended (``None``: the rest of
#: the range). A query costs about as much for its first granule of each part as for the rest
#: (docs/benchmarks.md, "Portal"), so the windows aim at one query per page. A principal's
#: search reads first the days its daily rollup says hold a page (``_principal_span``), then
#: the rest; a resource's (a few checks a week) reads the whole range at once; both are found by
#: the primary key however wide the window. A search with neither reads 1, 6 and 24 hours of the
#: ``by_time`` projection, 31 hours at most per page.
SEARCH_WINDOWS: dict[str, tuple[int | None, ...]] = {
    "resource": (None,),
    "any": (_HOUR_MS, 6 * _HOUR_MS, 24 * _HOUR_MS),
}

_DAY_MS = 24 * _HOUR_MS


def _principal_span(
    client: Client, t: str, i: str, lo: int, hi: int, need: int, verdict: str | None
) -> int | None:
    """The length (ms from `lo`) of a principal's first search window, or None for all of it.

    The window reaches the end of the first UTC day by which the principal's daily rollup
    (``principal_daily``) counts `need` decisions (denies or challenges for those verdicts) in
    ``[lo, hi)``; None when the rollup counts fewer. The counts are an estimate: they hold
    every decision of the first day (also before `lo`) and ignore the other filters, so the
    window may hold fewer matches than needed, and the search then reads the rest of the range;
    it never skips a decision.
    """
    column = {"deny": "denies", "challenge": "challenges"}.get(verdict or "", "decisions")
    rows = client.query(
        f"SELECT day, sum({column}) FROM {ROLLUP_TABLE} "
        "WHERE principal_type = {t:String} AND principal_id = {i:String} "
        "AND day >= toDate(fromUnixTimestamp64Milli({lo:Int64}, 'UTC')) "
        "AND day <= toDate(fromUnixTimestamp64Milli({hi:Int64}, 'UTC')) "
        "GROUP BY day ORDER BY day",
        parameters={"t": t, "i": i, "lo": lo, "hi": hi},
    ).result_rows
    total = 0
    for day, count in rows:
        total += int(count)
        if total >= need:
            end = _ms(datetime(day.year, day.month, day.day, tzinfo=UTC)) + _DAY_MS
            return max(end - lo, 1)
    return None


#: The largest position a cursor names within one millisecond: past every qid of that instant.
_PAST_QIDS = "\uffff"


@dataclass(frozen=True)
class SearchPage:
    """One page of a decision search (``search_decisions``).

    Attributes:
        decisions: decision dicts (module docs), oldest first, at most the page size.
        more: whether the range may hold further matches past ``end``: the page is full and
            another match follows, or the page's windows ended before the range did.
        end: the position ``(epoch ms, qid)`` the next page starts after (pass it as
            ``after``): the last decision's, or the end of the last window read when the page
            stopped early; None when nothing was read and there was no ``after``.
        scanned: the rows the engine read for this page (its ``read_rows``, every window).
        reads: queries run for this page (windows read).

    """

    decisions: list[dict[str, Any]]
    more: bool
    end: tuple[int, str] | None
    scanned: int
    reads: int


def search_decisions(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    principal: Ref | None = None,
    resource: Ref | None = None,
    action: str | None = None,
    verdict: str | None = None,
    policy: str | None = None,
    mode: str | None = None,
    after: tuple[int, str] | None = None,
    limit: int = 50,
) -> SearchPage:
    """One page of the decisions matching every filter given, in ``[start, end)``, oldest first.

    The portal's decision search (docs/history.md#searching-decisions). A principal's search
    reads ``decisions`` by its primary key, a resource's reads ``decisions_by_resource`` (checks
    only: plans name no resource id), and a search with neither reads the ``by_time``
    projection of ``decisions`` (schema version 5). Rows are read without ``FINAL`` and one row
    per ``qid`` is kept (a record's copies are identical rows). The range is read in the time
    windows of ``SEARCH_WINDOWS``, one query each, until the page is full; a page whose windows
    end before the range does returns ``more`` with ``end`` at the last window's end, so no page
    reads more than its windows (keyset paging: the next page starts after ``end``).

    Args:
        client: a client from ``svc.history.connect``.
        start: first instant included.
        end: first instant excluded.
        principal: only decisions this principal made (not those made on its behalf).
        resource: only checks on this resource.
        action: only this action.
        verdict: only this verdict (``allow``, ``deny``, ``challenge``) or plan outcome
            (``conditional``, ``always_allowed``, ``always_denied``, ``challenge``).
        policy: only decisions whose ``policies`` name this policy.
        mode: only decisions made in this mode (``monitor`` or ``enforce``).
        after: a previous page's ``end``: only decisions past it in ``(at, qid)`` order.
        limit: the page size, 1 to 10,000.

    Returns:
        A ``SearchPage``.

    Raises:
        ValueError: a bad reference, both a principal and a resource, an empty range, or a
            limit out of range.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    if principal is not None and resource is not None:
        raise ValueError("give a principal or a resource, not both")
    if not 1 <= limit <= _DEFAULT_LIMIT:
        raise ValueError(f"limit {limit}: must be 1 to {_DEFAULT_LIMIT}")
    params: dict[str, Any] = _range_params(start, end)
    where: list[str] = []
    table = "decisions"
    if principal is not None:
        params["t"], params["i"] = parse_ref(principal)
        where.append(_who("principal", False))
    elif resource is not None:
        params["t"], params["i"] = parse_ref(resource)
        where.append(f"{_who('resource', False)} AND call != 'plan'")
        table = "decisions_by_resource"
    for name, value, cond in (
        ("action", action, "action = {action:String}"),
        ("verdict", verdict, "(verdict = {verdict:String} OR outcome = {verdict:String})"),
        ("policy", policy, "has(policies, {policy:String})"),
        ("mode", mode, "mode = {mode:String}"),
    ):
        if value is not None:
            params[name] = value
            where.append(cond)
    lo, hi_end = params["start"], params["end"]
    if after is not None:
        lo = max(lo, after[0])
        params["after_ms"], params["after_qid"] = after
        where.append(
            "(at, qid) > (fromUnixTimestamp64Milli({after_ms:Int64}, 'UTC'), {after_qid:String})"
        )
    found: list[dict[str, Any]] = []
    scanned = reads = 0
    if principal is not None:
        first = _principal_span(client, params["t"], params["i"], lo, hi_end, limit + 1, verdict)
        windows: tuple[int | None, ...] = (first, None) if first is not None else (None,)
    else:
        windows = SEARCH_WINDOWS["resource" if resource is not None else "any"]
    for span in windows:
        if lo >= hi_end:
            break
        hi = hi_end if span is None else min(hi_end, lo + span)
        result = client.query(
            f"SELECT {_DECISION_SELECT} FROM {table} WHERE "
            + " AND ".join(
                [
                    *where,
                    "at >= fromUnixTimestamp64Milli({lo:Int64}, 'UTC')",
                    "at < fromUnixTimestamp64Milli({hi:Int64}, 'UTC')",
                ]
            )
            + f" ORDER BY at, qid LIMIT 1 BY qid LIMIT {limit + 1 - len(found)}",
            parameters={**params, "lo": lo, "hi": hi},
        )
        reads += 1
        scanned += int((result.summary or {}).get("read_rows", 0) or 0)
        found += [_decision(r) for r in result.result_rows]
        lo = hi
        if len(found) > limit:
            break
    page = found[:limit]
    if len(found) > limit:
        return SearchPage(page, True, _position(page[-1]), scanned, reads)
    if lo < hi_end:  # the windows ended first: the next page starts where they did
        return SearchPage(page, True, (lo - 1, _PAST_QIDS), scanned, reads)
    last = _position(page[-1]) if page else after
    return SearchPage(page, False, last, scanned, reads)


def _position(row: Mapping[str, Any]) -> tuple[int, str]:
    """A decision's place in ``(at, qid)`` order: (epoch ms, qid)."""
    return _ms(row["at"]), str(row["qid"])


def decision_by_qid(client: Client, qid: str) -> dict[str, Any] | None:
    """One decision by its id (the ``svc/decision_qid`` a client reports).

    Args:
        client: a client from ``svc.history.connect``.
        qid: the decision or plan id.

    Returns:
        The decision dict, or None when the history has no such record.

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    rows = client.query(
        f"SELECT {_DECISION_SELECT} FROM decisions FINAL WHERE qid = {{q:String}} LIMIT 1",
        parameters={"q": qid},
    ).result_rows
    return _decision(rows[0]) if rows else None


def events_of_principal(
    client: Client,
    principal: Ref,
    start: datetime,
    end: datetime,
    *,
    include_on_behalf_of: bool = False,
    limit: int | None = _DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """A principal's events in ``[start, end)``, oldest first (table ``events``).

    Args:
        client: a client from ``svc.history.connect``.
        principal: the principal (``"Human::alice"``, (type, id) or {type, id}).
        start: first instant included.
        end: first instant excluded.
        include_on_behalf_of: also events where the principal is ``on_behalf_of``.
        limit: most rows returned (None: all).

    Returns:
        Event dicts (module docs; ``count`` is the event's row count, docs/intake.md), sorted by
        ``at`` then ``ingest_id``.

    Raises:
        ValueError: a bad reference, an empty range, or a non-positive limit.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    where = _who("principal", include_on_behalf_of)
    rows = _range_rows(
        client, _EVENT_SELECT, "events", where, "at, ingest_id", principal, start, end, limit
    )
    return [_event(r) for r in rows]


def events_of_resource(
    client: Client,
    resource: Ref,
    start: datetime,
    end: datetime,
    *,
    limit: int | None = _DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """The events on one resource in ``[start, end)``, oldest first (``events_by_resource``).

    Args:
        client: a client from ``svc.history.connect``.
        resource: the resource; an empty id (``("File", "")``) selects the list and search
            events of that type (docs/intake.md#the-event-mandatory-and-optional-fields).
        start: first instant included.
        end: first instant excluded.
        limit: most rows returned (None: all).

    Returns:
        Event dicts (module docs), sorted by ``at`` then ``ingest_id``.

    Raises:
        ValueError: a bad reference, an empty range, or a non-positive limit.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    where = _who("resource", False)
    rows = _range_rows(
        client,
        _EVENT_SELECT,
        "events_by_resource",
        where,
        "at, ingest_id",
        resource,
        start,
        end,
        limit,
    )
    return [_event(r) for r in rows]


def verdict_counts(
    client: Client, principal: Ref, start: datetime, end: datetime
) -> dict[str, int]:
    """How a principal's checks in ``[start, end)`` were decided.

    Args:
        client: a client from ``svc.history.connect``.
        principal: the principal.
        start: first instant included.
        end: first instant excluded.

    Returns:
        ``{"allow", "deny", "challenge"}`` counts of checks by real verdict, plus
        ``"would_deny"`` / ``"would_challenge"`` (monitor-mode checks and plans enforcement would
        have denied / challenged) and ``"plans"``; every key present, 0 when none.

    Raises:
        ValueError: a bad reference or an empty range.
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    t, i = parse_ref(principal)
    row = client.query(
        f"SELECT {_VERDICT_COUNTS} "
        f"FROM decisions FINAL WHERE {_who('principal', False)} AND {_RANGE}",
        parameters={"t": t, "i": i, **_range_params(start, end)},
    ).result_rows[0]
    return {k: int(v) for k, v in zip(_VERDICT_KEYS, row, strict=True)}


@dataclass(frozen=True)
class DailyCounts:
    """One UTC day of a principal's history, the reasoner's input (docs/history.md#queries).

    Attributes:
        day: the UTC day.
        allow: checks allowed.
        deny: checks denied (real verdict).
        challenge: checks challenged (real verdict).
        would_deny: monitor-mode checks and plans that enforcement would have denied.
        would_challenge: monitor-mode checks and plans that enforcement would have challenged.
        plans: query plans made.
        events: events.
        failures: events with ``outcome: failure`` (they count like denials).
        moved_out: events whose action moves data out (``MOVING_OUT_ACTIONS``).
        rows_listed: sum of ``count`` over events with ``access: listed``.
        rows_read: the same for ``read``.
        rows_written: the same for ``written``.
        rows_exported: the same for ``exported``.

    """

    day: date
    allow: int = 0
    deny: int = 0
    challenge: int = 0
    would_deny: int = 0
    would_challenge: int = 0
    plans: int = 0
    events: int = 0
    failures: int = 0
    moved_out: int = 0
    rows_listed: int = 0
    rows_read: int = 0
    rows_written: int = 0
    rows_exported: int = 0


def daily_counts(
    client: Client, principal: Ref, days: int = 30, *, now: datetime | None = None
) -> list[DailyCounts]:
    """Per-day aggregates of a principal's decisions and events over the last `days` UTC days.

    The reasoner reads the last 30 days every cycle (docs/architecture.md#limits); this is that read
    as one aggregate per day and table instead of every row.

    Args:
        client: a client from ``svc.history.connect``.
        principal: the principal (the actor; ``on_behalf_of`` rows are not included).
        days: how many days, today (UTC) included.
        now: the current time (default: the clock).

    Returns:
        One ``DailyCounts`` per day, oldest first, exactly `days` of them (zeros where the
        history has nothing).

    Raises:
        ValueError: a bad reference, or `days` < 1.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    if days < 1:
        raise ValueError(f"days {days}: must be 1 or more")
    t, i = parse_ref(principal)
    today = _utc(now or datetime.now(UTC)).date()
    first = today - timedelta(days=days - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    params = {"t": t, "i": i, **_range_params(start, start + timedelta(days=days))}
    out: dict[date, dict[str, int]] = {first + timedelta(days=n): {} for n in range(days)}
    decisions = client.query(
        f"SELECT toDate(at) AS day, {_VERDICT_COUNTS} "
        f"FROM decisions FINAL WHERE {_who('principal', False)} AND {_RANGE} GROUP BY day",
        parameters=params,
    ).result_rows
    for day, *counts in decisions:
        out.setdefault(day, {}).update(zip(_VERDICT_KEYS, map(int, counts), strict=True))
    moving = ", ".join(f"'{a}'" for a in MOVING_OUT_ACTIONS)
    events = client.query(
        "SELECT toDate(at) AS day, count(), countIf(outcome = 'failure'), "
        f"countIf(action IN ({moving})), "
        "sumIf(ifNull(row_count, 0), access = 'listed'), "
        "sumIf(ifNull(row_count, 0), access = 'read'), "
        "sumIf(ifNull(row_count, 0), access = 'written'), "
        "sumIf(ifNull(row_count, 0), access = 'exported') "
        f"FROM events FINAL WHERE {_who('principal', False)} AND {_RANGE} GROUP BY day",
        parameters=params,
    ).result_rows
    for day, *counts in events:
        keys = (
            "events",
            "failures",
            "moved_out",
            "rows_listed",
            "rows_read",
            "rows_written",
            "rows_exported",
        )
        out.setdefault(day, {}).update(zip(keys, map(int, counts), strict=True))
    return [DailyCounts(day=d, **out[d]) for d in sorted(out)]


def rejected_count(client: Client, topic: str | None = None) -> int:
    """How many broker records the history could not read (table ``rejected``).

    Args:
        client: a client from ``svc.history.connect``.
        topic: only this topic's (default: all).

    Returns:
        The count (each record once, however often it was re-read).

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: the query failed.

    """
    where = "" if topic is None else " WHERE topic = {t:String}"
    rows = client.query(
        f"SELECT count() FROM rejected FINAL{where}", parameters={"t": topic or ""}
    ).result_rows
    return int(rows[0][0])


#: Bucket widths ``decision_stats`` accepts, in seconds (an hour, a day).
STATS_BUCKETS: dict[str, int] = {"hour": 3600, "day": 86400}


def decision_stats(
    client: Client, start: datetime, end: datetime, bucket: str = "hour", top: int = 5
) -> dict[str, Any]:
    """Decisions and events per time bucket, and the most denied principals and resources.

    The portal's overview charts (docs/portal.md#the-web-app), read from the hourly rollups
    of schema version 7 for the settled whole hours of the range and from the raw rows for the
    rest (``svc.history.hourly.read_stats``, docs/history.md#hourly-rollups): its cost follows
    the hours of the range, not the rows. Every figure is one ClickHouse aggregate, never rows
    in Python, and equals what ``decision_stats_raw`` counts from the raw rows (each record
    once though stored twice). A principal's denials are its checks with verdict ``deny`` and
    its plans ``always_denied``; a resource's, the checks on it with verdict ``deny`` (a plan
    names no resource id).

    Args:
        client: a client from ``svc.history.connect``.
        start: first instant included.
        end: first instant excluded.
        bucket: ``"hour"`` or ``"day"`` (UTC), a key of ``STATS_BUCKETS``.
        top: how many principals and resources to rank, 0 to 100 (0: no rankings, which
            saves reading the denials: the buckets alone are one row per hour).

    Returns:
        ``{"buckets": [{"at", "allow", "deny", "challenge", "would_deny", "would_challenge",
        "plans", "events"}], "top_denied_principals": [{"type", "id", "count"}],
        "top_denied_resources": [...same...]}``: buckets oldest first, only those with a
        decision or an event (``at`` an aware UTC datetime, the bucket's start); rankings most
        denied first, ties by type and id.

    Raises:
        ValueError: an unknown bucket, `top` out of range, or an empty range.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    _check_stats(start, end, bucket, top)
    return hourly.read_stats(client, _utc(start), _utc(end), bucket, top)


def _check_stats(start: datetime, end: datetime, bucket: str, top: int) -> None:
    if bucket not in STATS_BUCKETS:
        raise ValueError(f"bucket `{bucket}`: expected one of {sorted(STATS_BUCKETS)}")
    if not 0 <= top <= 100:
        raise ValueError(f"top {top}: must be 0 to 100")
    _range_params(start, end)


def decision_stats_raw(
    client: Client, start: datetime, end: datetime, bucket: str = "hour", top: int = 5
) -> dict[str, Any]:
    """``decision_stats`` counted from the raw rows read with ``FINAL`` (no rollup).

    Reads every decision and event of the range (its cost grows with the rows): the reference
    the rollups must equal (tests/test_history_stats.py) and the peer of the portal's
    benchmark (docs/benchmarks.md). Same arguments, result and errors as ``decision_stats``.
    """
    _check_stats(start, end, bucket, top)
    params = {**_range_params(start, end), "n": top}
    trunc = "toStartOfHour(at)" if bucket == "hour" else "toStartOfDay(at)"
    out: dict[datetime, dict[str, Any]] = {}
    for at, *counts in client.query(
        f"SELECT {trunc} AS b, {_VERDICT_COUNTS} FROM decisions FINAL WHERE {_RANGE} GROUP BY b",
        parameters=params,
    ).result_rows:
        out[_utc(at)] = dict(zip(_VERDICT_KEYS, map(int, counts), strict=True))
    for at, n in client.query(
        f"SELECT {trunc} AS b, count() FROM events FINAL WHERE {_RANGE} GROUP BY b",
        parameters=params,
    ).result_rows:
        out.setdefault(_utc(at), {})["events"] = int(n)

    def ranking(prefix: str, table: str, denied: str) -> list[dict[str, Any]]:
        rows = client.query(
            f"SELECT {prefix}_type AS t, {prefix}_id AS i, count() AS n FROM {table} FINAL "
            f"WHERE {_RANGE} AND {denied} GROUP BY t, i ORDER BY n DESC, t, i LIMIT {{n:UInt32}}",
            parameters=params,
        ).result_rows
        return [{"type": t, "id": i, "count": int(n)} for t, i, n in rows]

    zero = dict.fromkeys((*_VERDICT_KEYS, "events"), 0)
    return {
        "buckets": [{"at": at, **zero, **out[at]} for at in sorted(out)],
        "top_denied_principals": ranking(
            "principal", "decisions", "(verdict = 'deny' OR outcome = 'always_denied')"
        ),
        # A plan names a resource type only: resources rank by their denied checks.
        "top_denied_resources": ranking(
            "resource", "decisions_by_resource", "(verdict = 'deny' AND resource_id != '')"
        ),
    }
