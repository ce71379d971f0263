"""Indexes for SCIM lookups and pages at directory sizes (docs/context.md#scim).

``externalId eq`` (the lookup Microsoft Entra ID makes before a create) and the index
pagination of ``GET /Users`` and ``GET /Groups`` (ordered by creation, then id; users present
only) are answered from these indexes instead of a scan of every row.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates the external-id and creation-order indexes of ``scim_users`` and ``scim_groups``."""
    op.create_index("ix_scim_users_external_id", "scim_users", ["external_id"])
    op.create_index(
        "ix_scim_users_present_created",
        "scim_users",
        ["created_at", "id"],
        postgresql_where=sa.text("removed_at IS NULL"),
        sqlite_where=sa.text("removed_at IS NULL"),
    )
    op.create_index("ix_scim_groups_external_id", "scim_groups", ["external_id"])
    op.create_index("ix_scim_groups_created", "scim_groups", ["created_at", "id"])


def downgrade() -> None:
    """Drops them."""
    op.drop_index("ix_scim_groups_created", "scim_groups")
    op.drop_index("ix_scim_groups_external_id", "scim_groups")
    op.drop_index("ix_scim_users_present_created", "scim_users")
    op.drop_index("ix_scim_users_external_id", "scim_users")
