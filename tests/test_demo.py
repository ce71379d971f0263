"""The demo company, its bundle, its traffic and its summary (svc.demo; docs/demo.md).

The bundle is checked with the real engine: every showcase check and plan that `drive` sends is
decided in process and must come out as its scenario says (every verdict, every challenge kind,
`human_present=false`, agents where the stricter verdict wins, work-item assignment, every plan
outcome). The end-to-end test drives real HTTP traffic into a served engine whose decision log
ships to a real Kafka and into the real intake (uvicorn, transactional producers), loads both
topics into chDB with the history loader in a child process (chDB allows one engine per process,
and tests/test_history.py holds this one's) and checks the summary read back from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from kafka_fixture import create_topics
from svc._pdp_core import DecisionLog, Server
from svc.common.net import tcp_listener
from svc.common.topics import bootstrap_servers
from svc.demo.company import Company, generate, provision, write_bundle
from svc.demo.traffic import DriveReport, TrafficError, drive, scenarios
from svc.intake import IntakeSettings, create_app
from svc.pdp import Engine
from svc.pdp.decision_log import Shipper

TOKEN = "demo-test-intake-token-0123456789"

# What each showcase check must decide: verdict, challenges, built-in reason (or None), and for
# agents acting for a person the person's own verdict.
CHECKS: dict[str, tuple[str, set[str], str | None, str | None]] = {
    "department-read": ("allow", set(), None, None),
    "cross-department-denied": ("deny", set(), None, None),
    "delete-step-up": ("challenge", {"verification"}, None, None),
    "delete-nobody-present": ("deny", set(), "svc:human_not_present", None),
    "risk-step-up": ("challenge", {"verification"}, None, None),
    "risk-denied": ("deny", set(), None, None),
    "export-approval": ("challenge", {"approval"}, None, None),
    "secret-denied": ("deny", set(), None, None),
    "leaver-denied": ("deny", set(), None, None),
    "contractor-download-denied": ("deny", set(), None, None),
    "partner-share-justification": ("challenge", {"justification"}, None, None),
    "customer-export-approval": ("challenge", {"approval"}, None, None),
    "billing-export-approval": ("challenge", {"approval"}, None, None),
    "billing-export": ("allow", set(), None, None),
    "contained": ("deny", set(), "svc:contained", None),
    "reasoner-score-93": ("deny", set(), None, None),
    "reasoner-score-78": ("challenge", {"verification"}, None, None),
    "reasoner-score-74": ("challenge", {"verification"}, None, None),
    "reasoner-score-12": ("allow", set(), None, None),
    "unregistered-agent": ("deny", set(), "svc:unregistered", None),
    "agent-for-person-read": ("allow", set(), None, "allow"),
    "agent-secret-stricter": ("deny", set(), None, "allow"),
    "auditor-finance": ("allow", set(), None, None),
    "manager-reads-report": ("allow", set(), None, None),
    "template-grant": ("allow", set(), None, None),
    "indexer-read": ("allow", set(), None, None),
    "agent-assigned-write": ("allow", set(), None, "allow"),
    "agent-for-intern-stricter": ("deny", set(), None, "deny"),
    "agent-unlinked": ("deny", set(), None, "deny"),
    "agent-unknown-item": ("deny", set(), None, "allow"),
    "agent-closed-item": ("deny", set(), None, "allow"),
    "agent-customer-write": ("challenge", {"approval", "justification"}, None, "challenge"),
    "agent-alone-customer-write": ("challenge", {"approval"}, None, None),
    "agent-nobody-present-delete": ("deny", set(), "svc:human_not_present", "deny"),
    "agent-assigned-edit": ("allow", set(), None, "allow"),
}
# What each showcase plan must answer: outcome, and a filter node it must contain (or None).
PLANS: dict[str, tuple[str, str | None]] = {
    "contained-listing": ("always_denied", None),
    "reasoner-score-93-listing": ("always_denied", None),
    "reasoner-score-78-listing": ("challenge", "true"),
    "reasoner-score-74-listing": ("challenge", "true"),
    "reasoner-score-12-listing": ("always_allowed", None),
    "unregistered-agent-listing": ("always_denied", None),
    "tickets-for-staff": ("always_allowed", None),
    "documents-for-person": ("conditional", "contains"),
    "documents-to-delete": ("challenge", "compare"),
    "agent-for-person-documents": ("conditional", "compare"),
    "high-risk-listing": ("always_denied", None),
    "documents-for-manager": ("conditional", "unknown"),
    "documents-for-auditor": ("conditional", "in"),
    "downloads-for-contractor": ("always_denied", None),
    "documents-granted": ("conditional", "is"),
    "sales-bulk-export": ("conditional", "compare"),
    "billing-bulk-export": ("conditional", "compare"),
}


@pytest.fixture(scope="module")
def company() -> Company:
    return generate()


@pytest.fixture(scope="module")
def bundle(company: Company, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("demo-bundle")
    write_bundle(company, d)
    return d


@pytest.fixture(scope="module")
def engine(company: Company, bundle: Path) -> Engine:
    e = Engine.from_bundle_dir(bundle)
    provision(e, company)
    return e


def ops(node: Any) -> Iterator[str]:
    """Every `op` of a filter tree."""
    if isinstance(node, dict):
        if "op" in node:
            yield node["op"]
        for v in node.values():
            yield from ops(v)
    elif isinstance(node, list):
        for v in node:
            yield from ops(v)


# -- the company and its bundle


def test_generation_is_deterministic(company: Company, tmp_path: Path) -> None:
    again = generate(7, 300)
    assert again == company
    assert generate(8, 300) != company
    write_bundle(again, tmp_path / "a")
    write_bundle(generate(7, 300), tmp_path / "b")
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == [
        "10-documents.cedar",
        "20-tickets.cedar",
        "30-customers.cedar",
        "40-agents.cedar",
        "50-people.cedar",
        "60-approvals.cedar",
        "70-tools.cedar",
        "80-portal.cedar",
        "company.cedarschema",
        "entities.json",
        "linked",
    ]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert scenarios(company, seed=7) == scenarios(generate(7, 300), seed=7)
    assert scenarios(company, seed=7) != scenarios(company, seed=8)
    with pytest.raises(ValueError, match="at least 40"):
        generate(people=39)


def test_company_shape(company: Company) -> None:
    people = {p.user_name: p for p in company.people}
    assert len(people) == len(company.people) == 300
    ceo = company.people[0]
    assert ceo.manager is None and "managers" in ceo.groups
    for p in company.people:  # every manager chain ends at the CEO, without a cycle
        seen, q = set(), p
        while q.manager is not None:
            assert q.user_name not in seen
            seen.add(q.user_name)
            q = people[q.manager]
        assert q is ceo
        assert all(g in company.groups for g in p.groups)
        assert p.groups[0] == p.department
    assert {p.department for p in company.people} == set(company.departments())
    for group in ("interns", "contractors", "partner-managers", "security", "auditors"):
        assert company.in_group(group), group
    assert sum(not p.active for p in company.people) == 2
    sas = company.service_accounts
    assert {sa.ai for sa in sas} == {True, False}
    assert [sa.id for sa in sas if not sa.registered] == ["legacy.reportbot"]
    assert all(sa.owner in people and sa.id.startswith(sa.app + ".") for sa in sas)
    refs = {
        (r.type, r.id) for t in ("Document", "Ticket", "Customer") for r in company.resources(t)
    }
    assert len(company.documents) == 600 and len(company.tickets) == 300
    for t in ("Document", "Ticket", "Customer"):
        for r in company.resources(t):
            assert r.owner in people
            assert r.attrs["sensitivity"] in (
                "public",
                "internal",
                "confidential",
                "secret",
                "restricted",
            )
            assert isinstance(r.attrs["tags"], list)
    assert {w.status for w in company.work_items} == {"open", "closed"}
    assert all(set(w.links) <= refs and w.links for w in company.work_items)
    assert company.contained and all(u in people for u in company.contained)
    assert set(company.risk_scores) <= set(people)


def test_bundle_loads_strictly_without_warnings(
    company: Company, bundle: Path, engine: Engine
) -> None:
    fresh = Engine.from_bundle_dir(bundle)
    assert fresh.warnings == []
    names = set(fresh.policy_names)
    text = "".join((bundle / f).read_text() for f in sorted(p.name for p in bundle.glob("*.cedar")))
    declared = {line[5:-2] for line in text.splitlines() if line.startswith('@id("')}
    assert len(declared) == 41  # 40 policies and the `document-reader` template
    links = {f"reader-{u}-{d}" for u, d in company.grants}
    assert names == (declared - {"document-reader"}) | links
    # provision() loaded what the bundle cannot carry
    assert engine.versions["principals_version"] > fresh.versions["principals_version"]
    assert engine.versions["resources_version"] > fresh.versions["resources_version"]


# -- the requests traffic.py sends, decided in process


def test_every_showcase_check_decides_as_its_scenario_says(
    company: Company, engine: Engine
) -> None:
    traffic = scenarios(company, checks=2000, seed=7)
    seen: set[str] = set()
    for case in traffic.checks():
        r = engine.evaluate(case.request)
        if case.scenario == "routine":
            continue
        seen.add(case.scenario)
        verdict, challenges, reason, person = CHECKS[case.scenario]
        assert r["verdict"] == verdict, (case, r)
        assert set(r["challenges"]) == challenges, (case, r)
        if reason is not None:
            assert reason in r["policies"], (case, r)
        assert (r.get("on_behalf_of") or {}).get("verdict") == person, (case, r)
    assert seen == set(CHECKS)


def test_traffic_exercises_every_rule(company: Company, engine: Engine) -> None:
    checks = scenarios(company, checks=2000, seed=7).checks()
    assert len(checks) == 2000
    answers = [(c, engine.evaluate(c.request)) for c in checks]
    assert {r["verdict"] for _, r in answers} == {"allow", "deny", "challenge"}
    assert {k for _, r in answers for k in r["challenges"]} == {
        "verification",
        "approval",
        "justification",
    }
    reasons = {p for _, r in answers for p in r["policies"] if p.startswith("svc:")}
    assert reasons == {"svc:contained", "svc:unregistered", "svc:human_not_present"}
    # agents for people: the stricter verdict wins, both ways round
    obo = [(c, r) for c, r in answers if "on_behalf_of" in c.request]
    assert any(r["on_behalf_of"]["verdict"] == "allow" and r["verdict"] == "deny" for _, r in obo)
    assert any(
        r["on_behalf_of"]["verdict"] == "deny" and "agents-work-on-assigned" in r["policies"]
        for _, r in obo
    )
    # work items: an open item assigns what it links; closed or unknown items assign nothing
    records = [engine.decide(c.request) for c, _ in answers if "work_item_id" in c.request]
    assert any(d["assigned"] and d["verdict"] == "allow" for d in records)
    assert any(not d["assigned"] for d in records)
    assert {c.route for c in checks} == {"evaluation", "authzen"}
    assert any(c.request.get("human_present") is False for c in checks)
    assert any("risk_score" in c.request.get("context", {}) for c in checks)


def test_every_showcase_plan_answers_as_its_scenario_says(company: Company, engine: Engine) -> None:
    plans = scenarios(company, checks=2000, seed=7).plans()
    seen: set[str] = set()
    outcomes: set[str] = set()
    for case in plans:
        r = engine.plan(case.request)
        outcomes.add(r["outcome"])
        if case.scenario == "routine":
            continue
        seen.add(case.scenario)
        outcome, node = PLANS[case.scenario]
        assert r["outcome"] == outcome, (case, r)
        if node is not None:
            assert node in set(ops(r["filter"])), (case, r)
        assert r["needs_row_checks"] == (node == "unknown"), (case, r)
    assert seen == set(PLANS)
    assert outcomes == {"always_allowed", "always_denied", "conditional", "challenge"}


def test_drive_report_round_trips() -> None:
    r = DriveReport(checks=3, plans=1)
    r.verdicts.update(["allow", "deny", "allow"])
    r.plan_qids.add("q1")
    r.principals.update(["Human::a", "ServiceAccount::b.c"])
    with pytest.raises(ValueError):
        r.window()
    r.record_check(
        {
            "principal": {"type": "Human", "id": "z"},
            "on_behalf_of": None,
            "action": "read",
            "resource": {"type": "Document", "id": "d"},
        },
        {
            "qid": "x",
            "verdict": "challenge",
            "challenges": ["approval"],
            "policies": ["p"],
            "mode": "enforce",
        },
        "evaluation",
    )
    again = DriveReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r
    assert again.decisions_sent == 5


# -- real traffic end to end: PDP + decision log, intake, Kafka, history, summary


def make_topics(bootstrap: str, *names: str) -> None:
    create_topics(bootstrap, *names, partitions=3)


@dataclass
class Stack:
    pdp_url: str
    intake_url: str
    log: DecisionLog
    decisions_topic: str
    events_topic: str


@pytest.fixture
def stack(company: Company, bundle: Path, kafka_bootstrap: str, tmp_path: Path) -> Iterator[Stack]:
    bootstrap = bootstrap_servers(kafka_bootstrap)
    suffix = uuid.uuid4().hex[:10]
    decisions, events = f"test.demo.decisions.{suffix}", f"test.demo.events.{suffix}"
    make_topics(bootstrap, decisions, events)
    engine = Engine.from_bundle_dir(bundle)
    provision(engine, company)
    log = DecisionLog(tmp_path / "spool")
    server = Server(engine, port=0, decision_log=log, pdp_name="demo-test")
    port = server.start()
    server.set_ready(bundle=True, containments=True)
    shipper = Shipper(log, bootstrap, decisions, flush_timeout=5)
    shipper.start()
    settings = IntakeSettings(
        kafka_url=bootstrap,
        topic=events,
        token=TOKEN,
        transactional_id=f"test-demo-{suffix}",
        broker_timeout_secs=5.0,
        retry_after_secs=1,
    )
    sock = tcp_listener("127.0.0.1", 0)
    intake = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=intake.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    intake_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{intake_url}/readyz").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "intake not ready"
        time.sleep(0.2)
    try:
        yield Stack(f"http://127.0.0.1:{port}", intake_url, log, decisions, events)
    finally:
        intake.should_exit = True
        thread.join(30)
        server.stop()
        shipper.stop()


LOAD_AND_SUMMARIZE = textwrap.dedent(
    """
    import json, sys
    from svc import history
    from svc.demo.summary import history_counts, summarize
    from svc.demo.traffic import DriveReport

    dsn, bootstrap, decisions, events, report_file = sys.argv[1:]
    report = DriveReport.from_dict(json.load(open(report_file)))
    client = history.connect(dsn, create_database=True)
    history.migrate(client)
    loader = history.Loader(client, bootstrap, decisions_topic=decisions, events_topic=events,
                            group_id="test-demo-" + decisions, batch_ms=300)
    loader.run(until_caught_up=True)
    start, end = report.window()
    print(json.dumps({"window": history_counts(client, start, end),
                      "all": history_counts(client),
                      "summary": summarize(client, report)}))
    """
)


def test_drive_fills_history_and_the_summary_reads_it_back(
    company: Company, stack: Stack, kafka_bootstrap: str, tmp_path: Path
) -> None:
    said: list[str] = []
    report = drive(
        company, stack.pdp_url, stack.intake_url, TOKEN, checks=600, seed=3, progress=said.append
    )
    # What was sent: every verdict, challenge kind, built-in reason, plan outcome and route.
    assert set(report.verdicts) == {"allow", "deny", "challenge"}
    assert set(report.challenges) == {"verification", "approval", "justification"}
    assert set(report.reasons) == {"svc:contained", "svc:unregistered", "svc:human_not_present"}
    assert set(report.plan_outcomes) == {
        "always_allowed",
        "always_denied",
        "conditional",
        "challenge",
    }
    assert set(report.routes) == {"evaluation", "authzen", "authzen-batch", "row-check"}
    assert report.checks == 600 + report.routes["row-check"]
    assert report.pinned > 0 and len(report.plan_qids) < report.plans
    assert report.list_reports > 0 and report.rows_listed > 0
    assert report.events_by_access["listed"] + report.events_by_access["exported"] >= (
        report.list_reports
    )
    assert report.on_behalf_of > 0 and report.failures > 0
    assert "Human::" + company.contained[0] in report.principals
    assert said and said[-1].startswith("done: ")
    # Every decision's record is on the broker before the history reads it.
    records = report.decisions_sent
    deadline = time.monotonic() + 120
    while not (stack.log.stats["sent"] >= records and stack.log.stats["queued_now"] == 0):
        assert time.monotonic() < deadline, stack.log.stats
        time.sleep(0.1)
    assert stack.log.stats["sent"] == records
    report_file = tmp_path / "report.json"
    report_file.write_text(json.dumps(report.to_dict()))
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_SUMMARIZE,
            f"chdb://{tmp_path / 'chdb'}?database=demo",
            bootstrap_servers(kafka_bootstrap),
            stack.decisions_topic,
            stack.events_topic,
            str(report_file),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    decisions, events = got["window"]
    assert got["all"] == got["window"]
    assert decisions == report.decisions_sent
    assert events == report.events_sent
    summary: str = got["summary"]
    print(summary)
    lines = summary.splitlines()
    assert len(lines) == 10
    assert lines[0].endswith(f"{decisions:,} decisions, {events:,} events")
    labels = [ln.split()[0] for ln in lines[1:]]
    assert labels == [
        "mode",
        "checks",
        "challenges",
        "challenged",
        "agents",
        "plans",
        "list",
        "events",
        "moved",
    ]
    assert lines[1].split() == ["mode", "enforce", f"{decisions:,}"]
    v = report.verdicts
    assert lines[2].endswith(
        f"{report.checks:,}: allow {v['allow']:,}, deny {v['deny']:,}, challenge {v['challenge']:,}"
    )
    for kind, n in report.challenges.items():
        assert f"{kind} {n:,}" in lines[3]
    # No challenge service behind this decision point: no qids, so no outcomes.
    assert lines[4].split() == ["challenged", "0", "challenges", "opened:", "none"]
    assert f"agents        {report.on_behalf_of:,} checks by " in lines[5]
    for outcome, n in report.plan_outcomes.items():
        assert f"{outcome} {n:,}" in lines[6]
    assert f"({report.pinned:,} pages pinned)" in lines[6]
    assert f"{report.list_reports:,} reports of {len(report.plan_qids):,} plans" in lines[7]
    for access in ("read", "written", "exported", "listed"):
        assert f"{access} {report.events_by_access[access]:,}" in lines[8]
    assert f"({report.failures:,} failures)" in lines[8]
    assert lines[9].split()[4].startswith("row")


def test_drive_raises_when_intake_refuses(company: Company, stack: Stack) -> None:
    with pytest.raises(TrafficError, match="403"):
        drive(company, stack.pdp_url, stack.intake_url, "not-the-intake-token", checks=10)
