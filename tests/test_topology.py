"""The production topology on this machine, driven as a real install (docs/dev.md).

`svc topology start` runs each component as its own process (svc.topology): PostgreSQL and a
KRaft Kafka of their own, the policy, context and challenge services on PostgreSQL, two decision
points following them, the intake, and the history loader. The test then uses it as an install
is used: a policy published through the policy service (`svc policy draft` and `publish`), a
person provisioned over SCIM and an agent registered on the context service, agent and person
calls through both decision points, a challenge passed through the challenge service
(`Justify`), events posted to the intake; every decision and event is found in the history
exactly once (by `qid`, and by the event's resource id, which is unique per event).

Then each process is killed in turn with `kill -9` (a decision point, the intake, the history
loader, the policy, context and challenge services, Kafka, PostgreSQL) while traffic keeps
going, and `svc topology start` brings it back; at the end every decision the decision points
answered and every event the intake acknowledged (202) is in the history exactly once, and
nothing unacknowledged is there twice.

The history is read the way its own queries read it (`FINAL`: docs/history.md#schema), by a
separate process opening the chDB directory once the history process stopped (chDB hosts one
directory per process and the test process must not hold one).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from svc.challenge.v1 import challenge_pb2 as cpb
from svc.challenge.v1 import challenge_pb2_grpc as cpb_grpc
from svc.topology import Config, Topology

BASE_PORT = 19080

SCHEMA = """
entity Group in [Group];
entity Human in [Group] = {
  department: String,
  title: String,
  manager?: Human,
  active: Bool,
};
entity ServiceAccount in [Group] = {
  owner: Human,
  ai: Bool,
  registered: Bool,
  app: String,
  description?: String,
};
entity Document;
entity Tool;
action read, delete appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
action write appliesTo { principal: [Human, ServiceAccount], resource: [Document] };
action call appliesTo { principal: [Human, ServiceAccount], resource: [Tool] };
"""

FIRST = """
@id("people-read")
permit (principal is Human, action == Action::"read", resource is Document)
when { principal.active };
"""

#: The version the test publishes: agents may read, and deleting needs a reason.
SECOND = (
    FIRST
    + """
@id("agents-read")
permit (principal is ServiceAccount, action == Action::"read", resource is Document)
when { principal.ai };

@id("delete-needs-reason") @challenge("justification")
permit (principal is Human, action == Action::"delete", resource is Document);

@id("people-and-agents-call-tools")
permit (principal, action == Action::"call", resource is Tool);
"""
)

AGENT = "copilot.assistant"


def _bundle(path: Path, policies: str) -> Path:
    path.mkdir(parents=True)
    (path / "schema.cedarschema").write_text(SCHEMA)
    (path / "policies.cedar").write_text(policies)
    return path


def _svc(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "svc", *args], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, f"svc {' '.join(args)}: {r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    # The server runs as the postgres user under root: its directory must be reachable, so the
    # state directory sits in /var/tmp (pytest's own is 0700).
    state = Path(tempfile.mkdtemp(prefix="svc-topology-test-", dir="/var/tmp"))
    first = _bundle(state / "first-bundle", FIRST)
    try:
        _svc(
            "topology",
            "start",
            "--state-dir",
            str(state),
            "--base-port",
            str(BASE_PORT),
            "--bundle",
            str(first),
        )
        yield Topology(Config.load(state))
    finally:
        subprocess.run(
            [sys.executable, "-m", "svc", "topology", "stop", "--state-dir", str(state)],
            check=False,
        )
        shutil.rmtree(state, ignore_errors=True)


def _operator(t: Topology) -> dict[str, str]:
    return {"Authorization": f"Bearer {t.secret('operator.token')}"}


@dataclass
class Sent:
    """What the traffic sent: answered decisions' qids, acknowledged and unacknowledged events."""

    qids: dict[str, str] = field(default_factory=dict)  # qid -> the decision point
    events: list[str] = field(default_factory=list)
    unacked_events: list[str] = field(default_factory=list)
    failures: int = 0


class Client:
    """An application calling the install: checks on either decision point, events in batches."""

    def __init__(self, t: Topology) -> None:
        self.t = t
        self.http = httpx.Client(timeout=30)
        self.pdp_headers = _operator(t)
        self.intake_headers = {"Authorization": f"Bearer {t.secret('intake.token')}"}
        self.sent = Sent()
        self.lock = threading.Lock()

    def check(self, pdp: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post(
            f"{self.t.urls[pdp]}/v1/access/evaluation", json=body, headers=self.pdp_headers
        )
        r.raise_for_status()
        answer: dict[str, Any] = r.json()
        with self.lock:
            self.sent.qids[answer["qid"]] = pdp
        return answer

    def agent_read(self, pdp: str, doc: str) -> dict[str, Any]:
        return self.check(
            pdp,
            {
                "principal": {"type": "ServiceAccount", "id": AGENT},
                "on_behalf_of": {"type": "Human", "id": "ana"},
                "action": "read",
                "resource": {"type": "Document", "id": doc},
            },
        )

    def person(self, pdp: str, action: str, doc: str) -> dict[str, Any]:
        return self.check(
            pdp,
            {
                "principal": {"type": "Human", "id": "ana"},
                "action": action,
                "resource": {"type": "Document", "id": doc},
            },
        )

    def events(self, n: int) -> int:
        """Posts `n` events (one batch); returns the HTTP status (0: no answer)."""
        ids = [f"evt-{uuid.uuid4().hex}" for _ in range(n)]
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        batch = {
            "events": [
                {
                    "at": now,
                    "system": "topology-test",
                    "principal": {"type": "ServiceAccount", "id": AGENT},
                    "on_behalf_of": {"type": "Human", "id": "ana"},
                    "action": "read",
                    "resource": {"type": "Document", "id": i},
                }
                for i in ids
            ]
        }
        try:
            r = self.http.post(
                f"{self.t.urls['intake']}/v1/events", json=batch, headers=self.intake_headers
            )
            status = r.status_code
        except httpx.HTTPError:
            status = 0
        with self.lock:
            (self.sent.events if status == 202 else self.sent.unacked_events).extend(ids)
        return status


def _tool_call(t: Topology, tool: str, arguments: dict[str, Any]) -> Any:
    """One MCP ``tools/call`` through the topology's gateway (``/mcp/demo``), as the agent
    working for ana, with a token of the agent-token issuer; returns the ``CallToolResult``."""
    import asyncio

    import httpx2
    from mcp.client import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from svc.demo.token_issuer import DevTokenIssuer

    token = DevTokenIssuer.from_directory(t.agent_issuer_dir).mint(AGENT, "ana")

    async def call() -> Any:
        headers = {"authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http,
            streamable_http_client(f"{t.urls['gateway']}/mcp/demo", http_client=http) as (r, w),
            ClientSession(r, w) as s,
        ):
            await s.initialize()
            return await s.call_tool(tool, arguments)

    return asyncio.run(call())


def _gateway_events_sent(t: Topology) -> float:
    """``svc_gateway_events_sent_total`` of the gateway: events the intake accepted."""
    text = httpx.get(f"{t.urls['gateway']}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("svc_gateway_events_sent_total")
    )


def _until(what: str, ok: Any, within: float = 180.0) -> None:
    """Polls `ok()` until true; fails naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not ok():
        assert time.monotonic() < deadline, f"{what}: not so after {within:g} s"
        time.sleep(0.2)


def _history(t: Topology) -> dict[str, Any]:
    """The decision and event rows as the history's queries read them (``FINAL``).

    Stops the history process first (its loader stores and commits what it read) and opens the
    chDB directory in a process of its own. Returns ``{"qids": {qid: rows}, "events":
    {resource_id: rows}, "tools": {tool: rows}}`` (``tools``: the gateway's events).
    """
    t.stop(["history"])
    script = """
import json, sys
from svc import history
c = history.connect(sys.argv[1])
d = c.query("SELECT qid, count() FROM decisions FINAL GROUP BY qid").result_rows
e = c.query(
    "SELECT resource_id, count() FROM events FINAL WHERE system = 'topology-test' "
    "GROUP BY resource_id"
).result_rows
g = c.query(
    "SELECT tool, count() FROM events FINAL WHERE system = 'demo' GROUP BY tool"
).result_rows
print(json.dumps({"qids": dict(d), "events": dict(e), "tools": dict(g)}))
"""
    r = subprocess.run(
        [sys.executable, "-c", script, t.history_dsn], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def _wait_loaded(t: Topology, c: Client, documents: tuple[str, ...] = ()) -> None:
    """Waits until the history's totals reach what was answered and acknowledged, and the
    gateway's event of a tool call on each of `documents` can be read (it comes through the
    gateway's own batches, in a later load than the client's events)."""
    headers = _operator(t)

    def loaded() -> bool:
        try:
            r = httpx.get(f"{t.urls['history']}/v1/history/totals", headers=headers, timeout=10)
        except httpx.HTTPError:
            return False
        if not r.is_success:
            return False
        totals = r.json()
        return bool(
            totals["decisions"] >= len(c.sent.qids) and totals["events"] >= len(c.sent.events)
        )

    _until("the history holds every decision and event sent", loaded, within=300)

    def tool_event(document: str) -> bool:
        r = httpx.get(
            f"{t.urls['history']}/v1/history/events",
            params={"resource": f"Document::{document}", "limit": 1000},
            headers=headers,
            timeout=10,
        )
        rows = r.json() if r.is_success else []
        return any(isinstance(e, dict) and e.get("system") == "demo" for e in rows)

    for document in documents:
        _until(
            f"the history holds the tool call's event on {document}",
            lambda d=document: tool_event(d),
            within=300,
        )


def _assert_exactly_once(t: Topology, c: Client) -> dict[str, int]:
    """Every answered decision and acknowledged event once; returns the gateway's events by
    tool."""
    h = _history(t)
    qids, events = h["qids"], h["events"]
    missing = [q for q in c.sent.qids if q not in qids]
    assert not missing, f"{len(missing)} answered decisions missing from the history"
    twice = {q: n for q, n in qids.items() if n != 1}
    assert not twice, f"decisions in the history more than once: {twice}"
    lost = [e for e in c.sent.events if e not in events]
    assert not lost, f"{len(lost)} acknowledged events missing from the history"
    twice = {e: n for e, n in events.items() if n != 1}
    assert not twice, f"events in the history more than once: {twice}"
    # An unacknowledged batch may have been stored before the answer was lost: at most once.
    assert set(events) <= set(c.sent.events) | set(c.sent.unacked_events)
    return dict(h["tools"])


def test_an_install_end_to_end_then_kill_9_each_process(topo: Topology) -> None:
    t = topo
    c = Client(t)
    op = _operator(t)

    # -- a person over SCIM, an agent registered for them (the context service)
    scim = {
        "Authorization": f"Bearer {t.secret('scim.token')}",
        "Content-Type": "application/scim+json",
    }
    user = {
        "schemas": [
            "urn:ietf:params:scim:schemas:core:2.0:User",
            "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User",
        ],
        "userName": "ana",
        "title": "analyst",
        "active": True,
        "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User": {"department": "finance"},
    }
    r = httpx.post(f"{t.urls['context']}/scim/v2/Users", json=user, headers=scim)
    assert r.status_code == 201, r.text
    r = httpx.post(
        f"{t.urls['context']}/v1/service-accounts",
        json={
            "service_accounts": [
                {"id": AGENT, "owner": "ana", "ai": True, "groups": [], "description": "test"}
            ]
        },
        headers=op,
    )
    assert r.is_success, r.text

    # -- the first bundle: ana may read once both decision points see her; the agent may not
    for pdp in ("pdp-1", "pdp-2"):
        _until(f"{pdp} sees ana", lambda p=pdp: c.person(p, "read", "d1")["verdict"] == "allow")
        assert c.agent_read(pdp, "d1")["verdict"] == "deny"

    # -- a policy published through the policy service, as an operator does
    second = _bundle(t.state / "second-bundle", SECOND)
    url, token = f"127.0.0.1:{t.ports['policy']}", t.secret("operator.token")
    drafted = _svc("policy", "draft", str(second), "--url", url, "--token", token)
    version = drafted.split()[1]
    _svc("policy", "publish", version, "--url", url, "--token", token)
    active = _svc("policy", "active", "--url", url, "--token", token)
    assert f"version {version}" in active

    # -- agent calls through both decision points, once they serve the new version
    for pdp in ("pdp-1", "pdp-2"):
        _until(
            f"{pdp} serves version {version}",
            lambda p=pdp: c.agent_read(p, "d2")["verdict"] == "allow",
        )
        for i in range(20):
            answer = c.agent_read(pdp, f"doc-{i}")
            assert answer["verdict"] == "allow"
            assert "agents-read" in answer["policies"]

    # -- a challenge passed: ana deletes, gives her reason, and the retry is allowed
    first = c.person("pdp-1", "delete", "old-draft")
    assert first["verdict"] == "challenge"
    assert first["challenges"] == ["justification"]
    challenge_qid = first["challenge_qid"]
    with grpc.insecure_channel(f"127.0.0.1:{t.ports['challenge']}") as channel:
        stub = cpb_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
        done = stub.Justify(
            cpb.JustifyRequest(qid=challenge_qid, person="ana", text="an outdated draft"),
            timeout=30,
            metadata=[("authorization", op["Authorization"])],
        ).challenge
    assert done.state == cpb.CHALLENGE_STATE_PASSED
    for pdp in ("pdp-1", "pdp-2"):
        retry = c.person(pdp, "delete", "old-draft")
        assert retry["verdict"] == "allow", (pdp, retry)
        assert "svc:challenge_passed" in retry["policies"]

    # -- events posted to the intake
    for _ in range(5):
        assert c.events(20) == 202

    # -- an agent's tool calls through the gateway: a read is checked and forwarded (the
    # document's text comes back, no svc/verdict), a write is denied with the decision's id
    read = _tool_call(t, "read_document", {"document_id": "doc-0317"})
    assert not read.is_error and not (read.meta or {}).get("svc/verdict"), read
    assert "doc-0317" in str(read.content)
    write = _tool_call(t, "update_document", {"document_id": "doc-0317", "text": "x"})
    assert write.is_error and write.meta["svc/verdict"] == "deny", write
    assert write.meta["svc/decision_qid"]
    _until("the gateway's event reached the intake", lambda: _gateway_events_sent(t) >= 1)

    # -- every decision and event is in the history exactly once
    assert {p for p in c.sent.qids.values()} == {"pdp-1", "pdp-2"}
    _wait_loaded(t, c, ("doc-0317",))
    assert _assert_exactly_once(t, c) == {"demo/read_document": 1}
    _svc("topology", "start", "--state-dir", str(t.state))

    # -- kill -9 each process in turn under traffic; start brings it back
    stop = threading.Event()
    counter = {"n": 0}

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            for pdp in ("pdp-1", "pdp-2") if i % 2 else ("pdp-2", "pdp-1"):
                try:
                    c.agent_read(pdp, f"load-{i}")
                except httpx.HTTPError:
                    with c.lock:
                        c.sent.failures += 1
                    continue  # the other replica, as a load balancer would
                break
            if i % 10 == 0:
                c.events(10)
            counter["n"] = i
            time.sleep(0.01)

    def progressed(by: int) -> None:
        start = counter["n"]
        _until("traffic goes on", lambda: counter["n"] >= start + by)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        for name in (
            "pdp-1",
            "intake",
            "history",
            "policy",
            "context",
            "challenge",
            "pdp-2",
            "gateway",
            "agent-issuer",
            "tools",
            "kafka",
            "postgres",
        ):
            progressed(50)
            pid = t.pid(name)
            assert pid is not None, name
            os.kill(pid, signal.SIGKILL)
            _until(f"{name} is gone", lambda n=name: t.pid(n) is None)
            out = _svc("topology", "start", "--state-dir", str(t.state))
            assert name in out, out
            assert all(row["ready"] for row in t.status()), t.status()
            progressed(100)
    finally:
        stop.set()
        worker.join()
    # After the restarts, events are acknowledged again and decisions answered by both.
    for _ in range(3):
        assert c.events(10) == 202
    assert c.agent_read("pdp-1", "after")["verdict"] == "allow"
    assert c.agent_read("pdp-2", "after")["verdict"] == "allow"
    sent = _gateway_events_sent(t)  # counted since the gateway's restart
    again = _tool_call(t, "read_document", {"document_id": "doc-0001"})
    assert not again.is_error, again
    _until("the gateway's event reached the intake", lambda: _gateway_events_sent(t) > sent)
    # Each kill waited for 150 rounds of traffic: a check each, a batch of 10 events every 10.
    assert len(c.sent.qids) >= 11 * 150
    assert len(c.sent.events) >= 11 * 150
    _wait_loaded(t, c, ("doc-0317", "doc-0001"))
    tools = _assert_exactly_once(t, c)
    assert tools == {"demo/read_document": 2}, tools
