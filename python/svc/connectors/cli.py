"""``svc connectors``: the connectors' command (docs/connectors.md#running-it).

* ``svc connectors serve [--host 127.0.0.1] [--port 8080] [--context-url URL] [--drive-url URL]
  [--jira-url URL] ...``: run one connector per configured source, writing to the context
  service, with the probes on the port, until Ctrl-C or SIGTERM. Settings from
  ``SVC_CONNECTORS_*`` (``ConnectorsSettings``; ``SVC_CONNECTORS_JIRA_LINK_FIELDS`` from the
  environment only); options win over the environment.

Exit codes: 0 stopped; 2 bad settings or an unreadable credential file, with the problem on
standard error.
"""

from __future__ import annotations

import logging

import typer

from svc.common.cli import Options, settings_command
from svc.connectors.settings import ConnectorsSettings

__all__ = ["app"]

app = typer.Typer(
    name="connectors",
    help="The connectors: resources from Google Drive, work items from Jira.",
    no_args_is_help=True,
)


@app.command("serve")
@settings_command(
    "svc connectors serve",
    settings=Options(ConnectorsSettings, exclude=("jira_link_fields",)),
)
def serve(settings: ConnectorsSettings) -> None:
    """Run the connectors (link fields: SVC_CONNECTORS_JIRA_LINK_FIELDS; docs/connectors.md)."""
    from svc.connectors.app import serve as run

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not settings.drive_url and not settings.jira_url:
        logging.getLogger("svc.connectors").warning(
            "neither SVC_CONNECTORS_DRIVE_URL nor SVC_CONNECTORS_JIRA_URL is set: no connector runs"
        )
    try:
        run(
            settings,
            ready=lambda p: typer.echo(f"svc-connectors listening on {settings.host}:{p}"),
        )
    except (OSError, ValueError) as e:
        typer.echo(f"svc connectors serve: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(code=2) from e
