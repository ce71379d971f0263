"""``svc context``: the context service's commands (docs/context.md#running-it).

* ``svc context serve [--host 127.0.0.1] [--port 8080] [--database-url URL] ...``: migrate the
  database and serve SCIM 2.0 and the ``/v1`` routes until Ctrl-C or SIGTERM. Settings from
  ``SVC_CONTEXT_*`` (``ContextSettings``), caller checks from ``SVC_CONTEXT_AUTH*``
  (docs/auth.md); options win over the environment.
* ``svc context migrate [--database-url URL]``: apply the schema and print the revision
  (idempotent; ``serve`` does it on start too).

Exit codes: 0 done; 2 bad settings, an unsafe bind, or a database that cannot be migrated,
with the problem on standard error.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from svc.common.cli import Options, run_migration, settings_command
from svc.context.settings import ContextAuthSettings, ContextSettings

__all__ = ["app"]

app = typer.Typer(
    name="context",
    help="The context service: SCIM directory, principals, resources and work items.",
    no_args_is_help=True,
)


@app.command("serve")
@settings_command(
    "svc context serve",
    settings=Options(
        ContextSettings,
        only=(
            "host",
            "port",
            "database_url",
            "scim_max_results",
            "max_batch_items",
            "max_changes",
            "max_wait_secs",
            "poll_secs",
        ),
    ),
    auth=Options(ContextAuthSettings),
)
def serve(
    settings: ContextSettings,
    auth: ContextAuthSettings,
    access_log: Annotated[bool, typer.Option(help="Log one line per request.")] = False,
) -> None:
    """Serve the context service (SCIM token: SVC_CONTEXT_SCIM_TOKEN; docs/context.md)."""
    from sqlalchemy.exc import SQLAlchemyError

    from svc.common.auth import AuthConfigError
    from svc.context import serve as run

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.scim_token is None:
        logging.getLogger("svc.context").warning(
            "SVC_CONTEXT_SCIM_TOKEN is not set: every SCIM request is refused (401)"
        )
    try:
        run(settings, auth, access_log=access_log)
    except AuthConfigError as e:
        typer.echo(f"svc context serve: {e}", err=True)
        raise typer.Exit(code=2) from e
    except SQLAlchemyError as e:
        typer.echo(f"svc context serve: database: {e.__class__.__name__}: {e}", err=True)
        raise typer.Exit(code=2) from e


@app.command("migrate")
@settings_command("svc context migrate", settings=Options(ContextSettings, only=("database_url",)))
def migrate_command(settings: ContextSettings) -> None:
    """Apply the context service's schema (Alembic; idempotent) and print the revision."""
    from svc.context.migrate import migrate

    run_migration("svc context migrate", "context", settings.database_url, migrate)
