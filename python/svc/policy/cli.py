"""``svc policy``: serve the policy service, or talk to a running one (docs/policy.md#cli).

* ``svc policy [--port 8080] [--database-url URL] [--data-dir DIR] [--auth-* ...]``: serve;
  the options are made from ``PolicySettings`` and ``PolicyAuthSettings``
  (``svc.common.cli.settings_command``; ``SVC_POLICY_*``, options win). Runs until Ctrl-C or
  SIGTERM.
* ``svc policy migrate [--database-url URL]``: apply the schema and print the revision
  (idempotent; serving does it on start too; the chart runs it as a pre-upgrade Job).
* ``svc policy keygen FILE``: write an Ed25519 key pair (``FILE``, ``FILE.pub``): the service's
  signing key, or an admin's break-glass key.
* ``svc policy draft DIR``, ``publish VERSION``, ``active``, ``bundles``,
  ``mode monitor|enforce``, ``rollback VERSION --key FILE --admin NAME``,
  ``dry-run VERSION --since 24h``: call the service at ``--url`` (``SVC_POLICY_URL``, default
  ``127.0.0.1:8080``) with a bearer token (``--token``, ``SVC_POLICY_TOKEN``, else ``svc up``'s
  ``caller.token``; ``caller_token``) and print readable results.

Exit codes: 0 done; 1 the service refused (its status and every field violation on standard
error) or cannot be reached; 2 bad input.
"""

from __future__ import annotations

import getpass
import logging
import re
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from svc.common.auth_settings import PolicyAuthSettings
from svc.common.cli import Options, run_migration, settings_command
from svc.common.install import caller_token
from svc.common.install import grpc_target as target
from svc.policy import signing
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.v1 import policy_pb2_grpc as pb_grpc
from svc.policy.wire import CHANNEL_OPTIONS

__all__ = ["app", "caller_token", "parse_since", "target"]

app = typer.Typer(
    help="The policy service: serve it, or manage bundles and modes on a running one.",
    no_args_is_help=False,
)

UrlOpt = Annotated[
    str,
    typer.Option(
        "--url", envvar="SVC_POLICY_URL", help="The policy service (host:port or http://...)."
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SVC_POLICY_TOKEN",
        help="Bearer token for the service (default: the data directory's caller.token, which "
        "svc up writes, when it exists).",
        show_default=False,
    ),
]
AuthorOpt = Annotated[str, typer.Option("--author", help="Who does it (default: your login).")]
_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``24h``/``30m``/``7d``/``90s`` before now, or an RFC 3339 time (an offset is required).

    Raises:
        typer.BadParameter: neither form.

    """
    now = now or datetime.now(UTC)
    m = _DURATION.match(text.strip())
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return now - timedelta(
            **{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: n}
        )
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"`{text}`: expected 24h, 30m, 7d or an RFC 3339 time") from None
    if t.tzinfo is None:
        raise typer.BadParameter(f"`{text}`: an RFC 3339 time needs an offset (Z, +02:00)")
    return t


class _Client:
    """A stub of the service at ``url`` whose calls carry ``token`` and exit on a refusal."""

    def __init__(self, url: str, token: str | None) -> None:
        channel = grpc.insecure_channel(target(url), options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        bearer = caller_token(token)
        self.metadata = [("authorization", f"Bearer {bearer}")] if bearer else []

    def __call__(self, method: str, request: Any) -> Any:
        """Calls ``method``; on a refusal prints it (``_call``) and exits 1."""
        return _call(getattr(self.stub, method), request, self.metadata)


def _call(fn: Any, request: Any, metadata: list[tuple[str, str]]) -> Any:
    """Calls one method; prints a refusal with its field violations and exits 1."""
    try:
        return fn(request, timeout=60, metadata=metadata)
    except grpc.RpcError as e:
        code = e.code().name if isinstance(e, grpc.Call) else "UNKNOWN"
        details = e.details() if isinstance(e, grpc.Call) else str(e)
        typer.echo(f"refused: {code}: {details}", err=True)
        status = rpc_status.from_call(e) if isinstance(e, grpc.Call) else None
        for d in status.details if status else []:
            bad = error_details_pb2.BadRequest()
            if d.Unpack(bad):
                for v in bad.field_violations:
                    typer.echo(f"  {v.field}: {v.description}", err=True)
        raise typer.Exit(1) from None


def _author(author: str) -> str:
    return author or getpass.getuser()


def _when(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return str(ts.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds"))


def _state(value: int) -> str:
    return str(pb.BundleState.Name(value).removeprefix("BUNDLE_STATE_").lower())


def _mode(value: int) -> str:
    return str(pb.Mode.Name(value).removeprefix("MODE_").lower())


def _print_bundle(b: pb.Bundle) -> None:
    typer.echo(
        f"version {b.version}  {_state(b.state)}  by {b.author}  created {_when(b.created_at)}"
        f"  published {_when(b.published_at)}"
    )
    if b.signature:
        typer.echo(f"  signed by key {b.key_id}, digest {b.digest}")
    if b.files:
        typer.echo(f"  files: {', '.join(f.name for f in b.files)}")
    if b.policies:
        typer.echo(f"  {len(b.policies)} policies")
    for w in b.warnings:
        typer.echo(f"  warning: {w}")


@app.callback(invoke_without_command=True)
@settings_command(
    "svc policy",
    settings=Options(PolicySettings, exclude=("break_glass_keys",)),
    auth=Options(PolicyAuthSettings),
)
def serve(ctx: typer.Context, settings: PolicySettings, auth: PolicyAuthSettings) -> None:
    """Serve the policy service (without a subcommand); settings from options or SVC_POLICY_*.

    Break-glass keys: SVC_POLICY_BREAK_GLASS_KEYS. Bearer-token settings (--auth-*,
    SVC_POLICY_AUTH_*): docs/auth.md; without them the service may only bind a loopback address.
    """
    if ctx.invoked_subcommand is not None:
        return
    from svc.common.auth import AuthConfigError
    from svc.policy.app import serve as run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        run(
            settings,
            auth=auth,
            ready=lambda p: typer.echo(f"svc-policy listening on {settings.host}:{p}"),
        )
    except AuthConfigError as e:
        typer.echo(f"svc policy: {e}", err=True)
        raise typer.Exit(2) from None


@app.command("migrate")
@settings_command("svc policy migrate", settings=Options(PolicySettings, only=("database_url",)))
def migrate_command(settings: PolicySettings) -> None:
    """Apply the policy service's schema (Alembic; idempotent) and print the revision."""
    from svc.policy.migrate import migrate

    run_migration("svc policy migrate", "policy", settings.database_url, migrate)


@app.command()
def keygen(
    path: Annotated[Path, typer.Argument(help="Private key file to write (PKCS #8 PEM).")],
) -> None:
    """Write an Ed25519 key pair: PATH (private, mode 0600) and PATH.pub (public)."""
    try:
        pub = signing.generate_keypair(path)
    except FileExistsError:
        typer.echo(f"{path} exists; a key is never overwritten", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {path} and {path}.pub (key id {signing.key_id(pub)})")
    typer.echo(f"public key: {signing.public_key_text(pub).strip()}")


@app.command()
def draft(
    directory: Annotated[Path, typer.Argument(help="A bundle directory (docs/bundles.md).")],
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    author: AuthorOpt = "",
    comment: Annotated[str, typer.Option(help="Free text kept with the draft.")] = "",
) -> None:
    """Validate a bundle directory and store it as a draft; prints its version."""
    if not directory.is_dir():
        typer.echo(f"{directory} is not a directory", err=True)
        raise typer.Exit(2)
    files = [
        pb.BundleFile(name=p.name, content=p.read_text(encoding="utf-8"))
        for p in sorted(directory.iterdir())
        if p.is_file()
    ]
    r = _Client(url, token)(
        "CreateDraft",
        pb.CreateDraftRequest(files=files, author=_author(author), comment=comment),
    )
    _print_bundle(r.bundle)


def _print_tests(run: pb.TestRun) -> None:
    """A test run: its counts, then each failing test with what it expected and got."""
    typer.echo(f"tests under version {run.version}: {run.passed} passed, {run.failed} failed")
    for r in run.results:
        if r.passed:
            continue
        by = f" (by {', '.join(r.policies)})" if r.policies else ""
        why = f": {r.error}" if r.error else ""
        typer.echo(f"  FAILED {r.name}: expected {r.expected}, got {r.got}{by}{why}")
        for note in r.notes:
            typer.echo(f"    note: {note}")


@app.command()
def publish(
    version: Annotated[int, typer.Argument(help="The draft's version.")],
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    author: AuthorOpt = "",
    accept_failing_test: Annotated[
        list[str] | None,
        typer.Option(
            help="A policy test that fails under VERSION and that you accept (repeat for each; "
            "recorded with the publish, docs/policy.md#policy-tests)."
        ),
    ] = None,
) -> None:
    """Sign a draft and make it the active bundle, once its policy tests pass."""
    req = pb.PublishRequest(
        version=version, author=_author(author), accept_failing_tests=accept_failing_test or []
    )
    r = _Client(url, token)("Publish", req)
    _print_bundle(r.bundle)
    if r.HasField("tests"):
        _print_tests(r.tests)


@app.command()
def tests(
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    run: Annotated[
        int | None,
        typer.Option(help="Decide every test under this bundle version (0: the active one)."),
    ] = None,
) -> None:
    """List the saved policy tests, or decide them under a version (docs/policy.md#policy-tests).

    Exits 1 when a test fails under ``--run``.
    """
    client = _Client(url, token)
    if run is not None:
        out = client("RunTests", pb.RunTestsRequest(version=run)).tests
        _print_tests(out)
        if out.failed:
            raise typer.Exit(1)
        return
    for t in client("ListTests", pb.ListTestsRequest()).tests:
        q = t.request
        obo = ""
        if q.HasField("on_behalf_of"):
            obo = f" for {q.on_behalf_of.type}::{q.on_behalf_of.id}"
        typer.echo(
            f"{t.name}: {q.principal.type}::{q.principal.id} {q.action} "
            f"{q.resource.type}::{q.resource.id}{obo} expects {t.expect}  "
            f"saved by {t.saved_by} {_when(t.created_at)}"
        )


@app.command("test-delete")
def test_delete(
    name: Annotated[str, typer.Argument(help="The policy test's name.")],
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    author: AuthorOpt = "",
) -> None:
    """Delete a saved policy test."""
    _Client(url, token)("DeleteTest", pb.DeleteTestRequest(name=name, author=_author(author)))
    typer.echo(f"deleted {name}")


@app.command()
def active(url: UrlOpt = "127.0.0.1:8080", token: TokenOpt = None) -> None:
    """Print the active bundle and the modes."""
    client = _Client(url, token)
    e = client("GetEnforcement", pb.GetEnforcementRequest()).enforcement
    typer.echo(f"mode {_mode(e.mode)}, containment mode {_mode(e.containment_mode)}")
    _print_bundle(client("GetActive", pb.GetActiveRequest()).bundle)


@app.command()
def bundles(url: UrlOpt = "127.0.0.1:8080", token: TokenOpt = None, limit: int = 20) -> None:
    """List bundles, newest first."""
    for b in _Client(url, token)("ListBundles", pb.ListBundlesRequest(limit=limit)).bundles:
        _print_bundle(b)


@app.command()
def mode(
    new_mode: Annotated[str, typer.Argument(metavar="monitor|enforce")],
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    containment: Annotated[
        bool, typer.Option(help="Set the mode for automated containments instead.")
    ] = False,
    author: AuthorOpt = "",
    reason: Annotated[str, typer.Option(help="Why (recorded).")] = "",
) -> None:
    """Set the install's enforcement mode (or, with --containment, the containment mode)."""
    value = {"monitor": pb.MODE_MONITOR, "enforce": pb.MODE_ENFORCE}.get(new_mode)
    if value is None:
        typer.echo(f"mode `{new_mode}`: expected monitor or enforce", err=True)
        raise typer.Exit(2)
    scope = pb.MODE_SCOPE_CONTAINMENT if containment else pb.MODE_SCOPE_INSTALL
    r = _Client(url, token)(
        "SetEnforcement",
        pb.SetEnforcementRequest(scope=scope, mode=value, author=_author(author), reason=reason),
    )
    e = r.enforcement
    changed = "changed" if r.HasField("change") else "unchanged"
    typer.echo(f"{changed}: mode {_mode(e.mode)}, containment mode {_mode(e.containment_mode)}")


@app.command()
def rollback(
    version: Annotated[int, typer.Argument(help="An earlier published version.")],
    key: Annotated[Path, typer.Option("--key", help="Your break-glass private key (PEM).")],
    admin: Annotated[str, typer.Option(help="Your name in the service's break_glass_keys.")],
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    reason: Annotated[str, typer.Option(help="Why (recorded).")] = "",
) -> None:
    """Break glass: make an earlier version active at once, signed with your admin key."""
    try:
        private = signing.load_private_key(key)
    except (OSError, ValueError) as e:
        typer.echo(f"cannot use the key: {e}", err=True)
        raise typer.Exit(2) from None
    nonce = secrets.token_urlsafe(24)
    issued_at = int(time.time())
    sig = signing.sign_break_glass(private, version, admin, nonce, issued_at, reason)
    r = _Client(url, token)(
        "BreakGlassRollback",
        pb.BreakGlassRollbackRequest(
            version=version,
            admin=admin,
            nonce=nonce,
            issued_at=issued_at,
            reason=reason,
            signature=sig,
        ),
    )
    typer.echo(f"version {r.bundle.version} active (was {r.from_version})")


@app.command("dry-run")
def dry_run(
    version: Annotated[int, typer.Argument(help="The bundle version to decide under.")],
    since: Annotated[str, typer.Option(help="Start: 24h, 30m, 7d or an RFC 3339 time.")],
    until: Annotated[str | None, typer.Option(help="End (default now).")] = None,
    url: UrlOpt = "127.0.0.1:8080",
    token: TokenOpt = None,
    sample: Annotated[int, typer.Option(help="Changed decisions listed.")] = 20,
) -> None:
    """Decide the recorded decisions of a time range again under VERSION; count the changes."""
    req = pb.DryRunRequest(version=version, sample=sample)
    req.since.FromDatetime(parse_since(since))
    if until is not None:
        req.until.FromDatetime(parse_since(until))
    r = _Client(url, token)("DryRun", req)
    typer.echo(
        f"{r.decisions} decisions under version {r.version}: {r.unchanged} unchanged, "
        f"{r.allow_to_deny} allow->deny, {r.deny_to_allow} deny->allow, "
        f"{r.to_challenge} to challenge, {r.from_challenge} from challenge, {r.errors} errors"
        + (" (range cut at the limit)" if r.truncated else "")
    )
    if r.entities == "directory":
        typer.echo(f"entities: the directory at version {r.directory_version}")
    elif r.entities:
        typer.echo("entities: the bundle's own")
    for note in r.notes:
        typer.echo(f"  note: {note}")
    for c in r.sample:
        line = f"  {c.qid} {c.principal} {c.action} {c.resource}: {c.recorded} -> {c.draft}"
        typer.echo(line + (f" ({c.error})" if c.error else ""))
