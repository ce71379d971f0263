"""The context service's tables (SQLModel; docs/context.md#storage).

* ``scim_users``, ``scim_groups``, ``scim_members``: the directory as the identity provider
  provisions it over SCIM (RFC 7643). A user's whole SCIM document is kept in ``doc``; the
  columns beside it are what queries and uniqueness need. A deleted user is kept with
  ``removed_at`` set (history must still name removed people; docs/architecture.md).
* ``principals``: the decision points' view of people, groups, service accounts and risk
  scores, one row per ``(kind, id)``, each the exact record ``GET /v1/principals`` serves.
* ``resources``, ``work_items``: what connectors write, as Cedar entities and work-item records.
* ``changes``: every change of the three feeds (``principals``, ``resources``, ``work_items``)
  in one order; ``seq`` comes from the ``counters`` row ``changes``, whose row lock makes
  writers commit in ``seq`` order (docs/context.md#versions-and-feeds).
* ``service_accounts``, ``risk_scores``, ``trusted_apps``, ``investigations``: the records of
  their routes; ``service_account_changes`` every registration, change and retirement of a
  service account with its author; ``risk_score_days`` each principal's score per UTC day on
  which the reasoner published one (the 30-day risk history, docs/context.md#risk-scores).

The schema itself is made by the Alembic migrations in ``svc/context/migrations``
(``svc.context.migrate``), never by ``create_all``. Times are stored in UTC.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Column, Date, DateTime, Integer, String, Text
from sqlmodel import Field, SQLModel

__all__ = [
    "ChangeRow",
    "CounterRow",
    "InvestigationRow",
    "MemberRow",
    "PrincipalRow",
    "ResourceRow",
    "RiskScoreDayRow",
    "RiskScoreRow",
    "ScimGroupRow",
    "ScimUserRow",
    "ServiceAccountChangeRow",
    "ServiceAccountRow",
    "TrustedAppRow",
    "WorkItemRow",
    "utc",
]

_TZ = DateTime(timezone=True)


def utc(t: datetime | None) -> datetime | None:
    """``t`` as an aware UTC time (a naive time, as SQLite returns it, is taken as UTC)."""
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


class ScimUserRow(SQLModel, table=True):
    """A SCIM user; ``user_name_key`` is the case-folded ``userName`` (unique while present)."""

    __tablename__ = "scim_users"

    id: str = Field(sa_column=Column(String(64), primary_key=True))
    user_name: str = Field(sa_column=Column(String(512), nullable=False))
    user_name_key: str = Field(sa_column=Column(String(512), nullable=False, index=True))
    external_id: str | None = Field(default=None, sa_column=Column(String(512), nullable=True))
    active: bool = Field(sa_column=Column(Boolean, nullable=False))
    manager_id: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    removed_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    doc: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    version: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class ScimGroupRow(SQLModel, table=True):
    """A SCIM group; ``display_name_key`` is the case-folded ``displayName`` (unique)."""

    __tablename__ = "scim_groups"

    id: str = Field(sa_column=Column(String(64), primary_key=True))
    display_name: str = Field(sa_column=Column(String(512), nullable=False))
    display_name_key: str = Field(sa_column=Column(String(512), nullable=False, unique=True))
    external_id: str | None = Field(default=None, sa_column=Column(String(512), nullable=True))
    doc: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    version: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class MemberRow(SQLModel, table=True):
    """One member of a group: ``member_type`` is ``User`` or ``Group`` (RFC 7643 section 4.2)."""

    __tablename__ = "scim_members"

    group_id: str = Field(sa_column=Column(String(64), primary_key=True))
    member_id: str = Field(sa_column=Column(String(64), primary_key=True, index=True))
    member_type: str = Field(sa_column=Column(String(16), nullable=False))


class PrincipalRow(SQLModel, table=True):
    """One record of the principals snapshot (docs/context.md#principals).

    ``kind`` is ``Human``, ``Group``, ``ServiceAccount`` or ``RiskScore``; ``value`` the Cedar
    entity (people, groups), the registration record, or ``{"principal", "score"}``;
    ``removed`` marks a removed person, kept so the history can still name them.
    """

    __tablename__ = "principals"

    kind: str = Field(sa_column=Column(String(32), primary_key=True))
    id: str = Field(sa_column=Column(String(512), primary_key=True))
    value: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    removed: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))


class ResourceRow(SQLModel, table=True):
    """A resource as a Cedar entity ``{"uid", "attrs", "parents"}``."""

    __tablename__ = "resources"

    type: str = Field(sa_column=Column(String(256), primary_key=True))
    id: str = Field(sa_column=Column(String(512), primary_key=True))
    entity: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class WorkItemRow(SQLModel, table=True):
    """A work item ``{id, status, links, attrs}``; ``id`` is ``<tracker>:<key>``."""

    __tablename__ = "work_items"

    id: str = Field(sa_column=Column(String(512), primary_key=True))
    item: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class ChangeRow(SQLModel, table=True):
    """One change of a feed: the new state of ``(kind, key)``; ``value`` None when it is gone."""

    __tablename__ = "changes"

    seq: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    feed: str = Field(sa_column=Column(String(16), nullable=False, index=True))
    kind: str = Field(sa_column=Column(String(32), nullable=False))
    key: str = Field(sa_column=Column(String(1024), nullable=False))
    value: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    removed: bool = Field(default=False, sa_column=Column(Boolean, nullable=False))
    at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class CounterRow(SQLModel, table=True):
    """A named counter; ``changes`` numbers the change feed."""

    __tablename__ = "counters"

    name: str = Field(sa_column=Column(String(32), primary_key=True))
    value: int = Field(sa_column=Column(BigInteger, nullable=False))


class ServiceAccountRow(SQLModel, table=True):
    """A registered service account (docs/architecture.md#entities-and-the-base-schema)."""

    __tablename__ = "service_accounts"

    id: str = Field(sa_column=Column(String(512), primary_key=True))
    record: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class ServiceAccountChangeRow(SQLModel, table=True):
    """One registration, change or retirement of a service account, with its author.

    ``change`` is ``registered``, ``changed`` or ``retired``; ``record`` the record after it
    (None once retired); ``author`` who made it (a trusted app through the portal's agents API,
    or a caller's word; ``""`` when none was given).
    """

    __tablename__ = "service_account_changes"

    id: str = Field(sa_column=Column(String(64), primary_key=True))
    service_account: str = Field(sa_column=Column(String(512), nullable=False, index=True))
    change: str = Field(sa_column=Column(String(16), nullable=False))
    author: str = Field(default="", sa_column=Column(String(512), nullable=False))
    at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    record: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class RiskScoreRow(SQLModel, table=True):
    """The reasoner's latest score of a principal (``Type::"id"`` key), 0 to 100."""

    __tablename__ = "risk_scores"

    principal: str = Field(sa_column=Column(String(1024), primary_key=True))
    score: int = Field(sa_column=Column(Integer, nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    factors: list[dict[str, Any]] | None = Field(
        default=None, sa_column=Column(JSON, nullable=True)
    )
    """The top contributing factors ``{name, observed, baseline, contribution, ...}``."""
    details: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    """What else the reasoner says of the score (``learning``, ``peer_group``, ``window``)."""


class RiskScoreDayRow(SQLModel, table=True):
    """A principal's score on one UTC day on which the reasoner published a score for it.

    ``score`` is the last one published that day, ``high`` the highest; a day without a row
    kept the score of the day before (the reasoner publishes a score only when it changes,
    docs/reasoner.md#a-cycle). Rows older than ``risk_history_days`` are dropped, but for each
    principal's newest one, which still holds the score in force.
    """

    __tablename__ = "risk_score_days"

    principal: str = Field(sa_column=Column(String(1024), primary_key=True))
    day: date = Field(sa_column=Column(Date, primary_key=True))
    score: int = Field(sa_column=Column(Integer, nullable=False))
    high: int = Field(sa_column=Column(Integer, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class TrustedAppRow(SQLModel, table=True):
    """An app trusted to sign agent tokens (docs/architecture.md#trusted-app-issuers)."""

    __tablename__ = "trusted_apps"

    name: str = Field(sa_column=Column(String(128), primary_key=True))
    iss: str = Field(sa_column=Column(String(1024), nullable=False))
    jwks_url: str = Field(sa_column=Column(String(2048), nullable=False))
    aud: str = Field(sa_column=Column(String(1024), nullable=False))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class InvestigationRow(SQLModel, table=True):
    """An investigation of a principal: ``status`` is ``open`` or ``closed``.

    The reasoner's carry their ``kind``, ``evidence`` and ``summary``
    (docs/reasoner.md#investigations).
    """

    __tablename__ = "investigations"

    id: str = Field(sa_column=Column(String(64), primary_key=True))
    principal: str = Field(sa_column=Column(String(1024), nullable=False, index=True))
    reason: str = Field(sa_column=Column(Text, nullable=False))
    opened_by: str = Field(sa_column=Column(String(512), nullable=False))
    opened_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    status: str = Field(sa_column=Column(String(16), nullable=False))
    closed_by: str | None = Field(default=None, sa_column=Column(String(512), nullable=True))
    closed_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    resolution: str = Field(default="", sa_column=Column(Text, nullable=False))
    kind: str = Field(default="manual", sa_column=Column(String(32), nullable=False))
    """``manual``, or the reasoner's ``contain``, ``would_contain`` and ``score``."""
    evidence: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    """The evidence behind it: factors, baselines, the window, sample record ids."""
    summary: str = Field(default="", sa_column=Column(Text, nullable=False))
    summary_by: str = Field(default="", sa_column=Column(String(256), nullable=False))
    """Who wrote the summary: a model's name, or ``deterministic``."""
