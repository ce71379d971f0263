"""svc reporter (docs/reporter.md): the heartbeat holds the schema's members and nothing else.

A capturing receiver (the vendor's corp portal, served over HTTP on 127.0.0.1) records every
body. The reporter watches real components: a decision point serving the demo company's
bundle while checks of every verdict are sent to it, the connectors' probes, and an address
where nothing listens. Every body is validated against ``heartbeat.schema.json`` (every
object closed), its members compared with the schema's, and its text searched for any name of
the demo company (people, documents, policies): none may appear.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from serverkit import serve, wait_until
from svc.challenge.app import ChallengeServer
from svc.challenge.settings import ChallengeSettings
from svc.connectors.app import ConnectorsServer
from svc.connectors.settings import ConnectorsSettings
from svc.demo import company as demo
from svc.pdp import Engine
from svc.reporter.app import ReporterServer
from svc.reporter.service import SCHEMA, Reporter
from svc.reporter.settings import ReporterSettings
from test_connectors import Served

VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
TOKEN = "portal-" + "p" * 30


class Receiver:
    """The corp portal's heartbeat route: records bodies; answers 503 while ``down``."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.down = 0  # how many more posts to refuse
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/heartbeat")
        async def heartbeat(request: Request) -> Any:
            body = await request.json()
            with self.lock:
                if self.down > 0:
                    self.down -= 1
                    return JSONResponse({"detail": "unavailable"}, status_code=503)
                self.bodies.append(body)
                self.auth.append(request.headers.get("authorization"))
            return JSONResponse({}, status_code=202)

        self.served = Served(app)

    def stop(self) -> None:
        self.served.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def nowhere() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def names_of(company: demo.Company) -> set[str]:
    """Every identifier of the demo company that must never leave."""
    out = {p.user_name for p in company.people}
    out |= {sa.id for sa in company.service_accounts}
    out |= {r.id for r in (*company.documents, *company.tickets, *company.customers)}
    out |= {w.id for w in company.work_items}
    out |= set(company.groups)
    for text in demo.POLICIES.values():
        out |= {line.split('"')[1] for line in text.splitlines() if line.startswith("@id(")}
    return {n for n in out if len(n) >= 4}


def traffic(http: httpx.Client, company: demo.Company, rounds: int) -> set[str]:
    """Checks with each verdict: owners reading and deleting their documents, and others
    reading secret ones."""
    verdicts = set()
    docs = company.documents
    for i in range(rounds):
        d = docs[i % len(docs)]
        owner = {"type": "Human", "id": d.owner}
        stranger = {
            "type": "Human",
            "id": company.people[(i * 7 + 3) % len(company.people)].user_name,
        }
        for principal, action in ((owner, "read"), (owner, "delete"), (stranger, "read")):
            r = http.post(
                "/v1/access/evaluation",
                json={"principal": principal, "action": action, "resource": d.ref},
            )
            assert r.status_code == 200, r.text
            verdicts.add(r.json()["verdict"])
    return verdicts


def check_body(body: dict[str, Any], forbidden: set[str]) -> None:
    VALIDATOR.validate(body)
    assert set(body) == set(SCHEMA["properties"]), set(body) ^ set(SCHEMA["properties"])
    text = json.dumps(body)
    leaked = [n for n in forbidden if n in text]
    assert not leaked, leaked


def test_heartbeats_carry_the_schema_and_nothing_else(receiver: Receiver, tmp_path: Path) -> None:
    company = demo.generate(seed=7, people=60)
    bundle = tmp_path / "bundle"
    demo.write_bundle(company, bundle)
    engine = Engine.from_bundle_dir(bundle)
    demo.provision(engine, company)
    (tmp_path / "portal.token").write_text(TOKEN + "\n")
    forbidden = names_of(company)
    with serve(engine) as pdp:
        connectors = ConnectorsServer(
            ConnectorsSettings(port=0, state_path=str(tmp_path / "c.db"))
        ).start()
        challenge = ChallengeServer(
            ChallengeSettings(port=0, database_url=f"sqlite:///{tmp_path / 'challenge.db'}")
        ).start()
        settings = ReporterSettings(
            port=0,
            portal_url=receiver.served.url,
            portal_token_file=str(tmp_path / "portal.token"),
            install_id_file=str(tmp_path / "install-id"),
            interval_secs=0.3,
            components={
                "pdp": pdp.url,
                "connectors": connectors.url,
                "challenge": challenge.url,
                "gone": nowhere(),
            },
        )
        reporter = ReporterServer(settings).start()
        try:
            seen: set[str] = set()
            for _ in range(6):
                seen |= traffic(pdp.http, company, 40)
                time.sleep(0.2)
            assert seen == {"allow", "deny", "challenge"}
            # More traffic while waiting, so some heartbeat after the first counts it.
            wait_until(
                lambda: (
                    traffic(pdp.http, company, 5)
                    and any(
                        b["decisions_per_minute"] and b["decisions_per_minute"]["challenge"] > 0
                        for b in receiver.bodies
                    )
                ),
                timeout=60,
                every=0.2,
            )
            probe = httpx.get(f"{reporter.url}/metrics").text
        finally:
            reporter.stop()
            connectors.stop()
            challenge.stop()
    bodies = list(receiver.bodies)
    assert len(bodies) >= 2
    for b in bodies:
        check_body(b, forbidden)
    assert all(a == f"Bearer {TOKEN}" for a in receiver.auth)
    ids = {b["install_id"] for b in bodies}
    assert ids == {(tmp_path / "install-id").read_text().strip()}
    assert [b["sequence"] for b in bodies] == list(range(1, len(bodies) + 1))
    last = bodies[-1]
    assert last["components"]["pdp"] == {
        "reachable": True,
        "ready": True,
        "release": last["reporter_release"],
    }
    assert last["components"]["connectors"]["reachable"] is True
    assert last["components"]["gone"] == {"reachable": False, "ready": None, "release": None}
    assert bodies[0]["decisions_per_minute"] is None  # no rate before a second reading
    assert any(b["decisions_per_minute"] and b["decisions_per_minute"]["allow"] > 0 for b in bodies)
    assert any(b["decisions_per_minute"] and b["decisions_per_minute"]["deny"] > 0 for b in bodies)
    assert last["events_accepted_per_minute"] is None  # no intake watched
    assert last["components"]["challenge"]["ready"] is True
    assert last["open_challenges"] == 0 and last["containments"] == 0
    assert 'svc_reporter_heartbeats_total{outcome="sent"}' in probe


def test_a_portal_that_is_away_fills_a_bounded_backlog(receiver: Receiver, tmp_path: Path) -> None:
    import asyncio

    settings = ReporterSettings(
        portal_url=receiver.served.url,
        install_id="0b6a4c1e-8d2f-4a53-9e1b-2f1c3d4e5f60",
        interval_secs=60,
        backlog=3,
        attempts=2,
        backoff_secs=0.01,
        components={"gone": nowhere()},
    )
    receiver.down = 12  # 2 tries for each of the first 6 sends

    async def run() -> Reporter:
        reporter = Reporter(settings)
        for _ in range(6):  # each tick: made, queued, one send of the oldest tried twice
            await reporter.tick()
        assert len(reporter.backlog) == 3
        await reporter.tick()  # the portal is back: the backlog is sent, oldest first
        await reporter.aclose()
        return reporter

    reporter = asyncio.run(run())
    got = [b["sequence"] for b in receiver.bodies]
    assert got == [5, 6, 7], got  # 1 to 4 dropped from the full backlog, in order after
    assert (
        reporter.registry.get_sample_value("svc_reporter_heartbeats_total", {"outcome": "dropped"})
        == 4
    )
    assert not reporter.backlog
    for b in receiver.bodies:
        check_body(b, set())


def test_without_a_portal_nothing_is_sent(tmp_path: Path) -> None:
    import asyncio

    settings = ReporterSettings(install_id_file=str(tmp_path / "id"), components={})

    async def run() -> dict[str, Any]:
        reporter = Reporter(settings)
        body = await reporter.tick()
        assert not reporter.backlog
        await reporter.aclose()
        return body

    body = asyncio.run(run())
    check_body(body, set())
    with pytest.raises(ValueError):
        ReporterSettings(components={"Bad Name": "http://x"})
    with pytest.raises(ValueError):
        Reporter(ReporterSettings(install_id="not-a-uuid"))


def test_the_demo_receiver_prints_what_would_leave(tmp_path: Path) -> None:
    import asyncio

    from svc.demo.sources import HeartbeatReceiverServer

    printed: list[dict[str, Any]] = []
    served = HeartbeatReceiverServer(printed.append).start()
    try:
        settings = ReporterSettings(
            portal_url=served.url,
            install_id_file=str(tmp_path / "id"),
            components={"gone": nowhere()},
        )

        async def run() -> None:
            reporter = Reporter(settings)
            await reporter.tick()
            await reporter.tick()
            assert not reporter.backlog
            await reporter.aclose()

        asyncio.run(run())
        assert [b["sequence"] for b in printed] == [1, 2]
        # A body with a member the schema does not have is refused, and not passed on.
        extra = {**printed[0], "people": ["dana@example.com"]}
        r = httpx.post(f"{served.url}/v1/heartbeat", json=extra)
        assert r.status_code == 400, r.text
        assert len(printed) == 2
    finally:
        served.stop()
