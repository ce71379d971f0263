"""What the demo left in the history store, read back from it (docs/history.md#queries).

``summarize`` answers from the ``decisions`` and ``events`` tables, never from what the
``DriveReport`` says was sent, whose use is the time window to read: so the summary shows what
went through the decision log, the intake, the broker and the loader, not what the demo meant to
send. Every query reads with ``FINAL`` (records delivered twice count once). The one exception
is what became of the challenges (``challenge_outcomes``), which the history does not hold: the
report's answers of the decision point's challenge waits at the end of the drive.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from svc.demo.traffic import DriveReport
from svc.history.queries import MOVING_OUT_ACTIONS

__all__ = ["history_counts", "summarize"]

_RANGE = (
    "at >= fromUnixTimestamp64Milli({start:Int64}, 'UTC') "
    "AND at < fromUnixTimestamp64Milli({end:Int64}, 'UTC')"
)
_LABEL = 14


def _ms(t: datetime) -> int:
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000)


def _rows(client: Client, sql: str, start: datetime, end: datetime) -> Sequence[Sequence[Any]]:
    return client.query(sql, parameters={"start": _ms(start), "end": _ms(end)}).result_rows


def history_counts(
    client: Client, start: datetime | None = None, end: datetime | None = None
) -> tuple[int, int]:
    """How many decision rows and event rows the history holds (for waiting on the loader).

    Args:
        client: a ``svc.history.connect`` client on a migrated database.
        start: count only rows with ``at`` at or after this (default: all).
        end: count only rows with ``at`` before this (default: all).

    Returns:
        (decision rows, event rows), each record once (``FINAL``).

    Raises:
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    lo = start or datetime(1970, 1, 1, tzinfo=UTC)
    hi = end or datetime(9999, 1, 1, tzinfo=UTC)
    d = _rows(client, f"SELECT count() FROM decisions FINAL WHERE {_RANGE}", lo, hi)
    e = _rows(client, f"SELECT count() FROM events FINAL WHERE {_RANGE}", lo, hi)
    return int(d[0][0]), int(e[0][0])


def _n(v: Any) -> str:
    return f"{int(v):,}"


def _pairs(rows: Sequence[Sequence[Any]]) -> str:
    """``name n, name n`` from (name, n) rows (an empty name is ``unknown``), or ``none``."""
    return ", ".join(f"{k or 'unknown'} {_n(v)}" for k, v in rows) or "none"


def summarize(client: Client, report: DriveReport) -> str:
    """A few aligned lines on what the history holds for a demo drive (docs/demo.md#the-summary).

    Reads the decisions and events whose ``at`` lies in ``report.window()``: checks by verdict
    and decisions by mode (with monitor mode's would-deny and would-challenge), challenges by
    kind and what became of them (the report's ``challenge_outcomes``: pending, passed,
    rejected, expired), agents' checks on behalf of people, plans by outcome, the list reports
    that name a
    plan in the history and the rows they showed, events by kind of access, and the principals
    that moved the most rows out (``exported`` rows, ``download``/``export`` actions).

    Args:
        client: a ``svc.history.connect`` client on a migrated database the loader fills.
        report: the drive's report; its time window and ``challenge_outcomes`` are used.

    Returns:
        The summary, lines joined with newlines, no trailing newline.

    Raises:
        ValueError: the report's drive has not run.
        clickhouse_connect.driver.exceptions.ClickHouseError: a query failed.

    """
    start, end = report.window()

    def q(sql: str) -> Sequence[Sequence[Any]]:
        return _rows(client, sql, start, end)

    checks, plans, allow, deny, challenge, pinned = q(
        "SELECT countIf(call != 'plan'), countIf(call = 'plan'), "
        "countIf(call != 'plan' AND verdict = 'allow'), "
        "countIf(call != 'plan' AND verdict = 'deny'), "
        "countIf(call != 'plan' AND verdict = 'challenge'), "
        f"countIf(call = 'plan' AND pinned) FROM decisions FINAL WHERE {_RANGE}"
    )[0]
    modes = q(
        "SELECT mode, count(), countIf(verdict = 'deny' OR outcome = 'always_denied'), "
        "countIf(verdict = 'challenge' OR outcome = 'challenge') "
        f"FROM decisions FINAL WHERE {_RANGE} GROUP BY mode ORDER BY mode"
    )
    mode_text = (
        ", ".join(
            f"{m} {_n(n)}"
            + (f" (would deny {_n(wd)}, would challenge {_n(wc)})" if m == "monitor" else "")
            for m, n, wd, wc in modes
        )
        or "none"
    )
    kinds = q(
        "SELECT arrayJoin(challenges) AS kind, count() AS n FROM decisions FINAL "
        f"WHERE {_RANGE} AND call != 'plan' AND verdict = 'challenge' "
        "GROUP BY kind ORDER BY n DESC, kind"
    )
    a_checks, a_agents, a_people, a_allow, a_deny, a_challenge, a_stricter = q(
        "SELECT count(), uniqExact(principal_id), uniqExact(on_behalf_of_id), "
        "countIf(verdict = 'allow'), countIf(verdict = 'deny'), countIf(verdict = 'challenge'), "
        "countIf(JSONExtractString(on_behalf_of_outcome, 'verdict') != verdict) "
        f"FROM decisions FINAL WHERE {_RANGE} AND call != 'plan' AND on_behalf_of_id != ''"
    )[0]
    outcomes = q(
        "SELECT outcome, count() AS n FROM decisions FINAL "
        f"WHERE {_RANGE} AND call = 'plan' GROUP BY outcome ORDER BY n DESC, outcome"
    )
    reports, reported_plans, listed, exported = q(
        "SELECT count(), uniqExact(plan_qid), sumIf(ifNull(row_count, 0), access = 'listed'), "
        "sumIf(ifNull(row_count, 0), access = 'exported') "
        f"FROM events FINAL WHERE {_RANGE} AND plan_qid != '' AND plan_qid IN "
        f"(SELECT qid FROM decisions FINAL WHERE call = 'plan' AND {_RANGE})"
    )[0]
    events, failures = q(
        f"SELECT count(), countIf(outcome = 'failure') FROM events FINAL WHERE {_RANGE}"
    )[0]
    by_access = q(
        "SELECT access, count() AS n FROM events FINAL "
        f"WHERE {_RANGE} GROUP BY access ORDER BY n DESC, access"
    )
    moving = ", ".join(f"'{a}'" for a in MOVING_OUT_ACTIONS)
    movers = q(
        "SELECT principal_id, sum(ifNull(row_count, 1)) AS n FROM events FINAL "
        f"WHERE {_RANGE} AND (access = 'exported' OR action IN ({moving})) "
        "GROUP BY principal_type, principal_id ORDER BY n DESC, principal_id LIMIT 3"
    )

    def line(label: str, text: str) -> str:
        return f"  {label:<{_LABEL}}{text}"

    t0, t1 = (t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") for t in (start, end))
    lines = [
        f"History {t0} to {t1}: {_n(checks + plans)} decisions, {_n(events)} events",
        line("mode", mode_text),
        line(
            "checks",
            f"{_n(checks)}: allow {_n(allow)}, deny {_n(deny)}, challenge {_n(challenge)}",
        ),
        line("challenges", _pairs(kinds)),
        line(
            "challenged",
            f"{_n(sum(report.challenge_outcomes.values()))} challenges opened: "
            + _pairs(sorted(report.challenge_outcomes.items(), key=lambda kv: (-kv[1], kv[0]))),
        ),
        line(
            "agents",
            f"{_n(a_checks)} checks by {_n(a_agents)} agents for {_n(a_people)} people: "
            f"allow {_n(a_allow)}, deny {_n(a_deny)}, challenge {_n(a_challenge)}; "
            f"agent stricter {_n(a_stricter)}",
        ),
        line("plans", f"{_n(plans)}: {_pairs(outcomes)} ({_n(pinned)} pages pinned)"),
        line(
            "list reports",
            f"{_n(reports)} reports of {_n(reported_plans)} plans: "
            f"{_n(listed)} rows listed, {_n(exported)} exported",
        ),
        line("events", f"{_pairs(by_access)} ({_n(failures)} failures)"),
        line(
            "moved out", ", ".join(f"{p} {_n(n)} row{'s' * (n != 1)}" for p, n in movers) or "none"
        ),
    ]
    return "\n".join(lines)
