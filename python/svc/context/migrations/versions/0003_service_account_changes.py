"""Every registration, change and retirement of a service account, with its author.

The portal's agents API registers and retires an app's agents with the app as author
(docs/architecture.md#states-and-transitions); ``service_account_changes`` keeps each such
change after the service account's own row is gone (docs/context.md).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates ``service_account_changes`` and its index by service account."""
    op.create_table(
        "service_account_changes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("service_account", sa.String(512), nullable=False),
        sa.Column("change", sa.String(16), nullable=False),
        sa.Column("author", sa.String(512), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", sa.JSON, nullable=True),
    )
    op.create_index(
        "ix_service_account_changes_service_account",
        "service_account_changes",
        ["service_account"],
    )


def downgrade() -> None:
    """Drops it."""
    op.drop_index("ix_service_account_changes_service_account", "service_account_changes")
    op.drop_table("service_account_changes")
