"""The challenge service's tables (SQLModel; docs/challenges.md#storage).

``challenges`` (one row per challenge; ``active_key`` holds the fingerprint while the row is the
fingerprint's current challenge and is unique, so two replicas resolving the same request at once
cannot open two), ``containments`` (who is contained now) and ``containment_events`` (every
contain and lift), ``security_keys`` (WebAuthn credentials), ``ceremonies`` (a registration,
key change or verification between its begin and finish), ``key_resets`` (every
``ResetSecurityKey``), ``link_uses`` (the page's single-use link tokens, once used) and
``outbox`` (notifications, written in the same transaction as the change they tell of). The
schema itself is made by the Alembic migrations in ``svc/challenge/migrations``
(``svc.challenge.migrate``), never by ``create_all``.

Times are stored in UTC (``DateTime(timezone=True)``; SQLite keeps them naive, read back as UTC
by ``svc.policy.models.utc``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlmodel import Field, SQLModel

__all__ = [
    "CeremonyRow",
    "ChallengeRow",
    "ContainmentEventRow",
    "ContainmentRow",
    "KeyResetRow",
    "LinkUseRow",
    "OutboxRow",
    "SecurityKeyRow",
]

#: Row ids: BIGINT, except on SQLite, where only INTEGER PRIMARY KEY numbers rows by itself.
_ID = BigInteger().with_variant(Integer, "sqlite")
_TZ = DateTime(timezone=True)


class ChallengeRow(SQLModel, table=True):
    """One challenge (docs/challenges.md#states).

    ``state`` is the stored state, ``pending``, ``passed`` or ``rejected``; a pending one past
    ``expires_at`` reads as expired (``svc.challenge.service.effective_state``). ``kinds`` and
    ``satisfied`` are sorted lists of kind names. ``version`` grows with every change (watches
    compare it).
    """

    __tablename__ = "challenges"

    qid: str = Field(sa_column=Column(String(36), primary_key=True))
    fingerprint: str = Field(sa_column=Column(String(64), nullable=False, index=True))
    active_key: str | None = Field(
        default=None, sa_column=Column(String(64), nullable=True, unique=True)
    )
    state: str = Field(sa_column=Column(String(16), nullable=False))
    principal_type: str = Field(sa_column=Column(String(256), nullable=False))
    principal_id: str = Field(sa_column=Column(String(512), nullable=False, index=True))
    obo_type: str | None = Field(default=None, sa_column=Column(String(256), nullable=True))
    obo_id: str | None = Field(default=None, sa_column=Column(String(512), nullable=True))
    action: str = Field(sa_column=Column(String(512), nullable=False))
    resource_type: str = Field(sa_column=Column(String(256), nullable=False))
    resource_id: str = Field(sa_column=Column(String(512), nullable=False))
    kinds: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    satisfied: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    decision_qid: str = Field(default="", sa_column=Column(String(64), nullable=False))
    last_decision_qid: str = Field(default="", sa_column=Column(String(64), nullable=False))
    person: str = Field(sa_column=Column(String(512), nullable=False, index=True))
    approver: str = Field(default="", sa_column=Column(String(512), nullable=False, index=True))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    updated_at: datetime = Field(sa_column=Column(_TZ, nullable=False, index=True))
    expires_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    grant_expires_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    decided_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    decided_by: str = Field(default="", sa_column=Column(String(512), nullable=False))
    justification: str = Field(default="", sa_column=Column(Text, nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    version: int = Field(default=1, sa_column=Column(BigInteger, nullable=False))


class ContainmentRow(SQLModel, table=True):
    """A contained principal (``Type``, ``id``): the first containment's reason and author."""

    __tablename__ = "containments"

    principal_type: str = Field(sa_column=Column(String(256), primary_key=True))
    principal_id: str = Field(sa_column=Column(String(512), primary_key=True))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    author: str = Field(sa_column=Column(String(512), nullable=False))
    contained_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class ContainmentEventRow(SQLModel, table=True):
    """One recorded ``Contain`` (``contained`` true) or ``Lift`` (false)."""

    __tablename__ = "containment_events"

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True))
    at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    principal_type: str = Field(sa_column=Column(String(256), nullable=False))
    principal_id: str = Field(sa_column=Column(String(512), nullable=False))
    contained: bool = Field(sa_column=Column(Boolean, nullable=False))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    author: str = Field(sa_column=Column(String(512), nullable=False))


class SecurityKeyRow(SQLModel, table=True):
    """A person's WebAuthn credential: its id (base64url), COSE public key and sign counter."""

    __tablename__ = "security_keys"

    credential_id: str = Field(sa_column=Column(String(1400), primary_key=True))
    person: str = Field(sa_column=Column(String(512), nullable=False, index=True))
    name: str = Field(default="", sa_column=Column(String(256), nullable=False))
    public_key: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    sign_count: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    last_used_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))


class CeremonyRow(SQLModel, table=True):
    """A WebAuthn ceremony between begin and finish: ``kind`` ``registration``/``verification``.

    ``challenge`` is the random WebAuthn challenge the response must sign; ``used_at`` is set by
    the finish (each ceremony finishes at most once).
    """

    __tablename__ = "ceremonies"

    id: str = Field(sa_column=Column(String(36), primary_key=True))
    kind: str = Field(sa_column=Column(String(16), nullable=False))
    person: str = Field(sa_column=Column(String(512), nullable=False))
    challenge_qid: str | None = Field(default=None, sa_column=Column(String(36), nullable=True))
    challenge: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    name: str = Field(default="", sa_column=Column(String(256), nullable=False))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    expires_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    used_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    replaces: str | None = Field(default=None, sa_column=Column(String(1400), nullable=True))
    """A key change (``kind`` ``change``): the credential id of the key the new one replaces."""
    proof_challenge: bytes | None = Field(
        default=None, sa_column=Column(LargeBinary, nullable=True)
    )
    """A key change: the random challenge the replaced key's assertion must sign."""


class KeyResetRow(SQLModel, table=True):
    """One recorded ``ResetSecurityKey``: who removed every key of a person, when and why."""

    __tablename__ = "key_resets"

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True))
    at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    person: str = Field(sa_column=Column(String(512), nullable=False, index=True))
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    author: str = Field(sa_column=Column(String(512), nullable=False))
    removed: int = Field(default=0, sa_column=Column(Integer, nullable=False))


class LinkUseRow(SQLModel, table=True):
    """A used challenge-page link token (docs/challenges.md#link-tokens): its ``jti``, once.

    The primary key makes a second use of the same token fail, whichever replica sees it.
    """

    __tablename__ = "link_uses"

    jti: str = Field(sa_column=Column(String(64), primary_key=True))
    challenge_qid: str = Field(sa_column=Column(String(36), nullable=False, index=True))
    recipient: str = Field(sa_column=Column(String(512), nullable=False))
    event: str = Field(sa_column=Column(String(32), nullable=False))
    used_at: datetime = Field(sa_column=Column(_TZ, nullable=False))


class OutboxRow(SQLModel, table=True):
    """A notification to send (docs/challenges.md#notifications).

    ``key`` is the idempotency key the webhook receives; ``sent_at`` is set once the webhook
    answered 2xx, ``failed_at`` when it refused for good (a 4xx other than 408 and 429);
    ``next_attempt_at`` holds a notification back after a failed round.
    """

    __tablename__ = "outbox"

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True))
    key: str = Field(sa_column=Column(String(64), nullable=False, unique=True))
    challenge_qid: str = Field(sa_column=Column(String(36), nullable=False, index=True))
    event: str = Field(sa_column=Column(String(32), nullable=False))
    payload: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    next_attempt_at: datetime = Field(sa_column=Column(_TZ, nullable=False))
    sent_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    failed_at: datetime | None = Field(default=None, sa_column=Column(_TZ, nullable=True))
    last_error: str = Field(default="", sa_column=Column(Text, nullable=False))
