"""Key changes, key resets and the challenge page's single-use link tokens.

``ceremonies`` gains ``replaces`` and ``proof_challenge`` (a ``BeginKeyChange`` ceremony: the key
it replaces and the challenge that key's assertion signs); ``key_resets`` records every
``ResetSecurityKey``; ``link_uses`` holds each used link token's id once
(docs/challenges.md#link-tokens).

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
    """Adds the two ceremony columns and the ``key_resets`` and ``link_uses`` tables."""
    tz = sa.DateTime(timezone=True)
    ident = sa.BigInteger().with_variant(sa.Integer, "sqlite")
    with op.batch_alter_table("ceremonies") as batch:
        batch.add_column(sa.Column("replaces", sa.String(1400), nullable=True))
        batch.add_column(sa.Column("proof_challenge", sa.LargeBinary, nullable=True))
    op.create_table(
        "key_resets",
        sa.Column("id", ident, primary_key=True),
        sa.Column("at", tz, nullable=False),
        sa.Column("person", sa.String(512), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("author", sa.String(512), nullable=False),
        sa.Column("removed", sa.Integer, nullable=False),
    )
    op.create_index("ix_key_resets_person", "key_resets", ["person"])
    op.create_table(
        "link_uses",
        sa.Column("jti", sa.String(64), primary_key=True),
        sa.Column("challenge_qid", sa.String(36), nullable=False),
        sa.Column("recipient", sa.String(512), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("used_at", tz, nullable=False),
    )
    op.create_index("ix_link_uses_challenge_qid", "link_uses", ["challenge_qid"])


def downgrade() -> None:
    """Drops the two tables and the two ceremony columns."""
    op.drop_table("link_uses")
    op.drop_table("key_resets")
    with op.batch_alter_table("ceremonies") as batch:
        batch.drop_column("proof_challenge")
        batch.drop_column("replaces")
