"""The history store's ClickHouse schema and its migration job (docs/history.md#schema).

Tables, partitioned by UTC day so retention drops whole days (docs/history.md#retention):

* ``decisions``: one row per record of ``svc.decisions.v1`` (checks and plans), ordered by
  ``(principal_type, principal_id, at, qid)``: a principal's history is one range read.
* ``decisions_by_resource``: the same rows ordered by ``(resource_type, resource_id, at, qid)``
  for resource history.
* ``events`` / ``events_by_resource``: the same for ``svc.events.v1`` (the events of
  docs/intake.md#the-event-mandatory-and-optional-fields plus ``received_at``, ``ingest_id``,
  ``role_arn``), keyed by ``ingest_id``.
* ``rejected``: records that could not be read (not JSON, a required field missing), and records
  the engine refused when the loader stored them (``svc.history.loader``), with the topic,
  partition, offset, the record as received and the reason, by the day they were seen.
* ``schema_migrations``: the versions applied, so ``migrate`` is idempotent.

How rows get in: the loader sends broker records as they are (bytes, with topic, partition and
offset) into the ``Null``-engine table ``decisions_intake`` (``events_intake``). A materialized
view parses each record once (``JSONExtract`` into a typed tuple) into the ``Null`` table
``decisions_parsed``; two views on that check the record and route it: valid rows to
``decisions`` (``decisions_load_mv``), the others to ``rejected`` with the reason
(``decisions_reject_mv``). A view on ``decisions`` then writes the resource-ordered copy
(``decisions_by_resource_mv``). One INSERT per batch fills every table, and the JSON is parsed
by ClickHouse's C++ instead of Python's ``json``, which is what gives the loader its rate
(docs/benchmarks.md). ``Null`` tables keep nothing: the views see each inserted block.

The resource-ordered copy is a view-fed table rather than a second client insert so no writer
can forget it, and rather than a projection because ClickHouse does not read projections under
``FINAL``, which the dedup below relies on.

Dedup (at least once delivery): every table is a ``ReplacingMergeTree`` whose sorting key ends in
the record's id (``qid``, ``ingest_id``; ``(topic, partition, offset)`` for ``rejected``). The
copies of a record are identical rows with the same key in the same day partition, so merges
collapse them, and every query in ``svc.history.queries`` reads with ``FINAL``, which collapses
the rest at read time: counts are exact whether or not a merge has run. Decision searches are
the exception: they read the table or its ``by_time`` projection (version 5) without ``FINAL``
and keep one row per ``qid`` (``LIMIT 1 BY qid``), which is as exact for a page of rows.

Reading records (what is required, what is lenient):

* decision: non-empty ``qid``, ``at``, ``principal`` {type, id}, ``action``, ``resource.type``,
  ``mode``; for checks (``call`` is ``check``) also ``resource.id`` and ``verdict``; a search
  (``call`` ``search``) names its kind in ``search`` and may leave out what it searched for.
* event: non-empty ``ingest_id``, ``at``, ``principal`` {type, id}, ``action``, and
  ``resource`` {type, id} (``id`` may be ``""``: a list or a search).
* ``at`` / ``received_at``: RFC 3339, any offset, stored in UTC; no offset means UTC.
* Other fields of the wrong JSON type are converted as ``JSONExtract`` does (a number where a
  string is expected is kept as its text; anything else unreadable becomes the column default).
* Absent strings are stored as ``''`` (ClickHouse's idiom, cheaper than Nullable);
  ``svc.history.queries`` turns them back into ``None``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

__all__ = [
    "ACCESS_WEIGHTS",
    "CHALLENGE_FAILED_ACTIONS",
    "CHALLENGE_SYSTEM",
    "DECISION_COLUMNS",
    "DENIED_PRINCIPALS_TABLE",
    "DENIED_RESOURCES_TABLE",
    "EVENT_COLUMNS",
    "HOURLY_COUNTERS",
    "HOURLY_SELECTS",
    "HOURLY_SETTLED_TABLE",
    "HOURLY_STAGING",
    "HOURLY_TABLE",
    "HOURLY_TABLES",
    "INTAKE_COLUMNS",
    "MIGRATIONS",
    "MOVING_OUT_ACTIONS",
    "PRINCIPAL_DENIED",
    "RESOURCE_DENIED",
    "RETAINED_TABLES",
    "ROLLUP_COLUMNS",
    "ROLLUP_SELECTS",
    "ROLLUP_STAGING",
    "ROLLUP_TABLE",
    "SENSITIVE_ACTIONS",
    "Migration",
    "applied_versions",
    "hourly_rebuild_statements",
    "migrate",
    "rollup_rebuild_statements",
]

log = logging.getLogger("svc.history.schema")

#: ``decisions`` columns: (name, ClickHouse type), plus ``loaded_at`` (DEFAULT now).
DECISION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("qid", "String"),
    ("at", "DateTime64(3, 'UTC')"),
    ("call", "LowCardinality(String)"),
    ("transport", "LowCardinality(String)"),
    ("principal_type", "LowCardinality(String)"),
    ("principal_id", "String"),
    ("on_behalf_of_type", "LowCardinality(String)"),
    ("on_behalf_of_id", "String"),
    ("action", "LowCardinality(String)"),
    ("resource_type", "LowCardinality(String)"),
    ("resource_id", "String"),
    ("verdict", "LowCardinality(String)"),
    ("outcome", "LowCardinality(String)"),
    ("challenges", "Array(LowCardinality(String))"),
    ("policies", "Array(String)"),
    ("on_behalf_of_outcome", "String"),
    ("mode", "LowCardinality(String)"),
    ("challenge_qid", "String"),
    ("work_item", "String"),
    ("assigned", "Bool"),
    ("risk_score", "Nullable(Int64)"),
    ("policy_version", "UInt64"),
    ("principals_version", "UInt64"),
    ("latency_us", "UInt64"),
    ("pdp", "LowCardinality(String)"),
    ("pinned", "Nullable(Bool)"),
    ("needs_row_checks", "Nullable(Bool)"),
    ("plan_attributes", "Array(String)"),
    ("not_in_directory", "Array(Tuple(type String, id String))"),
    ("inline_ignored", "Array(Tuple(type String, id String))"),
    ("search", "LowCardinality(String)"),
    ("result_count", "Nullable(UInt64)"),
)

#: ``events`` columns: (name, ClickHouse type), plus ``loaded_at``. The event field
#: ``count`` is the column ``row_count``; ``plan_qid`` is copied out of ``attributes``.
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ingest_id", "String"),
    ("at", "DateTime64(3, 'UTC')"),
    ("received_at", "DateTime64(3, 'UTC')"),
    ("system", "LowCardinality(String)"),
    ("principal_type", "LowCardinality(String)"),
    ("principal_id", "String"),
    ("on_behalf_of_type", "LowCardinality(String)"),
    ("on_behalf_of_id", "String"),
    ("action", "LowCardinality(String)"),
    ("resource_type", "LowCardinality(String)"),
    ("resource_id", "String"),
    ("outcome", "LowCardinality(String)"),
    ("source_ip", "String"),
    ("attributes", "String"),
    ("plan_qid", "String"),
    ("access", "LowCardinality(String)"),
    ("row_count", "Nullable(UInt64)"),
    ("tool", "LowCardinality(String)"),
    ("action_class", "LowCardinality(String)"),
    ("role_arn", "String"),
)

#: Columns of the intake tables, in the loader's RowBinary order.
INTAKE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "String"),
    ("partition", "UInt32"),
    ("offset", "UInt64"),
    ("key", "String"),
    ("value", "String"),
)


def _columns_ddl(columns: tuple[tuple[str, str], ...]) -> str:
    return ",\n    ".join(f"`{name}` {type_}" for name, type_ in columns)


@dataclass(frozen=True)
class Migration:
    """One schema version: statements applied in order, each safe to run again.

    Attributes:
        version: strictly increasing integer recorded in ``schema_migrations``.
        name: short description.
        statements: SQL statements (``IF NOT EXISTS``), so a run that failed midway is finished
            by the next one.

    """

    version: int
    name: str
    statements: tuple[str, ...]


# -- the typed view of a record, as JSONExtract reads it (one parse per record)

_DECISION_TUPLE = (
    "Tuple(qid String, at String, call String, transport String, "
    "principal Tuple(type String, id String), on_behalf_of Tuple(type String, id String), "
    "action String, resource Tuple(type String, id Nullable(String)), verdict String, "
    "outcome String, challenges Array(String), policies Array(String), "
    "on_behalf_of_outcome Nullable(String), mode String, challenge_qid String, "
    "work_item String, assigned Bool, risk_score Nullable(Int64), policy_version UInt64, "
    "principals_version UInt64, latency_us UInt64, pdp String, pinned Nullable(Bool), "
    "needs_row_checks Nullable(Bool), attributes Array(String), "
    "not_in_directory Array(Tuple(type String, id String)), "
    "inline_ignored Array(Tuple(type String, id String)), search String, "
    "count Nullable(UInt64))"
)

_EVENT_TUPLE = (
    "Tuple(ingest_id String, at String, received_at Nullable(String), system String, "
    "principal Tuple(type String, id String), on_behalf_of Tuple(type String, id String), "
    "action String, resource Tuple(type String, id Nullable(String)), outcome String, "
    "source_ip String, attributes Nullable(String), access String, count Nullable(UInt64), "
    "tool String, action_class String, role_arn String)"
)

# RFC 3339 date and time at the start (parseDateTime64BestEffort alone accepts "12").
_TIME_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}"


def _time(expr: str) -> str:
    return (
        f"if(match({expr}, '{_TIME_RE}'), parseDateTime64BestEffortOrNull({expr}, 3, 'UTC'), NULL)"
    )


def _ok(checks: list[tuple[str, str]]) -> str:
    """SQL that holds when every check holds."""
    return " AND ".join(f"({c})" for c, _ in checks)


def _reason(checks: list[tuple[str, str]]) -> str:
    """SQL for the rejection reason of a failing row: the first check that fails."""
    branches = ", ".join(f"NOT ({c}), '{why}'" for c, why in checks)
    return f"multiIf(NOT isValidJSON(value), 'not JSON', {branches}, 'invalid')"


_DECISION_CHECKS: list[tuple[str, str]] = [
    ("match(value, '^\\\\s*\\\\{')", "not a JSON object"),
    ("r.qid != ''", "`qid`: missing"),
    ("parsed_at IS NOT NULL", "`at`: missing or not an RFC 3339 time"),
    (
        "r.principal.type != '' AND (r.principal.id != '' OR r.search = 'subject')",
        "`principal`: missing type or id",
    ),
    ("r.action != '' OR r.search = 'action'", "`action`: missing"),
    (
        "r.resource.type != '' AND (r.resource.id IS NOT NULL OR r.call = 'plan' "
        "OR r.search = 'resource')",
        "`resource`: missing type or id",
    ),
    ("r.mode != ''", "`mode`: missing"),
    ("r.verdict != '' OR r.call IN ('plan', 'search')", "`verdict`: missing"),
    (
        "(r.call = 'search') = (r.search IN ('subject', 'resource', 'action'))",
        "`search`: missing or not subject, resource or action",
    ),
]

_EVENT_CHECKS: list[tuple[str, str]] = [
    ("match(value, '^\\\\s*\\\\{')", "not a JSON object"),
    ("r.ingest_id != ''", "`ingest_id`: missing"),
    ("parsed_at IS NOT NULL", "`at`: missing or not an RFC 3339 time"),
    (
        "r.received_at IS NULL OR parsed_received_at IS NOT NULL",
        "`received_at`: not an RFC 3339 time",
    ),
    ("r.principal.type != '' AND r.principal.id != ''", "`principal`: missing type or id"),
    ("r.action != ''", "`action`: missing"),
    ("r.resource.type != '' AND r.resource.id IS NOT NULL", "`resource`: missing type or id"),
]


def _intake_tables(
    kind: str, tuple_type: str, times: dict[str, str], checks: list[tuple[str, str]]
) -> list[str]:
    """The intake (Null) and parsed (Null) tables of one record kind and the views between.

    The JSON is parsed once, into the column ``r`` of ``{kind}_parsed``; the checks and the
    times read that column. (Computing them from the ``JSONExtract`` expression directly would
    parse the record again for every check: ClickHouse evaluates the arguments of ``AND``
    lazily, each with its own copy of the shared expression.)
    """
    intake = _columns_ddl(INTAKE_COLUMNS)
    with_times = ", ".join(["*", *(f"{expr} AS {name}" for name, expr in times.items())])
    return [
        f"CREATE TABLE IF NOT EXISTS {kind}_intake (\n    {intake}\n) ENGINE = Null",
        f"CREATE TABLE IF NOT EXISTS {kind}_parsed (\n    {intake},\n    `r` {tuple_type}\n"
        ") ENGINE = Null",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {kind}_parse_mv TO {kind}_parsed AS "
        f"SELECT topic, partition, offset, key, value, JSONExtract(value, '{tuple_type}') AS r "
        f"FROM {kind}_intake",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {kind}_reject_mv TO rejected AS "
        f"SELECT topic, partition, offset, key, substring(value, 1, 65536) AS value, "
        f"{_reason(checks)} AS reason "
        f"FROM (SELECT {with_times} FROM {kind}_parsed) WHERE NOT ({_ok(checks)})",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {kind}_load_mv TO {kind} AS "
        + _LOAD_SELECT[kind]
        + f"FROM (SELECT {with_times} FROM {kind}_parsed) WHERE {_ok(checks)}",
    ]


_DECISIONS = f"""
CREATE TABLE IF NOT EXISTS decisions (
    {_columns_ddl(DECISION_COLUMNS)},
    `loaded_at` DateTime64(3, 'UTC') DEFAULT now64(3),
    INDEX on_behalf_of_idx on_behalf_of_id TYPE bloom_filter GRANULARITY 4,
    INDEX qid_idx qid TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(at)
ORDER BY (principal_type, principal_id, at, qid)
"""

_EVENTS = f"""
CREATE TABLE IF NOT EXISTS events (
    {_columns_ddl(EVENT_COLUMNS)},
    `loaded_at` DateTime64(3, 'UTC') DEFAULT now64(3),
    INDEX on_behalf_of_idx on_behalf_of_id TYPE bloom_filter GRANULARITY 4,
    INDEX ingest_id_idx ingest_id TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(at)
ORDER BY (principal_type, principal_id, at, ingest_id)
"""

_REJECTED = """
CREATE TABLE IF NOT EXISTS rejected (
    `topic` LowCardinality(String),
    `partition` UInt32,
    `offset` UInt64,
    `key` String,
    `value` String,
    `reason` String,
    `seen_at` DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(seen_at)
ORDER BY (topic, partition, offset)
"""

_DECISIONS_SELECT = """
SELECT
    r.qid AS qid,
    assumeNotNull(parsed_at) AS at,
    if(r.call = '', 'check', r.call) AS call,
    r.transport AS transport,
    r.principal.type AS principal_type,
    r.principal.id AS principal_id,
    r.on_behalf_of.type AS on_behalf_of_type,
    r.on_behalf_of.id AS on_behalf_of_id,
    r.action AS action,
    r.resource.type AS resource_type,
    ifNull(r.resource.id, '') AS resource_id,
    r.verdict AS verdict,
    r.outcome AS outcome,
    r.challenges AS challenges,
    r.policies AS policies,
    ifNull(r.on_behalf_of_outcome, '') AS on_behalf_of_outcome,
    r.mode AS mode,
    r.challenge_qid AS challenge_qid,
    r.work_item AS work_item,
    r.assigned AS assigned,
    r.risk_score AS risk_score,
    r.policy_version AS policy_version,
    r.principals_version AS principals_version,
    r.latency_us AS latency_us,
    r.pdp AS pdp,
    r.pinned AS pinned,
    r.needs_row_checks AS needs_row_checks,
    r.attributes AS plan_attributes,
    r.not_in_directory AS not_in_directory,
    r.inline_ignored AS inline_ignored,
    r.search AS search,
    r.count AS result_count
"""

_EVENTS_SELECT = """
SELECT
    r.ingest_id AS ingest_id,
    assumeNotNull(parsed_at) AS at,
    assumeNotNull(ifNull(parsed_received_at, parsed_at)) AS received_at,
    r.system AS system,
    r.principal.type AS principal_type,
    r.principal.id AS principal_id,
    r.on_behalf_of.type AS on_behalf_of_type,
    r.on_behalf_of.id AS on_behalf_of_id,
    r.action AS action,
    r.resource.type AS resource_type,
    assumeNotNull(r.resource.id) AS resource_id,
    r.outcome AS outcome,
    r.source_ip AS source_ip,
    ifNull(r.attributes, '') AS attributes,
    JSONExtractString(ifNull(r.attributes, ''), 'plan_qid') AS plan_qid,
    r.access AS access,
    r.count AS row_count,
    r.tool AS tool,
    r.action_class AS action_class,
    r.role_arn AS role_arn
"""

_LOAD_SELECT = {"decisions": _DECISIONS_SELECT, "events": _EVENTS_SELECT}

_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    `version` UInt32,
    `name` String,
    `applied_at` DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY version
"""


def _by_resource(table: str, key: str) -> tuple[str, str]:
    """The resource-ordered copy of `table` and the view that fills it from every insert."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table}_by_resource AS {table} "
        f"ENGINE = ReplacingMergeTree PARTITION BY toDate(at) "
        f"ORDER BY (resource_type, resource_id, at, {key})",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {table}_by_resource_mv "
        f"TO {table}_by_resource AS SELECT * FROM {table}",
    )


#: Decision columns added after schema version 1 (``not_in_directory`` and ``inline_ignored``
#: by version 2, ``search`` and ``result_count`` by version 3).
_ADDED_DECISION_COLUMNS = ("not_in_directory", "inline_ignored", "search", "result_count")


def _remake_decision_views() -> tuple[str, ...]:
    """Adds the decision columns added since version 1 and makes the decisions views again.

    The views are built from the current column lists and checks, so every version that remakes
    them first adds every column those views write (``IF NOT EXISTS``: a database that has them
    already is not changed). A database made by an earlier release and several versions behind
    thus passes through consistent states, and a new database (version 1 is built from the
    current lists) is not changed by the ``ALTER`` statements at all.
    """
    return (
        *(
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS `{name}` {ty}"
            for t in ("decisions", "decisions_by_resource")
            for name, ty in DECISION_COLUMNS
            if name in _ADDED_DECISION_COLUMNS
        ),
        "DROP VIEW IF EXISTS decisions_by_resource_mv",
        "DROP VIEW IF EXISTS decisions_load_mv",
        "DROP VIEW IF EXISTS decisions_reject_mv",
        "DROP VIEW IF EXISTS decisions_parse_mv",
        "DROP TABLE IF EXISTS decisions_parsed",
        _by_resource("decisions", "qid")[1],
        *_intake_tables(
            "decisions", _DECISION_TUPLE, {"parsed_at": _time("r.at")}, _DECISION_CHECKS
        ),
    )


#: Schema version 2: the decision record's ``not_in_directory`` and ``inline_ignored``
#: (docs/decisions.md, "Inline entities") become columns. The loader is the only writer and
#: migrates before it reads.
_V2_DECISION_FIELDS = _remake_decision_views()

#: Schema version 3: search records (docs/search.md, "Decision records"): ``call`` ``search``
#: with ``search`` (``subject``, ``resource`` or ``action``), the searched-for part absent, no
#: verdict, and ``count`` (the page's results) as ``result_count``.
_V3_SEARCH_RECORDS = _remake_decision_views()

#: The reasoner's per-principal daily rollups (docs/history.md#daily-rollups).
ROLLUP_TABLE = "principal_daily"

#: Where a day's rollup is rebuilt before it replaces the day's partition
#: (``svc.history.rollups.settle``).
ROLLUP_STAGING = "principal_daily_rebuild"

#: Event actions that move data out (docs/architecture.md#components); an event with
#: ``access: exported`` moves data out too.
MOVING_OUT_ACTIONS: tuple[str, ...] = ("download", "export", "send_external", "share_external")

#: Cloud audit actions counted as sensitive (the reasoner's family (f), docs/reasoner.md): the
#: CloudTrail ``eventName`` values that turn off auditing, widen access, mint credentials, or
#: destroy keys and logs. A new list is a new schema version.
SENSITIVE_ACTIONS: tuple[str, ...] = (
    "StopLogging",
    "DeleteTrail",
    "UpdateTrail",
    "PutEventSelectors",
    "DeleteFlowLogs",
    "DisableKey",
    "ScheduleKeyDeletion",
    "CreateAccessKey",
    "CreateLoginProfile",
    "UpdateLoginProfile",
    "CreateUser",
    "AttachUserPolicy",
    "AttachRolePolicy",
    "PutUserPolicy",
    "PutRolePolicy",
    "UpdateAssumeRolePolicy",
    "AddUserToGroup",
    "PutBucketPolicy",
    "PutBucketAcl",
    "DeleteBucketPolicy",
    "PutBucketPublicAccessBlock",
    "DeletePublicAccessBlock",
    "ModifySnapshotAttribute",
    "ModifyImageAttribute",
    "AuthorizeSecurityGroupIngress",
    "GetSecretValue",
    "DisableGuardDuty",
    "DeleteDetector",
)

#: The ``system`` of the challenge service's audit events (docs/reasoner.md#challenges-that-failed):
#: how each challenge ended, one event for the principal that was challenged.
CHALLENGE_SYSTEM = "svc-challenge"

#: Those events' actions that count as a challenge failed (the reasoner's family (c)): rejected
#: by the approver, expired unanswered, a security-key verification that failed. They are not
#: counted again as ``failures``.
CHALLENGE_FAILED_ACTIONS: tuple[str, ...] = (
    "challenge.rejected",
    "challenge.expired",
    "challenge.verification_failed",
)

#: Weight of a row per kind of access in the weighted volume (docs/reasoner.md): a listed row
#: counts a quarter of a read, an exported row four times (docs/architecture.md#components), and
#: a written row as much as a read.
ACCESS_WEIGHTS: dict[str, float] = {"listed": 0.25, "read": 1.0, "written": 1.0, "exported": 4.0}

_SUM = "SimpleAggregateFunction(sum, UInt64)"

#: ``principal_daily`` columns: (name, type). Counters are summed, ``hours`` maps the UTC hour
#: (0..23) to decisions plus events in it, ``first_at``/``last_at`` bound the day's activity,
#: ``resources`` is an exact distinct-count state of (type, id), the other states hold the
#: distinct values (at most 256; 1,024 people acted for).
ROLLUP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("day", "Date"),
    ("principal_type", "LowCardinality(String)"),
    ("principal_id", "String"),
    ("decisions", _SUM),
    ("denies", _SUM),
    ("challenges", _SUM),
    ("events", _SUM),
    ("failures", _SUM),
    ("moved_out", _SUM),
    ("moved_out_rows", _SUM),
    ("rows_listed", _SUM),
    ("rows_read", _SUM),
    ("rows_written", _SUM),
    ("rows_exported", _SUM),
    ("cloud_failures", _SUM),
    ("sensitive", _SUM),
    ("hours", "SimpleAggregateFunction(sumMap, Map(UInt8, UInt64))"),
    ("first_at", "SimpleAggregateFunction(min, DateTime64(3, 'UTC'))"),
    ("last_at", "SimpleAggregateFunction(max, DateTime64(3, 'UTC'))"),
    ("resources", "AggregateFunction(uniqExact, String, String)"),
    ("resource_types", "AggregateFunction(groupUniqArray(256), String)"),
    ("actions", "AggregateFunction(groupUniqArray(256), String)"),
    ("tools", "AggregateFunction(groupUniqArray(256), String)"),
    ("source_ips", "AggregateFunction(groupUniqArray(256), String)"),
    ("acted_for", "AggregateFunction(groupUniqArray(1024), String)"),
    ("challenges_failed", _SUM),
)

_ROLLUP = f"""
CREATE TABLE IF NOT EXISTS {ROLLUP_TABLE} (
    {_columns_ddl(ROLLUP_COLUMNS)}
)
ENGINE = AggregatingMergeTree
PARTITION BY day
ORDER BY (principal_type, principal_id, day)
"""


def _sql_list(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


_CHALLENGE_FAILED = _sql_list(CHALLENGE_FAILED_ACTIONS)

_MOVING = f"(action IN ({_sql_list(MOVING_OUT_ACTIONS)}) OR access = 'exported')"

#: What the decisions give a principal's day. A deny of the built-in ``svc:contained`` is the
#: containment itself, not new evidence, so it is not counted.
_ROLLUP_FROM_DECISIONS = """
SELECT
    toDate(at) AS day,
    principal_type,
    principal_id,
    count() AS decisions,
    countIf(verdict = 'deny' AND NOT has(policies, 'svc:contained')) AS denies,
    countIf(verdict = 'challenge') AS challenges,
    sumMap(map(toUInt8(toHour(at)), toUInt64(1))) AS hours,
    min(at) AS first_at,
    max(at) AS last_at,
    uniqExactStateIf(resource_type, resource_id, resource_id != '') AS resources,
    groupUniqArrayState(256)(resource_type) AS resource_types,
    groupUniqArrayStateIf(256)(action, action != '') AS actions,
    groupUniqArrayStateIf(1024)(on_behalf_of_id, on_behalf_of_id != '') AS acted_for
FROM {source}
WHERE principal_id != ''
GROUP BY day, principal_type, principal_id
"""

#: What the events give a principal's day. An access event without ``count`` is one row.
_ROLLUP_FROM_EVENTS = f"""
SELECT
    toDate(at) AS day,
    principal_type,
    principal_id,
    count() AS events,
    countIf(outcome = 'failure' AND system != '{CHALLENGE_SYSTEM}') AS failures,
    countIf({_MOVING}) AS moved_out,
    sumIf(ifNull(row_count, 1), {_MOVING}) AS moved_out_rows,
    sumIf(ifNull(row_count, 1), access = 'listed') AS rows_listed,
    sumIf(ifNull(row_count, 1), access = 'read') AS rows_read,
    sumIf(ifNull(row_count, 1), access = 'written') AS rows_written,
    sumIf(ifNull(row_count, 1), access = 'exported') AS rows_exported,
    countIf(endsWith(system, '.amazonaws.com') AND outcome = 'failure') AS cloud_failures,
    countIf(action IN ({_sql_list(SENSITIVE_ACTIONS)})) AS sensitive,
    sumMap(map(toUInt8(toHour(at)), toUInt64(1))) AS hours,
    min(at) AS first_at,
    max(at) AS last_at,
    uniqExactStateIf(resource_type, resource_id, resource_id != '') AS resources,
    groupUniqArrayState(256)(resource_type) AS resource_types,
    groupUniqArrayState(256)(action) AS actions,
    groupUniqArrayStateIf(256)(tool, tool != '') AS tools,
    groupUniqArrayStateIf(256)(source_ip, source_ip != '') AS source_ips,
    groupUniqArrayStateIf(1024)(on_behalf_of_id, on_behalf_of_id != '') AS acted_for,
    countIf(system = '{CHALLENGE_SYSTEM}' AND action IN ({_CHALLENGE_FAILED})) AS challenges_failed
FROM {{source}}
GROUP BY day, principal_type, principal_id
"""

#: The rollup's SELECT from each raw table, with ``{source}`` the table (``decisions``, or
#: ``decisions FINAL`` to rebuild from deduplicated rows).
ROLLUP_SELECTS: dict[str, str] = {
    "decisions": _ROLLUP_FROM_DECISIONS,
    "events": _ROLLUP_FROM_EVENTS,
}


def _rollup_views() -> tuple[str, ...]:
    """The views that feed ``principal_daily`` from every insert into ``decisions``/``events``."""
    return tuple(
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ROLLUP_TABLE}_{kind}_mv TO {ROLLUP_TABLE} AS "
        + select.format(source=kind)
        for kind, select in ROLLUP_SELECTS.items()
    )


def rollup_rebuild_statements(where: str = "", into: str = ROLLUP_TABLE) -> tuple[str, ...]:
    """Statements that fill ``principal_daily`` from the raw tables read with ``FINAL``.

    Args:
        where: an extra condition on the raw rows (for example ``toDate(at) = '2026-11-20'``);
            empty for every row.
        into: the table to fill (``ROLLUP_STAGING`` to rebuild a day apart).

    Returns:
        Two ``INSERT ... SELECT`` statements (decisions, events). They add to what the table
        holds: clear the days they cover first.

    """
    out = []
    for kind, select in ROLLUP_SELECTS.items():
        source = f"{kind} FINAL" + (f" WHERE {where}" if where else "")
        body = select.format(source=source)
        if where and "WHERE principal_id" in body:
            body = body.replace("WHERE principal_id", "AND principal_id")
        names = ", ".join(f"`{n}`" for n in _select_names(select))
        out.append(f"INSERT INTO {into} ({names}) " + body)
    return tuple(out)


def _select_names(select: str) -> list[str]:
    """The column names a rollup SELECT gives (its ``AS`` aliases and bare columns)."""
    head = select.split("FROM", 1)[0].removeprefix("\nSELECT")
    names = []
    for line in head.strip().splitlines():
        item = line.strip().rstrip(",")
        names.append(item.rsplit(" AS ", 1)[1] if " AS " in item else item)
    return names


#: Schema version 4: the reasoner's daily rollups, fed by views on the raw tables, and filled
#: once from what the raw tables already hold (``TRUNCATE`` first, so a run that died midway and
#: runs again does not count a row twice).
_V4_ROLLUPS: tuple[str, ...] = (
    _ROLLUP,
    f"CREATE TABLE IF NOT EXISTS {ROLLUP_STAGING} AS {ROLLUP_TABLE}",
    *_rollup_views(),
    f"TRUNCATE TABLE IF EXISTS {ROLLUP_TABLE}",
    *rollup_rebuild_statements(),
)

#: Schema version 5: decision searches (``svc.history.queries.search_decisions``,
#: docs/history.md#searching-decisions). The projection ``by_time`` keeps a copy of every
#: ``decisions`` part ordered by ``(at, qid)``, in granules of 1,024 rows, so a search without a
#: principal or resource (a verdict or a policy over a time range) reads the few granules of its
#: time window instead of every granule of the day's parts (ordered by principal). Searches
#: read without ``FINAL`` (ClickHouse reads projections only then) and drop a record's copies
#: with ``LIMIT 1 BY qid``. A ``ReplacingMergeTree`` takes a projection only with
#: ``deduplicate_merge_projection_mode`` set: ``rebuild`` makes a merge that drops copies build
#: the merged part's projection again. ``MATERIALIZE`` builds the projection of the parts the
#: table already holds (a mutation, waited for), so a history made by an earlier release is
#: served the same way. The projection holds the columns the table has now: a column added by a
#: later version is read from the table itself until that version rebuilds the projection.
_V5_SEARCH: tuple[str, ...] = (
    "ALTER TABLE decisions MODIFY SETTING deduplicate_merge_projection_mode = 'rebuild'",
    "ALTER TABLE decisions ADD PROJECTION IF NOT EXISTS by_time "
    "(SELECT * ORDER BY at, qid) WITH SETTINGS (index_granularity = 1024)",
    "ALTER TABLE decisions MATERIALIZE PROJECTION by_time SETTINGS mutations_sync = 1",
)

#: Schema version 6: ``principal_daily.challenges_failed``, the challenges of a principal's day
#: that were rejected, expired or failed verification (the challenge service's audit events,
#: ``CHALLENGE_FAILED_ACTIONS``), and ``failures`` without them; the events view is made again
#: from the current SELECT. Days rolled up before keep 0 (no such events existed).
_V6_CHALLENGES_FAILED: tuple[str, ...] = (
    *(
        f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS `challenges_failed` {_SUM}"
        for t in (ROLLUP_TABLE, ROLLUP_STAGING)
    ),
    f"DROP VIEW IF EXISTS {ROLLUP_TABLE}_events_mv",
    _rollup_views()[1],
)

#: The overview's hourly rollups (schema version 7, docs/history.md#hourly-rollups): decisions
#: and events per UTC hour by verdict, and per hour the denials of each principal and resource
#: (with ``key``, ``cityHash64(type, id)``, which the rankings group by: an integer is grouped
#: several times faster than two strings). ``svc.history.hourly`` settles and reads them.
HOURLY_TABLE = "decisions_hourly"
DENIED_PRINCIPALS_TABLE = "denied_principals_hourly"
DENIED_RESOURCES_TABLE = "denied_resources_hourly"

#: When each hour of ``decisions_hourly`` was last found equal to the raw rows (one row per
#: hour; the latest ``settled_at`` wins). An hour whose rollup row was written after its mark
#: (``inserted_at``) is read from the raw rows.
HOURLY_SETTLED_TABLE = "decisions_hourly_settled"

#: The three rollup tables of version 7, in the order a settled day is swapped in (the table
#: that carries ``inserted_at`` last).
HOURLY_TABLES: tuple[str, ...] = (DENIED_PRINCIPALS_TABLE, DENIED_RESOURCES_TABLE, HOURLY_TABLE)

#: Where a day of each hourly rollup is rebuilt before it replaces the day's partition.
HOURLY_STAGING: dict[str, str] = {t: f"{t}_rebuild" for t in HOURLY_TABLES}

#: The counters of ``decisions_hourly``: every decision (checks, plans, searches), the checks
#: by verdict, monitor mode's would-deny / would-challenge (checks by verdict, plans by
#: outcome), plans, and events.
HOURLY_COUNTERS: tuple[str, ...] = (
    "decisions",
    "allow",
    "deny",
    "challenge",
    "would_deny",
    "would_challenge",
    "plans",
    "events",
)

_HOURLY = f"""
CREATE TABLE IF NOT EXISTS {{name}} (
    `hour` DateTime('UTC'),
    {", ".join(f"`{c}` {_SUM}" for c in HOURLY_COUNTERS)},
    `inserted_at` SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(hour)
ORDER BY hour
"""

_DENIED = f"""
CREATE TABLE IF NOT EXISTS {{name}} (
    `hour` DateTime('UTC'),
    `type` LowCardinality(String),
    `id` String,
    `denies` {_SUM},
    `key` SimpleAggregateFunction(any, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(hour)
ORDER BY (hour, type, id)
"""

_HOURLY_SETTLED = f"""
CREATE TABLE IF NOT EXISTS {HOURLY_SETTLED_TABLE} (
    `hour` DateTime('UTC'),
    `settled_at` DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(settled_at)
PARTITION BY toDate(hour)
ORDER BY hour
"""

#: A decision a principal was denied: a check denied or a plan ``always_denied``.
PRINCIPAL_DENIED = "(verdict = 'deny' OR outcome = 'always_denied')"
#: A decision a resource was denied: a check on it denied (a plan names no resource id).
RESOURCE_DENIED = "(verdict = 'deny' AND resource_id != '')"

#: Each hourly rollup's SELECT from a raw table, ``{source}`` the table (or a deduplicated
#: subquery to rebuild), keyed by (rollup table, raw table).
HOURLY_SELECTS: dict[tuple[str, str], str] = {
    (HOURLY_TABLE, "decisions"): (
        "SELECT toStartOfHour(at) AS hour, count() AS decisions, "
        "countIf(call != 'plan' AND verdict = 'allow') AS allow, "
        "countIf(call != 'plan' AND verdict = 'deny') AS deny, "
        "countIf(call != 'plan' AND verdict = 'challenge') AS challenge, "
        "countIf(mode = 'monitor' AND (verdict = 'deny' OR outcome = 'always_denied')) "
        "AS would_deny, "
        "countIf(mode = 'monitor' AND (verdict = 'challenge' OR outcome = 'challenge')) "
        "AS would_challenge, "
        "countIf(call = 'plan') AS plans, now64(3) AS inserted_at "
        "FROM {source} GROUP BY hour"
    ),
    (HOURLY_TABLE, "events"): (
        "SELECT toStartOfHour(at) AS hour, count() AS events, now64(3) AS inserted_at "
        "FROM {source} GROUP BY hour"
    ),
    (DENIED_PRINCIPALS_TABLE, "decisions"): (
        "SELECT toStartOfHour(at) AS hour, principal_type AS type, principal_id AS id, "
        "count() AS denies, cityHash64(type, id) AS key "
        f"FROM {{source}} WHERE {PRINCIPAL_DENIED} GROUP BY hour, type, id"
    ),
    (DENIED_RESOURCES_TABLE, "decisions"): (
        "SELECT toStartOfHour(at) AS hour, resource_type AS type, resource_id AS id, "
        "count() AS denies, cityHash64(type, id) AS key "
        f"FROM {{source}} WHERE {RESOURCE_DENIED} GROUP BY hour, type, id"
    ),
}


def _hourly_view_name(table: str, raw: str) -> str:
    return f"{table}_{raw}_mv"


def hourly_rebuild_statements(where: str = "", staging: bool = False) -> tuple[str, ...]:
    """Statements that fill the hourly rollups from the raw tables read with ``FINAL``.

    Args:
        where: a condition on the raw rows (for example ``toDate(at) = '2026-11-20'``); empty
            for every row.
        staging: fill the staging copies (``HOURLY_STAGING``) instead of the rollups.

    Returns:
        One ``INSERT ... SELECT`` per (rollup, raw table) of ``HOURLY_SELECTS``. They add to
        what the tables hold: clear the days they cover first.

    """
    out = []
    for (table, raw), select in HOURLY_SELECTS.items():
        source = f"(SELECT * FROM {raw} FINAL" + (f" WHERE {where}" if where else "") + ")"
        into = HOURLY_STAGING[table] if staging else table
        names = select.split(" FROM ", 1)[0].removeprefix("SELECT ")
        cols = ", ".join(f"`{item.rsplit(' AS ', 1)[1]}`" for item in _split_top(names))
        out.append(f"INSERT INTO {into} ({cols}) " + select.format(source=source))
    return tuple(out)


def _split_top(items: str) -> list[str]:
    """Splits a SELECT list at its top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in items:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    out.append(cur.strip())
    return out


#: Marks every hour of every day the raw tables hold as settled now (the backfill of version 7
#: made them equal; the loader must not be running, as for every migration).
_MARK_ALL_SETTLED = (
    f"INSERT INTO {HOURLY_SETTLED_TABLE} (hour, settled_at) "
    "SELECT toDateTime(d, 'UTC') + 3600 * arrayJoin(range(24)) AS hour, now64(3) "
    "FROM (SELECT DISTINCT toDate(at) AS d FROM decisions "
    "UNION DISTINCT SELECT DISTINCT toDate(at) AS d FROM events)"
)

#: Schema version 7: the overview's hourly rollups (``decisions_hourly``, the denied
#: principals and resources per hour), fed by views on every insert into ``decisions`` and
#: ``events``, filled once from the raw rows read with ``FINAL`` (truncated first, so a run
#: that died midway counts nothing twice) and marked settled.
_V7_HOURLY: tuple[str, ...] = (
    _HOURLY.format(name=HOURLY_TABLE),
    _DENIED.format(name=DENIED_PRINCIPALS_TABLE),
    _DENIED.format(name=DENIED_RESOURCES_TABLE),
    *(f"CREATE TABLE IF NOT EXISTS {s} AS {t}" for t, s in HOURLY_STAGING.items()),
    _HOURLY_SETTLED,
    *(
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {_hourly_view_name(t, raw)} TO {t} AS "
        + select.format(source=raw)
        for (t, raw), select in HOURLY_SELECTS.items()
    ),
    *(f"TRUNCATE TABLE IF EXISTS {t}" for t in (*HOURLY_TABLES, HOURLY_SETTLED_TABLE)),
    *hourly_rebuild_statements(),
    _MARK_ALL_SETTLED,
)

#: Every schema version, oldest first. Add new versions at the end; never edit an applied one.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "decisions, events, rejected; resource-ordered copies; intake views",
        (
            _DECISIONS,
            *_by_resource("decisions", "qid"),
            _EVENTS,
            *_by_resource("events", "ingest_id"),
            _REJECTED,
            *_intake_tables(
                "decisions",
                _DECISION_TUPLE,
                {"parsed_at": _time("r.at")},
                _DECISION_CHECKS,
            ),
            *_intake_tables(
                "events",
                _EVENT_TUPLE,
                {"parsed_at": _time("r.at"), "parsed_received_at": _time("r.received_at")},
                _EVENT_CHECKS,
            ),
        ),
    ),
    Migration(2, "decisions: not_in_directory, inline_ignored", _V2_DECISION_FIELDS),
    Migration(3, "decisions: search records (search, result_count)", _V3_SEARCH_RECORDS),
    Migration(4, "principal_daily: the reasoner's per-principal daily rollups", _V4_ROLLUPS),
    Migration(5, "decisions: projection by_time for decision searches", _V5_SEARCH),
    Migration(6, "principal_daily: challenges failed, rejected or expired", _V6_CHALLENGES_FAILED),
    Migration(7, "decisions_hourly and the denied per hour: the overview's rollups", _V7_HOURLY),
)

#: Tables holding day partitions that retention drops (docs/history.md#retention).
RETAINED_TABLES: tuple[str, ...] = (
    "decisions",
    "decisions_by_resource",
    "events",
    "events_by_resource",
    "rejected",
    ROLLUP_TABLE,
    *HOURLY_TABLES,
    HOURLY_SETTLED_TABLE,
)


def applied_versions(client: Client) -> set[int]:
    """The schema versions recorded in ``schema_migrations`` (creating that table if missing).

    Args:
        client: a ``clickhouse-connect`` client on the history database.

    Returns:
        The set of applied version numbers (empty on a new database).

    Raises:
        clickhouse_connect.driver.exceptions.DatabaseError: the engine refused a statement.

    """
    client.command(_MIGRATIONS_TABLE)
    rows = client.query("SELECT DISTINCT version FROM schema_migrations").result_rows
    return {int(r[0]) for r in rows}


def migrate(client: Client, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Applies the schema versions not yet applied: the per-release schema job.

    Idempotent: a second run applies nothing. Every statement is ``IF NOT EXISTS`` and a
    version is recorded only after all its statements ran, so a run that failed midway is
    finished by the next one (docs/history.md#schema).

    Args:
        client: a ``clickhouse-connect`` client on the history database (see
            ``svc.history.connect``).
        migrations: the versions to apply (default: this release's schema).

    Returns:
        The versions applied by this call, in order (``[]`` when already up to date).

    Raises:
        clickhouse_connect.driver.exceptions.DatabaseError: a statement failed; the versions
            applied before it stay recorded.

    """
    done = applied_versions(client)
    applied: list[int] = []
    for m in sorted(migrations, key=lambda m: m.version):
        if m.version in done:
            continue
        for stmt in m.statements:
            client.command(stmt)
        client.insert(
            "schema_migrations",
            [[m.version, m.name]],
            column_names=["version", "name"],
            column_type_names=["UInt32", "String"],
        )
        log.info("history schema: applied version %d (%s)", m.version, m.name)
        applied.append(m.version)
    return applied
