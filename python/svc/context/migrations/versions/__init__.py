"""Alembic revisions of the context service."""
