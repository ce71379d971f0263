"""The policy service's tables (SQLModel; docs/policy.md#storage).

``bundles`` (drafts, the active bundle, superseded ones), ``enforcement_changes`` (every mode
change; the latest per scope is the mode in force), ``outage_fallbacks`` (a tier per MCP tool
pattern), ``break_glass_events`` (accepted break-glass rollbacks; ``nonce`` is unique, which
is what refuses a replay), ``policy_tests`` (saved decisions every dry run and publish decides
again, docs/policy.md#policy-tests) and ``publishes`` (every publish, with the failing tests
its author accepted). The schema itself is made by the Alembic migrations in
``svc/policy/migrations`` (``svc.policy.migrate``), never by ``create_all``.

Times are stored in UTC (``DateTime(timezone=True)``; SQLite keeps them naive, read back as UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Integer, LargeBinary, String, Text
from sqlmodel import Field, SQLModel

__all__ = [
    "BreakGlassEvent",
    "BundleRow",
    "EnforcementChangeRow",
    "OutageFallbackRow",
    "PolicyTestRow",
    "PublishRow",
    "utc",
]


#: Row ids: BIGINT, except on SQLite, where only INTEGER PRIMARY KEY numbers rows by itself.
_ID = BigInteger().with_variant(Integer, "sqlite")


def utc(t: datetime | None) -> datetime | None:
    """``t`` as an aware UTC time (a naive time, as SQLite returns it, is taken as UTC)."""
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


class BundleRow(SQLModel, table=True):
    """One bundle version: ``state`` is ``draft``, ``active`` or ``superseded``.

    ``files`` maps file name to text; ``policies``/``warnings`` are the validation's result;
    ``digest`` is the hex SHA-256 of the canonical form and ``signature`` the Ed25519 signature
    of its bytes, set on the first publish (docs/bundles.md#signed-bundles).
    """

    __tablename__ = "bundles"

    version: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    state: str = Field(sa_column=Column(String(16), nullable=False, index=True))
    author: str = Field(sa_column=Column(String(256), nullable=False))
    comment: str = Field(default="", sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    published_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    files: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    policies: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    warnings: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    digest: str = Field(sa_column=Column(String(64), nullable=False))
    signature: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    key_id: str = Field(default="", sa_column=Column(String(64), nullable=False))


class EnforcementChangeRow(SQLModel, table=True):
    """One recorded mode change: ``scope`` is ``install`` or ``containment``."""

    __tablename__ = "enforcement_changes"

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True))
    at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    author: str = Field(sa_column=Column(String(256), nullable=False))
    scope: str = Field(sa_column=Column(String(16), nullable=False, index=True))
    from_mode: str = Field(sa_column=Column(String(16), nullable=False))
    to_mode: str = Field(sa_column=Column(String(16), nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))


class OutageFallbackRow(SQLModel, table=True):
    """The outage tier of the tools a pattern names (``up/tool``, ``up/*``, ``*``)."""

    __tablename__ = "outage_fallbacks"

    tool: str = Field(sa_column=Column(String(512), primary_key=True))
    tier: str = Field(sa_column=Column(String(16), nullable=False))
    author: str = Field(sa_column=Column(String(256), nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))


class BreakGlassEvent(SQLModel, table=True):
    """An accepted break-glass rollback (docs/policy.md#break-glass)."""

    __tablename__ = "break_glass_events"

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True))
    at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    admin: str = Field(sa_column=Column(String(256), nullable=False))
    nonce: str = Field(sa_column=Column(String(128), nullable=False, unique=True))
    version: int = Field(sa_column=Column(BigInteger, nullable=False))
    from_version: int = Field(sa_column=Column(BigInteger, nullable=False))
    issued_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    signature: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class PolicyTestRow(SQLModel, table=True):
    """A saved policy test (docs/policy.md#policy-tests): a request and its expected verdict.

    ``request`` is ``{principal, action, resource, context, on_behalf_of?}``; ``entities`` the
    Cedar entities (JSON entity shape) it is decided with, a snapshot taken when it was saved;
    ``contained`` the principals contained then and ``risk_scores`` ``[{principal, score}]``;
    ``expect`` is ``allow``, ``deny`` or ``challenge``.
    """

    __tablename__ = "policy_tests"

    name: str = Field(sa_column=Column(String(128), primary_key=True))
    request: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    entities: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    contained: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    risk_scores: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    expect: str = Field(sa_column=Column(String(16), nullable=False))
    saved_by: str = Field(sa_column=Column(String(256), nullable=False))
    from_decision: str = Field(default="", sa_column=Column(String(128), nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class PublishRow(SQLModel, table=True):
    """One publish of a bundle version: who, when, how many tests ran, the failures accepted.

    ``accepted_failures`` is ``[{name, expected, got}]``: the tests that failed under the
    version and that the author named as accepted (docs/policy.md#policy-tests).
    """

    __tablename__ = "publishes"

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True))
    version: int = Field(sa_column=Column(BigInteger, nullable=False, index=True))
    at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    author: str = Field(sa_column=Column(String(256), nullable=False))
    tests_run: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    accepted_failures: list[Any] = Field(sa_column=Column(JSON, nullable=False))
