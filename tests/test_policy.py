"""The policy service (docs/policy.md) over the wire: a real service on a free 127.0.0.1 port,
PostgreSQL behind it (a schema of its own per test), gRPC clients from grpcio."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sqlalchemy import Engine as SqlEngine
from sqlalchemy import create_engine, inspect, text

from svc.policy import signing
from svc.policy.app import PolicyServer
from svc.policy.migrate import HEAD, current_revision, migrate
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.v1 import policy_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "python" / "svc" / "demo" / "bundle"
BAD = REPO / "tests" / "testdata" / "bad_bundles"


def files_of(directory: Path) -> dict[str, str]:
    return {
        p.name: p.read_text()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != "expect.json"
    }


def file_msgs(files: dict[str, str]) -> list[pb.BundleFile]:
    return [pb.BundleFile(name=n, content=t) for n, t in files.items()]


SCHEMA = """entity User;
entity Doc = { public: Bool };
action view appliesTo { principal: [User], resource: [Doc] };
"""
ENTITIES = json.dumps(
    [
        {"uid": {"type": "User", "id": "alice"}, "attrs": {}, "parents": []},
        {"uid": {"type": "Doc", "id": "open"}, "attrs": {"public": True}, "parents": []},
        {"uid": {"type": "Doc", "id": "closed"}, "attrs": {"public": False}, "parents": []},
    ]
)
PUBLIC_ONLY = {
    "s.cedarschema": SCHEMA,
    "entities.json": ENTITIES,
    "p.cedar": '@id("public")\npermit (principal, action == Action::"view", resource)\n'
    "when { resource.public };\n",
}
CLOSED_ONLY = {
    **PUBLIC_ONLY,
    "p.cedar": '@id("closed")\npermit (principal, action == Action::"view", resource)\n'
    "when { !resource.public };\n",
}


@pytest.fixture
def pg(postgres_url: str) -> Iterator[SqlEngine]:
    """An engine on a fresh PostgreSQL schema (dropped afterwards), so runs never meet."""
    schema = f"policy_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url)
    with admin.begin() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = create_engine(
        postgres_url, connect_args={"options": f"-csearch_path={schema}"}, pool_pre_ping=True
    )
    yield engine
    engine.dispose()
    with admin.begin() as c:
        c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def admin_key(tmp_path: Path) -> Path:
    path = tmp_path / "admin.key"
    signing.generate_keypair(path)
    return path


@pytest.fixture
def server(tmp_path: Path, pg: SqlEngine, admin_key: Path) -> Iterator[PolicyServer]:
    settings = PolicySettings(
        port=0,
        data_dir=tmp_path,
        heartbeat_secs=0.2,
        break_glass_keys={"root": (admin_key.parent / "admin.key.pub").read_text()},
    )
    srv = PolicyServer(settings, PolicyService(settings, db=pg)).start()
    yield srv
    srv.stop()
    srv.service.close()


@pytest.fixture
def stub(server: PolicyServer) -> Iterator[pb_grpc.PolicyServiceStub]:
    channel = grpc.insecure_channel(server.target)
    yield pb_grpc.PolicyServiceStub(channel)
    channel.close()


def violations(e: grpc.RpcError) -> list[tuple[str, str]]:
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert status is not None
    out = []
    for d in status.details:
        bad = error_details_pb2.BadRequest()
        assert d.Unpack(bad)
        out += [(v.field, v.description) for v in bad.field_violations]
    return out


def draft(stub: pb_grpc.PolicyServiceStub, files: dict[str, str]) -> pb.Bundle:
    return stub.CreateDraft(pb.CreateDraftRequest(files=file_msgs(files), author="ana")).bundle


# ------------------------------------------------------------------------------ validation


def test_invalid_draft_names_every_problem_by_file_line_and_column(
    stub: pb_grpc.PolicyServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        draft(stub, files_of(BAD / "validation_errors"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = violations(err.value)
    assert [f for f, _ in got] == ["policies.cedar:3:8", "policies.cedar:6:22"]
    assert got[0][1].startswith("policy `a`: ") and "`secret`" in got[0][1]
    assert got[1][1].startswith("policy `b`: ") and "`Group`" in got[1][1]
    # A problem in the second file is named in that file, and nothing was stored.
    with pytest.raises(grpc.RpcError) as err:
        draft(stub, files_of(BAD / "error_in_second_file"))
    assert all(f.startswith("b.cedar:") for f, _ in violations(err.value))
    assert list(stub.ListBundles(pb.ListBundlesRequest()).bundles) == []


def test_draft_refuses_bad_names_and_duplicates(stub: pb_grpc.PolicyServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        draft(stub, {"../p.cedar": "permit (principal, action, resource);"})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(err.value)[0][0] == "files[0].name"
    same = [pb.BundleFile(name="p.cedar", content="")] * 2
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateDraft(pb.CreateDraftRequest(files=same, author="ana"))
    assert violations(err.value) == [("files", "`p.cedar` appears twice")]


# ---------------------------------------------------------------- draft, publish, signature


def test_draft_publish_then_active_list_and_get(
    stub: pb_grpc.PolicyServiceStub, server: PolicyServer
) -> None:
    demo = files_of(DEMO)
    d1 = draft(stub, demo)
    assert (d1.version, d1.state, d1.signature) == (1, pb.BUNDLE_STATE_DRAFT, b"")
    assert len(d1.policies) > 10 and sorted(f.name for f in d1.files) == sorted(demo)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetActive(pb.GetActiveRequest())
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    p1 = stub.Publish(pb.PublishRequest(version=1, author="ana")).bundle
    assert p1.state == pb.BUNDLE_STATE_ACTIVE and len(p1.signature) == 64
    assert p1.key_id == signing.key_id(server.service.public_key)
    active = stub.GetActive(pb.GetActiveRequest()).bundle
    got = {f.name: f.content for f in active.files}
    assert got == demo
    signing.verify(server.service.public_key, active.version, got, active.signature)
    assert active.digest == signing.bundle_digest(1, demo).hex()

    d2 = draft(stub, PUBLIC_ONLY)
    assert d2.version == 2
    stub.Publish(pb.PublishRequest(version=2, author="ana"))
    listed = stub.ListBundles(pb.ListBundlesRequest()).bundles
    assert [(b.version, b.state) for b in listed] == [
        (2, pb.BUNDLE_STATE_ACTIVE),
        (1, pb.BUNDLE_STATE_SUPERSEDED),
    ]
    assert all(not b.files for b in listed)
    one = stub.GetBundle(pb.GetBundleRequest(version=1)).bundle
    assert one.state == pb.BUNDLE_STATE_SUPERSEDED and {f.name for f in one.files} == set(demo)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetBundle(pb.GetBundleRequest(version=9))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    # The health routes share the port.
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    ready = httpx.get(f"{server.url}/readyz").json()
    assert ready == {"ready": True, "policy_version": 2, "migration": HEAD}
    assert httpx.get(f"{server.url}/version").json()["component"] == "svc-policy"
    assert "svc_policy_active_version 2.0" in httpx.get(f"{server.url}/metrics").text


def test_verify_refuses_tampered_bundles(tmp_path: Path) -> None:
    key_path = tmp_path / "k"
    pub = signing.generate_keypair(key_path)
    key = signing.load_private_key(key_path)
    files = dict(PUBLIC_ONLY)
    sig = signing.sign_bundle(key, 4, files)
    signing.verify(pub, 4, files, sig)
    with pytest.raises(signing.SignatureError, match="does not verify"):
        signing.verify(pub, 4, {**files, "p.cedar": files["p.cedar"] + " "}, sig)
    with pytest.raises(signing.SignatureError):
        signing.verify(pub, 5, files, sig)  # the version is signed too
    with pytest.raises(signing.SignatureError):
        signing.verify(pub, 4, {**files, "extra.cedar": ""}, sig)
    with pytest.raises(signing.SignatureError):
        signing.verify(pub, 4, files, bytes([sig[0] ^ 1]) + sig[1:])
    with pytest.raises(signing.SignatureError, match="no signature"):
        signing.verify(pub, 4, files, b"")
    other = signing.generate_keypair(tmp_path / "other")
    with pytest.raises(signing.SignatureError):
        signing.verify(other, 4, files, sig)
    # The canonical form is the documented text.
    assert signing.canonical_bundle(1, {"b": "x", "a": ""}).decode().splitlines() == [
        "svc-bundle-v1",
        "version 1",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a",
        "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881  b",
    ]


def test_a_new_signing_key_signs_again_what_it_serves(pg: SqlEngine, tmp_path: Path) -> None:
    first = PolicyService(PolicySettings(data_dir=tmp_path / "a"), db=pg)
    v1 = first.create_draft(PUBLIC_ONLY, "ana").version
    v2 = first.create_draft(CLOSED_ONLY, "ana").version
    first.publish(v1, "ana")
    first.publish(v2, "ana")
    rotated = PolicyService(PolicySettings(data_dir=tmp_path / "b"), db=pg)
    assert rotated.key_id != first.key_id
    active = rotated.get_active()
    assert active is not None and active.key_id == rotated.key_id
    signing.verify(rotated.public_key, active.version, active.files, active.signature)
    again = rotated.publish(v1, "ana")  # signed by the old key: signed again on publish
    signing.verify(rotated.public_key, again.version, again.files, again.signature)


# -------------------------------------------------------------------------------- break glass


def rollback_request(
    key_path: Path, version: int, nonce: str, issued_at: int | None = None
) -> pb.BreakGlassRollbackRequest:
    issued = int(time.time()) if issued_at is None else issued_at
    key = signing.load_private_key(key_path)
    sig = signing.sign_break_glass(key, version, "root", nonce, issued, "bad publish")
    return pb.BreakGlassRollbackRequest(
        version=version,
        admin="root",
        nonce=nonce,
        issued_at=issued,
        reason="bad publish",
        signature=sig,
    )


def test_break_glass_wrong_key_refused_right_key_active_replay_refused(
    stub: pb_grpc.PolicyServiceStub, server: PolicyServer, admin_key: Path, tmp_path: Path
) -> None:
    for files in (PUBLIC_ONLY, CLOSED_ONLY):
        v = draft(stub, files).version
        stub.Publish(pb.PublishRequest(version=v, author="ana"))
    intruder = tmp_path / "intruder.key"
    signing.generate_keypair(intruder)

    def refused(req: pb.BreakGlassRollbackRequest) -> str:
        with pytest.raises(grpc.RpcError) as err:
            stub.BreakGlassRollback(req)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        return str(err.value.details())

    assert "does not verify" in refused(rollback_request(intruder, 1, "n" * 20))
    assert "does not verify" in refused(
        pb.BreakGlassRollbackRequest(version=1, admin="root", nonce="n" * 20, issued_at=1)
    )
    stale = rollback_request(admin_key, 1, "s" * 20, issued_at=int(time.time()) - 3600)
    assert "outside `break_glass_window_secs`" in refused(stale)
    assert stub.GetActive(pb.GetActiveRequest()).bundle.version == 2

    ok = rollback_request(admin_key, 1, "good-nonce-0123456789")
    r = stub.BreakGlassRollback(ok)
    assert (r.bundle.version, r.from_version) == (1, 2)
    assert stub.GetActive(pb.GetActiveRequest()).bundle.version == 1
    assert "used already" in refused(ok)

    with server.service.db.connect() as c:
        rows = c.execute(text("SELECT admin, version, from_version FROM break_glass_events"))
        assert rows.all() == [("root", 1, 2)]


# -------------------------------------------------------------------- enforcement, fallbacks


def test_enforcement_changes_are_recorded(stub: pb_grpc.PolicyServiceStub) -> None:
    e = stub.GetEnforcement(pb.GetEnforcementRequest()).enforcement
    # A new install: enforced, automated containments only recorded (docs/policy.md).
    assert (e.mode, e.containment_mode) == (pb.MODE_ENFORCE, pb.MODE_MONITOR)
    r = stub.SetEnforcement(
        pb.SetEnforcementRequest(
            scope=pb.MODE_SCOPE_INSTALL, mode=pb.MODE_MONITOR, author="ana", reason="rollout"
        )
    )
    assert r.enforcement.mode == pb.MODE_MONITOR and r.change.from_mode == pb.MODE_ENFORCE
    again = stub.SetEnforcement(
        pb.SetEnforcementRequest(scope=pb.MODE_SCOPE_INSTALL, mode=pb.MODE_MONITOR, author="ana")
    )
    assert not again.HasField("change")
    stub.SetEnforcement(
        pb.SetEnforcementRequest(scope=pb.MODE_SCOPE_CONTAINMENT, mode=pb.MODE_ENFORCE, author="bo")
    )
    changes = stub.ListEnforcementChanges(pb.ListEnforcementChangesRequest()).changes
    assert [(c.author, c.scope, c.to_mode) for c in changes] == [
        ("bo", pb.MODE_SCOPE_CONTAINMENT, pb.MODE_ENFORCE),
        ("ana", pb.MODE_SCOPE_INSTALL, pb.MODE_MONITOR),
    ]
    assert changes[1].reason == "rollout"
    with pytest.raises(grpc.RpcError) as err:
        stub.SetEnforcement(pb.SetEnforcementRequest(mode=pb.MODE_MONITOR))
    assert {f for f, _ in violations(err.value)} == {"scope", "author"}


def test_outage_fallback_most_specific_pattern_wins(stub: pb_grpc.PolicyServiceStub) -> None:
    def tier(tool: str) -> tuple[str, int]:
        f = stub.GetOutageFallback(pb.GetOutageFallbackRequest(tool=tool)).fallbacks[0]
        return f.tool, f.tier

    assert tier("crm/search") == ("*", pb.OUTAGE_TIER_FAIL_CLOSED)
    for pattern, t in (("*", pb.OUTAGE_TIER_CACHED), ("crm/*", pb.OUTAGE_TIER_FAIL_OPEN)):
        stub.SetOutageFallback(pb.SetOutageFallbackRequest(tool=pattern, tier=t, author="ana"))
    assert tier("crm/search") == ("crm/*", pb.OUTAGE_TIER_FAIL_OPEN)
    assert tier("mail/send") == ("*", pb.OUTAGE_TIER_CACHED)
    everything = stub.GetOutageFallback(pb.GetOutageFallbackRequest()).fallbacks
    assert [f.tool for f in everything] == ["*", "crm/*"]
    with pytest.raises(grpc.RpcError) as err:
        stub.SetOutageFallback(pb.SetOutageFallbackRequest(tool="no slash", author="ana"))
    assert {f for f, _ in violations(err.value)} == {"tool", "tier"}


def test_one_connection_carries_more_calls_than_hypercorns_default_limit(
    stub: pb_grpc.PolicyServiceStub,
) -> None:
    # Hypercorn's default closes a connection after 1,000 requests and fails the call in flight.
    for _ in range(1500):
        assert stub.GetEnforcement(pb.GetEnforcementRequest()).enforcement.mode == pb.MODE_ENFORCE


# --------------------------------------------------------------------------------- migrations


def test_migrations_applied_twice_change_nothing(pg: SqlEngine) -> None:
    assert current_revision(pg) is None
    assert migrate(pg) == HEAD

    def shape() -> dict[str, list[tuple[str, str]]]:
        insp = inspect(pg)
        return {
            t: [(c["name"], str(c["type"])) for c in insp.get_columns(t)]
            for t in sorted(insp.get_table_names())
        }

    before = shape()
    assert set(before) == {
        "alembic_version",
        "break_glass_events",
        "bundles",
        "enforcement_changes",
        "outage_fallbacks",
        "policy_tests",
        "publishes",
    }
    assert migrate(pg) == HEAD
    assert shape() == before
    assert "ux_bundles_one_active" in {i["name"] for i in inspect(pg).get_indexes("bundles")}
    with pg.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).all() == [(HEAD,)]


# ------------------------------------------------------------------------------- WatchActive


def next_active(stream: Iterator[pb.WatchActiveResponse]) -> pb.ActiveState:
    for msg in stream:
        if msg.HasField("active"):
            return msg.active
    raise AssertionError("the stream ended")


def test_watch_active_delivers_publish_mode_change_and_heartbeats(
    stub: pb_grpc.PolicyServiceStub,
) -> None:
    stream = stub.WatchActive(pb.WatchActiveRequest())
    first = next(stream)
    assert first.HasField("active") and not first.active.HasField("bundle")
    assert first.active.enforcement.mode == pb.MODE_ENFORCE
    beat = next(stream)  # nothing changes: a heartbeat comes
    assert beat.HasField("heartbeat") and beat.heartbeat.version == 0

    v = draft(stub, PUBLIC_ONLY).version
    stub.Publish(pb.PublishRequest(version=v, author="ana"))
    published = next_active(stream)
    assert published.bundle.version == v and len(published.bundle.signature) == 64
    assert {f.name for f in published.bundle.files} == set(PUBLIC_ONLY)

    stub.SetEnforcement(
        pb.SetEnforcementRequest(scope=pb.MODE_SCOPE_INSTALL, mode=pb.MODE_MONITOR, author="ana")
    )
    changed = next_active(stream)
    assert changed.enforcement.mode == pb.MODE_MONITOR and changed.bundle.version == v
    stream.cancel()


# ---------------------------------------------------------------------------------- dry run

DRY_RUN = r"""
import json, sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
import grpc
from svc import history
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService, bundle_engine
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as pb, policy_pb2_grpc as pb_grpc

tmp, old, new = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
dsn = f"chdb://{tmp / 'chdb'}?database=dry"
client = history.connect(dsn, create_database=True)
history.migrate(client)
engine = bundle_engine(old)
records = []
for i, doc in enumerate(["open"] * 3 + ["closed"] * 2):
    rec = engine.decide({"principal": {"type": "User", "id": "alice"}, "action": "view",
                         "resource": {"type": "Doc", "id": doc}})
    records.append(("d", 0, i, b"User::alice", json.dumps(rec).encode()))
history.store(client, "decisions", records)
settings = PolicySettings(port=0, data_dir=tmp, database_url=f"sqlite:///{tmp / 'p.db'}",
                          history_dsn=dsn)
server = PolicyServer(settings, PolicyService(settings)).start()
stub = pb_grpc.PolicyServiceStub(grpc.insecure_channel(server.target))
v = stub.CreateDraft(pb.CreateDraftRequest(
    files=[pb.BundleFile(name=n, content=t) for n, t in new.items()], author="ana")).bundle.version
req = pb.DryRunRequest(version=v, sample=2)
req.since.FromDatetime(datetime.now(UTC) - timedelta(hours=1))
r = stub.DryRun(req)
print(json.dumps({"decisions": r.decisions, "unchanged": r.unchanged,
                  "allow_to_deny": r.allow_to_deny, "deny_to_allow": r.deny_to_allow,
                  "errors": r.errors, "sample": [[s.qid, s.principal, s.resource, s.recorded,
                  s.draft] for s in r.sample], "qids": [json.loads(x[4])["qid"] for x in records]}))
server.stop()
"""


def test_dry_run_counts_verdict_changes_of_recorded_decisions(tmp_path: Path) -> None:
    # Its own process: chDB opens one directory per process, and other tests hold theirs.
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            DRY_RUN,
            str(tmp_path),
            json.dumps(PUBLIC_ONLY),
            json.dumps(CLOSED_ONLY),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in ("decisions", "unchanged", "allow_to_deny", "deny_to_allow")} == {
        "decisions": 5,
        "unchanged": 0,
        "allow_to_deny": 3,
        "deny_to_allow": 2,
    }
    assert got["errors"] == 0
    assert got["sample"] == [
        [got["qids"][0], "User::alice", "Doc::open", "allow", "deny"],
        [got["qids"][1], "User::alice", "Doc::open", "allow", "deny"],
    ]


# ---------------------------------------------------------------------------------- settings


def test_settings_refuse_what_the_service_cannot_run_safely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from svc.common.auth import AuthConfigError, PolicyAuthSettings

    # Without caller authentication the service binds loopback addresses only.
    wide = PolicySettings(
        host="0.0.0.0", port=0, data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/p.db"
    )
    with pytest.raises(AuthConfigError, match=r"refusing to listen on 0\.0\.0\.0"):
        PolicyServer(wide, auth=PolicyAuthSettings(auth="none")).start()
    assert PolicySettings(host="::1").host == "::1"
    assert PolicySettings.component == "svc-policy"
    assert PolicyAuthSettings().auth_audience == "svc-policy"
    with pytest.raises(ValidationError, match="break-glass key of `ana`"):
        PolicySettings(break_glass_keys={"ana": "bm90IGEga2V5"})
    pub = signing.generate_keypair(tmp_path / "k")
    monkeypatch.setenv(
        "SVC_POLICY_BREAK_GLASS_KEYS", json.dumps({"ana": signing.public_key_text(pub)})
    )
    monkeypatch.setenv("SVC_POLICY_PORT", "9099")
    s = PolicySettings()
    assert s.port == 9099 and list(s.break_glass_keys) == ["ana"]
    assert s.signing_key_path == Path("policy-signing.key")


# ---------------------------------------------------------------------------------- callers


def test_callers_need_a_bearer_token_of_a_listed_caller(tmp_path: Path, pg: SqlEngine) -> None:
    """docs/auth.md: gRPC calls need `authorization: Bearer <JWT>` of a listed caller (the
    answers table); the probes take none."""
    from svc.common.auth import LocalIssuer, PolicyAuthSettings

    issuer = LocalIssuer(tmp_path / "issuer")
    auth = PolicyAuthSettings(
        auth_issuer=issuer.issuer, auth_jwks=issuer.jwks_url, auth_callers=["svc-local"]
    )
    settings = PolicySettings(port=0, data_dir=tmp_path)
    srv = PolicyServer(settings, PolicyService(settings, db=pg), auth=auth).start()
    channel = grpc.insecure_channel(srv.target)
    stub = pb_grpc.PolicyServiceStub(channel)
    try:

        def call(token: str | None) -> grpc.RpcError | pb.GetEnforcementResponse:
            md = [("authorization", f"Bearer {token}")] if token is not None else []
            try:
                return stub.GetEnforcement(pb.GetEnforcementRequest(), metadata=md)
            except grpc.RpcError as e:
                return e

        missing = call(None)
        assert isinstance(missing, grpc.Call)
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "no bearer token" in (missing.details() or "")
        other = call(issuer.mint("svc-local", "svc-pdp", 60))
        assert isinstance(other, grpc.Call)
        assert other.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "does not name `svc-policy`" in (other.details() or "")
        stranger = call(issuer.mint("mallory", "svc-policy", 60))
        assert isinstance(stranger, grpc.Call)
        assert stranger.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "caller `mallory` is not allowed" in (stranger.details() or "")
        ok = call(issuer.mint("svc-local", ["svc-pdp", "svc-policy"], 60))
        assert isinstance(ok, pb.GetEnforcementResponse)
        assert ok.enforcement.mode == pb.MODE_ENFORCE
        # The probes take no token.
        ready = httpx.get(f"{srv.url}/readyz")
        assert ready.status_code == 200 and ready.json()["policy_version"] == 0
        assert httpx.get(f"{srv.url}/version").json()["component"] == "svc-policy"
    finally:
        channel.close()
        srv.stop()
        srv.service.close()
