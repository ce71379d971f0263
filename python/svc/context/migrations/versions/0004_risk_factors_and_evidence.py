"""Risk scores keep their factors; investigations keep their kind, evidence and summary.

The reasoner publishes every score with its top contributing factors (``name``, observed value,
baseline, contribution) and a few details (learning, peer group), read back through
``GET /v1/risk``; its investigations carry the evidence behind them and a summary
(docs/context.md#risk-scores, docs/reasoner.md).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds the columns of factors, details, kind, evidence and summaries.

    ``risk_scores.factors``/``details``, ``investigations.kind``/``evidence``/``summary``/
    ``summary_by``, and an index of investigations by kind and status.
    """
    with op.batch_alter_table("risk_scores") as t:
        t.add_column(sa.Column("factors", sa.JSON(), nullable=True))
        t.add_column(sa.Column("details", sa.JSON(), nullable=True))
    with op.batch_alter_table("investigations") as t:
        t.add_column(sa.Column("kind", sa.String(32), nullable=False, server_default="manual"))
        t.add_column(sa.Column("evidence", sa.JSON(), nullable=True))
        t.add_column(sa.Column("summary", sa.Text(), nullable=False, server_default=""))
        t.add_column(sa.Column("summary_by", sa.String(256), nullable=False, server_default=""))
    op.create_index("ix_investigations_kind_status", "investigations", ["kind", "status"])


def downgrade() -> None:
    """Drops them."""
    op.drop_index("ix_investigations_kind_status", "investigations")
    with op.batch_alter_table("investigations") as t:
        t.drop_column("summary_by")
        t.drop_column("summary")
        t.drop_column("evidence")
        t.drop_column("kind")
    with op.batch_alter_table("risk_scores") as t:
        t.drop_column("details")
        t.drop_column("factors")
