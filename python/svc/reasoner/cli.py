"""``svc reasoner``: the reasoner's commands (docs/reasoner.md#commands).

* ``svc reasoner serve [--port 8080] [--history-dsn DSN] [--context-url URL] ...``: the loop (a
  cycle at start, then every ``--cycle-secs``, under the one-replica lease) with the probes on
  the port, until Ctrl-C or SIGTERM.
* ``svc reasoner cycle [--at RFC3339] [...]``: one cycle now, as if the time were ``--at``
  (default: now), against the services the settings name; prints one JSON object
  (``scores``, ``contained``, ``would_contain``, ``investigations``, ...;
  docs/reasoner.md#commands).
* ``svc reasoner cycle --data-dir DIR [--url URL] [--at RFC3339]``: the same cycle run by the
  reasoner of the ``svc up`` that owns ``DIR`` (it alone may open the history's chDB
  directory): ``POST /v1/cycles`` at ``--url`` (default ``http://127.0.0.1:8092``, ``svc up``'s
  reasoner on its default ports) with the caller token in ``DIR/caller.token``.

Settings from ``SVC_REASONER_*`` (``ReasonerSettings``); options win over the environment.
Exit codes: 0 done; 1 the cycle failed (a dependency unreachable: the message names it), the
reasoner refused (a cycle running, another holds the lease) or did not answer; 2 bad settings or
a bad ``--at``.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from svc.common.cli import Options, settings_command
from svc.reasoner.settings import ReasonerAuthSettings, ReasonerSettings

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


#: ``svc up``'s reasoner on its default ports (base 8080 + 12; python/svc/reasoner/component.py).
UP_REASONER_URL = "http://127.0.0.1:8092"


@app.command("serve")
@settings_command(
    "svc reasoner serve",
    settings=Options(ReasonerSettings),
    auth=Options(ReasonerAuthSettings),
)
def serve(settings: ReasonerSettings, auth: ReasonerAuthSettings) -> None:
    """Run the reasoner's loop with its probes and POST /v1/cycles (docs/reasoner.md)."""
    import uvicorn

    from svc.common.auth import AuthConfigError
    from svc.reasoner.app import create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        service = _service("svc reasoner serve", settings)
        web = create_app(settings, service, auth)
    except AuthConfigError as e:
        typer.echo(f"svc reasoner serve: {e}", err=True)
        raise typer.Exit(code=2) from e
    uvicorn.run(web, host=settings.host, port=settings.port, log_level="warning")


@app.command("cycle")
@settings_command("svc reasoner cycle", settings=Options(ReasonerSettings))
def cycle(
    settings: ReasonerSettings,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Run as if the time were this (RFC 3339 with an offset)."),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Ask the reasoner of the svc up that owns this directory to run the cycle "
            "(with its caller.token), instead of opening the history here.",
        ),
    ] = None,
    url: Annotated[
        str,
        typer.Option("--url", help="With --data-dir: the running reasoner."),
    ] = UP_REASONER_URL,
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
    if data_dir is not None:
        typer.echo(json.dumps(_remote_cycle(data_dir, url, at)))
        return
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


def _remote_cycle(data_dir: Path, url: str, at: str | None) -> dict[str, object]:
    """``POST {url}/v1/cycles`` with ``data_dir``'s caller token; the cycle's JSON.

    Raises:
        typer.Exit: 1 when the reasoner refuses (its problem's detail is printed) or does not
            answer; 2 when ``data_dir`` holds no caller token.

    """
    import httpx

    prog = "svc reasoner cycle"
    token_file = data_dir.expanduser() / "caller.token"
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as e:
        typer.echo(
            f"{prog}: {token_file}: {e.strerror or e} (is it svc up's data directory?)", err=True
        )
        raise typer.Exit(code=2) from e
    body = {"at": at} if at else {}
    try:
        r = httpx.post(
            f"{url.rstrip('/')}/v1/cycles",
            json=body,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=httpx.Timeout(30.0, read=3600.0),
        )
    except httpx.HTTPError as e:
        typer.echo(f"{prog}: the reasoner at {url} does not answer: {e}", err=True)
        raise typer.Exit(code=1) from e
    if r.status_code != 200:
        try:
            detail = r.json().get("detail") or r.text
        except ValueError:
            detail = r.text
        typer.echo(f"{prog}: the reasoner at {url} answered {r.status_code}: {detail}", err=True)
        raise typer.Exit(code=1)
    out: dict[str, object] = r.json()
    return out
