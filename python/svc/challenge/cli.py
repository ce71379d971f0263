"""``svc challenge``: the challenge service's commands (docs/challenges.md#running-it).

* ``svc challenge serve [--host 127.0.0.1] [--port 8080] [--database-url URL] ...``: migrate the
  database and serve gRPC ``svc.challenge.v1.ChallengeService`` with the probes, and the outbox
  worker when ``--webhook-url`` is set, until Ctrl-C or SIGTERM. Settings from
  ``SVC_CHALLENGE_*`` (``ChallengeSettings``), caller checks from ``SVC_CHALLENGE_AUTH*``
  (docs/auth.md); options win over the environment.
* ``svc challenge migrate [--database-url URL]``: apply the schema and print the revision
  (idempotent; ``serve`` does it on start too).

Exit codes: 0 done; 2 bad settings, an unsafe bind, or a database that cannot be migrated, with
the problem on standard error.
"""

from __future__ import annotations

import logging

import typer

from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.common.cli import Options, run_migration, settings_command

__all__ = ["app"]

app = typer.Typer(
    name="challenge",
    help="The challenge service: step-up challenges, security keys, containments.",
    no_args_is_help=True,
)


@app.command("serve")
@settings_command(
    "svc challenge serve",
    settings=Options(ChallengeSettings, exclude=("origins",)),
    auth=Options(ChallengeAuthSettings),
)
def serve(settings: ChallengeSettings, auth: ChallengeAuthSettings) -> None:
    """Serve the challenge service (WebAuthn origins: SVC_CHALLENGE_ORIGINS; docs/challenges.md)."""
    from sqlalchemy.exc import SQLAlchemyError

    from svc.challenge.app import serve as run
    from svc.common.auth import AuthConfigError

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(
            settings,
            auth=auth,
            ready=lambda p: typer.echo(f"svc-challenge listening on {settings.host}:{p}"),
        )
    except AuthConfigError as e:
        typer.echo(f"svc challenge serve: {e}", err=True)
        raise typer.Exit(code=2) from e
    except SQLAlchemyError as e:
        typer.echo(f"svc challenge serve: database: {e.__class__.__name__}: {e}", err=True)
        raise typer.Exit(code=2) from e


@app.command("migrate")
@settings_command(
    "svc challenge migrate", settings=Options(ChallengeSettings, only=("database_url",))
)
def migrate_command(settings: ChallengeSettings) -> None:
    """Apply the challenge service's schema (Alembic; idempotent) and print the revision."""
    from svc.challenge.migrate import migrate

    run_migration("svc challenge migrate", "challenge", settings.database_url, migrate)
