r"""The `svc` command line (Typer).

Commands:

* ``svc check --bundle DIR REQUEST.json``: decide one request against a bundle directory and
  print the decision as JSON, like ``cedar authorize`` / ``opa eval``. ``REQUEST.json`` holds the
  body of ``POST /v1/access/evaluation`` (docs/decisions.md#request); Cedar CLI request files
  (``"principal": "User::\\"alice\\""``) work as they are. ``-`` reads standard input.
* ``svc plan --bundle DIR REQUEST.json``: build the query plan of ``POST /v1/access/plan``
  (docs/plans.md) for a request naming a ``resource_type``, and print it as JSON.
* ``svc pdp --bundle DIR [--port 8080] [--mode monitor|enforce]``: the decision point in
  standalone mode (docs/api.md): gRPC and HTTP on one port, serving one bundle directory and
  reloading it when its files change; ``svc pdp --policy URL --public-key FILE`` follows a
  policy service's active bundle and mode instead (docs/policy.md); ``--context URL`` follows
  the context service's principals and fetches resources from it (docs/context.md);
  ``--challenge URL`` resolves challenge verdicts with the challenge service and answers
  challenge waits (docs/challenges.md#the-decision-point); ``--auth-*``
  (``SVC_PDP_AUTH_*``) set who may call (docs/auth.md). Runs until Ctrl-C or SIGTERM.
* ``svc validate --bundle DIR``: load and strictly validate a bundle, listing every problem.
* ``svc intake [--port 8080] [--dev]``: the event intake (docs/intake.md), settings
  from ``SVC_INTAKE_*`` and ``SVC_KAFKA_URL``. Runs until Ctrl-C or SIGTERM.
* ``svc history migrate --dsn DSN``: apply the history store's schema (idempotent).
* ``svc history load --dsn DSN --kafka URL [--retention-days N] [--port 8080]``: load the
  decision and event topics into the history store (docs/history.md); with ``--port`` it also
  serves the probes and the history routes there (``svc.history.service``; callers from
  ``SVC_HISTORY_AUTH*``, docs/auth.md). Runs until Ctrl-C or SIGTERM.
* ``svc up [--demo] [--port 8080] [--data-dir DIR]``: the decision point, the intake, the
  history loader and the policy service on one machine with the embedded defaults
  (docs/architecture.md#embedded-defaults-and-production-parts; ``svc.up``).
* ``svc demo``: ``svc up`` with the demo company's traffic; prints the summary read back from
  the history and stops (``--serve`` keeps it running).
* ``svc topology start|stop|status``: the production topology on this machine, each component
  its own process on PostgreSQL and Kafka (``svc.topology``, docs/dev.md).
* ``svc demo token --agent ID [--for PERSON] ...``: an agent token signed by ``svc up``'s
  development token issuer, for its gateway (docs/demo.md#agent-tokens).
* ``svc gateway --upstreams-file FILE [--pdp-url URL] ...``: the MCP gateway (docs/gateway.md):
  every agent tool call checked at the decision point before it is forwarded. Runs until
  Ctrl-C or SIGTERM.
* ``svc version`` (or ``svc --version``): print the release.

The options of ``svc pdp``, ``svc intake``, ``svc history`` and the ``--log-*`` ones of ``svc up``
are made from the components' settings classes (``svc.common.cli.settings_command``): each
option's environment variable, default and help are its field's, and a given option wins over
the environment, which wins over the default.

Exit codes: 0 decision printed (whatever the verdict, unless ``--exit-code``), 1 with
``--exit-code`` when the verdict is not ``allow``, 2 bad input (bundle or request), with the
problem on standard error.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from svc import __version__
from svc.challenge.cli import app as challenge_app
from svc.common.auth_settings import HistoryAuthSettings, PdpAuthSettings
from svc.common.cli import Options, settings_command
from svc.connectors.cli import app as connectors_app
from svc.context.cli import app as context_app
from svc.gateway.cli import gateway as gateway_command
from svc.history.loader import HistoryStoreSettings, LoaderSettings
from svc.intake.settings import IntakeSettings
from svc.pdp import BundleError, Engine, RequestError
from svc.pdp.log_settings import DecisionLogSettings
from svc.pdp.settings import PdpSettings
from svc.policy.cli import app as policy_app
from svc.portal.cli import app as portal_app
from svc.reasoner.cli import app as reasoner_app
from svc.reporter.cli import app as reporter_app
from svc.topology import app as topology_app

app = typer.Typer(
    name="svc",
    help="svc: access decisions (Cedar) and audit intake.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    """``svc --version``: prints the release (the wheel's version, from Cargo.toml) and exits."""
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the release and exit.",
        ),
    ] = False,
) -> None:
    """svc: access decisions (Cedar) and audit intake."""


# The options of a component come from its settings class (svc.common.cli): name, help,
# environment variable, default and bounds are the field's.
_LOG_OPTIONS = Options(DecisionLogSettings)

BundleOpt = Annotated[
    Path,
    typer.Option(
        "--bundle",
        "-b",
        help="Bundle directory: *.cedar, one schema file, entities.json, optional `linked`.",
        exists=True,
        file_okay=False,
        dir_okay=True,
        readable=True,
    ),
]


def _fail(message: str) -> typer.Exit:
    """Prints `message` on standard error and returns the exit for bad input (code 2)."""
    typer.echo(message, err=True)
    return typer.Exit(code=2)


def _load_engine(bundle: Path) -> Engine:
    """Loads `bundle` (warnings go to standard error) or exits listing every problem."""
    try:
        engine = Engine.from_bundle_dir(bundle)
    except BundleError as e:
        raise _fail(str(e)) from e
    for w in engine.warnings:
        typer.echo(f"warning: {w}", err=True)
    return engine


#: What `_answer` hands back: the engine's typed answer (`svc.pdp.Decision`, `DecisionRecord`
#: or `Plan`), unchanged.
_Answer = TypeVar("_Answer")


def _answer(
    bundle: Path, request: str, mode: str, call: Callable[[Engine, Any], _Answer]
) -> _Answer:
    """Returns `call(engine, body)` for `bundle`, `request` and `mode`.

    Exits with code 2, naming the problem, on a bad bundle, request file or request.
    """
    engine = _load_engine(bundle)
    body = _read_request(request)
    try:
        engine.set_mode(mode)
        return call(engine, body)
    except RequestError as e:
        raise _fail(str(e)) from e


def _read_request(path: str) -> Any:
    """Reads the request JSON from `path` (`-` for standard input) or exits with the reason."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise _fail(f"cannot read request `{path}`: {e.strerror}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(
            f"request `{path}` is not JSON: line {e.lineno}, column {e.colno}: {e.msg}"
        ) from e


@app.command()
def check(
    request: Annotated[str, typer.Argument(help="Request JSON file, or - for standard input.")],
    bundle: BundleOpt,
    mode: Annotated[
        str, typer.Option(help="Mode to report with the decision: monitor or enforce.")
    ] = "enforce",
    record: Annotated[
        bool, typer.Option("--record", help="Print the full decision-log record instead.")
    ] = False,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the verdict is not allow.")
    ] = False,
) -> None:
    """Decide one request against a bundle directory and print the decision as JSON."""
    result = _answer(
        bundle, request, mode, lambda e, body: e.decide(body) if record else e.evaluate(body)
    )
    typer.echo(json.dumps(result, indent=2))
    if exit_code and result["verdict"] != "allow":
        raise typer.Exit(code=1)


@app.command()
def plan(
    request: Annotated[str, typer.Argument(help="Plan request JSON file, or - for stdin.")],
    bundle: BundleOpt,
    mode: Annotated[
        str, typer.Option(help="Mode to report with the plan: monitor or enforce.")
    ] = "enforce",
) -> None:
    """Build the query plan (filter tree) of a request against a bundle directory."""
    result = _answer(bundle, request, mode, lambda e, body: e.plan(body))
    typer.echo(json.dumps(result, indent=2))


@app.command()
@settings_command(
    "svc pdp",
    settings=Options(
        PdpSettings,
        # The order of docs/api.md's table.
        only=(
            "host",
            "port",
            "mode",
            "max_body_bytes",
            "workers",
            "public_url",
            "watch",
            "policy",
            "public_key",
            "policy_token_file",
            "context",
            "context_token_file",
            "context_fetch_timeout_ms",
            "challenge",
            "challenge_token_file",
            "challenge_timeout_ms",
            "feed_max_staleness_secs",
            "noop_routes",
            "plan_max_age_secs",
            "kafka_url",
            "spool_dir",
            "log_queue_bound",
            "spool_max_bytes",
            "log_commit_ms",
            "log_durability",
            "log_fsync",
            "decisions_topic",
            "max_batch_items",
            "search_max_limit",
            "max_inline_entities",
            "max_entity_depth",
        ),
        names={"kafka_url": "--kafka"},
    ),
    auth=Options(PdpAuthSettings),
)
def pdp(
    settings: PdpSettings,
    auth: PdpAuthSettings,
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            "-b",
            help="Bundle directory: *.cedar, one schema file, entities.json, optional `linked` "
            "(or --policy).",
            exists=True,
            file_okay=False,
            dir_okay=True,
            readable=True,
        ),
    ] = None,
) -> None:
    """Run the decision point (gRPC + HTTP on one port) over a bundle or a policy service.

    --bundle DIR serves a bundle directory (reloaded when its files change); --policy URL
    --public-key FILE follows the policy service's active bundle and mode instead. Either way,
    --context URL follows the context service's principals and fetches the resources checks
    name from it (docs/context.md); --challenge URL resolves challenge verdicts with the
    challenge service and answers challenge waits (docs/challenges.md).

    Bearer-token settings (--auth-*, SVC_PDP_AUTH_*): docs/auth.md. Without them the decision
    point serves anyone and may only bind a loopback address.
    """
    if (bundle is None) == (settings.policy is None):
        raise _fail("svc pdp: give either --bundle DIR or --policy URL --public-key FILE")
    from svc.common.auth import AuthConfigError
    from svc.pdp.server import StandaloneOptions, run_standalone

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    opts = StandaloneOptions(**dict(settings), auth=auth)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        run_standalone(bundle, opts, stop)
    except AuthConfigError as e:
        raise _fail(f"svc pdp: {e}") from e
    except BundleError as e:
        raise _fail(str(e)) from e
    except RequestError as e:
        raise _fail(str(e)) from e
    except (OSError, ValueError) as e:
        raise _fail(str(e)) from e


@app.command()
def validate(bundle: BundleOpt) -> None:
    """Load a bundle directory and validate its policies strictly against its schema."""
    engine = _load_engine(bundle)
    names = engine.policy_names
    typer.echo(f"ok: {len(names)} policies: {', '.join(names)}")


@app.command()
@settings_command(
    "svc intake",
    settings=Options(IntakeSettings, only=("host", "port", "dev"), names={"dev": "--dev"}),
)
def intake(
    settings: IntakeSettings,
    access_log: Annotated[bool, typer.Option(help="Log one line per request.")] = False,
) -> None:
    """Run the event intake (HTTP on port 8080); other settings: SVC_INTAKE_*, SVC_KAFKA_URL."""
    from svc.intake import serve

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    serve(settings, access_log=access_log)


DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="SVC_DATA_DIR",
        help="Where svc up keeps its data (default $XDG_DATA_HOME/svc or ~/.local/share/svc).",
        file_okay=False,
    ),
]
UpPortOpt = Annotated[
    int,
    typer.Option(
        min=1,
        max=65527,
        help=(
            "Decision point port; intake on PORT+1, history on PORT+2, policy service on "
            "PORT+3, context service on PORT+4, challenge service on PORT+5, demo identity "
            "provider on PORT+6, gateway on PORT+7, demo token issuer on PORT+8."
        ),
    ),
]
UpHostOpt = Annotated[str, typer.Option(help="Address every component binds.")]


@app.command()
@settings_command("svc up", log=_LOG_OPTIONS)
def up(
    data_dir: DataDirOpt = None,
    host: UpHostOpt = "127.0.0.1",
    port: UpPortOpt = 8080,
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            "-b",
            help="Bundle to publish to the policy service (default on first start: "
            "DATA_DIR/bundle, the demo company's).",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    mode: Annotated[str, typer.Option(help="monitor or enforce, reported with decisions.")] = (
        "enforce"
    ),
    demo: Annotated[
        bool, typer.Option("--demo", help="Also run the demo traffic and print its summary.")
    ] = False,
    retention_days: Annotated[
        int, typer.Option(min=0, help="History retention in days (0 keeps everything).")
    ] = 0,
    *,
    log: DecisionLogSettings,
) -> None:
    """Run the decision point, intake, history loader and policy service here (embedded defaults).

    Prints each URL once everything is up; Ctrl-C stops cleanly and keeps the data directory.
    """
    from svc.common.install import default_data_dir
    from svc.up import UpOptions, run

    if demo and bundle is not None:
        raise _fail("svc up: --demo drives the demo company's bundle; leave out --bundle")
    opts = UpOptions(
        data_dir=data_dir or default_data_dir(),
        host=host,
        port=port,
        bundle=bundle,
        mode=mode,
        retention_days=retention_days,
        log_commit_ms=log.log_commit_ms,
        log_durability=log.log_durability,
        log_fsync=log.log_fsync,
    )
    raise typer.Exit(run(opts, demo_checks=2000 if demo else 0, keep_serving=True))


demo_app = typer.Typer(name="demo", add_completion=False)


@demo_app.callback(invoke_without_command=True)
def demo_command(
    ctx: typer.Context,
    data_dir: DataDirOpt = None,
    host: UpHostOpt = "127.0.0.1",
    port: UpPortOpt = 8080,
    checks: Annotated[int, typer.Option(min=1, help="Checks to send.")] = 2000,
    serve: Annotated[
        bool, typer.Option(help="Keep serving after the summary (as svc up --demo does).")
    ] = False,
) -> None:
    """Provision the demo company, drive traffic through svc up, print what history holds."""
    if ctx.invoked_subcommand is not None:
        return
    from svc.common.install import default_data_dir
    from svc.up import UpOptions, run

    opts = UpOptions(data_dir=data_dir or default_data_dir(), host=host, port=port)
    raise typer.Exit(run(opts, demo_checks=checks, keep_serving=serve))


@demo_app.command("token")
def demo_token(
    agent: Annotated[str, typer.Option(help="The agent's service account id (copilot.assistant).")],
    person: Annotated[
        str | None,
        typer.Option(
            "--for",
            help="The person the agent works for (a token-exchange token, RFC 8693); "
            "leave out for the agent alone (client credentials).",
        ),
    ] = None,
    human_present: Annotated[
        bool | None,
        typer.Option(
            "--human-present/--no-human-present", help="svc_human_present (default: left out)."
        ),
    ] = None,
    work_item: Annotated[
        str | None, typer.Option(help="svc_work_item_id, <tracker>:<key> (jira:DOC-101).")
    ] = None,
    lifetime: Annotated[int, typer.Option(help="Seconds until it expires.")] = 3600,
    app_name: Annotated[
        str | None,
        typer.Option("--app", help="Sign as this demo app instead of the agent's own."),
    ] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Print an agent token signed by svc up's development token issuer (demo only).

    The issuer's keys and address are in DATA_DIR/token-issuer, written by svc up
    (docs/demo.md#agent-tokens).
    """
    from svc.common.install import default_data_dir
    from svc.demo.token_issuer import DevTokenIssuer

    directory = (data_dir or default_data_dir()) / "token-issuer"
    try:
        issuer = DevTokenIssuer.from_directory(directory)
    except (OSError, ValueError) as e:
        raise _fail(f"svc demo token: {e}; start svc up first") from None
    try:
        token = issuer.mint(
            agent,
            person,
            human_present=human_present,
            work_item_id=work_item,
            lifetime_secs=lifetime,
            app=app_name,
        )
    except ValueError as e:
        raise _fail(f"svc demo token: {e}") from None
    typer.echo(token)


app.add_typer(demo_app, name="demo")


@app.command()
def version() -> None:
    """Print the release."""
    typer.echo(__version__)


history_app = typer.Typer(
    name="history",
    help="The history store (ClickHouse or chDB): schema job and loader.",
    no_args_is_help=True,
)
app.add_typer(history_app, name="history")
app.add_typer(policy_app, name="policy")


def _history_client(dsn: str, create_database: bool = False) -> Any:
    """`svc.history.connect(dsn)`, or exits with the problem (code 2)."""
    from svc import history

    try:
        return history.connect(dsn, create_database=create_database)
    except ValueError as e:
        raise _fail(str(e)) from e


@history_app.command("migrate")
@settings_command(
    "svc history migrate", store=Options(HistoryStoreSettings, names={"dsn": "--dsn"})
)
def history_migrate(store: HistoryStoreSettings) -> None:
    """Apply the history schema (the per-release schema job; idempotent, docs/history.md#schema)."""
    from svc import history

    applied = history.migrate(_history_client(store.dsn, create_database=True))
    typer.echo(f"applied versions {applied}" if applied else "history schema is up to date")


@history_app.command("load")
@settings_command(
    "svc history load",
    settings=Options(
        LoaderSettings,
        only=(
            "dsn",
            "kafka_url",
            "host",
            "port",
            "retention_days",
            "retention_file",
            "retention_interval",
            "group",
            "decisions_topic",
            "events_topic",
            "batch_records",
            "batch_ms",
        ),
        names={"dsn": "--dsn", "kafka_url": "--kafka"},
    ),
    auth=Options(HistoryAuthSettings),
)
def history_load(
    settings: LoaderSettings,
    auth: HistoryAuthSettings,
    migrate: Annotated[bool, typer.Option(help="Apply the schema first.")] = False,
    until_caught_up: Annotated[
        bool, typer.Option(help="Exit once every partition is loaded and committed.")
    ] = False,
) -> None:
    """Load svc.decisions.v1 and svc.events.v1 into the history (at least once, deduplicated).

    Offsets are committed only after a batch is stored; runs until Ctrl-C or SIGTERM. The
    loader's health settings (SVC_HISTORY_FAILING_AFTER, ...) come from the environment. With
    --port, the probes (/readyz: the loader's health) and the history routes are served there;
    bearer-token settings (--auth-*, SVC_HISTORY_AUTH_*): docs/auth.md.
    """
    from svc import history
    from svc.common.auth import AuthConfigError
    from svc.common.topics import bootstrap_servers

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    bootstrap = bootstrap_servers(settings.kafka_url)
    client = _history_client(settings.dsn, create_database=migrate)
    if migrate:
        history.migrate(client)
    loader = history.Loader(
        client,
        bootstrap,
        decisions_topic=settings.decisions_topic or None,
        events_topic=settings.events_topic or None,
        group_id=settings.group,
        batch_records=settings.batch_records,
        batch_ms=settings.batch_ms,
        retention_days=settings.current_retention,
        retention_interval=settings.retention_interval,
        health=settings,
    )
    stop_http: Callable[[], None] | None = None
    if settings.port is not None:
        from svc.history.service import create_app

        try:
            auth.check_bind(settings.host)
            app_ = create_app(client, loader, auth=auth)
        except AuthConfigError as e:
            raise _fail(f"svc history load: {e}") from e
        stop_http = _serve_http(app_, settings.host, settings.port)
    stop_on = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: loader.stop()) for sig in stop_on}
    try:
        stats = loader.run(until_caught_up=until_caught_up)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stop_http is not None:
            stop_http()
    typer.echo(json.dumps(stats.__dict__))


def _serve_http(app_: Any, host: str, port: int) -> Callable[[], None]:
    """Serves the ASGI app `app_` with uvicorn on (`host`, `port`) in a thread of its own.

    The socket comes from ``svc.common.net.tcp_listener`` (docs/architecture.md#code-layout-
    and-conventions). Returns a function that stops the server (requests under way finish)
    and joins the thread. Exits with code 2 when the port cannot be bound.
    """
    import asyncio

    import uvicorn

    from svc.common.net import tcp_listener

    try:
        sock = tcp_listener(host, port)
    except OSError as e:
        raise _fail(f"cannot listen on {host}:{port}: {e.strerror}") from e
    config = uvicorn.Config(
        app_, lifespan="on", log_level="warning", access_log=False, server_header=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])),
        name="svc-history-http",
        daemon=True,
    )
    thread.start()
    logging.getLogger("svc.history").info(
        "serving the history on %s:%d", host, sock.getsockname()[1]
    )

    def stop() -> None:
        """Stops the server and closes its socket."""
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    return stop


app.add_typer(context_app, name="context")
app.add_typer(challenge_app, name="challenge")
app.add_typer(connectors_app, name="connectors")
app.add_typer(reporter_app, name="reporter")
app.add_typer(portal_app, name="portal")
app.add_typer(reasoner_app, name="reasoner")
app.add_typer(topology_app, name="topology")
app.command("gateway")(gateway_command)

if __name__ == "__main__":  # pragma: no cover
    app()
