"""``svc reporter``: the heartbeat's command (docs/reporter.md#running-it).

* ``svc reporter serve [--portal-url URL] [--install-id-file FILE] ...``: heartbeat once a
  minute to ``<portal-url>/v1/heartbeat`` (nothing without it), probes on the port, until Ctrl-C
  or SIGTERM. Settings from ``SVC_REPORTER_*`` (``SVC_REPORTER_COMPONENTS`` from the environment
  only).
* ``svc reporter schema``: print the heartbeat's JSON Schema.

Exit codes: 0 stopped; 2 bad settings, with the problem on standard error.
"""

from __future__ import annotations

import json
import logging

import typer

from svc.common.cli import Options, settings_command
from svc.reporter.settings import ReporterSettings

__all__ = ["app"]

app = typer.Typer(
    name="reporter",
    help="The reporter: a heartbeat of health numbers to the vendor's corp portal.",
    no_args_is_help=True,
)


@app.command("serve")
@settings_command("svc reporter serve", settings=Options(ReporterSettings, exclude=("components",)))
def serve(settings: ReporterSettings) -> None:
    """Send the heartbeat (components watched: SVC_REPORTER_COMPONENTS; docs/reporter.md)."""
    from svc.reporter.app import serve as run

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(settings, ready=lambda p: typer.echo(f"svc-reporter listening on {settings.host}:{p}"))
    except (OSError, ValueError) as e:
        typer.echo(f"svc reporter serve: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(code=2) from e


@app.command("schema")
def schema() -> None:
    """Print the heartbeat's JSON Schema (svc.heartbeat.v1)."""
    from svc.reporter.service import SCHEMA

    typer.echo(json.dumps(SCHEMA, indent=2))
