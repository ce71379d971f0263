"""The reasoner against the real parts (docs/reasoner.md): a labelled month in chDB, the context
service and the challenge service on PostgreSQL, the policy service for the containment mode, a
real decision point following the containment list, and a stub chat-completions server.

chDB hosts one engine per process on one directory: these tests reuse the directory an earlier
module of the run opened (tests/test_history.py), else open their own; each test gets a
database of its own.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest
import uvicorn
from clickhouse_connect.driver.client import Client
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from svc import history
from svc.challenge.app import ChallengeServer
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeSettings
from svc.challenge.v1 import challenge_pb2 as cpb
from svc.challenge.v1 import challenge_pb2_grpc as cpb_grpc
from svc.cli import app as cli_app
from svc.common.net import tcp_listener
from svc.demo import month as months
from svc.history import rollups
from svc.pdp import Engine, Server
from svc.pdp.containment_follower import follow_containments
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.reasoner.app import create_app
from svc.reasoner.clients import ChallengeClient, ContextClient, PolicyClient, Unavailable
from svc.reasoner.lease import PostgresLease
from svc.reasoner.scoring import peers_from_snapshot, score_window
from svc.reasoner.service import ReasonerService
from svc.reasoner.settings import ReasonerSettings
from svc.reasoner.summary import EVIDENCE_FIELDS
from test_context import Live

TODAY = datetime.now(UTC).date()
END = TODAY - timedelta(days=1)  # the month ends yesterday; cycles run now
CONTAINED_STORIES = {"after_hours_leaver", "exporter", "agent_misuse", "sa_exporter"}
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"


# -- the parts -------------------------------------------------------------------------------


def schema_url(postgres_url: str, prefix: str) -> Iterator[str]:
    url = make_url(postgres_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
        hide_password=False
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def new_history(chdb_root: str) -> tuple[str, Client]:
    dsn = f"{chdb_root}?database=rs_{uuid.uuid4().hex[:12]}"
    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    return dsn, client


@pytest.fixture(scope="module")
def the_month() -> months.Month:
    return months.month(people=48, departments=4, agents=6, end=END, seed=11)


@pytest.fixture(scope="module")
def shared_history(chdb_root: str, the_month: months.Month) -> tuple[str, Client]:
    """One month stored once, read by the tests that add nothing to it."""
    dsn, client = new_history(chdb_root)
    months.fill(client, the_month)
    return dsn, client


@pytest.fixture
def context(postgres_url: str, the_month: months.Month) -> Iterator[Live]:
    """A live context service holding the month's people (with departments) and agents."""
    for url in schema_url(postgres_url, "rctx"):
        live = Live(url)
        try:
            for a in the_month.people():
                doc = {
                    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User", ENTERPRISE],
                    "userName": a.id,
                    "active": True,
                    ENTERPRISE: {"department": a.group},
                }
                r = live.scim.post("/Users", json=doc)
                assert r.status_code == 201, r.text
            accounts = [
                {"id": a.id, "owner": the_month.people()[0].id, "ai": a.group != "etl"}
                for a in the_month.accounts()
            ]
            live.http.post("/v1/service-accounts", json={"service_accounts": accounts})
            yield live
        finally:
            live.stop()


@pytest.fixture
def challenge(postgres_url: str) -> Iterator[ChallengeServer]:
    for url in schema_url(postgres_url, "rchal"):
        service = ChallengeService(ChallengeSettings(database_url=url, port=0, heartbeat_secs=0.2))
        srv = ChallengeServer(service.settings, service, outbox=False).start()
        try:
            yield srv
        finally:
            srv.stop()
            service.close()


@pytest.fixture
def policy(postgres_url: str, tmp_path: Path) -> Iterator[PolicyServer]:
    for url in schema_url(postgres_url, "rpol"):
        settings = PolicySettings(port=0, data_dir=tmp_path, database_url=url)
        srv = PolicyServer(settings, PolicyService(settings)).start()
        try:
            # An install whose admin switched automated containments to enforce (a new one
            # starts in monitor); the monitor tests switch it back.
            set_containment_mode(srv, "enforce")
            yield srv
        finally:
            srv.stop()
            srv.service.close()


def set_containment_mode(policy: PolicyServer, mode: str) -> None:
    from svc.policy.v1 import policy_pb2 as pb
    from svc.policy.v1 import policy_pb2_grpc as pb_grpc

    with grpc.insecure_channel(policy.target) as ch:
        pb_grpc.PolicyServiceStub(ch).SetEnforcement(
            pb.SetEnforcementRequest(
                scope=pb.MODE_SCOPE_CONTAINMENT,
                mode=pb.MODE_MONITOR if mode == "monitor" else pb.MODE_ENFORCE,
                author="ana",
                reason="test",
            ),
            timeout=30,
        )


def reasoner(
    client: Client,
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
    **settings: Any,
) -> ReasonerService:
    s = ReasonerSettings(
        context_url=context.url, challenge_url=challenge.url, policy_url=policy.url, **settings
    )
    return ReasonerService(
        s,
        client,
        ContextClient(s.context_url),
        ChallengeClient(s.challenge_url),
        PolicyClient(s.policy_url),
    )


def stories(m: months.Month, label: str | None = None) -> dict[tuple[str, str], str]:
    return {s.principal: s.name for s in m.stories if label is None or s.label == label}


def contained_now(challenge: ChallengeServer) -> dict[tuple[str, str], str]:
    return {k: c.author for k, c in ChallengeClient(challenge.url).containments().items()}


def investigations(context: Live, **params: str) -> list[dict[str, Any]]:
    return list(context.http.get("/v1/investigations", params=params).json()["investigations"])


# -- containment in enforce and monitor mode -----------------------------------------------------


SCHEMA = """
entity Human; entity ServiceAccount; entity Document;
action view appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
"""


def test_enforce_contains_the_stories_and_the_decision_point_denies_them(
    shared_history: tuple[str, Client],
    the_month: months.Month,
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    dsn, client = shared_history
    engine = Engine('@id("all") permit (principal, action, resource);', SCHEMA)
    pdp = Server(engine, port=0, workers=1)
    pdp.start()
    pdp.set_ready(bundle=True)
    follower = follow_containments(engine, pdp, challenge.url)
    try:
        # One cycle through the command line, as an operator runs it.
        run = CliRunner().invoke(
            cli_app,
            [
                "reasoner",
                "cycle",
                "--history-dsn",
                dsn,
                "--context-url",
                context.url,
                "--challenge-url",
                challenge.url,
                "--policy-url",
                policy.url,
            ],
        )
        assert run.exit_code == 0, run.output
        out = json.loads(run.output.strip().splitlines()[-1])
        assert {"scores", "contained", "would_contain", "investigations"} <= set(out)
        assert out["mode"] == "enforce" and out["would_contain"] == []
        got = {(c["principal"]["type"], c["principal"]["id"]) for c in out["contained"]}
        want = stories(the_month, months.CONTAIN)
        assert got == set(want), (got, want)
        # Every decision point denies them now; the others still pass.
        follower.wait_for(lambda st: set(want) <= st.contained)
        http = httpx.Client(base_url=f"http://127.0.0.1:{pdp.port}", timeout=30)
        for (t, i), name in want.items():
            r = http.post(
                "/v1/access/evaluation",
                json={
                    "principal": {"type": t, "id": i},
                    "action": "view",
                    "resource": {"type": "Document", "id": "d"},
                },
            ).json()
            assert r["verdict"] == "deny" and "svc:contained" in r["policies"], name
        normal = the_month.people()[20].id
        r = http.post(
            "/v1/access/evaluation",
            json={
                "principal": {"type": "Human", "id": normal},
                "action": "view",
                "resource": {"type": "Document", "id": "d"},
            },
        ).json()
        assert r["verdict"] == "allow"
        http.close()
        assert set(contained_now(challenge).values()) == {"svc-reasoner"}
        # Scores and factors are in the context service.
        risk = {
            (s["principal"]["type"], s["principal"]["id"]): s
            for s in context.http.get("/v1/risk").json()["scores"]
        }
        for p in want:
            assert risk[p]["score"] >= 50 and risk[p]["factors"][0]["name"] == "moved_out"
            f = risk[p]["factors"][0]
            assert {"observed", "baseline", "contribution"} <= set(f)
        decoys = stories(the_month, months.DECOY)
        assert all(risk[p]["score"] < 70 for p in decoys if p in risk)
        # Investigations hold the evidence and a deterministic summary.
        invs = investigations(context, kind="contain")
        assert {tuple(i["evidence"]["principal"].values()) for i in invs} == set(want)
        for inv in invs:
            ev = inv["evidence"]
            assert ev["samples"]["events"] and ev["gate"]["passed"] and ev["window"]
            assert inv["summary_by"] == "deterministic" and "contained" in inv["summary"]
        flagged = {
            tuple(i["evidence"]["principal"].values())
            for i in investigations(context, kind="score")
        }
        assert set(stories(the_month, months.FLAG)) <= flagged

        # Again: nothing new, nothing twice.
        again = reasoner(client, context, challenge, policy).run_cycle()
        assert again.contained == [] and again.investigations == [] and again.published == 0
    finally:
        follower.stop()
        pdp.stop()


def test_monitor_records_would_contain_and_contains_nobody(
    shared_history: tuple[str, Client],
    the_month: months.Month,
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    set_containment_mode(policy, "monitor")
    r = reasoner(shared_history[1], context, challenge, policy)
    first = r.run_cycle()
    assert first.mode == "monitor" and first.contained == []
    want = stories(the_month, months.CONTAIN)
    assert {(w["principal"]["type"], w["principal"]["id"]) for w in first.would_contain} == set(
        want
    )
    assert contained_now(challenge) == {}
    invs = investigations(context, kind="would_contain")
    assert len(invs) == len(want)
    assert all("would have been contained" in i["summary"] for i in invs)
    assert r.run_cycle().would_contain == []  # recorded once while open


def test_the_daily_cap_holds_the_rest_as_would_contain(
    shared_history: tuple[str, Client],
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    r = reasoner(shared_history[1], context, challenge, policy, max_containments_per_day=2)
    out = r.run_cycle()
    assert len(out.contained) == 2 and len(out.would_contain) == 2
    assert all(w["capped"] for w in out.would_contain)
    assert len(contained_now(challenge)) == 2
    again = r.run_cycle()  # the cap is spent for today; the rest is recorded once
    assert again.contained == [] and again.would_contain == [] and again.investigations == []
    assert len(investigations(context, kind="would_contain")) == 2
    # Tomorrow the cap is free again, but their evidence is then older than the gate's days:
    # they stay with their would-contain investigations, for a person to act on.
    tomorrow = r.run_cycle(datetime.now(UTC) + timedelta(days=1))
    assert tomorrow.contained == [] and len(contained_now(challenge)) == 2


def test_a_lifted_person_is_contained_again_only_on_new_evidence(
    chdb_root: str,
    the_month: months.Month,
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    _, client = new_history(chdb_root)
    months.fill(client, the_month)
    r = reasoner(client, context, challenge, policy)
    first = r.run_cycle()
    leaver = next(s.principal for s in the_month.stories if s.name == "exporter")
    assert leaver in {(c["principal"]["type"], c["principal"]["id"]) for c in first.contained}
    with grpc.insecure_channel(challenge.target) as ch:
        cpb_grpc.ChallengeServiceStub(ch).Lift(
            cpb.LiftRequest(
                principal=cpb.EntityRef(type=leaver[0], id=leaver[1]), reason="ok", author="ana"
            ),
            timeout=30,
        )
    second = r.run_cycle()
    assert second.lifted == [{"type": leaver[0], "id": leaver[1]}]
    assert second.contained == [] and leaver not in contained_now(challenge)
    third = r.run_cycle()
    assert third.contained == [] and third.lifted == []
    # New evidence after the lift: the same person exports again, today.
    later = datetime.now(UTC) + timedelta(seconds=5)
    evs = [
        {
            "ingest_id": str(uuid.uuid4()),
            "at": later.isoformat().replace("+00:00", "Z"),
            "system": "drive",
            "principal": {"type": leaver[0], "id": leaver[1]},
            "action": "export",
            "resource": {"type": "Report", "id": f"after-{k}"},
            "access": "exported",
            "count": 400,
        }
        for k in range(6)
    ]
    history.store(client, "events", list(months.records(evs, "e")))
    fourth = r.run_cycle()
    assert [c["principal"]["id"] for c in fourth.contained] == [leaver[1]]
    assert leaver in contained_now(challenge)


# -- one replica, failures -----------------------------------------------------------------------


def test_two_reasoners_never_run_a_cycle_at_once(
    postgres_url: str,
    shared_history: tuple[str, Client],
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    key = uuid.uuid4().int & 0x7FFFFFFFFFFFFFFF
    apps = []
    for _ in range(2):
        r = reasoner(shared_history[1], context, challenge, policy)
        r.lease = PostgresLease(postgres_url, key)
        apps.append(create_app(r.settings, r))
    first, second = (a.state.loop for a in apps)
    assert first.once() == "ok"
    assert second.once() == "no-lease"
    probe = TestClient(apps[1])  # no lifespan: the loops are driven by hand
    r = probe.get("/readyz")
    assert r.status_code == 503 and "waiting for the lease" in r.json()["detail"]
    assert "svc_reasoner_lease_held 0.0" in probe.get("/metrics").text
    assert TestClient(apps[0]).get("/readyz").status_code == 200
    first.service.lease.release()
    assert second.once() == "ok"
    assert TestClient(apps[1]).get("/readyz").status_code == 200
    second.service.lease.release()


def test_a_cycle_with_a_dependency_down_writes_nothing_and_the_next_one_works(
    chdb_root: str,
    shared_history: tuple[str, Client],
    the_month: months.Month,
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    closed = tcp_listener("127.0.0.1", 0)
    down = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    client = shared_history[1]
    # The context service unreachable.
    r = reasoner(client, context, challenge, policy)
    r.context = ContextClient(down, timeout=2)
    with pytest.raises(Unavailable) as e:
        r.run_cycle()
    assert e.value.service == "context"
    # The challenge and the policy service unreachable.
    r = reasoner(client, context, challenge, policy)
    r.challenge = ChallengeClient(down, timeout=2)
    with pytest.raises(Unavailable) as e:
        r.run_cycle()
    assert e.value.service == "challenge"
    r = reasoner(client, context, challenge, policy)
    r.policy = PolicyClient(down, timeout=2)
    with pytest.raises(Unavailable) as e:
        r.run_cycle()
    assert e.value.service == "policy"
    # The model unreachable: everything was read and decided, nothing written.
    r = reasoner(client, context, challenge, policy, model_url=f"{down}/v1", call_timeout_secs=2)
    with pytest.raises(Unavailable) as e:
        r.run_cycle()
    assert e.value.service == "model"
    # The history unusable (a database without the rollups).
    bare = history.connect(
        f"{chdb_root}?database=bare_{uuid.uuid4().hex[:8]}", create_database=True
    )
    r = reasoner(bare, context, challenge, policy)
    app = create_app(r.settings, r)
    assert app.state.loop.once() == "failed"
    ready = TestClient(app).get("/readyz")
    assert ready.status_code == 503 and "history" in ready.json()["detail"]
    assert context.http.get("/v1/risk").json()["scores"] == []
    assert investigations(context) == [] and contained_now(challenge) == {}
    # Retried next cycle, with the history back.
    r.history = client
    assert app.state.loop.once() == "ok"
    assert TestClient(app).get("/readyz").status_code == 200
    assert len(contained_now(challenge)) == len(stories(the_month, months.CONTAIN))


# -- the model ---------------------------------------------------------------------------------


class ChatStub:
    """A local server speaking the chat-completions API (``POST /v1/chat/completions``)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.requests.append({"body": body, "auth": request.headers.get("authorization")})
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "Model summary: exported."},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        self.sock = tcp_listener("127.0.0.1", 0)
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def test_a_model_writes_summaries_from_the_evidence_fields_only(
    shared_history: tuple[str, Client],
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
    tmp_path: Path,
) -> None:
    stub = ChatStub()
    key = tmp_path / "model.key"
    key.write_text("sk-test\n")
    try:
        r = reasoner(
            shared_history[1],
            context,
            challenge,
            policy,
            model_url=stub.url,
            model_name="local-model",
            model_api_key_file=key,
        )
        out = r.run_cycle()
    finally:
        stub.stop()
    assert out.investigations and all(
        i["summary"] == "Model summary: exported." for i in out.investigations
    )
    assert {i["summary_by"] for i in investigations(context)} == {"local-model"}
    assert len(stub.requests) == len(out.investigations)
    for req in stub.requests:
        assert req["auth"] == "Bearer sk-test"
        assert req["body"]["model"] == "local-model"
        sent = json.loads(req["body"]["messages"][-1]["content"])
        assert set(sent) <= set(EVIDENCE_FIELDS) and "samples" not in sent


# -- decay and late records -----------------------------------------------------------------------


def test_scores_come_down_as_evidence_ages_and_late_records_count(
    chdb_root: str, the_month: months.Month
) -> None:
    _, client = new_history(chdb_root)
    months.fill(client, the_month)
    peers = peers_from_snapshot(the_month.snapshot())
    leaver = next(s.principal for s in the_month.stories if s.name == "after_hours_leaver")

    def score_on(day: Any, who: tuple[str, str]) -> int:
        first = day - timedelta(days=29)
        rows = rollups.read_days(client, first, day)
        sets = rollups.read_sets(client, first, day, day - timedelta(days=6))
        return next(s.score for s in score_window(rows, sets, peers) if s.principal == who)

    at_end = score_on(END, leaver)
    later = [score_on(END + timedelta(days=n), leaver) for n in (2, 4, 8)]
    assert at_end >= 70 and at_end >= later[0] >= later[1] >= later[2]
    assert later[0] < at_end and later[2] == 0
    # A late, backfilled export of a quiet person, three days ago, counts on its day.
    quiet = the_month.people()[30]
    before = score_on(END, ("Human", quiet.id))
    when = datetime.combine(END - timedelta(days=2), datetime.min.time(), tzinfo=UTC)
    late = {
        "ingest_id": str(uuid.uuid4()),
        "at": (when + timedelta(hours=11)).isoformat().replace("+00:00", "Z"),
        "system": "drive",
        "principal": {"type": "Human", "id": quiet.id},
        "action": "export",
        "resource": {"type": "Report", "id": "all"},
        "access": "exported",
        "count": 5000,
    }
    history.store(client, "events", list(months.records([late], "late")))
    assert score_on(END, ("Human", quiet.id)) > before


def test_the_demo_company_s_month_has_its_two_stories_flagged(chdb_root: str) -> None:
    from svc.demo.backfill import STORIES, backfill
    from svc.demo.company import generate
    from svc.reasoner.gate import evaluate

    _, client = new_history(chdb_root)
    m = backfill(client, generate(), end=END)
    assert {s.name for s in m.stories} == set(STORIES)
    first = TODAY - timedelta(days=29)
    rows = rollups.read_days(client, first, TODAY)
    sets = rollups.read_sets(client, first, TODAY, TODAY - timedelta(days=6))
    scores = score_window(rows, sets, peers_from_snapshot(m.snapshot()))
    passed = {s.principal for s in scores if evaluate(s, rows.days).passed}
    assert passed == {s.principal for s in m.stories}
    top = sorted(scores, key=lambda s: -s.score)[:2]
    assert {s.principal for s in top} == passed


def test_the_demo_month_is_the_same_whatever_the_weekday_it_ends_on() -> None:
    """The backfilled month lays its weeks out as if it ended on a Friday: made to end on a
    Tuesday it is the same records, shifted in time (so svc up's first scores do not depend on
    the day it starts)."""
    from collections import Counter

    from svc.demo.backfill import company_month
    from svc.demo.company import generate

    def by_offset(m: months.Month) -> Counter[tuple[int, str, str]]:
        def day(r: dict[str, Any]) -> int:
            return (m.end - datetime.fromisoformat(r["at"].replace("Z", "+00:00")).date()).days

        return Counter(
            (day(r), r["principal"]["id"], r["action"]) for r in [*m.decisions, *m.events]
        )

    friday = company_month(generate(), end=datetime(2026, 11, 27).date())
    tuesday = company_month(generate(), end=datetime(2026, 12, 1).date())
    assert friday.end.weekday() == 4 and tuesday.end.weekday() == 1
    assert by_offset(friday) == by_offset(tuesday)
    assert [(s.name, s.principal) for s in friday.stories] == [
        (s.name, s.principal) for s in tuesday.stories
    ]


def test_the_app_runs_a_cycle_at_start_and_serves_its_probes(
    tmp_path: Path,
    shared_history: tuple[str, Client],
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    lease = f"file://{tmp_path / 'reasoner.lease'}"
    r = reasoner(shared_history[1], context, challenge, policy, lease_url=lease)
    app = create_app(r.settings, r)
    with TestClient(app) as probe:
        deadline = datetime.now(UTC) + timedelta(seconds=120)
        while r.status.cycles["ok"] == 0 and datetime.now(UTC) < deadline:
            threading.Event().wait(0.2)
        assert r.status.cycles["ok"] == 1 and r.status.lease_held
        ready = probe.get("/readyz")
        assert ready.status_code == 200 and ready.json()["lease"].startswith("file ")
        metrics = probe.get("/metrics").text
        assert 'svc_reasoner_cycles_total{outcome="ok"} 1.0' in metrics
        assert 'svc_reasoner_last_cycle{what="contained"} 4.0' in metrics
        assert probe.get("/version").json()["component"] == "svc-reasoner"
        # A second reasoner on the same lease file waits.
        other = reasoner(shared_history[1], context, challenge, policy, lease_url=lease)
        assert create_app(other.settings, other).state.loop.once() == "no-lease"
    # The lifespan's end freed the lease.
    assert create_app(other.settings, other).state.loop.once() == "ok"
    other.lease.release()


def test_a_kafka_fed_history_leads_to_the_containments(
    chdb_root: str,
    the_month: months.Month,
    kafka_bootstrap: str,
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    from confluent_kafka import Producer

    from kafka_fixture import create_topics

    tag = uuid.uuid4().hex[:10]
    topics = (f"test.reasoner.decisions.{tag}", f"test.reasoner.events.{tag}")
    create_topics(kafka_bootstrap, *topics, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for topic, values in ((topics[0], the_month.decisions), (topics[1], the_month.events)):
        # every 40th record twice, as a producer's retry or a redelivery would
        for v in values + values[::40]:
            key = f"{v['principal']['type']}::{v['principal']['id']}".encode()
            while True:
                try:
                    producer.produce(topic, json.dumps(v).encode(), key)
                    break
                except BufferError:
                    producer.poll(0.5)
    assert producer.flush(120) == 0
    _, client = new_history(chdb_root)
    loader = history.Loader(
        client,
        kafka_bootstrap,
        decisions_topic=topics[0],
        events_topic=topics[1],
        group_id=f"test-reasoner-{tag}",
        batch_records=20_000,
        batch_ms=300,
        consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (loader.run(until_caught_up=True), done.set()), daemon=True
    )
    thread.start()
    if not done.wait(300):
        loader.stop()
        pytest.fail(f"the loader did not catch up: {loader.stats}")
    out = reasoner(client, context, challenge, policy).run_cycle()
    # the redelivered records counted twice by the views, made exact again before scoring
    assert out.settled
    got = {(c["principal"]["type"], c["principal"]["id"]) for c in out.contained}
    assert got == set(stories(the_month, months.CONTAIN))


def test_a_learning_principal_is_scored_against_peers_and_never_contained(
    chdb_root: str, the_month: months.Month
) -> None:
    from svc.reasoner.gate import evaluate

    _, client = new_history(chdb_root)
    months.fill(client, the_month)
    # A newcomer of three days, in the first person's department, exports 5,000 rows today.
    peer = the_month.people()[0]
    newcomer = months.Actor("Human", "newcomer@example.com", peer.group, "10.9.9.9")
    evs = []
    for n in range(3):
        at = datetime.combine(TODAY - timedelta(days=n), datetime.min.time(), tzinfo=UTC)
        evs.append(
            {
                "ingest_id": str(uuid.uuid4()),
                "at": (at + timedelta(hours=10)).isoformat().replace("+00:00", "Z"),
                "system": "drive",
                "principal": {"type": "Human", "id": newcomer.id},
                "action": "export" if n == 0 else "view",
                "resource": {"type": "Document", "id": f"d{n}"},
                "access": "exported" if n == 0 else "read",
                "count": 5000 if n == 0 else 10,
            }
        )
    history.store(client, "events", list(months.records(evs, "new")))
    snap = the_month.snapshot()
    snap["principals"].append(
        {
            "kind": "Human",
            "id": newcomer.id,
            "value": {"attrs": {"department": peer.group}, "parents": []},
            "removed": False,
        }
    )
    first = TODAY - timedelta(days=29)
    rows = rollups.read_days(client, first, TODAY)
    sets = rollups.read_sets(client, first, TODAY, TODAY - timedelta(days=6))
    scores = score_window(rows, sets, peers_from_snapshot(snap))
    sc = next(s for s in scores if s.principal == ("Human", newcomer.id))
    assert sc.learning and sc.peer_group == f"department:{peer.group}"
    moved = next(f for f in sc.factors if f.name == "moved_out")
    assert moved.baseline is None and moved.peers is not None  # peers only
    assert sc.score >= 50
    gate = evaluate(sc, rows.days)
    assert not gate.passed and gate.reasons[0].startswith("learning")


# -- a cycle asked of a running reasoner (svc reasoner cycle --data-dir) -------------------------


def test_cycle_with_data_dir_asks_the_running_reasoner(
    tmp_path: Path,
    the_month: months.Month,
    shared_history: tuple[str, Client],
    context: Live,
    challenge: ChallengeServer,
    policy: PolicyServer,
) -> None:
    """`svc reasoner cycle --data-dir` reaches a served reasoner (as under svc up, which owns
    the chDB directory) through POST /v1/cycles with the data directory's caller token: the
    cycle's JSON comes back; no token, another audience, a bad body, a cycle running and a
    reasoner without the lease each get their problem."""
    from svc.common.auth import LocalIssuer
    from svc.common.inprocess import serve_http
    from svc.reasoner.settings import ReasonerAuthSettings

    issuer = LocalIssuer(tmp_path / "issuer", issuer="https://issuer.test")
    auth = ReasonerAuthSettings(
        auth="jwt", auth_issuer=issuer.issuer, auth_jwks=issuer.jwks_url, auth_callers=["op"]
    )
    data_dir = tmp_path / "up"
    data_dir.mkdir()
    token = issuer.mint("op", ["svc-context", "svc-reasoner"], 600)
    (data_dir / "caller.token").write_text(token + "\n", encoding="utf-8")
    lease = f"file://{tmp_path / 'reasoner.lease'}"
    r = reasoner(shared_history[1], context, challenge, policy, lease_url=lease, cycle_secs=3600)
    port = tcp_listener("127.0.0.1", 0)
    free = port.getsockname()[1]
    port.close()
    url = f"http://127.0.0.1:{free}"
    with serve_http(create_app(r.settings, r, auth), "127.0.0.1", free, "reasoner"):
        deadline = datetime.now(UTC) + timedelta(seconds=120)
        while r.status.cycles["ok"] == 0 and datetime.now(UTC) < deadline:
            threading.Event().wait(0.2)
        assert r.status.cycles["ok"] == 1

        at = datetime.now(UTC).replace(microsecond=0)
        out = CliRunner().invoke(
            cli_app,
            [
                "reasoner",
                "cycle",
                "--data-dir",
                str(data_dir),
                "--url",
                url,
                "--at",
                at.isoformat(),
            ],
        )
        assert out.exit_code == 0, out.output
        result = json.loads(out.stdout)
        assert result["at"] == at.isoformat()
        assert {"scores", "contained", "would_contain", "investigations"} <= set(result)
        scored = {(s["principal"]["type"], s["principal"]["id"]) for s in result["scores"]}
        assert set(stories(the_month, "contain")) <= scored
        assert r.status.cycles["ok"] == 2  # the loop's own counters saw it

        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.post("/v1/cycles").status_code == 401
            other_aud = issuer.mint("op", ["svc-context"], 600)
            refused = http.post("/v1/cycles", headers={"authorization": f"Bearer {other_aud}"})
            assert refused.status_code == 401
            bearer = {"authorization": f"Bearer {token}"}
            bad = http.post("/v1/cycles", json={"at": "yesterday", "x": 1}, headers=bearer)
            assert bad.status_code == 400 and "`x`" in bad.json()["detail"]
            bad = http.post("/v1/cycles", json={"at": "2026-11-20T10:00:00"}, headers=bearer)
            assert bad.status_code == 400 and "offset" in bad.json()["detail"]
            # While a cycle runs (this process's cycle lock held), a second is refused.
            assert r._cycle_lock.acquire(timeout=60)
            try:
                busy = http.post("/v1/cycles", json={}, headers=bearer)
            finally:
                r._cycle_lock.release()
            assert busy.status_code == 409, busy.text
            assert busy.json()["type"] == "urn:svc:problem:cycle-running"

        # A reasoner that does not hold the lease runs nothing and says so.
        other = reasoner(shared_history[1], context, challenge, policy, lease_url=lease)
        other_app = create_app(other.settings, other, auth)
        with TestClient(other_app) as probe:
            no = probe.post("/v1/cycles", json={}, headers={"authorization": f"Bearer {token}"})
            assert no.status_code == 409 and no.json()["type"] == "urn:svc:problem:no-lease"

    # The command names a reasoner that does not answer, and a directory without a token.
    out = CliRunner().invoke(
        cli_app, ["reasoner", "cycle", "--data-dir", str(data_dir), "--url", url]
    )
    assert out.exit_code == 1 and "does not answer" in out.output
    out = CliRunner().invoke(
        cli_app, ["reasoner", "cycle", "--data-dir", str(tmp_path / "nowhere"), "--url", url]
    )
    assert out.exit_code == 2 and "caller.token" in out.output
