"""Alembic environment of the challenge service.

Runs on the connection ``svc.challenge.migrate`` passes in ``config.attributes["connection"]``
(online mode only).
"""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
