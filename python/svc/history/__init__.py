"""The history store: decisions and events in ClickHouse (docs/history.md).

Both broker topics (``svc.decisions.v1``, ``svc.events.v1``) are loaded into ClickHouse tables
ordered by principal, each with a copy ordered by resource, for the portal's search and the
reasoner's 30-day reads. docs/history.md describes the whole of it.

* ``connect(dsn)``: ``chdb:///dir`` for the embedded engine (one per process, shared) or
  ``http(s)://host:port/db`` for a ClickHouse server (``svc.history.store``).
* ``migrate(client)``: the per-release schema job, idempotent (``svc.history.schema``).
* ``Loader``: the consumer that stores batches, then commits offsets, and reports whether it is
  failing or behind (``Loader.health``; ``svc.history.loader``).
* ``apply_retention(client, days)``: drops whole days older than ``analytics.retentionDays``.
* Queries (``svc.history.queries``): decisions and events of a principal or a resource over a
  time range (optionally only monitor-mode would-deny / would-challenge), verdict counts, and
  per-day aggregates for the reasoner.

Example::

    from datetime import datetime, timedelta, UTC
    from svc import history

    client = history.connect("chdb:///var/lib/svc/history", create_database=True)
    history.migrate(client)
    now = datetime.now(UTC)
    history.decisions_of_principal(client, "Human::alice", now - timedelta(days=1), now,
                                   monitor_only=True)
"""

from svc.history.loader import (
    DEFAULT_GROUP,
    EVENTS_TOPIC,
    Batch,
    Loader,
    LoaderHealth,
    LoaderHealthSettings,
    LoaderStats,
    consumer_config,
)
from svc.history.queries import (
    MOVING_OUT_ACTIONS,
    DailyCounts,
    Ref,
    daily_counts,
    decision_by_qid,
    decisions_between,
    decisions_of_principal,
    decisions_of_resource,
    events_of_principal,
    events_of_resource,
    parse_ref,
    rejected_count,
    verdict_counts,
)
from svc.history.schema import MIGRATIONS, RETAINED_TABLES, Migration, applied_versions, migrate
from svc.history.store import (
    Kind,
    Record,
    apply_retention,
    connect,
    encode_rowbinary,
    retention_cutoff,
    store,
)

__all__ = [
    "DEFAULT_GROUP",
    "EVENTS_TOPIC",
    "MIGRATIONS",
    "MOVING_OUT_ACTIONS",
    "RETAINED_TABLES",
    "Batch",
    "DailyCounts",
    "Kind",
    "Loader",
    "LoaderHealth",
    "LoaderHealthSettings",
    "LoaderStats",
    "Migration",
    "Record",
    "Ref",
    "applied_versions",
    "apply_retention",
    "connect",
    "consumer_config",
    "daily_counts",
    "decision_by_qid",
    "decisions_between",
    "decisions_of_principal",
    "decisions_of_resource",
    "encode_rowbinary",
    "events_of_principal",
    "events_of_resource",
    "migrate",
    "parse_ref",
    "rejected_count",
    "retention_cutoff",
    "store",
    "verdict_counts",
]
