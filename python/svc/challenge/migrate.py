"""Applies the challenge service's Alembic migrations on start (docs/challenges.md#storage).

The scripts are in ``svc/challenge/migrations``; ``svc.common.migrate.Migrations`` runs them, as it
does for every service with a database (docs/architecture.md#versioning).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from svc.common.migrate import Migrations

__all__ = ["HEAD", "current_revision", "migrate"]

_MIGRATIONS = Migrations(Path(__file__).parent / "migrations")

#: The newest revision of the scripts.
HEAD: str = _MIGRATIONS.head


def migrate(engine: Engine) -> str:
    """Upgrades the database behind ``engine`` to the newest revision (``Migrations.upgrade``).

    Returns:
        The revision now applied (``HEAD``).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused a step; nothing of it is kept.

    """
    return _MIGRATIONS.upgrade(engine)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None before the first migration."""
    return Migrations.current_revision(engine)
