"""A feed that cannot be applied keeps the last good state and says so (svc.pdp.feeds).

The decision point (``svc.pdp.server.serve_bundle``, its Rust listener) and the gateway
(``svc.gateway.app.GatewayServer``) follow a real context service (tests/test_context.py's
``Live``, on SQLite) through ``Breaker``: a real HTTP proxy on loopback that forwards every
request and can be told to answer 500 for one path, as the context service did for
``/v1/resources/changes`` once a poisoned change was stored. With a short staleness bound:

* ``/readyz`` turns 503 naming the feed, its last success and its last error, while the feeds
  that still sync stay out of it;
* ``svc_*_feed_errors_total`` counts the failures and ``svc_*_feed_stale`` says which feed;
* decisions use the last good state (the document's old attributes, the old trusted apps);
* one ERROR line names the feed and the change, however many retries fail the same way;
* once the path heals, the change is applied and ``/readyz`` is 200 again.

Every wait polls for a state (``wait_until``); nothing asserts on wall-clock time.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import Engine as SqlEngine
from sqlalchemy import text

from serverkit import metric, wait_until
from svc.challenge.app import ChallengeServer
from svc.challenge.service import Ref
from svc.challenge.settings import ChallengeSettings
from svc.common.net import tcp_listener
from svc.gateway.app import GatewayServer
from svc.gateway.service import GatewayService
from svc.gateway.settings import GatewaySettings
from svc.pdp import Engine, Server
from svc.pdp.feeds import FeedHealth, ServerFeeds
from svc.pdp.follower import Follower
from svc.pdp.server import StandaloneOptions, serve_bundle
from svc.policy.app import PolicyServer
from test_containment_follow import CY
from test_containment_follow import POLICIES as CONTAINMENT_POLICIES
from test_containment_follow import SCHEMA as CONTAINMENT_SCHEMA
from test_context import Live, create_user
from test_context_follow import POLICIES, SCHEMA, human, put_docs
from test_policy import CLOSED_ONLY, ENTITIES, PUBLIC_ONLY, admin_key, pg, server
from test_policy import SCHEMA as POLICY_SCHEMA

__all__ = ["admin_key", "pg", "server"]  # fixtures, shared with tests/test_policy.py

#: The staleness bound of the processes below: short, so the tests do not wait long, and
#: several of the healthy feeds' polls (a third of it) and heartbeats (0.2 s), so that they
#: never look stale on a busy machine.
BOUND_SECS = 3.0
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"


class Breaker:
    """A loopback HTTP proxy in front of `target` that answers 500 for the paths in `broken`.

    Forwards GET, POST and DELETE with their query, body and headers (a long poll is held as
    long as the target holds it). ``hits[path]`` counts the 500s answered per path.
    """

    def __init__(self, target: str) -> None:
        self.broken: set[str] = set()
        self.hits: dict[str, int] = {}
        self.client = httpx.Client(base_url=target, timeout=120)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if path in proxy.broken:
                    proxy.hits[path] = proxy.hits.get(path, 0) + 1
                    out = json.dumps({"status": 500, "title": "Internal Server Error"}).encode()
                    self.send_response(500)
                    self.send_header("Content-Type", "application/problem+json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in {"host", "content-length", "connection"}
                }
                r = proxy.client.request(self.command, self.path, content=body, headers=headers)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in {"content-length", "transfer-encoding", "connection"}:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


@pytest.fixture
def context(tmp_path: Path) -> Iterator[tuple[Live, Breaker]]:
    """A real context service and the proxy in front of it."""
    live = Live(f"sqlite:///{tmp_path / 'context.db'}")
    breaker = Breaker(live.url)
    yield live, breaker
    breaker.close()
    live.stop()


def _bundle(tmp: Path, policies: str = POLICIES, schema: str = SCHEMA) -> Path:
    d = tmp / "bundle"
    d.mkdir()
    (d / "policies.cedar").write_text(policies)
    (d / "schema.cedarschema").write_text(schema)
    return d


def _grpc_health(port: int) -> int:
    """The decision point's gRPC health for ``""`` (``grpc.health.v1``), as its enum value."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30).status)


def _errors_logged(caplog: pytest.LogCaptureFixture, feed: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "svc.feeds"
        and r.levelno == logging.ERROR
        and f"feed {feed} " in r.getMessage()
    ]


def test_a_broken_resources_feed_makes_the_decision_point_unready_until_it_heals(
    context: tuple[Live, Breaker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="svc.feeds")
    caplog.set_level(logging.INFO, logger="svc.pdp.context")
    live, breaker = context
    create_user(live, "dana@example.com", **{ENTERPRISE: {"department": "eng"}})
    put_docs(live, ("plan", "eng", "internal"))
    options = StandaloneOptions(
        port=0,
        watch=False,
        context=breaker.url,
        context_fetch_timeout_ms=30_000,
        feed_max_staleness_secs=BOUND_SECS,
    )
    with (
        serve_bundle(_bundle(tmp_path), options, context_wait_secs=60) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http,
    ):

        def verdict() -> str:
            r = http.post(
                "/v1/access/evaluation",
                json={
                    "principal": human("dana@example.com"),
                    "action": "read",
                    "resource": {"type": "Document", "id": "plan"},
                },
            )
            assert r.status_code == 200, r.text
            return str(r.json()["verdict"])

        wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
        ready = http.get("/readyz").json()
        assert set(ready["feeds"]) == {"principals", "resources", "work_items"}
        assert verdict() == "allow"  # her department's document, fetched on the miss

        # The feed breaks; the document is then given to another department and made secret.
        breaker.broken.add("/v1/resources/changes")
        # Once a poll was refused, none forwarded before the break is still open.
        wait_until(lambda: breaker.hits.get("/v1/resources/changes", 0) >= 1, timeout=60)
        before = int(http.get("/readyz").json()["feeds"]["resources"]["version"])
        changed = put_docs(live, ("plan", "sales", "secret"))
        assert changed > before

        r = wait_until(lambda: (x := http.get("/readyz")).status_code == 503 and x, timeout=60)
        problem = r.json()
        assert r.headers["content-type"] == "application/problem+json"
        assert "feed `resources` is stale" in problem["detail"]
        (stale,) = problem["stale_feeds"]  # the principals and work items still sync
        assert stale["feed"] == "resources"
        assert stale["version"] == before
        assert stale["last_success"] is not None
        assert "HTTP 500" in stale["last_error"]
        assert f"after version {before}" in stale["last_error"]
        assert len(stale["last_error"]) <= 303
        assert stale["errors"] >= 1
        assert not server.ready
        # gRPC health follows at the feed's next report (each retry reports its failure).
        wait_until(
            lambda: _grpc_health(server.port or 0) == health_pb2.HealthCheckResponse.NOT_SERVING,
            timeout=60,
        )
        # The last good state decides meanwhile: the old attributes still allow her.
        assert verdict() == "allow"

        # Metrics name the feed: its errors, its staleness, its last applied version.
        wait_until(lambda: breaker.hits.get("/v1/resources/changes", 0) >= 3, timeout=60)
        text = http.get("/metrics").text
        assert metric(text, "svc_pdp_feed_errors_total", feed="resources") >= 3
        assert metric(text, "svc_pdp_feed_stale", feed="resources") == 1
        assert metric(text, "svc_pdp_feed_stale", feed="principals") == 0
        assert metric(text, "svc_pdp_feed_version", feed="resources") == before
        assert metric(text, "svc_pdp_feed_age_seconds", feed="resources") > BOUND_SECS
        assert metric(text, "svc_pdp_feed_max_staleness_seconds", feed="resources") == BOUND_SECS
        assert metric(text, "svc_pdp_ready") == 0
        # One log line for the failure, however many retries failed the same way.
        (line,) = _errors_logged(caplog, "resources")
        assert f"the resources changes after version {before}" in line
        assert "HTTP 500" in line
        retries = [
            r
            for r in caplog.records
            if r.name == "svc.pdp.context" and "/v1/resources/changes: HTTP 500" in r.getMessage()
        ]
        assert len(retries) == 1  # the reconnect policy's line too, once per window

        # Healed: the change is applied, the document is denied, and the process is ready.
        breaker.broken.clear()
        wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
        assert verdict() == "deny"
        wait_until(
            lambda: _grpc_health(server.port or 0) == health_pb2.HealthCheckResponse.SERVING,
            timeout=60,
        )
        ready = http.get("/readyz").json()
        assert ready["feeds"]["resources"]["version"] >= changed
        text = http.get("/metrics").text
        assert metric(text, "svc_pdp_feed_stale", feed="resources") == 0
        assert metric(text, "svc_pdp_feed_version", feed="resources") >= changed
        assert metric(text, "svc_pdp_ready") == 1
        assert any(
            r.name == "svc.feeds" and "feed resources syncs again" in r.getMessage()
            for r in caplog.records
        )


def test_the_principals_and_work_items_feeds_are_covered_too(
    context: tuple[Live, Breaker], tmp_path: Path
) -> None:
    live, breaker = context
    options = StandaloneOptions(
        port=0, watch=False, context=breaker.url, feed_max_staleness_secs=BOUND_SECS
    )
    with (
        serve_bundle(_bundle(tmp_path), options, context_wait_secs=60) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http,
    ):
        wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
        broken = {"/v1/principals/watch", "/v1/principals", "/v1/work-items/changes"}
        breaker.broken.update(broken)
        wait_until(
            lambda: all(breaker.hits.get(p, 0) >= 1 for p in broken - {"/v1/principals"}), 60
        )
        create_user(live, "erin@example.com")

        def both() -> httpx.Response | None:
            r = http.get("/readyz")
            stale = r.json().get("stale_feeds", []) if r.status_code == 503 else []
            return r if len(stale) == 2 else None

        r = wait_until(both, timeout=60)
        assert [f["feed"] for f in r.json()["stale_feeds"]] == ["principals", "work_items"]
        detail = r.json()["detail"]
        assert "feed `principals` is stale" in detail and "feed `work_items` is stale" in detail
        breaker.broken.clear()
        wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
        assert any(f["feed"] == "principals" and not f["stale"] for f in server.feeds)


def _view(http: httpx.Client, doc: str) -> str:
    """The decision point's verdict on `alice` viewing `doc` (tests/test_policy.py's bundles)."""
    r = http.post(
        "/v1/access/evaluation",
        json={
            "principal": {"type": "User", "id": "alice"},
            "action": "view",
            "resource": {"type": "Doc", "id": doc},
        },
    )
    assert r.status_code == 200, r.text
    return str(r.json()["verdict"])


def test_a_refused_bundle_makes_the_decision_point_unready_until_the_active_one_serves(
    server: PolicyServer, pg: SqlEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="svc.feeds")
    service = server.service
    engine = Engine("forbid (principal, action, resource);", POLICY_SCHEMA, ENTITIES)
    pdp = Server(engine, port=0, workers=1)
    pdp.start()
    pdp.set_ready(containments=True)
    feeds = ServerFeeds(pdp, BOUND_SECS)
    feeds.started("bundle")
    follower = Follower(engine, server.target, service.public_key, server=pdp, feeds=feeds)
    follower.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{pdp.port}", timeout=60) as http:
            v1 = service.create_draft(PUBLIC_ONLY, "ana").version
            service.publish(v1, "ana")
            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
            assert http.get("/readyz").json()["feeds"]["bundle"]["version"] == v1

            # v2 is signed on its publish; then v1 is active again.
            v2 = service.create_draft(CLOSED_ONLY, "ana").version
            service.publish(v2, "ana")
            wait_until(lambda: follower.status.version == v2, timeout=60)
            service.publish(v1, "ana")
            wait_until(lambda: follower.status.version == v1, timeout=60)
            # v2's stored files altered after signing, and published again: refused, v1 keeps
            # serving; heartbeats keep coming, but the active bundle is not the one serving.
            with pg.begin() as c:
                c.execute(
                    text("UPDATE bundles SET files = :f WHERE version = :v"),
                    {
                        "f": json.dumps(
                            {**CLOSED_ONLY, "p.cedar": "permit (principal, action, resource);"}
                        ),
                        "v": v2,
                    },
                )
            service.publish(v2, "ana")
            r = wait_until(lambda: (x := http.get("/readyz")).status_code == 503 and x, timeout=60)
            (stale,) = r.json()["stale_feeds"]
            assert stale["feed"] == "bundle" and stale["version"] == v1
            assert f"bundle version {v2}" in stale["last_error"]
            assert "does not verify" in stale["last_error"]
            # The last verified bundle decides meanwhile (v1: public documents only).
            assert follower.status.version == v1
            assert [_view(http, d) for d in ("open", "closed")] == ["allow", "deny"]
            (line,) = _errors_logged(caplog, "bundle")
            assert f"bundle version {v2}" in line

            # The active bundle is v1 again: the one serving, so the feed syncs and it is ready.
            service.publish(v1, "ana")
            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
            exposition = http.get("/metrics").text
            assert metric(exposition, "svc_pdp_feed_errors_total", feed="bundle") == 1
            assert metric(exposition, "svc_pdp_feed_stale", feed="bundle") == 0
    finally:
        follower.stop()
        pdp.stop()


def test_a_lost_containment_stream_makes_the_decision_point_unready_until_it_is_back(
    tmp_path: Path,
) -> None:
    sock = tcp_listener("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    sock.close()

    def challenge() -> ChallengeServer:
        settings = ChallengeSettings(
            database_url=f"sqlite:///{tmp_path / 'challenge.db'}",
            port=port,
            heartbeat_secs=0.2,
            watch_poll_secs=0.1,
        )
        return ChallengeServer(settings, outbox=False).start()

    first = challenge()
    first.service.contain(Ref("Human", "cy"), "stolen laptop", "reasoner")
    options = StandaloneOptions(
        port=0,
        watch=False,
        challenge=f"http://127.0.0.1:{port}",
        feed_max_staleness_secs=BOUND_SECS,
    )
    bundle = _bundle(tmp_path, CONTAINMENT_POLICIES, CONTAINMENT_SCHEMA)
    again: ChallengeServer | None = None
    try:
        with (
            serve_bundle(bundle, options, context_wait_secs=60) as server,
            httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=60) as http,
        ):

            def contained() -> bool:
                r = http.post(
                    "/v1/access/evaluation",
                    json={
                        "principal": CY,
                        "action": "read",
                        "resource": {"type": "Document", "id": "d1"},
                    },
                )
                assert r.status_code == 200, r.text
                return "svc:contained" in r.json()["policies"]

            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
            assert contained()

            # The challenge service goes away: the list in force keeps serving, and once no
            # stream has delivered anything within the bound, the feed is named stale.
            first.stop()
            first.service.close()
            r = wait_until(lambda: (x := http.get("/readyz")).status_code == 503 and x, timeout=60)
            (stale,) = r.json()["stale_feeds"]
            assert stale["feed"] == "containments"
            assert "containment stream lost" in stale["last_error"]
            assert contained()

            again = challenge()
            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
            assert contained()
            exposition = http.get("/metrics").text
            assert metric(exposition, "svc_pdp_feed_errors_total", feed="containments") >= 1
            assert metric(exposition, "svc_pdp_feed_stale", feed="containments") == 0
    finally:
        if again is not None:
            again.stop()
            again.service.close()


def test_the_gateway_keeps_its_trusted_apps_and_says_the_feed_is_stale(
    context: tuple[Live, Breaker], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="svc.feeds")
    caplog.set_level(logging.INFO, logger="svc.gateway.feeds")
    live, breaker = context
    app = {
        "name": "ctxapp",
        "iss": "https://ctx-app.example.com",
        "jwks_url": "https://ctx-app.example.com/jwks.json",
        "aud": "svc-gateway",
    }
    r = live.http.post("/v1/directory/trusted-apps", json=app)
    assert r.status_code in (200, 201), r.text
    settings = GatewaySettings(
        port=0,
        context_url=breaker.url,
        trust_refresh_secs=0.2,
        feed_max_staleness_secs=BOUND_SECS,
    )
    service = GatewayService(settings)
    gw = GatewayServer(settings, service=service).start()
    try:
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
            assert "trusted_apps" in http.get("/readyz").json()["feeds"]
            assert service.apps.by_iss(app["iss"]) is not None

            breaker.broken.add("/v1/directory/trusted-apps")
            wait_until(lambda: breaker.hits.get("/v1/directory/trusted-apps", 0) >= 1, timeout=60)
            assert live.http.delete("/v1/directory/trusted-apps/ctxapp").status_code == 204
            r = wait_until(lambda: (x := http.get("/readyz")).status_code == 503 and x, timeout=60)
            body = r.json()
            assert "feed `trusted_apps` is stale" in body["detail"]
            feed = body["feeds"]["trusted_apps"]
            assert feed["stale"] is True
            assert feed["last_success"] is not None
            assert "HTTP 500" in feed["last_error"]
            # The last good list stays in force: the removed app is still trusted here.
            assert service.apps.by_iss(app["iss"]) is not None

            wait_until(lambda: breaker.hits.get("/v1/directory/trusted-apps", 0) >= 3, timeout=60)
            text = http.get("/metrics").text
            assert metric(text, "svc_gateway_feed_errors_total", feed="trusted_apps") >= 3
            assert metric(text, "svc_gateway_feed_stale", feed="trusted_apps") == 1
            assert metric(text, "svc_gateway_feed_age_seconds", feed="trusted_apps") > BOUND_SECS
            (line,) = _errors_logged(caplog, "trusted_apps")
            assert "GET /v1/directory/trusted-apps" in line
            retries = [r for r in caplog.records if r.name == "svc.gateway.feeds"]
            assert len(retries) == 1 and "reconnecting" in retries[0].getMessage()

            breaker.broken.clear()
            wait_until(lambda: http.get("/readyz").status_code == 200, timeout=60)
            assert service.apps.by_iss(app["iss"]) is None
            text = http.get("/metrics").text
            assert metric(text, "svc_gateway_feed_stale", feed="trusted_apps") == 0
    finally:
        gw.stop()


def test_the_gateways_bound_must_exceed_its_polls() -> None:
    with pytest.raises(ValueError, match=r"feed_max_staleness_secs.*trust_refresh_secs"):
        GatewaySettings(context_url="http://127.0.0.1:1", feed_max_staleness_secs=5)
    with pytest.raises(ValueError, match="fallback_refresh_secs"):
        GatewaySettings(fallback_file="tiers.json", feed_max_staleness_secs=10)
    with pytest.raises(ValueError, match="containments file"):
        GatewaySettings(containments_file="contained.json", feed_max_staleness_secs=1)
    # Feeds not followed do not bound it.
    assert GatewaySettings(feed_max_staleness_secs=1).feed_max_staleness_secs == 1


def test_one_error_line_per_distinct_failure_and_staleness_by_the_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``FeedHealth`` on its own, with a clock the test moves: what the gateway's probes read."""
    caplog.set_level(logging.INFO, logger="svc.feeds")
    now = [100.0]
    health = FeedHealth(10.0, component="svc-test", clock=lambda: now[0])
    health.started("apps")
    assert health.stale() == [] and health.readiness_reasons() == []
    now[0] += 10.5  # never synced: counted from its start
    assert [f["feed"] for f in health.stale()] == ["apps"]
    assert "last success never" in health.readiness_reasons()[0]

    health.synced("apps", 7)
    for _ in range(5):
        health.failed("apps", "HTTP 500: boom", "the list")
    health.failed("apps", "HTTP 503: " + "x" * 1000, "the list")
    (report,) = health.report()
    assert report["errors"] == 6 and report["version"] == 7 and not report["stale"]
    assert len(report["last_error"]) == 300 and report["last_error"].endswith("...")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) == 2  # one per distinct failure, not one per retry
    assert lines[0].startswith("svc-test: feed apps cannot apply the list: HTTP 500: boom")
    assert "(version 7)" in lines[0]

    now[0] += 10.5
    (reason,) = health.readiness_reasons()
    assert reason.startswith("feed `apps` is stale: no successful sync for 10.5 s (bound 10 s")
    health.synced("apps", 8)
    assert health.stale() == []
    assert any(
        "feed apps syncs again at version 8 after 6 failures" in r.getMessage()
        for r in caplog.records
    )
    health.failed("apps", "HTTP 500: boom", "the list")  # the same failure after a recovery
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 3
