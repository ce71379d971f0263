"""The first schema: bundles, enforcement changes, outage fallbacks, break-glass events.

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
    """Creates the four tables of ``svc.policy.models``."""
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "bundles",
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("author", sa.String(256), nullable=False),
        sa.Column("comment", sa.Text, nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("published_at", tz, nullable=True),
        sa.Column("files", sa.JSON, nullable=False),
        sa.Column("policies", sa.JSON, nullable=False),
        sa.Column("warnings", sa.JSON, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("signature", sa.LargeBinary, nullable=True),
        sa.Column("key_id", sa.String(64), nullable=False),
    )
    op.create_index("ix_bundles_state", "bundles", ["state"])
    # At most one active bundle, even when replicas of the service publish at the same time.
    active = sa.text("state = 'active'")
    op.create_index(
        "ux_bundles_one_active",
        "bundles",
        ["state"],
        unique=True,
        postgresql_where=active,
        sqlite_where=active,
    )
    op.create_table(
        "enforcement_changes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("at", tz, nullable=False),
        sa.Column("author", sa.String(256), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("from_mode", sa.String(16), nullable=False),
        sa.Column("to_mode", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_index("ix_enforcement_changes_scope", "enforcement_changes", ["scope"])
    op.create_table(
        "outage_fallbacks",
        sa.Column("tool", sa.String(512), primary_key=True),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("author", sa.String(256), nullable=False),
        sa.Column("updated_at", tz, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_table(
        "break_glass_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("at", tz, nullable=False),
        sa.Column("admin", sa.String(256), nullable=False),
        sa.Column("nonce", sa.String(128), nullable=False, unique=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("from_version", sa.BigInteger, nullable=False),
        sa.Column("issued_at", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("signature", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    """Drops the four tables."""
    for table in ("break_glass_events", "outage_fallbacks", "enforcement_changes", "bundles"):
        op.drop_table(table)
