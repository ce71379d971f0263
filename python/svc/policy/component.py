"""The policy service's registration: how ``svc up`` and ``svc topology`` run it.

Under ``svc up`` it is served in a thread of its own on ``port + 3`` with a SQLite database
``<data_dir>/policy.db`` and its signing key in the data directory; when nothing is published
yet (or ``--bundle`` names files that differ from the active bundle's), the bundle directory
is drafted and published, and the public key written to ``<data_dir>/policy-signing.pub`` for
the decision point. Under ``svc topology`` it is ``svc policy`` on PostgreSQL; once ready, the
first bundle is published through its gRPC API (docs/policy.md). Both give it the context
service, whose directory dry runs decide with, and a token of the ``policy`` role for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from svc.common.auth import PolicyAuthSettings
from svc.common.component import (
    Process,
    Registration,
    Role,
    TopologyRuntime,
    UpRuntime,
    svc_command,
)
from svc.common.inprocess import serve_threaded
from svc.policy import signing
from svc.policy.app import PolicyServer
from svc.policy.directory import DirectoryClient
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings

__all__ = ["REGISTRATION", "publish_first_bundle"]


def _bundle_files(bundle_dir: Path) -> dict[str, str]:
    """The files of `bundle_dir` (its top level), name -> text."""
    return {
        p.name: p.read_text(encoding="utf-8") for p in sorted(bundle_dir.iterdir()) if p.is_file()
    }


@contextmanager
def _start(rt: UpRuntime) -> Iterator[PolicyServer]:
    """The policy service in this process until the block ends (module docs).

    Raises:
        svc.policy.service.PolicyError: the bundle does not validate (every problem named).
        OSError: the database, the key or the port cannot be opened (``PortTaken`` when the
            port is in use).
        AuthConfigError: the issuer's keys cannot be loaded.

    """
    d = rt.data_dir
    settings = PolicySettings(
        host=rt.host,
        port=rt.port("policy"),
        database_url=f"sqlite:///{(d / 'policy.db').resolve()}",
        data_dir=d,
        default_mode=rt.options.mode,
    )
    # Dry runs read the directory as the decision point does (docs/policy.md#dry-runs); the
    # context service starts after this one, and is first asked at the first dry run.
    directory = DirectoryClient(rt.url("context"), rt.token(Role.POLICY, "context", 600))
    service = PolicyService(settings, history=rt.history, directory=directory)
    try:
        files = _bundle_files(rt.bundle_dir)
        active = service.get_active()
        republish = rt.options.bundle is not None
        if active is None or (republish and active.files != files):
            author = rt.subject(Role.OPERATOR)
            draft = service.create_draft(files, author, comment=f"svc up: {rt.bundle_dir}")
            service.publish(draft.version, author)
        (d / "policy-signing.pub").write_text(
            signing.public_key_text(service.public_key), encoding="utf-8"
        )
        server = PolicyServer(settings, service, auth=PolicyAuthSettings(**rt.auth("policy")))
        with serve_threaded(server, settings.host, settings.port, "policy service"):
            yield server
    finally:
        service.close()


def _processes(t: TopologyRuntime) -> list[Process]:
    """``svc policy`` on its PostgreSQL database; dry runs only against a ClickHouse server.

    chDB's directory belongs to the history process alone (docs/history.md#engines-and-dsns),
    so with chDB the policy service runs without dry runs.
    """
    history = (
        ["--history-dsn", t.history_dsn]
        if t.history_dsn.startswith(("http://", "https://"))
        else []
    )
    argv = [
        "policy",
        "--port",
        str(t.port("policy")),
        "--database-url",
        t.database_url("policy"),
        "--data-dir",
        str(t.state),
        "--signing-key-file",
        str(t.secrets / "policy-signing.key"),
        *history,
    ]
    env = t.auth_env("policy") | {
        "SVC_POLICY_CONTEXT_URL": t.url("context"),
        "SVC_POLICY_CONTEXT_TOKEN_FILE": str(t.token_file(Role.POLICY)),
    }
    return [Process("policy", svc_command(*argv), t.port("policy"), env)]


def publish_first_bundle(t: TopologyRuntime) -> None:
    """Publishes the topology's bundle directory through the gRPC API when nothing is active.

    Raises:
        grpc.RpcError: the service refused a call (the bundle does not validate, for example).

    """
    import grpc

    from svc.policy.v1 import policy_pb2 as pb
    from svc.policy.v1 import policy_pb2_grpc as pb_grpc

    operator = t.secret(f"{Role.OPERATOR}.token")
    meta = [("authorization", f"Bearer {operator}")]
    with grpc.insecure_channel(f"127.0.0.1:{t.port('policy')}") as channel:
        stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            active = stub.GetActive(pb.GetActiveRequest(), timeout=30, metadata=meta)
            if active.bundle.version:
                return
        except grpc.RpcError as e:
            if not isinstance(e, grpc.Call) or e.code() != grpc.StatusCode.NOT_FOUND:
                raise
        files = [
            pb.BundleFile(name=name, content=text) for name, text in _bundle_files(t.bundle).items()
        ]
        author = t.subject(Role.OPERATOR)
        draft = stub.CreateDraft(
            pb.CreateDraftRequest(files=files, author=author, comment=f"first: {t.bundle}"),
            timeout=60,
            metadata=meta,
        )
        stub.Publish(
            pb.PublishRequest(version=draft.bundle.version, author=author),
            timeout=60,
            metadata=meta,
        )


def _banner(rt: UpRuntime) -> list[str]:
    url = rt.url("policy")
    return [
        f"  policy service  {url}   gRPC svc.policy.v1.PolicyService "
        f"(svc policy active --url {url})"
    ]


REGISTRATION = Registration(
    name="policy",
    title="policy service",
    settings=(PolicySettings, PolicyAuthSettings),
    audience="svc-policy",
    callers=(Role.OPERATOR, Role.PDP, Role.GATEWAY, Role.REASONER, Role.PORTAL),
    up_port=3,
    topology_ports={"policy": 3},
    phase="starting the policy service",
    start=_start,
    processes=_processes,
    after_ready=publish_first_bundle,
    banner=_banner,
)
