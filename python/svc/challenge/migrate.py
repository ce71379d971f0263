"""Applies the challenge service's Alembic migrations on start (docs/challenges.md#storage).

The scripts are in ``svc/challenge/migrations``; ``svc.common.migrate.Migrations`` runs them, as it
does for every service with a database (docs/architecture.md#versioning).
"""

from __future__ import annotations

from pathlib import Path

from svc.common.migrate import Migrations

__all__ = ["HEAD", "MIGRATIONS", "current_revision", "migrate"]

#: The scripts in ``migrations/`` beside this module.
MIGRATIONS = Migrations(Path(__file__).parent / "migrations")

#: The newest revision of the scripts.
HEAD: str = MIGRATIONS.head

#: Upgrades the database behind an engine to ``HEAD`` (``Migrations.upgrade``).
migrate = MIGRATIONS.upgrade

#: The revision a database is at, or None before the first migration
#: (``Migrations.current_revision``).
current_revision = Migrations.current_revision
