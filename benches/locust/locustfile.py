"""Locust scenarios for the whole install: ``svc topology`` under the mix a real install sees.

Run against a topology started with the demo company's bundle (``svc topology start`` without
``--bundle``); the first run provisions the demo company into its context service over SCIM and
the context service's batch routes (``svc.demo.directory.provision_context``), as an identity
provider and connectors would. The requests are the demo's (``svc.demo.traffic.scenarios``:
people, agents acting for people and agents alone, on documents, tickets and customers), sent
by each simulated enforcement point to one of the two decision points (chosen per user, as a
load balancer keeping connections would):

| task | weight | route (locust name) |
|---|---|---|
| a check over HTTP | 30 | ``POST /v1/access/evaluation`` |
| a check over gRPC | 25 | ``grpc Check`` |
| an AuthZEN evaluation | 10 | ``POST /access/v1/evaluation`` |
| an AuthZEN batch (2 to 5 items) | 5 | ``POST /access/v1/evaluations`` |
| a query plan over HTTP | 5 | ``POST /v1/access/plan`` |
| a query plan over gRPC | 3 | ``grpc Plan`` |
| an app's event batch (20 events) | 10 | ``POST /v1/events`` |

Beside these enforcement points, one user in ten is an AI agent calling the demo company's
tools through the MCP gateway (``Agent``: ``/mcp/demo``, Streamable HTTP, one MCP session per
user; locust name ``mcp tools/call``): ``read_document`` and ``read_ticket`` on the demo's
documents and tickets, as ``copilot.assistant`` working for ``alan.hughes`` with a token of the
topology's agent-token issuer. Each call is checked twice at the decision point (``call`` on the
tool, ``read`` on the document or ticket) and forwarded when allowed; a blocked call is an
answer too (a tool error with ``_meta`` ``svc/verdict``), so only an HTTP or JSON-RPC error
counts as a failure.

Settings (environment): ``SVC_TOPOLOGY_DIR`` the topology's state directory (tokens and ports
are read from it); ``SVC_LOCUST_RATE`` tasks per second per user (0, the default: as fast as it
can, for finding the maximum rate; locust's ``constant_throughput`` otherwise).

The gRPC user follows locust's documentation for other protocols
(<https://docs.locust.io/en/stable/testing-other-systems.html>): grpcio made cooperative with
gevent (``grpc.experimental.gevent.init_gevent``) and each call reported through
``events.request``.

Run: ``locust -f benches/locust/locustfile.py --headless -u 20 -r 20 -t 60s --only-summary``
(benches/locust/README.md; docs/benchmarks.md records a run).
"""

from __future__ import annotations

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import os  # noqa: E402  (gevent first: grpcio must be made cooperative before it is used)
import random  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from functools import cache  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import grpc  # noqa: E402
import httpx  # noqa: E402
from google.protobuf import json_format, struct_pb2  # noqa: E402
from locust.env import Environment  # noqa: E402

from locust import FastHttpUser, constant, constant_throughput, events, task  # noqa: E402
from svc.authz.v1 import authz_pb2, authz_pb2_grpc  # noqa: E402
from svc.demo import company as demo_company  # noqa: E402
from svc.demo import traffic  # noqa: E402
from svc.topology import Config, Topology  # noqa: E402

Json = dict[str, Any]

RATE = float(os.environ.get("SVC_LOCUST_RATE", "0"))
_GRPC_KEYS = {"principal", "action", "resource", "on_behalf_of", "context", "human_present"}


@cache
def install() -> Topology:
    """The running topology named by ``SVC_TOPOLOGY_DIR`` (or ``svc topology``'s default)."""
    from svc.topology import _default_state_dir

    state = Path(os.environ.get("SVC_TOPOLOGY_DIR") or _default_state_dir())
    return Topology(Config.load(state))


@cache
def workload() -> tuple[list[Json], list[list[Json]], list[Json]]:
    """The demo's requests: (checks, AuthZEN batches as lists of checks, plans)."""
    steps = traffic.scenarios(demo_company.generate(), checks=5000, seed=11).steps
    checks = [s.request for s in steps if isinstance(s, traffic.CheckCase)]
    batches = [[c.request for c in s.cases] for s in steps if isinstance(s, traffic.AuthzenBatch)]
    plans = [s.request for s in steps if isinstance(s, traffic.PlanCase)]
    return checks, batches, plans


@events.test_start.add_listener
def provision(environment: Environment, **_: Any) -> None:
    """Provisions the demo company into the context service once (when it holds no people)."""
    from svc.demo.directory import provision_context

    t = install()
    headers = {"Authorization": f"Bearer {t.secret('operator.token')}"}
    people = httpx.get(f"{t.urls['context']}/v1/directory/people", headers=headers, timeout=60)
    people.raise_for_status()
    if not people.json()["people"]:
        provision_context(
            t.urls["context"],
            demo_company.generate(),
            scim_token=t.secret("scim.token"),
            token=lambda: t.secret("operator.token"),
        )
        time.sleep(2)  # the decision points' watch picks the people up
    workload()


def _ref(e: Json | None) -> authz_pb2.EntityRef | None:
    return authz_pb2.EntityRef(type=e["type"], id=e["id"]) if e else None


def _struct(d: Json | None) -> struct_pb2.Struct | None:
    if not d:
        return None
    s = struct_pb2.Struct()
    json_format.ParseDict(d, s)
    return s


class Enforcer(FastHttpUser):
    """One enforcement point: checks, plans and AuthZEN to a decision point, events to intake."""

    weight = 9
    wait_time = constant_throughput(RATE) if RATE > 0 else constant(0)
    host = "http://127.0.0.1"

    def on_start(self) -> None:
        """Picks a decision point and opens its gRPC channel; reads the tokens."""
        t = install()
        self.pdp = random.choice([t.urls["pdp-1"], t.urls["pdp-2"]])
        self.intake = t.urls["intake"]
        token = t.secret("operator.token")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.intake_headers = {"Authorization": f"Bearer {t.secret('intake.token')}"}
        self.metadata = [("authorization", f"Bearer {token}")]
        self.channel = grpc.insecure_channel(self.pdp.removeprefix("http://"))
        self.stub = authz_pb2_grpc.AuthorizerStub(self.channel)  # type: ignore[no-untyped-call]
        self.checks, self.batches, self.plans = workload()
        self.grpc_checks = [c for c in self.checks if set(c) <= _GRPC_KEYS]

    def on_stop(self) -> None:
        """Closes the gRPC channel."""
        self.channel.close()

    def _post(self, url: str, body: Json, name: str, want: int = 200) -> None:
        headers = self.intake_headers if url.startswith(self.intake) else self.headers
        with self.client.post(url, json=body, headers=headers, name=name, catch_response=True) as r:
            if r.status_code != want:
                r.failure(f"{r.status_code}: {(r.text or '')[:200]}")

    def _grpc(self, name: str, call: Any, request: Any) -> None:
        start = time.perf_counter()
        exc: Exception | None = None
        length = 0
        try:
            length = call(request, metadata=self.metadata, timeout=10).ByteSize()
        except grpc.RpcError as e:
            exc = e
        self.environment.events.request.fire(
            request_type="grpc",
            name=name,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=length,
            exception=exc,
            context={},
        )

    @task(30)
    def check_http(self) -> None:
        """A check on ``/v1/access/evaluation``."""
        self._post(
            f"{self.pdp}/v1/access/evaluation",
            random.choice(self.checks),
            "POST /v1/access/evaluation",
        )

    @task(25)
    def check_grpc(self) -> None:
        """A check on gRPC ``svc.authz.v1.Authorizer/Check``."""
        c = random.choice(self.grpc_checks)
        req = authz_pb2.CheckRequest(
            principal=_ref(c["principal"]),
            action=c["action"],
            resource=_ref(c["resource"]),
            on_behalf_of=_ref(c.get("on_behalf_of")),
            context=_struct(c.get("context")),
        )
        if "human_present" in c:
            req.human_present = c["human_present"]
        self._grpc("grpc Check", self.stub.Check, req)

    @task(10)
    def authzen(self) -> None:
        """An AuthZEN 1.0 evaluation (subject, action, resource, context)."""
        c = random.choice(self.checks)
        body = {
            "subject": c["principal"],
            "action": {"name": c["action"]},
            "resource": c["resource"],
            "context": c.get("context", {}),
        }
        self._post(f"{self.pdp}/access/v1/evaluation", body, "POST /access/v1/evaluation")

    @task(5)
    def authzen_batch(self) -> None:
        """An AuthZEN batch of one subject's checks (``execute_all``)."""
        cases = random.choice(self.batches)
        body = {
            "subject": cases[0]["principal"],
            "evaluations": [
                {
                    "action": {"name": c["action"]},
                    "resource": c["resource"],
                    "context": c.get("context", {}),
                }
                for c in cases
            ],
            "options": {"evaluations_semantic": "execute_all"},
        }
        self._post(f"{self.pdp}/access/v1/evaluations", body, "POST /access/v1/evaluations")

    @task(5)
    def plan_http(self) -> None:
        """A query plan on ``/v1/access/plan``."""
        self._post(f"{self.pdp}/v1/access/plan", random.choice(self.plans), "POST /v1/access/plan")

    @task(3)
    def plan_grpc(self) -> None:
        """A query plan on gRPC ``svc.authz.v1.Authorizer/Plan``."""
        p = random.choice(self.plans)
        req = authz_pb2.PlanRequest(
            principal=_ref(p["principal"]),
            action=p["action"],
            resource_type=p["resource_type"],
            on_behalf_of=_ref(p.get("on_behalf_of")),
            context=_struct(p.get("context")),
        )
        self._grpc("grpc Plan", self.stub.Plan, req)

    @task(10)
    def event_batch(self) -> None:
        """An app's batch of 20 events on the intake's ``/v1/events``."""
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        batch = []
        for c in random.sample(self.checks, 20):
            e: Json = {
                "at": now,
                "system": "locust",
                "principal": c["principal"],
                "action": c["action"],
                "resource": c["resource"],
                "outcome": "success",
                "attributes": {"request": uuid.uuid4().hex},
            }
            if c.get("on_behalf_of"):
                e["on_behalf_of"] = c["on_behalf_of"]
            batch.append(e)
        self._post(f"{self.intake}/v1/events", {"events": batch}, "POST /v1/events", want=202)


#: The agent and person of the gateway's tool calls (the demo company's; ``Agent``).
AGENT, PERSON = "copilot.assistant", "alan.hughes"
#: MCP's Streamable HTTP transport asks for both kinds of response
#: (<https://modelcontextprotocol.io/specification/2025-06-18/basic/transports>).
_MCP_ACCEPT = "application/json, text/event-stream"


def _jsonrpc_result(r: Any, request_id: int) -> Json:
    """The JSON-RPC response to `request_id` in a Streamable HTTP answer: a JSON body, or the
    ``data:`` line of a ``text/event-stream`` event that carries it. Raises ``ValueError`` when
    the answer holds none or an error."""
    import json

    text = r.text or ""
    if "text/event-stream" in (r.headers.get("content-type") or ""):
        messages = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    else:
        messages = [json.loads(text)]
    for m in messages:
        if isinstance(m, dict) and m.get("id") == request_id:
            if "error" in m:
                raise ValueError(f"JSON-RPC error: {m['error']}")
            result: Json = m["result"]
            return result
    raise ValueError(f"no response to request {request_id}: {text[:200]}")


class Agent(FastHttpUser):
    """An AI agent calling tools through the MCP gateway (module docs)."""

    weight = 1
    wait_time = constant_throughput(RATE) if RATE > 0 else constant(0)
    host = "http://127.0.0.1"

    def on_start(self) -> None:
        """Opens an MCP session: ``initialize``, then ``notifications/initialized``."""
        from svc.demo.token_issuer import DevTokenIssuer

        t = install()
        self.url = f"{t.urls['gateway']}/mcp/demo"
        token = DevTokenIssuer.from_directory(t.agent_issuer_dir).mint(
            AGENT, PERSON, human_present=True, lifetime_secs=24 * 3600
        )
        self.headers = {"Authorization": f"Bearer {token}", "Accept": _MCP_ACCEPT}
        self.next_id = 1
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "svc-locust", "version": "1"},
            },
        }
        r = self.client.post(self.url, json=init, headers=self.headers, name="mcp initialize")
        _jsonrpc_result(r, 0)
        session = r.headers.get("mcp-session-id")
        if session:
            self.headers["Mcp-Session-Id"] = session
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        self.client.post(self.url, json=note, headers=self.headers, name="mcp initialized")
        data = demo_company.generate()
        self.docs = [d.id for d in data.documents][:500]
        self.tickets = [k.id for k in data.tickets][:500]

    @task
    def call_tool(self) -> None:
        """``read_document`` or ``read_ticket`` on a random one, through the gateway."""
        rid = self.next_id
        self.next_id += 1
        if random.random() < 0.5:
            name, args = "read_document", {"document_id": random.choice(self.docs)}
        else:
            name, args = "read_ticket", {"ticket_id": random.choice(self.tickets)}
        body = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": name, "arguments": args},
        }
        with self.client.post(
            self.url, json=body, headers=self.headers, name="mcp tools/call", catch_response=True
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {(r.text or '')[:200]}")
                return
            try:
                _jsonrpc_result(r, rid)
            except ValueError as e:
                r.failure(str(e))
