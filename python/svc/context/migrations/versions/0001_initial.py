"""The first schema of the context service (``svc.context.models``).

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
    """Creates every table of ``svc.context.models`` and the ``changes`` counter."""
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "scim_users",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_name", sa.String(512), nullable=False),
        sa.Column("user_name_key", sa.String(512), nullable=False),
        sa.Column("external_id", sa.String(512), nullable=True),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.Column("manager_id", sa.String(64), nullable=True),
        sa.Column("removed_at", tz, nullable=True),
        sa.Column("doc", sa.JSON, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
    )
    op.create_index("ix_scim_users_user_name_key", "scim_users", ["user_name_key"])
    # A userName is unique among the people present; removed people keep theirs.
    op.create_index(
        "ux_scim_users_present_user_name",
        "scim_users",
        ["user_name_key"],
        unique=True,
        postgresql_where=sa.text("removed_at IS NULL"),
        sqlite_where=sa.text("removed_at IS NULL"),
    )
    op.create_index("ix_scim_users_manager_id", "scim_users", ["manager_id"])
    op.create_table(
        "scim_groups",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("display_name", sa.String(512), nullable=False),
        sa.Column("display_name_key", sa.String(512), nullable=False, unique=True),
        sa.Column("external_id", sa.String(512), nullable=True),
        sa.Column("doc", sa.JSON, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("created_at", tz, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
    )
    op.create_table(
        "scim_members",
        sa.Column("group_id", sa.String(64), primary_key=True),
        sa.Column("member_id", sa.String(64), primary_key=True),
        sa.Column("member_type", sa.String(16), nullable=False),
    )
    op.create_index("ix_scim_members_member_id", "scim_members", ["member_id"])
    op.create_table(
        "principals",
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("id", sa.String(512), primary_key=True),
        sa.Column("value", sa.JSON, nullable=False),
        sa.Column("removed", sa.Boolean, nullable=False),
    )
    op.create_table(
        "resources",
        sa.Column("type", sa.String(256), primary_key=True),
        sa.Column("id", sa.String(512), primary_key=True),
        sa.Column("entity", sa.JSON, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
    )
    op.create_table(
        "work_items",
        sa.Column("id", sa.String(512), primary_key=True),
        sa.Column("item", sa.JSON, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
    )
    op.create_table(
        "changes",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("feed", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("key", sa.String(1024), nullable=False),
        sa.Column("value", sa.JSON, nullable=True),
        sa.Column("removed", sa.Boolean, nullable=False),
        sa.Column("at", tz, nullable=False),
    )
    op.create_index("ix_changes_feed", "changes", ["feed", "seq"])
    counters = op.create_table(
        "counters",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(counters, [{"name": "changes", "value": 0}])
    op.create_table(
        "service_accounts",
        sa.Column("id", sa.String(512), primary_key=True),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
    )
    op.create_table(
        "risk_scores",
        sa.Column("principal", sa.String(1024), primary_key=True),
        sa.Column("score", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("updated_at", tz, nullable=False),
    )
    op.create_table(
        "trusted_apps",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("iss", sa.String(1024), nullable=False),
        sa.Column("jwks_url", sa.String(2048), nullable=False),
        sa.Column("aud", sa.String(1024), nullable=False),
        sa.Column("created_at", tz, nullable=False),
    )
    op.create_table(
        "investigations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("principal", sa.String(1024), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("opened_by", sa.String(512), nullable=False),
        sa.Column("opened_at", tz, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("closed_by", sa.String(512), nullable=True),
        sa.Column("closed_at", tz, nullable=True),
        sa.Column("resolution", sa.Text, nullable=False),
    )
    op.create_index("ix_investigations_principal", "investigations", ["principal"])


def downgrade() -> None:
    """Drops every table."""
    for table in (
        "investigations",
        "trusted_apps",
        "risk_scores",
        "service_accounts",
        "counters",
        "changes",
        "work_items",
        "resources",
        "principals",
        "scim_members",
        "scim_groups",
        "scim_users",
    ):
        op.drop_table(table)
