"""Applies the context service's Alembic migrations on start (docs/context.md#storage).

Each service migrates its own database (docs/architecture.md#versioning). ``migrate`` runs
``alembic upgrade head`` on the engine's database from the scripts in ``svc/context/migrations``;
applied twice it changes nothing (Alembic's ``alembic_version`` table records the head). The
same approach as the policy service's.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

__all__ = ["HEAD", "current_revision", "migrate"]

_SCRIPTS = Path(__file__).parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    return cfg


#: The newest revision of the scripts.
HEAD: str = ScriptDirectory.from_config(_config()).get_current_head() or ""


def migrate(engine: Engine) -> str:
    """Upgrades the database behind ``engine`` to the newest revision.

    Args:
        engine: a SQLAlchemy engine (PostgreSQL or SQLite).

    Returns:
        The revision now applied (``HEAD``).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused a step; the step's transaction
            is rolled back.

    """
    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return current_revision(engine) or ""


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None before the first migration."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
