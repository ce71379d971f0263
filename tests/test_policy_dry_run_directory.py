"""Dry runs decide with the directory, as the decision point does (docs/policy.md#dry-runs).

Real parts: a context service (``svc.context`` on a PostgreSQL schema of its own, served by
uvicorn, people and groups provisioned over SCIM, resources over ``/v1/resources``, an AI
agent acting for a person over ``/v1/service-accounts``), the
history in chDB (the session's directory, ``chdb_root``, a database of this module's own), and
the policy service over gRPC on PostgreSQL. The recorded checks are decided by the decision core
with the directory's records, as a decision point following the context service holds them;
then drafts are dry-run against them:

* a draft that leaves the group-based policies alone shows no change for the people whose access
  comes from their groups (the same draft decided with the bundle's entities alone, as dry runs
  did before, flips every one of them: the defect this fixes);
* a draft that drops a group's permit, and reads a resource attribute the context service holds,
  changes exactly those checks;
* without a context service, or with one that does not answer, the dry run still answers, with
  the bundle's entities, and says so;
* saved policy tests keep deciding with their own snapshot.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine as SqlEngine
from sqlalchemy import create_engine, text

from svc import history
from svc.policy.app import PolicyServer
from svc.policy.directory import DirectoryClient, bundle_uids
from svc.policy.service import PolicyService, bundle_engine
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.v1 import policy_pb2_grpc as pb_grpc
from test_context import Live, create_group, create_user

SCHEMA = """
entity Group in [Group];
entity Human in [Group] = {
  active: Bool,
  department: String,
  title: String,
  manager?: Human,
};
entity ServiceAccount in [Group] = {
  owner: Human,
  ai: Bool,
  registered: Bool,
  app: String,
  description?: String,
};
entity Document = { classification?: String };
entity PortalArea;
entity Tool;
action read appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
action view, administer appliesTo { principal: [Human, ServiceAccount], resource: [PortalArea] };
action call appliesTo { principal: [Human, ServiceAccount], resource: [Tool] };
"""

INACTIVE = """@id("inactive-people-denied")
forbid (principal is Human, action, resource) unless { principal.active };
"""
SECURITY = """@id("security-team-administers")
permit (principal in Group::"security-team", action in [Action::"view", Action::"administer"],
        resource is PortalArea);
"""
AUDITORS = """@id("auditors-view")
permit (principal in Group::"auditors", action == Action::"view", resource is PortalArea);
"""
PUBLIC_DOCS = """@id("public-documents")
permit (principal is Human, action == Action::"read", resource is Document)
when { resource has classification && resource.classification == "public" };
"""
INTERNAL_DOCS = """@id("internal-documents")
permit (principal is Human, action == Action::"read", resource is Document)
when { resource has classification && resource.classification == "internal" };
"""
AGENTS = """@id("ai-agents-read-documents")
permit (principal is ServiceAccount, action == Action::"read", resource is Document)
when { principal.ai };
"""
TOOLS = """@id("people-call-tools")
permit (principal is Human, action == Action::"call", resource is Tool);
"""


def bundle(*policies: str) -> dict[str, str]:
    """A bundle of the schema and `policies` (its own entities: the portal's areas)."""
    areas = [{"uid": {"type": "PortalArea", "id": a}, "attrs": {}, "parents": []} for a in AREAS]
    return {
        "schema.cedarschema": SCHEMA,
        "entities.json": json.dumps(areas),
        "policies.cedar": "\n".join(policies),
    }


AREAS = ("policies", "decisions")
ACTIVE = bundle(INACTIVE, SECURITY, AUDITORS, PUBLIC_DOCS, AGENTS)
#: People provisioned: user name -> groups; `gus` is deactivated.
PEOPLE = {"ana": ["security-team"], "bo": ["auditors"], "cy": [], "gus": ["security-team"]}
DOCS = {"memo": "public", "plan": "internal", "vault": "secret"}
#: A registered AI agent acting for ana (a service account of the directory).
AGENT = "copilot.ana"


def _checks() -> list[dict[str, Any]]:
    """Every person x (view, administer) x area, and every person reading every document."""
    out = []
    for person in PEOPLE:
        p = {"type": "Human", "id": person}
        for action in ("view", "administer"):
            for area in AREAS:
                out.append(
                    {
                        "principal": p,
                        "action": action,
                        "resource": {"type": "PortalArea", "id": area},
                    }
                )
        for doc in DOCS:
            r = {"type": "Document", "id": doc}
            out.append({"principal": p, "action": "read", "resource": r})
    for doc in DOCS:
        out.append(
            {
                "principal": {"type": "ServiceAccount", "id": AGENT},
                "action": "read",
                "resource": {"type": "Document", "id": doc},
                "on_behalf_of": {"type": "Human", "id": "ana"},
            }
        )
    return out


class World:
    """The context service, the recorded checks in chDB, and a policy service over gRPC."""

    def __init__(self, live: Live, dsn: str, pg: SqlEngine, tmp: Path) -> None:
        self.live = live
        self.dsn = dsn
        self.pg = pg
        self.tmp = tmp
        self.recorded: dict[tuple[str, str, str], str] = {}

    def record(self) -> None:
        """Decides every check as a decision point following the context service would, and
        stores the decisions in the history (what dry runs read)."""
        engine = bundle_engine(ACTIVE)
        snap = self.live.http.get("/v1/principals").json()
        engine.upsert_entities(
            [p["value"] for p in snap["principals"] if p["kind"] in ("Human", "Group")]
        )
        engine.register_service_accounts(
            [p["value"] for p in snap["principals"] if p["kind"] == "ServiceAccount"]
        )
        refs = [{"type": "Document", "id": d} for d in DOCS]
        engine.upsert_entities(
            self.live.http.post("/v1/resources/get", json={"resources": refs}).json()["resources"]
        )
        client = history.connect(self.dsn, create_database=True)
        history.migrate(client)
        rows = []
        for i, check in enumerate(_checks()):
            rec = engine.decide(check)
            key = (check["principal"]["id"], check["action"], check["resource"]["id"])
            self.recorded[key] = rec["verdict"]
            who = f"{check['principal']['type']}::{key[0]}"
            rows.append(("d", 0, i, who.encode(), json.dumps(rec).encode()))
        history.store(client, "decisions", rows)

    def server(self, context_url: str | None) -> PolicyServer:
        settings = PolicySettings(
            port=0, data_dir=self.tmp, history_dsn=self.dsn, context_url=context_url
        )
        return PolicyServer(settings, PolicyService(settings, db=self.pg)).start()


def dry_run(
    stub: pb_grpc.PolicyServiceStub, files: dict[str, str], sample: int = 1000
) -> pb.DryRunResponse:
    """Drafts `files` and dry-runs the draft over the last hour."""
    v = stub.CreateDraft(
        pb.CreateDraftRequest(
            files=[pb.BundleFile(name=n, content=t) for n, t in files.items()], author="ana"
        )
    ).bundle.version
    req = pb.DryRunRequest(version=v, sample=sample)
    req.since.FromDatetime(datetime.now(UTC) - timedelta(hours=1))
    r: pb.DryRunResponse = stub.DryRun(req, timeout=120)
    return r


def changes(r: pb.DryRunResponse) -> set[tuple[str, str, str, str, str]]:
    """The sample as (principal, action, resource, recorded, draft)."""
    return {(s.principal, s.action, s.resource, s.recorded, s.draft) for s in r.sample}


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, chdb_root: str
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("dryrun")
    schemas = [f"dryrun_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    admin = create_engine(postgres_url)
    with admin.begin() as c:
        for s in schemas:
            c.execute(text(f'CREATE SCHEMA "{s}"'))
    from sqlalchemy.engine import make_url

    ctx_url = (
        make_url(postgres_url)
        .update_query_dict({"options": f"-csearch_path={schemas[0]}"})
        .render_as_string(hide_password=False)
    )
    pg = create_engine(
        postgres_url, connect_args={"options": f"-csearch_path={schemas[1]}"}, pool_pre_ping=True
    )
    live = Live(ctx_url)
    try:
        ids = {name: create_user(live, name, title="t")["id"] for name in PEOPLE}
        for group in ("security-team", "auditors"):
            create_group(live, group, [ids[p] for p, gs in PEOPLE.items() if group in gs])
        r = live.scim.patch(
            f"/Users/{ids['gus']}",
            json={
                "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
                "Operations": [{"op": "replace", "path": "active", "value": False}],
            },
        )
        assert r.status_code in (200, 204), r.text
        docs = [
            {"type": "Document", "id": d, "attrs": {"classification": c}} for d, c in DOCS.items()
        ]
        r = live.http.post("/v1/resources", json={"resources": docs})
        assert r.status_code == 200, r.text
        agent = {"id": AGENT, "owner": "ana", "ai": True}
        r = live.http.post("/v1/service-accounts", json={"service_accounts": [agent]})
        assert r.status_code == 200, r.text
        w = World(live, f"{chdb_root}?database=dryrun_{uuid.uuid4().hex[:8]}", pg, tmp)
        w.record()
        yield w
    finally:
        live.stop()
        pg.dispose()
        with admin.begin() as c:
            for s in schemas:
                c.execute(text(f'DROP SCHEMA "{s}" CASCADE'))
        admin.dispose()


@pytest.fixture
def stub(world: World) -> Iterator[pb_grpc.PolicyServiceStub]:
    srv = world.server(world.live.url)
    with grpc.insecure_channel(srv.target) as channel:
        yield pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
    srv.stop()
    srv.service.close()


def test_the_recorded_checks_came_from_the_directory(world: World) -> None:
    """What the decision point decided: groups, the deactivated person, the documents."""
    got = world.recorded
    assert got[("ana", "administer", "policies")] == "allow"  # security-team
    assert got[("bo", "view", "decisions")] == "allow"  # auditors
    assert got[("bo", "administer", "policies")] == "deny"
    assert got[("cy", "view", "policies")] == "deny"  # no group
    assert got[("gus", "view", "policies")] == "deny"  # security-team, but deactivated
    assert got[("cy", "read", "memo")] == "allow"  # public, by the context service's record
    assert got[("cy", "read", "plan")] == "deny"
    assert got[(AGENT, "read", "memo")] == "allow"  # registered, ai; ana may read it
    assert got[(AGENT, "read", "plan")] == "deny"  # ana may not: both are checked


def test_a_draft_leaving_group_policies_alone_changes_nothing(
    world: World, stub: pb_grpc.PolicyServiceStub
) -> None:
    r = dry_run(stub, bundle(INACTIVE, SECURITY, AUDITORS, PUBLIC_DOCS, AGENTS, TOOLS))
    assert r.entities == "directory"
    assert r.directory_version > 0
    assert list(r.notes) == []
    assert r.decisions == len(world.recorded)
    assert r.unchanged == r.decisions
    assert r.allow_to_deny == r.deny_to_allow == r.errors == 0
    assert list(r.sample) == []


def test_the_same_draft_with_the_bundle_alone_flips_every_group_grant(world: World) -> None:
    """The defect: without the directory, access from groups, documents' attributes and agents'
    registrations is lost."""
    srv = world.server(None)
    try:
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
            r = dry_run(stub, bundle(INACTIVE, SECURITY, AUDITORS, PUBLIC_DOCS, AGENTS, TOOLS))
    finally:
        srv.stop()
        srv.service.close()
    assert r.entities == "bundle"
    assert any("no context service is configured" in n for n in r.notes)
    allowed = sum(1 for v in world.recorded.values() if v == "allow")
    assert allowed > 0
    # Without `active`, groups and the documents' classification, every recorded allow flips.
    assert r.allow_to_deny == allowed
    assert r.deny_to_allow == r.errors == 0


def test_a_draft_changing_group_and_resource_policies_shows_exactly_those(
    world: World, stub: pb_grpc.PolicyServiceStub
) -> None:
    # Drops the auditors' permit; adds internal documents (read from the context service).
    r = dry_run(stub, bundle(INACTIVE, SECURITY, PUBLIC_DOCS, INTERNAL_DOCS, AGENTS))
    assert r.entities == "directory"
    expected = {("Human::bo", "view", f"PortalArea::{area}", "allow", "deny") for area in AREAS}
    expected |= {
        (f"Human::{p}", "read", "Document::plan", "deny", "allow") for p in ("ana", "bo", "cy")
    }
    # The agent reads it for ana, who now may.
    expected.add((f"ServiceAccount::{AGENT}", "read", "Document::plan", "deny", "allow"))
    assert changes(r) == expected
    assert r.allow_to_deny == 2
    assert r.deny_to_allow == 4  # not gus: deactivated people stay denied
    assert r.unchanged == r.decisions - 6


def test_a_context_service_that_does_not_answer_leaves_the_bundle_and_a_note(
    world: World,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    srv = world.server(f"http://127.0.0.1:{port}")
    try:
        with grpc.insecure_channel(srv.target) as channel:
            stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
            r = dry_run(stub, ACTIVE)
    finally:
        srv.stop()
        srv.service.close()
    assert r.entities == "bundle"
    assert r.directory_version == 0
    assert r.decisions == len(world.recorded)
    (note,) = r.notes
    assert note.startswith("the context service did not answer (GET /v1/principals: ")


def test_resources_past_the_bound_are_named_in_a_note(world: World) -> None:
    settings = PolicySettings(
        port=0,
        data_dir=world.tmp,
        history_dsn=world.dsn,
        context_url=world.live.url,
        dry_run_max_resources=1,
    )
    service = PolicyService(settings, db=world.pg)
    try:
        v = service.create_draft(ACTIVE, "ana").version
        r = service.dry_run(v, datetime.now(UTC) - timedelta(hours=1))
    finally:
        service.close()
    assert r.entities == "directory"
    assert r.notes == [
        "the records name 3 resources: the first 1 were read from the context service, "
        "the rest decided without their records"
    ]
    # memo (first seen) was read: its reads are unchanged; nothing else allowed them anyway.
    assert r.allow_to_deny == 0


def test_saved_policy_tests_keep_their_own_snapshot(
    world: World, stub: pb_grpc.PolicyServiceStub
) -> None:
    """cy is in no group in the directory; the test's snapshot puts cy in security-team."""
    cy = {
        "uid": {"type": "Human", "id": "cy"},
        "attrs": {"active": True, "department": "", "title": "t"},
        "parents": [{"type": "Group", "id": "security-team"}],
    }
    from google.protobuf import struct_pb2

    entity = struct_pb2.Struct()
    entity.update(cy)
    name = f"cy-administers-{uuid.uuid4().hex[:6]}"
    stub.SaveTest(
        pb.SaveTestRequest(
            test=pb.PolicyTest(
                name=name,
                request=pb.TestRequest(
                    principal=pb.EntityRef(type="Human", id="cy"),
                    action="administer",
                    resource=pb.EntityRef(type="PortalArea", id="policies"),
                ),
                entities=[entity],
                expect="allow",
            ),
            author="ana",
        )
    )
    try:
        r = dry_run(stub, ACTIVE)
        assert r.entities == "directory"
        (result,) = [t for t in r.tests.results if t.name == name]
        assert result.passed, result
        # The directory's cy, in no group, is still denied in the recorded checks.
        assert world.recorded[("cy", "administer", "policies")] == "deny"
        assert r.unchanged == r.decisions
    finally:
        stub.DeleteTest(pb.DeleteTestRequest(name=name, author="ana"))


def test_bundle_uids_reads_both_entity_forms() -> None:
    assert bundle_uids(ACTIVE) == {("PortalArea", "policies"), ("PortalArea", "decisions")}
    as_map = {"entities.json": json.dumps({"areas": {'PortalArea::"x"': {"euid": "x"}}})}
    assert bundle_uids(as_map) == {("PortalArea", "x")}
    assert bundle_uids({}) == set()


def test_the_client_reads_resources_in_batches(world: World) -> None:
    client = DirectoryClient(world.live.url)
    try:
        refs = [{"type": "Document", "id": d} for d in DOCS] + [
            {"type": "Document", "id": f"none-{i}"} for i in range(1200)
        ]
        found = client.resources(refs)
    finally:
        client.close()
    assert sorted(f["uid"]["id"] for f in found) == sorted(DOCS)
