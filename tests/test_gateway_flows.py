"""An agent loop through the MCP gateway (docs/gateway.md), every part real.

The challenge service (SQLite, `ChallengeServer`), `svc pdp --bundle DIR --challenge URL` as a
child process, the intake (`svc intake --dev` as a child process on the embedded topic log), the
upstream MCP server (tests/gwupstream.py) and the gateway, which follows the challenge service's
containment feed, reads its outage tiers from a file and sends its events to the intake.

The agent is written with the `mcp` SDK's `ClientSession` over Streamable HTTP and behaves as
docs/gateway.md#blocked-calls says: on `deny` it stops and reports the decision id; on
`challenge` it tells the person (here: the person answers through the challenge service's
`Justify`), waits at `svc/challenge_wait` and retries the same call once it passed; on
`unavailable` it retries after a short wait. Then the decision point is killed: tools whose
tier fails open are forwarded (recorded `outage_fail_open`), a recent allow of a `cached` tool
is replayed, everything else answers `unavailable`, and nothing of a contained person's agent is
forwarded; started again, the agent's retry goes through.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gwkit import Issuer, JwksServer, UpstreamProcess, agent_session, wait_until, write_bundle
from svc.broker import LocalLog
from svc.challenge.app import ChallengeServer
from svc.challenge.directory import StaticDirectory
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeSettings
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from svc.common.net import tcp_listener
from svc.gateway.app import GatewayServer
from svc.gateway.settings import GatewaySettings
from test_pdp_standalone import SVC, Pdp

AUD = "svc-gateway"
TOOLS = {
    "read_doc": {"resource_arg": "doc_id", "resource_type": "Document", "read_only": True},
    "write_doc": {"resource_arg": "doc_id", "resource_type": "Document"},
}
INTAKE_TOKEN = "dev-intake-token"
EVENTS_TOPIC = "svc.events.v1"


def _free_port() -> int:
    with tcp_listener("127.0.0.1", 0) as s:
        return int(s.getsockname()[1])


class World:
    """Every part (module docs); ``agent`` and ``other`` mint the agents' tokens.

    `era`: the protocol era(s) the upstream serves (``both``, ``legacy``, ``modern``:
    tests/gwupstream.py).
    """

    def __init__(self, tmp: Path, era: str = "both") -> None:
        self.tmp = tmp
        self.jwks = JwksServer(tmp)
        self.app = Issuer("https://copilot.example.com", "ES256")
        apps = [
            {
                "name": "copilot",
                "iss": self.app.iss,
                "aud": AUD,
                "jwks_url": self.jwks.publish("copilot", self.app),
            }
        ]
        (tmp / "apps.json").write_text(json.dumps(apps))
        self.fallback = tmp / "fallback.json"
        self.fallback.write_text(json.dumps({"docs/ping": "fail_open", "docs/read_doc": "cached"}))
        self.challenge_service = ChallengeService(
            ChallengeSettings(
                database_url=f"sqlite:///{tmp / 'challenge.db'}",
                port=0,
                heartbeat_secs=0.2,
                watch_poll_secs=0.1,
            ),
            directory=StaticDirectory(owners={"copilot.assistant": "ana"}, managers={}),
        )
        self.challenge = ChallengeServer(
            self.challenge_service.settings, self.challenge_service, outbox=False
        ).start()
        self.channel = grpc.insecure_channel(self.challenge.target)
        self.stub = pb_grpc.ChallengeServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.bundle = write_bundle(tmp / "bundle")
        self.pdp_port = _free_port()
        self.pdp = self.start_pdp()
        self.log_path = tmp / "broker.db"
        LocalLog.open(self.log_path).create_topics([EVENTS_TOPIC])
        self.intake_port = _free_port()
        self.intake = subprocess.Popen(
            [str(SVC), "intake", "--dev", "--port", str(self.intake_port)],
            env={**os.environ, "SVC_KAFKA_URL": f"local://{self.log_path}"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        (tmp / "intake-token").write_text(INTAKE_TOKEN)
        self.upstream = UpstreamProcess(era=era)
        self.gateway = GatewayServer(
            GatewaySettings(
                port=0,
                pdp_url=f"http://127.0.0.1:{self.pdp_port}",
                pdp_timeout_ms=30_000,
                trusted_apps_file=str(tmp / "apps.json"),
                jwks_ca_file=str(self.jwks.ca_file),
                challenge_url=self.challenge.url,
                fallback_file=str(self.fallback),
                fallback_refresh_secs=0.2,
                intake_url=f"http://127.0.0.1:{self.intake_port}",
                intake_token_file=str(tmp / "intake-token"),
                intake_flush_secs=0.2,
                upstreams={"docs": {"url": self.upstream.url, "tools": TOOLS}},
            )
        ).start()
        self.url = f"{self.gateway.url}/mcp/docs"
        self.http = httpx.Client(timeout=60)
        wait_until(lambda: self.http.get(f"{self.gateway.url}/readyz").status_code == 200)
        wait_until(lambda: self._intake_ready())

    def _intake_ready(self) -> bool:
        try:
            return self.http.get(f"http://127.0.0.1:{self.intake_port}/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def start_pdp(self) -> Pdp:
        pdp = Pdp(
            "--bundle",
            str(self.bundle),
            "--port",
            str(self.pdp_port),
            "--no-watch",
            "--challenge",
            self.challenge.url,
            "--challenge-timeout-ms",
            "30000",
        )
        assert pdp.port() == self.pdp_port
        return pdp

    def agent(self, **claims: Any) -> str:
        """copilot.assistant acting for ana (RFC 8693 token exchange)."""
        return self.app.mint("ana", AUD, act="copilot.assistant", **claims)

    def events(self) -> list[dict[str, Any]]:
        """Every event the intake wrote to its topic."""
        rows = LocalLog.open(self.log_path).read(EVENTS_TOPIC, 0, 10_000)
        return [json.loads(v) for _, _, v, _ in rows if v is not None]

    def metric(self, name: str) -> float:
        text = self.http.get(f"{self.gateway.url}/metrics").text
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")
        )

    def close(self) -> None:
        self.http.close()
        self.gateway.stop()
        self.upstream.stop()
        self.intake.terminate()
        self.intake.wait(timeout=30)
        if self.pdp.proc.poll() is None:
            assert self.pdp.stop() == 0, self.pdp.log
        self.channel.close()
        self.challenge.stop()
        self.challenge_service.close()
        self.jwks.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


class Agent:
    """An agent that follows the client behaviour of docs/gateway.md#blocked-calls.

    ``tell_person`` is called with the challenge's qid when a challenge needs the person;
    ``steps`` records what happened, in order.
    """

    def __init__(self, world: World, token: str, tell_person: Any = None) -> None:
        self.world = world
        self.token = token
        self.tell_person = tell_person
        self.steps: list[str] = []

    async def wait(self, url: str, secs: int) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.get(
                url, params={"wait": secs}, headers={"authorization": f"Bearer {self.token}"}
            )
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            assert set(body) == {"outcome", "expires_at", "grant_expires_at", "retry"}
            return body

    async def call(self, session: Any, tool: str, args: dict[str, Any], tries: int = 20) -> Any:
        for _ in range(tries):
            r = await session.call_tool(tool, args)
            if not r.is_error:
                self.steps.append("done")
                return r
            meta = r.meta or {}
            verdict = meta["svc/verdict"]
            self.steps.append(verdict)
            if verdict == "deny":
                assert meta["svc/decision_qid"] in r.content[0].text
                return r  # stop and report the decision id
            if verdict == "unavailable":
                await asyncio.sleep(0.2)
                continue
            assert verdict == "challenge", meta
            wait_url = meta["svc/challenge_wait"]
            assert wait_url.endswith(f"/mcp/challenges/{meta['svc/challenge_qid']}")
            looked = await self.wait(wait_url, 0)
            self.steps.append(looked["outcome"])
            await asyncio.to_thread(self.tell_person, meta["svc/challenge_qid"])
            while True:
                answer = await self.wait(wait_url, 25)
                self.steps.append(answer["outcome"])
                if answer["outcome"] != "pending":
                    break
            if answer["outcome"] == "rejected":
                return r
        raise AssertionError(f"no answer after {tries} tries: {self.steps}")


def test_an_agent_meets_deny_challenge_pass_and_retry(world: World) -> None:
    def justify(qid: str) -> None:
        # Someone else's agent (or the person's own token) cannot wait on it.
        other = world.app.mint("bo", AUD, act="copilot.assistant")
        r = world.http.get(
            f"{world.gateway.url}/mcp/challenges/{qid}?wait=0",
            headers={"authorization": f"Bearer {other}"},
        )
        assert r.status_code == 404
        assert r.json()["type"] == "urn:svc:problem:challenge-not-found"
        world.stub.Justify(
            pb.JustifyRequest(qid=qid, person="ana", text="fixing a typo"), timeout=30
        )

    agent = Agent(world, world.agent(), justify)

    async def run() -> dict[str, Any]:
        async with agent_session(world.url, agent.token) as s:
            read = await agent.call(s, "read_doc", {"doc_id": "plan"})
            denied = await agent.call(s, "read_doc", {"doc_id": "secret"})
            wrote = await agent.call(s, "write_doc", {"doc_id": "plan", "text": "new plan"})
            again = await agent.call(s, "read_doc", {"doc_id": "plan"})
            return {"read": read, "denied": denied, "wrote": wrote, "again": again}

    got = asyncio.run(run())
    assert got["read"].content[0].text == "the plan"
    assert got["denied"].is_error
    assert got["denied"].meta["svc/verdict"] == "deny"
    assert "secret-is-secret" in got["denied"].content[0].text
    assert got["wrote"].content[0].text == "wrote plan"
    assert got["again"].content[0].text == "new plan"
    assert agent.steps == [
        "done",
        "deny",
        "challenge",
        "pending",
        "passed",
        "done",
        "done",
    ]
    events = wait_until(
        lambda: (
            [e for e in world.events() if e.get("tool", "").startswith("docs/")]
            if len(world.events()) >= 3
            else None
        )
    )
    forwarded = [(e["tool"], e["action"], e["resource"]["id"], e["action_class"]) for e in events]
    assert forwarded == [
        ("docs/read_doc", "read", "plan", "read"),
        ("docs/write_doc", "write", "plan", "write"),
        ("docs/read_doc", "read", "plan", "read"),
    ]
    for e in events:
        assert e["principal"] == {"type": "ServiceAccount", "id": "copilot.assistant"}
        assert e["on_behalf_of"] == {"type": "Human", "id": "ana"}
        assert e["system"] == "docs"
        assert e["outcome"] == "success"
    assert world.metric('svc_gateway_tool_calls_total{outcome="deny",upstream="docs"}') == 1


def test_an_outage_answers_by_tier_and_never_for_the_contained(world: World) -> None:
    agent = Agent(world, world.agent())

    async def before() -> None:
        async with agent_session(world.url, agent.token) as s:
            assert not (await s.call_tool("read_doc", {"doc_id": "plan"})).is_error

    asyncio.run(before())
    world.pdp.proc.kill()  # killed mid-run: no goodbye to anyone
    assert world.pdp.proc.wait(timeout=30) == -9

    async def during() -> dict[str, Any]:
        async with agent_session(world.url, agent.token) as s:
            return {
                "ping": await s.call_tool("ping", {}),
                "cached": await s.call_tool("read_doc", {"doc_id": "plan"}),
                "not cached": await s.call_tool("read_doc", {"doc_id": "other"}),
                "closed": await s.call_tool("write_doc", {"doc_id": "plan", "text": "x"}),
            }

    got = asyncio.run(during())
    assert got["ping"].content[0].text == "pong"
    assert got["cached"].content[0].text == "the plan"
    for name in ("not cached", "closed"):
        assert got[name].is_error
        assert got[name].meta == {"svc/verdict": "unavailable"}
        assert "Retry the same call after a short wait" in got[name].content[0].text
    events = wait_until(
        lambda: [
            e
            for e in world.events()
            if e["tool"] != "docs/read_doc" or e["attributes"]["gateway_check"] != "allowed"
        ]
    )
    assert sorted((e["tool"], e["attributes"]["gateway_check"]) for e in events) == [
        ("docs/ping", "outage_fail_open"),
        ("docs/read_doc", "outage_cached"),
    ]

    # The person is contained: nothing of their agent goes through while the decision point is
    # away, whatever the tier.
    world.stub.Contain(
        pb.ContainRequest(
            principal=pb.EntityRef(type="Human", id="ana"), reason="test", author="secops"
        ),
        timeout=30,
    )
    wait_until(lambda: world.metric("svc_gateway_contained") == 1)

    async def contained() -> list[Any]:
        async with agent_session(world.url, agent.token) as s:
            return [
                await s.call_tool("ping", {}),
                await s.call_tool("read_doc", {"doc_id": "plan"}),
            ]

    for r in asyncio.run(contained()):
        assert r.meta == {"svc/verdict": "unavailable"}
    world.stub.Lift(
        pb.LiftRequest(
            principal=pb.EntityRef(type="Human", id="ana"), reason="ok", author="secops"
        ),
        timeout=30,
    )
    wait_until(lambda: world.metric("svc_gateway_contained") == 0)

    # The agent retries an unavailable call after a short wait; the decision point comes back.
    async def retry() -> Any:
        async with agent_session(world.url, agent.token) as s:
            first = await s.call_tool("read_doc", {"doc_id": "other"})
            assert first.meta == {"svc/verdict": "unavailable"}
            world.pdp = await asyncio.to_thread(world.start_pdp)
            return await agent.call(s, "read_doc", {"doc_id": "other"})

    assert asyncio.run(retry()).content[0].text == ""
    assert agent.steps[-1] == "done"
