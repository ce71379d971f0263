"""``svc portal``: the portal's commands (docs/portal.md#running-it).

* ``svc portal serve [--host 127.0.0.1] [--port 8080] [--pdp-url URL] [--context-url URL] ...``:
  serve the portal (the agents API, sign-in, GraphQL) until Ctrl-C or SIGTERM. Settings from
  ``SVC_PORTAL_*`` (``PortalSettings``); options win over the environment.
* ``svc portal schema``: print the GraphQL schema (SDL), as ``python/svc/portal/schema.graphql``
  holds it.

Exit codes: 0 done; 2 bad settings or an unsafe bind, with the problem on standard error.
"""

from __future__ import annotations

import logging

import typer

from svc.common.cli import Options, settings_command
from svc.portal.settings import PortalSettings

__all__ = ["app"]

app = typer.Typer(
    name="portal",
    help="The portal: the agents API for trusted apps, sign-in and GraphQL.",
    no_args_is_help=True,
)


@app.command("serve")
@settings_command("svc portal serve", settings=Options(PortalSettings))
def serve(settings: PortalSettings) -> None:
    """Serve the portal (docs/portal.md)."""
    from svc.portal.app import serve as run

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(settings, ready=lambda p: typer.echo(f"svc-portal listening on {settings.host}:{p}"))
    except ValueError as e:
        typer.echo(f"svc portal serve: {e}", err=True)
        raise typer.Exit(code=2) from e


@app.command("schema")
def schema() -> None:
    """Print the GraphQL schema (SDL): what python/svc/portal/schema.graphql holds."""
    from svc.portal.gql import schema_sdl

    typer.echo(schema_sdl(), nl=False)
