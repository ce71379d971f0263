"""The first schema: challenges, containments and their events, security keys, ceremonies, outbox.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates the six tables of ``svc.challenge.models``."""
    tz = sa.DateTime(timezone=True)
    ident = sa.BigInteger().with_variant(sa.Integer, "sqlite")
    op.create_table(
        "challenges",
        sa.Column("qid", sa.String(36), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        # The fingerprint while this row is its current challenge; unique, so replicas resolving
        # the same request at once open one challenge, not two.
        sa.Column("active_key", sa.String(64), nullable=True, unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("principal_type", sa.String(256), nullable=False),
        sa.Column("principal_id", sa.String(512), nullable=False),
        sa.Column("obo_type", sa.String(256), nullable=True),
        sa.Column("obo_id", sa.String(512), nullable=True),
        sa.Column("action", sa.String(512), nullable=False),
        sa.Column("resource_type", sa.String(256), nullable=False),
        sa.Column("resource_id", sa.String(512), nullable=False),
        sa.Column("kinds", sa.JSON, nullable=False),
        sa.Column("satisfied", sa.JSON, nullable=False),
        sa.Column("decision_qid", sa.String(64), nullable=False),
        sa.Column("last_decision_qid", sa.String(64), nullable=False),
        sa.Column("person", sa.String(512), nullable=False),
        sa.Column("approver", sa.String(512), nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
        sa.Column("expires_at", tz, nullable=False),
        sa.Column("grant_expires_at", tz, nullable=True),
        sa.Column("decided_at", tz, nullable=True),
        sa.Column("decided_by", sa.String(512), nullable=False),
        sa.Column("justification", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
    )
    for column in ("fingerprint", "principal_id", "person", "approver", "updated_at"):
        op.create_index(f"ix_challenges_{column}", "challenges", [column])
    op.create_table(
        "containments",
        sa.Column("principal_type", sa.String(256), primary_key=True),
        sa.Column("principal_id", sa.String(512), primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("author", sa.String(512), nullable=False),
        sa.Column("contained_at", tz, nullable=False),
    )
    op.create_table(
        "containment_events",
        sa.Column("id", ident, primary_key=True),
        sa.Column("at", tz, nullable=False),
        sa.Column("principal_type", sa.String(256), nullable=False),
        sa.Column("principal_id", sa.String(512), nullable=False),
        sa.Column("contained", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("author", sa.String(512), nullable=False),
    )
    op.create_table(
        "security_keys",
        sa.Column("credential_id", sa.String(1400), primary_key=True),
        sa.Column("person", sa.String(512), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("public_key", sa.LargeBinary, nullable=False),
        sa.Column("sign_count", sa.BigInteger, nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("last_used_at", tz, nullable=True),
    )
    op.create_index("ix_security_keys_person", "security_keys", ["person"])
    op.create_table(
        "ceremonies",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("person", sa.String(512), nullable=False),
        sa.Column("challenge_qid", sa.String(36), nullable=True),
        sa.Column("challenge", sa.LargeBinary, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("expires_at", tz, nullable=False),
        sa.Column("used_at", tz, nullable=True),
    )
    op.create_table(
        "outbox",
        sa.Column("id", ident, primary_key=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("challenge_qid", sa.String(36), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", tz, nullable=False),
        sa.Column("sent_at", tz, nullable=True),
        sa.Column("failed_at", tz, nullable=True),
        sa.Column("last_error", sa.Text, nullable=False),
    )
    op.create_index("ix_outbox_challenge_qid", "outbox", ["challenge_qid"])
    # The worker's scan: unsent, unfailed notifications in order.
    pending = sa.text("sent_at IS NULL AND failed_at IS NULL")
    op.create_index(
        "ix_outbox_pending",
        "outbox",
        ["id"],
        postgresql_where=pending,
        sqlite_where=pending,
    )


def downgrade() -> None:
    """Drops the six tables."""
    for table in (
        "outbox",
        "ceremonies",
        "security_keys",
        "containment_events",
        "containments",
        "challenges",
    ):
        op.drop_table(table)
