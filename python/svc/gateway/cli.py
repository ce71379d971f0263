"""``svc gateway``: the MCP gateway (docs/gateway.md#running-it).

``svc gateway [--host 127.0.0.1] [--port 8080] [--upstreams-file FILE] [--pdp-url URL] ...``
serves the MCP proxies, the agents' challenge wait and the probes until Ctrl-C or SIGTERM.
Every option is a field of ``svc.gateway.settings.GatewaySettings``, read from its
``SVC_GATEWAY_*`` variable when not given (the upstreams themselves also from
``SVC_GATEWAY_UPSTREAMS`` as JSON).

Exit codes: 0 stopped; 2 bad settings or an unreadable upstreams file, with the problem on
standard error.
"""

from __future__ import annotations

import logging

import typer

from svc.common.cli import Options, settings_command
from svc.gateway.settings import GatewaySettings

__all__ = ["gateway"]


@settings_command("svc gateway", settings=Options(GatewaySettings, exclude=("upstreams",)))
def gateway(settings: GatewaySettings) -> None:
    """Serve the MCP gateway: /mcp/{upstream} and the challenge wait (docs/gateway.md)."""
    from svc.common.auth_settings import AuthConfigError
    from svc.gateway.app import serve
    from svc.gateway.service import GatewayService

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # The HTTP clients and the MCP SDK log a line at INFO for every request and session: at
    # the gateway's rate that was 6 % of its CPU (py-spy, benches/bench_gateway.py), and the
    # gateway's own log and intake events already say what happened to each call.
    for noisy in ("httpx", "httpx2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        service = GatewayService(settings)
    except (OSError, ValueError) as e:
        typer.echo(f"svc gateway: upstreams: {e}", err=True)
        raise typer.Exit(code=2) from e
    if not service.upstreams:
        typer.echo(
            "svc gateway: no upstream MCP server: set --upstreams-file or SVC_GATEWAY_UPSTREAMS",
            err=True,
        )
        raise typer.Exit(code=2)
    try:
        serve(
            settings,
            service=service,
            ready=lambda p: typer.echo(f"svc-gateway listening on {settings.host}:{p}"),
        )
    except AuthConfigError as e:
        typer.echo(f"svc gateway: {e}", err=True)
        raise typer.Exit(code=2) from e
