"""``svc reasoner``: the reasoner's commands (docs/reasoner.md#commands).

* ``svc reasoner serve [--port 8080] [--history-dsn DSN] [--context-url URL] ...``: the loop (a
  cycle at start, then every ``--cycle-secs``, under the one-replica lease) with the probes on
  the port, until Ctrl-C or SIGTERM.
* ``svc reasoner cycle [--at RFC3339] [...]``: one cycle now, as if the time were ``--at``
  (default: now), against the services the settings name; prints one JSON object
  (``scores``, ``contained``, ``would_contain``, ``investigations``, ...;
  docs/reasoner.md#commands).

Settings from ``SVC_REASONER_*`` (``ReasonerSettings``); options win over the environment.
Exit codes: 0 done; 1 the cycle failed (a dependency unreachable: the message names it);
2 bad settings or a bad ``--at``.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Annotated

import typer

from svc.common.cli import Options, settings_command
from svc.reasoner.settings import ReasonerSettings

__all__ = ["app"]

app = typer.Typer(
    name="reasoner",
    help="The reasoner: risk per person and per agent, containment, investigations.",
    no_args_is_help=True,
)


def _service(prog: str, settings: ReasonerSettings):  # type: ignore[no-untyped-def]
    from svc.reasoner.service import from_settings

    try:
        return from_settings(settings)
    except ValueError as e:
        typer.echo(f"{prog}: {e}", err=True)
        raise typer.Exit(code=2) from e


@app.command("serve")
@settings_command("svc reasoner serve", settings=Options(ReasonerSettings))
def serve(settings: ReasonerSettings) -> None:
    """Run the reasoner's loop with its probes (docs/reasoner.md)."""
    import uvicorn

    from svc.reasoner.app import create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    service = _service("svc reasoner serve", settings)
    uvicorn.run(
        create_app(settings, service), host=settings.host, port=settings.port, log_level="warning"
    )


@app.command("cycle")
@settings_command("svc reasoner cycle", settings=Options(ReasonerSettings))
def cycle(
    settings: ReasonerSettings,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Run as if the time were this (RFC 3339 with an offset)."),
    ] = None,
) -> None:
    """Run one cycle now and print its result as one JSON object."""
    from svc.reasoner.clients import Unavailable

    when = None
    if at is not None:
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            typer.echo(
                f"svc reasoner cycle: --at `{at}`: expected RFC 3339 with an offset", err=True
            )
            raise typer.Exit(code=2)
    service = _service("svc reasoner cycle", settings)
    if not service.lease.acquire():
        typer.echo(
            f"svc reasoner cycle: another reasoner holds the lease ({service.lease.describe})",
            err=True,
        )
        raise typer.Exit(code=1)
    try:
        result = service.run_cycle(when)
    except Unavailable as e:
        typer.echo(f"svc reasoner cycle: failed, nothing half-done was written: {e}", err=True)
        raise typer.Exit(code=1) from e
    finally:
        service.lease.release()
    typer.echo(json.dumps(result.as_json()))
