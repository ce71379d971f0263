"""Policy tests and the publish record: ``policy_tests`` and ``publishes``.

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
    """Creates ``policy_tests`` and ``publishes`` (``svc.policy.models``)."""
    tz = sa.DateTime(timezone=True)
    op.create_table(
        "policy_tests",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("entities", sa.JSON, nullable=False),
        sa.Column("contained", sa.JSON, nullable=False),
        sa.Column("risk_scores", sa.JSON, nullable=False),
        sa.Column("expect", sa.String(16), nullable=False),
        sa.Column("saved_by", sa.String(256), nullable=False),
        sa.Column("from_decision", sa.String(128), nullable=False),
        sa.Column("created_at", tz, nullable=False),
    )
    op.create_table(
        "publishes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("at", tz, nullable=False),
        sa.Column("author", sa.String(256), nullable=False),
        sa.Column("tests_run", sa.Integer, nullable=False),
        sa.Column("accepted_failures", sa.JSON, nullable=False),
    )
    op.create_index("ix_publishes_version", "publishes", ["version"])


def downgrade() -> None:
    """Drops both tables."""
    op.drop_index("ix_publishes_version", "publishes")
    op.drop_table("publishes")
    op.drop_table("policy_tests")
