"""Alembic migrations applied on start, for every service with a relational database.

Each service migrates its own database (docs/architecture.md#versioning) from the scripts of its
package (``svc/<component>/migrations``: an ``env.py`` that runs online on the connection passed
in ``config.attributes["connection"]``, and ``versions/``). ``Migrations.upgrade`` runs
``alembic upgrade head`` in one transaction; applied twice it changes nothing (Alembic's
``alembic_version`` table records the head). Alembic: <https://alembic.sqlalchemy.org>.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

__all__ = ["Migrations"]


class Migrations:
    """One service's migration scripts.

    Args:
        scripts: the directory holding ``env.py`` and ``versions/``.

    Raises:
        alembic.util.CommandError: the directory holds no valid scripts.

    """

    def __init__(self, scripts: Path) -> None:
        self.scripts = scripts
        self.head: str = ScriptDirectory.from_config(self._config()).get_current_head() or ""
        """The newest revision of the scripts."""

    def _config(self) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", str(self.scripts))
        return cfg

    def upgrade(self, engine: Engine) -> str:
        """Upgrades the database behind ``engine`` to the newest revision.

        Args:
            engine: a SQLAlchemy engine (PostgreSQL or SQLite).

        Returns:
            The revision now applied (``head``).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database refused a step; the transaction is
                rolled back.

        """
        cfg = self._config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        return self.current_revision(engine) or ""

    @staticmethod
    def current_revision(engine: Engine) -> str | None:
        """The revision the database behind ``engine`` is at, or None before the first."""
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
