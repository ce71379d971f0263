"""Risk scores keep a bounded history by UTC day (docs/context.md#risk-scores).

``risk_score_days``: per principal and UTC day on which the reasoner published a score, the
last score of the day and the highest; the portal draws a principal's 30-day risk history from
it. Each stored score becomes its principal's row of the day it was last set, so the history
starts with what is known.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates ``risk_score_days`` and fills it with each stored score on its day."""
    days = op.create_table(
        "risk_score_days",
        sa.Column("principal", sa.String(1024), primary_key=True),
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("score", sa.Integer(), nullable=False),
        sa.Column("high", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    conn = op.get_bind()
    scores = conn.execute(
        sa.text("SELECT principal, score, updated_at FROM risk_scores")
    ).fetchall()
    rows = []
    for principal, score, at in scores:
        if isinstance(at, str):  # SQLite answers text
            at = datetime.fromisoformat(at)
        at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
        rows.append(
            {"principal": principal, "day": at.date(), "score": score, "high": score,
             "updated_at": at}
        )  # fmt: skip
    if rows:
        op.bulk_insert(days, rows)


def downgrade() -> None:
    """Drops ``risk_score_days``."""
    op.drop_table("risk_score_days")
