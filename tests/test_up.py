"""`svc up`: the whole install on one machine with the embedded defaults (issue: svc up).

Each test runs `svc up` as a child process, as a newcomer would, and talks to it over HTTP only.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from serverkit import wait_until
from svc.intake.cloudtrail import map_record
from test_intake import cloudtrail_files
from uphelp import SVC, Up, free_base_port, get_json, run_svc, start_up

CORP = Path(__file__).parent / "testdata" / "bundles" / "corp"
ALICE_DELETE = {
    "principal": {"type": "Human", "id": "alice"},
    "action": "delete",
    "resource": {"type": "Document", "id": "design"},
}


@pytest.fixture(scope="module")
def corp_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    up = start_up(tmp_path_factory.mktemp("up-corp"), "--bundle", str(CORP))
    yield up
    code, _, err = up.stop()
    assert code == 0, err


def test_banner_names_every_component_and_each_answers(corp_up: Up) -> None:
    banner = "".join(corp_up.stdout)
    urls = (corp_up.pdp, corp_up.intake, corp_up.history, corp_up.policy, corp_up.context)
    for url in (*urls, corp_up.challenge):
        assert url in banner
        assert get_json(f"{url}/healthz")
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        assert "version" in get_json(f"{url}/version")
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
    assert str(corp_up.data_dir) in banner
    # The challenge page answers: a stranger is sent to sign in at the demo identity provider.
    page = f"http://localhost:{corp_up.port + 5}"
    assert f"{page}/keys" in banner
    r = httpx.get(f"{page}/keys", timeout=10)
    assert r.status_code == 303 and r.headers["location"] == f"{page}/auth/login"
    r = httpx.get(f"{page}/auth/login", timeout=10)
    idp = f"http://127.0.0.1:{corp_up.port + 6}"
    assert r.status_code == 302 and r.headers["location"].startswith(f"{idp}/oauth2/authorize?")
    assert "code_challenge_method=S256" in r.headers["location"]
    assert httpx.get(f"{idp}/.well-known/openid-configuration", timeout=10).json()["issuer"] == idp
    # Signing in at the demo provider as any user name opens that person's key page.
    with httpx.Client(timeout=10) as browser:
        authorize = browser.get(f"{page}/auth/login").headers["location"]
        assert browser.get(authorize).status_code == 200  # the provider's form
        callback = browser.post(authorize, data={"sub": "alice"})
        assert callback.status_code == 302, callback.text
        keys = browser.get(callback.headers["location"])
        assert keys.status_code == 303 and keys.headers["location"] == "/keys"
        assert browser.get(f"{page}/keys").status_code == 200
        assert browser.get(f"{page}/page/api/me").json()["user"] == "alice"
        assert browser.get(f"{page}/page/api/keys").json() == {"keys": []}


@pytest.fixture(scope="module")
def demo_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`svc up` with the demo company (no --bundle): provisioned through the context service."""
    up = start_up(tmp_path_factory.mktemp("up-demo"))
    yield up
    code, _, err = up.stop()
    assert code == 0, err


def test_the_demo_company_is_provisioned_through_the_context_service(demo_up: Up) -> None:
    """docs/quickstart.md: people and groups over SCIM, documents and work items through the
    connectors (from the demo's Drive and Jira fakes), agents through the service-account
    route, and the reasoner's scores from the backfilled month."""
    from svc.demo import company

    co = company.generate()
    scim = {"authorization": f"Bearer {demo_up.scim_token}"}
    person = next(p for p in co.people if p.manager and p.active)
    found = httpx.get(
        f"{demo_up.context}/scim/v2/Users",
        params={"filter": f'userName eq "{person.user_name}"'},
        headers=scim,
        timeout=10,
    ).json()
    assert found["totalResults"] == 1
    user = found["Resources"][0]
    assert user["title"] == person.title and user["active"] is True
    enterprise = user["urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"]
    assert enterprise["department"] == person.department
    # The SCIM token is the identity provider's only: the caller token does not open SCIM.
    assert httpx.get(f"{demo_up.context}/scim/v2/Users", headers=demo_up.auth).status_code == 401

    people = get_json(f"{demo_up.context}/v1/directory/people", headers=demo_up.auth)
    assert len(people["people"] if isinstance(people, dict) else people) == len(co.people)
    doc = co.documents[0]
    got = httpx.post(
        f"{demo_up.context}/v1/resources/get",
        json={"resources": [doc.ref]},
        headers=demo_up.auth,
        timeout=10,
    ).json()
    attrs = got["resources"][0]["attrs"]
    # Every attribute the demo gives the document, as the connector brought it from the fake
    # Drive (which adds its own: mime type, sharing, modification time).
    assert {k: attrs.get(k) for k in doc.attrs} == doc.attrs and got["missing"] == []
    accounts = get_json(f"{demo_up.context}/v1/service-accounts", headers=demo_up.auth)
    listed = accounts["service_accounts"] if isinstance(accounts, dict) else accounts
    assert {a["id"] for a in listed} == {sa.id for sa in co.service_accounts if sa.registered}
    snapshot = get_json(f"{demo_up.context}/v1/principals", headers=demo_up.auth)
    kinds = defaultdict(int)
    for p in snapshot["principals"]:
        kinds[p["kind"]] += 1
    assert kinds["Human"] == len(co.people) and kinds["RiskScore"] > 0


def test_the_demo_token_issuer_is_trusted_and_svc_demo_token_signs(demo_up: Up) -> None:
    """docs/demo.md#agent-tokens: one trusted app per demo agent prefix, its JWKS over HTTPS
    with the issuer's own CA, and ``svc demo token`` minting with the same keys."""
    import ssl

    import jwt

    apps = get_json(f"{demo_up.context}/v1/directory/trusted-apps", headers=demo_up.auth)
    by_name = {a["name"]: a for a in apps["trusted_apps"]}
    assert set(by_name) == {"copilot", "helpdesk", "crm", "docs"}
    copilot = by_name["copilot"]
    assert copilot["iss"] == f"{demo_up.token_issuer}/copilot"
    assert copilot["jwks_url"] == f"{demo_up.token_issuer}/copilot/jwks.json"
    ca = demo_up.data_dir / "token-issuer" / "ca.pem"
    ctx = ssl.create_default_context(cafile=str(ca))

    r = run_svc(
        "demo", "token", "--agent", "copilot.assistant", "--for", "ana", "--no-human-present",
        "--data-dir", str(demo_up.data_dir),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    key = jwt.PyJWKClient(copilot["jwks_url"], ssl_context=ctx).get_signing_key_from_jwt(token)
    claims = jwt.decode(
        token, key.key, algorithms=["ES256"], audience=copilot["aud"], issuer=copilot["iss"]
    )
    assert claims["sub"] == "ana" and claims["act"] == {"sub": "copilot.assistant"}
    assert claims["svc_human_present"] is False

    refused = run_svc(
        "demo", "token", "--agent", "legacy.reportbot", "--data-dir", str(demo_up.data_dir)
    )
    assert refused.returncode == 2 and "not one of the demo apps" in refused.stderr


def test_the_gateway_checks_the_demo_agents_tool_calls(demo_up: Up) -> None:
    """docs/quickstart.md: the gateway on port+7 in front of the demo's tools server (stdio),
    agent tokens of the demo apps accepted, each call checked, forwarded calls in the history."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from svc.demo.token_issuer import DevTokenIssuer
    from svc.demo.tools_server import TOOLS

    assert demo_up.gateway in "".join(demo_up.stdout)
    assert httpx.get(f"{demo_up.gateway}/readyz", timeout=10).status_code == 200
    apps = DevTokenIssuer.from_directory(demo_up.data_dir / "token-issuer")
    before = demo_up.totals()["events"]

    async def call(token: str, tool: str, **arguments: Any) -> Any:
        headers = {"authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            transport = streamable_http_client(f"{demo_up.gateway}/mcp/demo", http_client=http)
            async with Client(transport, mode="legacy") as agent:
                listed = {t.name for t in (await agent.list_tools()).tools}
                assert listed == set(TOOLS)
                return await agent.call_tool(tool, arguments)

    read = asyncio.run(
        call(apps.mint("copilot.assistant", "alan.hughes"), "read_document", document_id="doc-0317")
    )
    assert not read.is_error and read.structured_content["id"] == "doc-0317"
    denied = asyncio.run(
        call(apps.mint("copilot.assistant", "uma.dubois"), "read_document", document_id="doc-0537")
    )
    assert denied.is_error and denied.meta["svc/verdict"] == "deny"
    challenged = asyncio.run(
        call(
            apps.mint("helpdesk.triage", "lara.kim", work_item_id="jira:OPS-100"),
            "close_ticket",
            ticket_id="TCK-1261",
            resolution="done",
        )
    )
    assert challenged.is_error and challenged.meta["svc/verdict"] == "challenge"
    assert challenged.meta["svc/challenge_wait"].startswith(f"{demo_up.gateway}/mcp/challenges/")
    # An app signing for another app's agent is refused before any check.
    foreign = apps.mint("helpdesk.triage", "lara.kim", app="copilot")
    r = httpx.post(
        f"{demo_up.gateway}/mcp/demo",
        headers={"authorization": f"Bearer {foreign}", "accept": "application/json"},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        timeout=10,
    )
    assert r.status_code == 401
    # The forwarded call reached the history through the intake.
    demo_up.wait_totals(events=before + 1)


def test_the_decision_point_follows_the_context_service(demo_up: Up) -> None:
    """docs/context.md: a person deactivated over SCIM is denied, reactivated allowed again;
    a resource written through the batch route after the start is fetched on the first check
    that names it."""
    from svc.demo import company

    co = company.generate()
    scim = {"authorization": f"Bearer {demo_up.scim_token}"}
    assert httpx.get(f"{demo_up.pdp}/readyz", timeout=10).status_code == 200
    reader = next(
        p
        for p in co.people
        if p.active
        and p.user_name not in co.contained
        and p.user_name not in co.risk_scores
        and not {"interns", "contractors"} & set(p.groups)
    )
    doc = next(
        d
        for d in co.documents
        if d.attrs["department"] == reader.department and d.attrs["sensitivity"] == "internal"
    )

    def verdict(resource: dict[str, str]) -> str:
        check = {
            "principal": {"type": "Human", "id": reader.user_name},
            "action": {"type": "Action", "id": "read"},
            "resource": resource,
        }
        r = httpx.post(
            f"{demo_up.pdp}/v1/access/evaluation", json=check, headers=demo_up.auth, timeout=10
        )
        assert r.status_code == 200, r.text
        return str(r.json()["verdict"])

    # The document was provisioned before the decision point started: fetched on this miss
    # (on a busy machine the fetch may land after the first check's 200 ms deadline, and
    # that check is decided without it; the next one has it).
    wait_until(lambda: verdict(doc.ref) == "allow", timeout=30)
    found = httpx.get(
        f"{demo_up.context}/scim/v2/Users",
        params={"filter": f'userName eq "{reader.user_name}"'},
        headers=scim,
        timeout=10,
    ).json()
    user_id = found["Resources"][0]["id"]

    def set_active(active: bool) -> None:
        patch = {
            "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "replace", "path": "active", "value": active}],
        }
        r = httpx.patch(
            f"{demo_up.context}/scim/v2/Users/{user_id}", json=patch, headers=scim, timeout=10
        )
        assert r.status_code in (200, 204), r.text  # RFC 7644 section 3.5.2

    set_active(False)
    wait_until(lambda: verdict(doc.ref) == "deny", timeout=30)
    set_active(True)
    wait_until(lambda: verdict(doc.ref) == "allow", timeout=30)

    # A document written after the start, in another department: denied, then moved into the
    # reader's department through the batch route, allowed (the change feed applies it).
    new = {"type": "Document", "id": "written-after-start"}
    other = next(
        p for p in co.people if p.department != reader.department and p.manager != reader.user_name
    )
    attrs = {
        **doc.attrs,
        "owner": {"__entity": {"type": "Human", "id": other.user_name}},
        "department": "nowhere",
        "tags": [],
    }
    put = httpx.post(
        f"{demo_up.context}/v1/resources",
        json={"resources": [{**new, "attrs": attrs}]},
        headers=demo_up.auth,
        timeout=10,
    )
    assert put.status_code == 200, put.text
    assert verdict(new) == "deny"
    put = httpx.post(
        f"{demo_up.context}/v1/resources",
        json={"resources": [{**new, "attrs": {**attrs, "department": reader.department}}]},
        headers=demo_up.auth,
        timeout=10,
    )
    assert put.status_code == 200, put.text
    wait_until(lambda: verdict(new) == "allow", timeout=30)


def test_the_decision_point_follows_the_challenge_services_containments(demo_up: Up) -> None:
    """docs/challenges.md#containments: the demo's contained person was written with Contain;
    a person contained through the challenge service is denied `svc:contained` at the decision
    point, and allowed again once lifted."""
    import grpc

    from svc.challenge.v1 import challenge_pb2 as pb
    from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
    from svc.demo import company

    co = company.generate()
    reader = next(
        p
        for p in co.people
        if p.active
        and p.user_name not in co.contained
        and p.user_name not in co.risk_scores
        and not {"interns", "contractors"} & set(p.groups)
    )
    doc = next(
        d
        for d in co.documents
        if d.attrs["department"] == reader.department and d.attrs["sensitivity"] == "internal"
    )

    def answer(user: str) -> dict[str, Any]:
        check = {
            "principal": {"type": "Human", "id": user},
            "action": {"type": "Action", "id": "read"},
            "resource": doc.ref,
        }
        r = httpx.post(
            f"{demo_up.pdp}/v1/access/evaluation", json=check, headers=demo_up.auth, timeout=10
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    def contained(user: str) -> bool:
        a = answer(user)
        return a["verdict"] == "deny" and "svc:contained" in a["policies"]

    md = [("authorization", f"Bearer {demo_up.caller_token}")]
    with grpc.insecure_channel(demo_up.challenge.removeprefix("http://")) as channel:
        stub = pb_grpc.ChallengeServiceStub(channel)
        listed = stub.ListContainments(pb.ListContainmentsRequest(), metadata=md, timeout=30)
        # Recorded under the caller that contained them (svc up's operator token), never the
        # request's `author` (docs/auth.md#who-made-a-change).
        assert [(c.principal.id, c.author) for c in listed.containments] == [
            (u, "svc-local") for u in co.contained
        ]
        assert all(contained(u) for u in co.contained)
        wait_until(lambda: answer(reader.user_name)["verdict"] == "allow", timeout=30)

        who = pb.EntityRef(type="Human", id=reader.user_name)
        r = stub.Contain(
            pb.ContainRequest(principal=who, reason="odd downloads", author="test"),
            metadata=md,
            timeout=30,
        )
        assert r.changed
        wait_until(lambda: contained(reader.user_name), timeout=30)
        lifted = stub.Lift(pb.LiftRequest(principal=who, author="test"), metadata=md, timeout=30)
        assert lifted.changed
        wait_until(lambda: answer(reader.user_name)["verdict"] == "allow", timeout=30)


def test_a_decision_reaches_the_history(corp_up: Up) -> None:
    r = httpx.post(
        f"{corp_up.pdp}/v1/access/evaluation", json=ALICE_DELETE, headers=corp_up.auth, timeout=10
    )
    assert r.status_code == 200
    qid = r.json()["qid"]
    deadline_rows = corp_up.wait_totals(decisions=1)
    assert deadline_rows["decisions"] >= 1
    for _ in range(100):
        r = httpx.get(
            f"{corp_up.history}/v1/history/decisions",
            params={"qid": qid},
            headers=corp_up.auth,
            timeout=10,
        )
        if r.status_code == 200:
            break
    assert r.status_code == 200, r.text
    row = r.json()
    assert row["verdict"] == "challenge" and row["challenges"] == ["verification"]
    assert row["principal"] == {"type": "Human", "id": "alice"}


def test_history_routes_name_bad_parameters(corp_up: Up) -> None:
    auth = corp_up.auth
    r = httpx.get(
        f"{corp_up.history}/v1/history/decisions", params={"principal": "alice"}, headers=auth
    )
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "principal" in r.json()["title"]
    r = httpx.get(
        f"{corp_up.history}/v1/history/events",
        params={"principal": "Human::alice", "since": "yesterday"},
        headers=auth,
    )
    assert r.status_code == 400 and "since" in r.json()["title"]
    r = httpx.get(
        f"{corp_up.history}/v1/history/decisions", params={"qid": "no-such"}, headers=auth
    )
    assert r.status_code == 404


def test_history_readyz_and_metrics_report_the_loader(corp_up: Up) -> None:
    """svc up runs the history loader in process: its health is on the history's port."""
    a_decision = httpx.post(
        f"{corp_up.pdp}/v1/access/evaluation", json=ALICE_DELETE, headers=corp_up.auth, timeout=10
    )
    assert a_decision.status_code == 200
    corp_up.wait_totals(decisions=1)
    loader = get_json(f"{corp_up.history}/readyz")["loader"]
    assert loader["ready"] is True and loader["reasons"] == []
    assert loader["consecutive_failures"] == 0 and loader["last_success"]
    metrics = httpx.get(f"{corp_up.history}/metrics", timeout=10).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("svc_history_loader_")
    }
    assert values["svc_history_loader_ready"] == 1
    assert values["svc_history_loader_consecutive_failures"] == 0
    assert values["svc_history_loader_last_success_timestamp_seconds"] > 0
    for name in ("oldest_unstored_age_seconds", "lag_records", "refused", "split_inserts"):
        assert f"svc_history_loader_{name}" in values


def test_cloudtrail_files_posted_to_intake_are_found_in_history(corp_up: Up) -> None:
    files = cloudtrail_files()
    assert files
    expected: dict[tuple[str, str], set[str]] = defaultdict(set)
    before = corp_up.totals()["events"]
    total = 0
    for path in files:
        raw = path.read_bytes()
        r = httpx.post(
            f"{corp_up.intake}/v1/events/cloud-audit-trail",
            content=raw,
            headers={
                "authorization": f"Bearer {corp_up.token}",
                "content-type": "application/json",
                "content-encoding": "gzip",
            },
            timeout=30,
        )
        assert r.status_code == 202, r.text
        records = json.loads(gzip.decompress(raw))["Records"]
        assert r.json()["accepted"] == len(records)
        for rec in records:
            event = map_record(rec, lambda *_: False)
            assert event is not None
            p = event["principal"]
            expected[(p["type"], p["id"])].add(rec["eventID"])
            total += 1
    corp_up.wait_totals(events=before + total)
    for (ptype, pid), ids in expected.items():
        rows = get_json(
            f"{corp_up.history}/v1/history/events",
            corp_up.auth,
            principal=f"{ptype}::{pid}",
            since="2000-01-01T00:00:00Z",
            until="2100-01-01T00:00:00Z",
            limit=10_000,
        )
        got = {row["attributes"].get("cloud_event_id") for row in rows}
        assert ids <= got, (ptype, pid, ids - got)


def test_port_taken_refused_with_a_clear_message(tmp_path: Path) -> None:
    port = free_base_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port + 1))
        s.listen()
        r = run_svc("up", "--data-dir", str(tmp_path), "--port", str(port), "--bundle", str(CORP))
    assert r.returncode == 2
    assert f"port {port + 1}" in r.stderr and "intake" in r.stderr and "--port" in r.stderr


def test_second_svc_up_on_one_data_dir_refused(corp_up: Up) -> None:
    r = run_svc(
        "up", "--data-dir", str(corp_up.data_dir), "--port", str(free_base_port()),
        "--bundle", str(CORP),
    )  # fmt: skip
    assert r.returncode == 2
    assert "another svc up" in r.stderr and str(corp_up.data_dir) in r.stderr


def policy_cli(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    """`svc policy ARGS --url <the install's policy service>`, with the install's caller token
    (found through SVC_DATA_DIR, as on a person's machine)."""
    return subprocess.run(
        [*SVC, "policy", *args, "--url", up.policy],
        capture_output=True,
        text=True,
        env={**os.environ, "SVC_DATA_DIR": str(up.data_dir)},
        check=False,
    )


def test_the_decision_point_follows_the_policy_service(corp_up: Up, tmp_path: Path) -> None:
    """docs/quickstart.md: the bundle is version 1 of svc-policy; a published draft is what the
    decision point serves, and the policy service takes the caller token only."""
    active = policy_cli(corp_up, "active")
    assert active.returncode == 0, active.stderr
    assert "version 1  active  by svc-local" in active.stdout and "signed by key" in active.stdout
    assert httpx.get(f"{corp_up.policy}/readyz").json()["policy_version"] >= 1

    def verdict() -> str:
        r = httpx.post(
            f"{corp_up.pdp}/v1/access/evaluation", json=ALICE_DELETE, headers=corp_up.auth
        )
        return str(r.json()["verdict"])

    before = verdict()
    assert before != "deny"
    closed = tmp_path / "closed"
    shutil.copytree(CORP, closed)
    (closed / "zz-forbid.cedar").write_text(
        '@id("all-closed")\nforbid (principal, action, resource);\n'
    )
    drafted = policy_cli(corp_up, "draft", str(closed))
    assert drafted.returncode == 0, drafted.stderr
    version = drafted.stdout.split()[1]
    # A dry run reads the history of the same process: the check above, allowed or challenged
    # when recorded, is denied under the draft.
    corp_up.wait_totals(decisions=1)
    dry = policy_cli(corp_up, "dry-run", version, "--since", "1h")
    assert dry.returncode == 0, dry.stderr
    counts = re.match(
        r"(\d+) decisions under version \d+: \d+ unchanged, (\d+) allow->deny, \d+ deny->allow, "
        r"\d+ to challenge, (\d+) from challenge, 0 errors",
        dry.stdout,
    )
    assert counts, dry.stdout
    assert int(counts[1]) >= 1 and int(counts[2]) + int(counts[3]) >= 1, dry.stdout
    assert policy_cli(corp_up, "publish", version).returncode == 0
    wait_until(lambda: verdict() == "deny", timeout=30)
    rollback = policy_cli(corp_up, "publish", "1")
    assert rollback.returncode == 0, rollback.stderr
    wait_until(lambda: verdict() == before, timeout=30)


def test_ctrl_c_stops_cleanly_and_the_data_dir_is_kept(tmp_path: Path) -> None:
    # A data directory of an earlier release: a bundle/ directory, no policy service yet. It is
    # published as version 1 (then, `--bundle` with the same files publishes nothing new).
    shutil.copytree(CORP, tmp_path / "bundle")
    up = start_up(tmp_path)
    assert "version 1  active" in policy_cli(up, "active").stdout
    for _ in range(5):
        r = httpx.post(f"{up.pdp}/v1/access/evaluation", json=ALICE_DELETE, headers=up.auth)
        assert r.status_code == 200
    up.wait_totals(decisions=5)
    code, _, err = up.stop()
    assert code == 0, err
    assert "stopped; data kept in" in err
    assert (tmp_path / "intake.token").exists()
    token = (tmp_path / "intake.token").read_text()
    again = start_up(tmp_path, "--bundle", str(CORP))
    try:
        assert again.totals()["decisions"] == 5
        assert again.token == token.strip()
        listed = policy_cli(again, "bundles").stdout
        assert "version 1  active" in listed and "version 2" not in listed
    finally:
        code, _, err = again.stop()
    assert code == 0, err


def test_svc_demo_runs_to_its_summary_read_from_history(tmp_path: Path) -> None:
    r = run_svc("demo", "--data-dir", str(tmp_path), "--port", str(free_base_port()))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "svc up: ready" in out
    summary = out[out.index("History ") :]
    lines = {line.split()[0]: line for line in summary.splitlines()[1:] if line.strip()}
    for verdict in ("allow", "deny", "challenge"):
        assert f"{verdict} " in lines["checks"], summary
    for kind in ("verification", "approval", "justification"):
        assert kind in lines["challenges"], summary
    # The challenge verdicts carried qids; nobody answered them during the drive.
    assert "challenges opened: pending " in lines["challenged"], summary
    for outcome in ("conditional", "always_allowed", "always_denied", "challenge"):
        assert outcome in lines["plans"], summary
    assert "rows listed" in lines["list"] and "agents" in lines
    assert "stopped; data kept in" in r.stderr
    # The bundle (policies, no entities: those are the context service's), the directory,
    # the intake token and the history stay for the next start.
    assert (tmp_path / "bundle" / "company.cedarschema").exists()
    assert not (tmp_path / "bundle" / "entities.json").exists()
    assert (tmp_path / "context.db").exists()
    assert (tmp_path / "intake.token").exists()


def test_svc_up_demo_refuses_a_bundle(tmp_path: Path) -> None:
    r = run_svc("up", "--demo", "--data-dir", str(tmp_path), "--bundle", str(CORP))
    assert r.returncode == 2 and "--bundle" in r.stderr


def test_ctrl_c_interrupts_the_demo_and_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*SVC, "demo", "--data-dir", str(tmp_path), "--port", str(free_base_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # plain progress lines (not a terminal)
        seen.append(line)
        if line.startswith("demo: ") and "checks" in line:
            proc.send_signal(signal.SIGINT)
            break
    _, rest = proc.communicate(timeout=90)
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "demo: interrupted" in err and "stopped; data kept in" in err


# A child process (chDB allows one engine per process, so not this one) that starts a `Stack`
# and takes the history's port the moment the decision point and the intake have started:
# the start fails half-way. It prints what it saw as JSON.
HALF_WAY = """
import json, socket, sys, threading
from pathlib import Path
from svc.up import PortTaken, Stack, UpOptions, check_ports

data_dir, port, bundle = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
options = UpOptions(data_dir=data_dir, port=port, bundle=bundle)
before = set(threading.enumerate())
holder = socket.socket()
phases = []

def progress(phase):
    phases.append(phase)
    if phase == "starting the intake and the history routes":
        holder.bind(("127.0.0.1", port + 2))
        holder.listen()

out = {}
stack = Stack(options, progress)
try:
    stack.start()
except PortTaken as e:
    out["error"] = str(e)
out["threads_left"] = [t.name for t in threading.enumerate() if t not in before]
out["phases"] = phases
holder.close()
check_ports("127.0.0.1", {"decision point": port, "intake": port + 1})  # PortTaken if held
stack.stop()  # again: nothing left to stop
# What the failed start held is free again: the same data directory and ports start anew.
again = Stack(options)
again.start()
out["started_again"] = [t.name for t in threading.enumerate() if t not in before]
again.stop()
again.stop()
out["threads_after_stops"] = [t.name for t in threading.enumerate() if t not in before]
print(json.dumps(out))
"""


def test_a_failure_half_way_stops_what_started_and_stop_is_idempotent(tmp_path: Path) -> None:
    port = free_base_port()
    r = subprocess.run(
        [sys.executable, "-c", HALF_WAY, str(tmp_path), str(port), str(CORP)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert f"port {port + 2}" in out["error"] and "(the history)" in out["error"]
    # The decision point and the intake had started (and waited for the producers).
    assert out["phases"][-2:] == [
        "starting the intake and the history routes",
        "waiting for the intake's producers",
    ]
    assert out["threads_left"] == []
    # The second start ran every component again (their threads), and its stops ended them.
    assert {"svc-up-intake", "svc-up-history", "svc-history-loader"} <= set(out["started_again"])
    assert out["threads_after_stops"] == []


def test_data_files_holding_secrets_are_private(corp_up: Up) -> None:
    """The databases holding live tokens, the issuer's key and the caller tokens are 0600 in
    0700 directories (issue 43: challenge.db, context.db and policy.db were world-readable)."""
    d = corp_up.data_dir
    secret_names = {"challenge.db", "context.db", "policy.db", "caller.token", "intake.token"}
    found = {
        p
        for p in d.rglob("*")
        if p.is_file()
        and (
            p.name in secret_names
            or p.name.endswith((".token", ".key"))
            or (p.parent.name == "issuer" and "pub" not in p.name and p.suffix != ".json")
        )
    }
    names = {p.name for p in found}
    listing = sorted(f"{oct(p.stat().st_mode & 0o777)} {p.relative_to(d)}" for p in d.rglob("*"))
    assert {"challenge.db", "context.db", "policy.db", "caller.token"} <= names, listing
    assert d / "issuer" / "key.pem" in found, listing
    for p in found:
        assert p.stat().st_mode & 0o777 == 0o600, (str(p.relative_to(d)), listing)
        for parent in (p.parent, *p.parent.parents):
            if parent == d.parent:
                break
            assert parent.stat().st_mode & 0o777 == 0o700, (str(parent), listing)
