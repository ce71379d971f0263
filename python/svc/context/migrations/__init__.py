"""Alembic migrations of the context service (svc.context.migrate)."""
