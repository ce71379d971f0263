"""Policy tests in the policy service (docs/policy.md#policy-tests), over the wire: a real
service on a free 127.0.0.1 port, PostgreSQL behind it (a schema of its own per test), gRPC
clients from grpcio; the dry run's part against a chDB history in a process of its own.

Covered: a saved test decided with its own entity snapshot (the bundle alone decides otherwise)
under drafts that pass and fail it, each failure with expected, got and the deciding policies;
tests isolated from each other's snapshots; a request the bundle cannot decide as an error;
publish refused while a test fails, then allowed when the failure is named, and the accepted
failure recorded with the publish; every bad field of a test named and nothing stored; a name in
use, an unknown name to delete; `saved_by` the verified caller (`<person> via <portal>`), never
the request's; a dry run answering the tests' results beside its counts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sqlalchemy import Engine as SqlEngine

from svc.common.auth import PERSON_HEADER, LocalIssuer, PolicyAuthSettings
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.v1 import policy_pb2_grpc as pb_grpc
from test_policy import pg  # noqa: F401  (a fresh PostgreSQL schema per test, used by name)

SCHEMA = """entity User;
entity Doc = { public: Bool };
action view appliesTo { principal: [User], resource: [Doc] };
"""
ENTITIES = json.dumps([{"uid": {"type": "User", "id": "alice"}, "attrs": {}, "parents": []}])
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
def server(tmp_path: Path, pg: SqlEngine) -> Iterator[PolicyServer]:  # noqa: F811
    settings = PolicySettings(port=0, data_dir=tmp_path)
    srv = PolicyServer(settings, PolicyService(settings, db=pg)).start()
    yield srv
    srv.stop()
    srv.service.close()


@pytest.fixture
def stub(server: PolicyServer) -> Iterator[pb_grpc.PolicyServiceStub]:
    channel = grpc.insecure_channel(server.target)
    yield pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
    channel.close()


def violations(e: grpc.RpcError) -> list[tuple[str, str]]:
    status = rpc_status.from_call(e)  # type: ignore[arg-type]
    assert status is not None
    out = []
    for d in status.details:
        bad = error_details_pb2.BadRequest()
        assert d.Unpack(bad)
        out.extend((v.field, v.description) for v in bad.field_violations)
    return out


def draft(stub: pb_grpc.PolicyServiceStub, files: dict[str, str]) -> int:
    req = pb.CreateDraftRequest(
        files=[pb.BundleFile(name=n, content=t) for n, t in files.items()], author="ana"
    )
    return int(stub.CreateDraft(req).bundle.version)


def struct(value: dict[str, object]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def doc_test(name: str, doc: str, public: bool, expect: str = "allow") -> pb.PolicyTest:
    """A test of alice viewing `doc`, whose snapshot holds `doc` with `public`."""
    return pb.PolicyTest(
        name=name,
        request=pb.TestRequest(
            principal=pb.EntityRef(type="User", id="alice"),
            action="view",
            resource=pb.EntityRef(type="Doc", id=doc),
        ),
        entities=[
            struct({"uid": {"type": "Doc", "id": doc}, "attrs": {"public": public}, "parents": []})
        ],
        expect=expect,
        from_decision="0190b0c0-0000-7000-8000-000000000001",
    )


def results(run: pb.TestRun) -> dict[str, tuple[bool, str, str, list[str]]]:
    return {r.name: (r.passed, r.expected, r.got, list(r.policies)) for r in run.results}


def test_saved_tests_decide_with_their_snapshot_under_any_version(
    stub: pb_grpc.PolicyServiceStub,
) -> None:
    public, closed = draft(stub, PUBLIC_ONLY), draft(stub, CLOSED_ONLY)
    stub.Publish(pb.PublishRequest(version=public, author="ana"))
    # The bundle holds no Doc "report": only the snapshot says it is public.
    saved = stub.SaveTest(
        pb.SaveTestRequest(author="ana", test=doc_test("alice reads the report", "report", True))
    )
    assert saved.test.name == "alice reads the report" and saved.test.saved_by == "ana"
    assert saved.test.from_decision == "0190b0c0-0000-7000-8000-000000000001"
    assert saved.test.HasField("created_at")
    assert (saved.active.passed, saved.active.got, list(saved.active.policies)) == (
        True,
        "allow",
        ["public"],
    )
    # Another test's snapshot holds a Doc of the same id, not public: each test sees its own.
    stub.SaveTest(
        pb.SaveTestRequest(
            author="ana", test=doc_test("draft stays hidden", "report", False, "deny")
        )
    )
    # A request the bundle cannot decide: the schema has no `edit` action.
    odd = doc_test("edits are decided", "report", True)
    odd.request.action = "edit"
    stub.SaveTest(pb.SaveTestRequest(author="ana", test=odd))

    listed = stub.ListTests(pb.ListTestsRequest()).tests
    assert [t.name for t in listed] == [
        "alice reads the report",
        "draft stays hidden",
        "edits are decided",
    ]
    entity = json_format.MessageToDict(listed[0].entities[0])
    assert entity["attrs"] == {"public": True} and entity["uid"]["id"] == "report"

    under_public = stub.RunTests(pb.RunTestsRequest(version=public)).tests
    assert under_public.version == public
    assert (under_public.passed, under_public.failed) == (2, 1)
    got = results(under_public)
    assert got["alice reads the report"] == (True, "allow", "allow", ["public"])
    assert got["draft stays hidden"] == (True, "deny", "deny", [])
    assert got["edits are decided"][:3] == (False, "allow", "error")
    (err,) = [r.error for r in under_public.results if r.name == "edits are decided"]
    assert "edit" in err

    under_closed = stub.RunTests(pb.RunTestsRequest(version=closed)).tests
    got = results(under_closed)
    assert got["alice reads the report"] == (False, "allow", "deny", [])
    assert got["draft stays hidden"] == (False, "deny", "allow", ["closed"])
    # 0 is the active version.
    assert stub.RunTests(pb.RunTestsRequest()).tests.version == public

    stub.DeleteTest(pb.DeleteTestRequest(author="ana", name="edits are decided"))
    assert [t.name for t in stub.ListTests(pb.ListTestsRequest()).tests] == [
        "alice reads the report",
        "draft stays hidden",
    ]
    with pytest.raises(grpc.RpcError) as e:
        stub.DeleteTest(pb.DeleteTestRequest(author="ana", name="edits are decided"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as e:
        stub.RunTests(pb.RunTestsRequest(version=999))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_publish_refuses_failing_tests_unless_accepted_and_records_them(
    stub: pb_grpc.PolicyServiceStub, server: PolicyServer
) -> None:
    public, closed = draft(stub, PUBLIC_ONLY), draft(stub, CLOSED_ONLY)
    first = stub.Publish(pb.PublishRequest(version=public, author="ana"))
    assert first.tests.version == public and not first.tests.results  # no tests yet
    stub.SaveTest(
        pb.SaveTestRequest(author="ana", test=doc_test("alice reads the report", "report", True))
    )
    stub.SaveTest(
        pb.SaveTestRequest(author="ana", test=doc_test("secrets stay hidden", "s", False, "deny"))
    )

    with pytest.raises(grpc.RpcError) as e:
        stub.Publish(pb.PublishRequest(version=closed, author="ana"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    details = e.value.details()  # type: ignore[attr-defined]
    assert "2 policy tests fail under version" in details and "accept_failing_tests" in details
    assert violations(e.value) == [
        ("tests[alice reads the report]", "expected allow, got deny"),
        ("tests[secrets stay hidden]", "expected deny, got allow (by closed)"),
    ]
    assert stub.GetActive(pb.GetActiveRequest()).bundle.version == public  # nothing changed

    # Accepting one of two is not enough; the refusal names the other only.
    with pytest.raises(grpc.RpcError) as e:
        stub.Publish(
            pb.PublishRequest(
                version=closed, author="ana", accept_failing_tests=["alice reads the report"]
            )
        )
    assert [f for f, _ in violations(e.value)] == ["tests[secrets stay hidden]"]

    out = stub.Publish(
        pb.PublishRequest(
            version=closed,
            author="ana",
            accept_failing_tests=["alice reads the report", "secrets stay hidden", "unknown"],
        )
    )
    assert out.bundle.version == closed and out.bundle.state == pb.BUNDLE_STATE_ACTIVE
    assert (out.tests.passed, out.tests.failed) == (0, 2)
    (record, before) = server.service.publishes()
    assert (record["version"], record["author"], record["tests_run"]) == (closed, "ana", 2)
    assert record["accepted_failures"] == [
        {"name": "alice reads the report", "expected": "allow", "got": "deny"},
        {"name": "secrets stay hidden", "expected": "deny", "got": "allow"},
    ]
    assert (before["version"], before["tests_run"], before["accepted_failures"]) == (public, 0, [])
    # Back to a version its tests pass under: no acceptance needed.
    again = stub.Publish(pb.PublishRequest(version=public, author="ana"))
    assert again.tests.failed == 0 and again.tests.passed == 2


def test_bad_tests_are_refused_naming_every_field_and_nothing_is_stored(
    stub: pb_grpc.PolicyServiceStub,
) -> None:
    bad = pb.PolicyTest(
        name="bell\x07",
        request=pb.TestRequest(
            principal=pb.EntityRef(type="", id="alice"),
            action="",
            resource=pb.EntityRef(type="Doc", id="x" * 300),
        ),
        entities=[
            struct({"uid": {"type": "Doc", "id": "a"}, "attrs": [], "parents": []}),
            struct({"uid": {"type": "Doc", "id": "a"}}),
            struct({"uid": "Doc::b", "size": 3}),
        ],
        expect="maybe",
        risk_scores=[pb.TestRiskScore(principal=pb.EntityRef(type="User", id="a"), score=101)],
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.SaveTest(pb.SaveTestRequest(author="ana", test=bad))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    fields = dict(violations(e.value))
    assert "control character U+0007" in fields["name"]
    assert fields["request.principal.type"] == "must not be empty"
    assert fields["request.action"] == "must not be empty"
    assert fields["request.resource.id"] == "300 characters, more than 256"
    assert fields["entities[0].attrs"] == "expected an object"
    assert fields["entities[1].uid"] == "this entity appears twice"
    assert fields["entities[2]"] == "unknown fields: size"
    assert fields["entities[2].uid"] == "expected {type, id}"
    assert fields["expect"] == "`maybe`: expected allow, deny or challenge"
    assert fields["risk_scores[0].score"] == "expected a whole number 0 to 100"
    assert not stub.ListTests(pb.ListTestsRequest()).tests

    stub.SaveTest(pb.SaveTestRequest(author="ana", test=doc_test("once", "r", True)))
    with pytest.raises(grpc.RpcError) as e:
        stub.SaveTest(
            pb.SaveTestRequest(author="ana", test=doc_test("once", "other", False, "deny"))
        )
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert [f for f, _ in violations(e.value)] == ["name"]
    (kept,) = stub.ListTests(pb.ListTestsRequest()).tests
    assert kept.expect == "allow" and kept.request.resource.id == "r"
    # Before anything is published a test is saved, with no result yet.
    assert not stub.SaveTest(
        pb.SaveTestRequest(author="ana", test=doc_test("twice", "r", True))
    ).HasField("active")


def test_saved_by_is_the_verified_caller_and_the_portals_person(
    tmp_path: Path,
    pg: SqlEngine,  # noqa: F811
) -> None:
    issuer = LocalIssuer(tmp_path / "issuer")
    auth = PolicyAuthSettings(
        auth_issuer=issuer.issuer,
        auth_jwks=issuer.jwks_url,
        auth_roles={"ops": "operator", "svc-portal": "portal"},
    )
    settings = PolicySettings(port=0, data_dir=tmp_path)
    srv = PolicyServer(settings, PolicyService(settings, db=pg), auth=auth).start()
    channel = grpc.insecure_channel(srv.target)
    stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
    try:
        portal = [("authorization", f"Bearer {issuer.mint('svc-portal', 'svc-policy', 60)}")]
        saved = stub.SaveTest(
            pb.SaveTestRequest(author="ana", test=doc_test("mine", "r", True)),
            metadata=[*portal, (PERSON_HEADER, "ana")],
        )
        assert saved.test.saved_by == "ana via svc-portal"
        ops = [("authorization", f"Bearer {issuer.mint('ops', 'svc-policy', 60)}")]
        other = pb.SaveTestRequest(author="mallory", test=doc_test("theirs", "r", True))
        assert stub.SaveTest(other, metadata=ops).test.saved_by == "ops"
        with pytest.raises(grpc.RpcError) as e:
            stub.ListTests(pb.ListTestsRequest())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        channel.close()
        srv.stop()
        srv.service.close()


DRY_RUN = r"""
import json, sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
import grpc
from google.protobuf import json_format, struct_pb2
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
engine.upsert_entities([{"uid": {"type": "Doc", "id": "open"}, "attrs": {"public": True},
                         "parents": []}])
rec = engine.decide({"principal": {"type": "User", "id": "alice"}, "action": "view",
                     "resource": {"type": "Doc", "id": "open"}})
history.store(client, "decisions", [("d", 0, 0, b"User::alice", json.dumps(rec).encode())])
settings = PolicySettings(port=0, data_dir=tmp, database_url=f"sqlite:///{tmp / 'p.db'}",
                          history_dsn=dsn)
server = PolicyServer(settings, PolicyService(settings)).start()
stub = pb_grpc.PolicyServiceStub(grpc.insecure_channel(server.target))
files = lambda fs: [pb.BundleFile(name=n, content=t) for n, t in fs.items()]
v1 = stub.CreateDraft(pb.CreateDraftRequest(files=files(old), author="ana")).bundle.version
stub.Publish(pb.PublishRequest(version=v1, author="ana"))
entity = struct_pb2.Struct()
entity.update({"uid": {"type": "Doc", "id": "open"}, "attrs": {"public": True}, "parents": []})
stub.SaveTest(pb.SaveTestRequest(author="ana", test=pb.PolicyTest(
    name="open stays open", expect="allow", from_decision=rec["qid"], entities=[entity],
    request=pb.TestRequest(principal=pb.EntityRef(type="User", id="alice"), action="view",
                           resource=pb.EntityRef(type="Doc", id="open")))))
v2 = stub.CreateDraft(pb.CreateDraftRequest(files=files(new), author="ana")).bundle.version
req = pb.DryRunRequest(version=v2, sample=5)
req.since.FromDatetime(datetime.now(UTC) - timedelta(hours=1))
r = stub.DryRun(req)
print(json.dumps({"allow_to_deny": r.allow_to_deny, "tests": [r.tests.version, r.tests.passed,
                  r.tests.failed, [[t.name, t.passed, t.expected, t.got] for t in r.tests.results]],
                  "v2": v2}))
server.stop()
"""


def test_a_dry_run_answers_the_tests_results(tmp_path: Path) -> None:
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
    assert got["allow_to_deny"] == 1
    assert got["tests"] == [got["v2"], 0, 1, [["open stays open", False, "allow", "deny"]]]
