"""The decision-point follower (svc.pdp.follower) against a real policy service and a real
in-process Engine served by a real decision-point listener."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import Engine as SqlEngine
from sqlalchemy import text

from serverkit import wait_until
from svc.pdp import Engine, Server
from svc.pdp.follower import Follower, bundle_sources
from svc.policy import signing
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from test_pdp_standalone import Pdp
from test_policy import CLOSED_ONLY, ENTITIES, PUBLIC_ONLY, SCHEMA, admin_key, pg, server  # noqa: F401  (fixtures used by name)


def verdict(engine: Engine, doc: str) -> str:
    return engine.evaluate(
        {
            "principal": {"type": "User", "id": "alice"},
            "action": "view",
            "resource": {"type": "Doc", "id": doc},
        }
    )["verdict"]


def test_bundle_sources_split_a_bundle_as_a_directory_would() -> None:
    policies, schema, entities, links = bundle_sources(
        {**PUBLIC_ONLY, "README.md": "ignored", "linked": "[]"}
    )
    assert policies == {"p.cedar": PUBLIC_ONLY["p.cedar"]}
    assert (schema, entities, links) == (SCHEMA, ENTITIES, "[]")


def test_follower_swaps_on_publish_keeps_old_bundle_on_bad_signature_and_catches_up(
    server: PolicyServer,  # noqa: F811
    pg: SqlEngine,  # noqa: F811
    tmp_path: Path,
) -> None:
    service = server.service
    engine = Engine("forbid (principal, action, resource);", SCHEMA, ENTITIES)
    pdp = Server(engine, port=0, workers=1)
    pdp.start()
    pdp.set_ready(containments=True)  # no containment feed here: only the bundle is awaited
    follower = Follower(engine, server.target, service.public_key, server=pdp).start()
    try:
        follower.wait_for(lambda s: s.connected and s.mode == "enforce")
        assert verdict(engine, "open") == "deny"
        assert httpx.get(f"http://127.0.0.1:{pdp.port}/readyz").status_code == 503

        # A publish is verified and swapped in.
        v1 = service.create_draft(PUBLIC_ONLY, "ana").version
        service.publish(v1, "ana")
        follower.wait_for(lambda s: s.version == v1)
        assert (verdict(engine, "open"), verdict(engine, "closed")) == ("allow", "deny")
        assert httpx.get(f"http://127.0.0.1:{pdp.port}/readyz").json()["ready"] is True

        # v2 is published and served, then v1 again.
        v2 = service.create_draft(CLOSED_ONLY, "ana").version
        service.publish(v2, "ana")
        follower.wait_for(lambda s: s.version == v2)
        service.publish(v1, "ana")
        follower.wait_for(lambda s: s.version == v1 and s.swaps == 3)

        # Someone alters v2's stored files after it was signed; publishing it again sends the
        # altered files with the old signature. Refused: v1 keeps serving.
        tampered = {**CLOSED_ONLY, "p.cedar": "permit (principal, action, resource);"}
        with pg.begin() as c:
            c.execute(
                text("UPDATE bundles SET files = :f WHERE version = :v"),
                {"f": json.dumps(tampered), "v": v2},
            )
        service.publish(v2, "ana")
        status = follower.wait_for(lambda s: s.refused == 1)
        assert status.version == v1 and "does not verify" in status.error
        assert (verdict(engine, "open"), verdict(engine, "closed")) == ("allow", "deny")
        ready = httpx.get(f"http://127.0.0.1:{pdp.port}/readyz").json()
        assert "does not verify" in ready["bundle_error"]
        metrics = httpx.get(f"http://127.0.0.1:{pdp.port}/metrics").text
        assert "svc_pdp_bundle_error 1" in metrics

        # The mode follows SetEnforcement.
        service.set_enforcement("install", "monitor", "ana")
        follower.wait_for(lambda s: s.mode == "monitor")
        assert engine.mode == "monitor"

        # The stream drops; the follower keeps serving, reconnects and catches up.
        port = server.port
        server.stop()
        follower.wait_for(lambda s: not s.connected)
        assert verdict(engine, "open") == "allow"
        v3 = service.create_draft(CLOSED_ONLY, "ana", comment="fixed").version
        service.publish(v3, "ana")
        again = PolicyServer(
            PolicySettings(port=port, data_dir=server.settings.data_dir), service
        ).start()
        try:
            status = follower.wait_for(lambda s: s.version == v3)
            assert status.reconnects >= 1 and status.error == ""
            assert (verdict(engine, "open"), verdict(engine, "closed")) == ("deny", "allow")
            ready = httpx.get(f"http://127.0.0.1:{pdp.port}/readyz").json()
            assert "bundle_error" not in ready
        finally:
            follower.stop()
            again.stop()
    finally:
        follower.stop()
        pdp.stop()


def test_plans_follow_a_publish(server: PolicyServer) -> None:  # noqa: F811
    """docs/plans.md, Paging: a plan pinned under one bundle is made again once a publish is
    swapped in, with the new ``policy_version``, a new ``qid`` and the new bundle's filter."""
    service = server.service
    engine = Engine("forbid (principal, action, resource);", SCHEMA, ENTITIES)
    follower = Follower(engine, server.target, service.public_key).start()
    try:
        v1 = service.create_draft(PUBLIC_ONLY, "ana").version
        service.publish(v1, "ana")
        follower.wait_for(lambda s: s.version == v1)
        ask = {
            "principal": {"type": "User", "id": "alice"},
            "action": "view",
            "resource_type": "Doc",
        }
        first = engine.plan(ask)
        assert first["outcome"] == "conditional" and first["policies"] == ["public"]
        again = engine.plan({**ask, "plan_qid": first["qid"]})
        assert again["pinned"] and again["qid"] == first["qid"]

        v2 = service.create_draft(CLOSED_ONLY, "ana").version
        service.publish(v2, "ana")
        follower.wait_for(lambda s: s.version == v2)
        after = engine.plan({**ask, "plan_qid": first["qid"]})
        assert not after["pinned"] and after["qid"] != first["qid"]
        assert after["policy_version"] > first["policy_version"]
        assert after["policies"] == ["closed"] and after["filter"] != first["filter"]
    finally:
        follower.stop()


def test_a_silent_stream_counts_as_lost_and_is_opened_again(
    pg: SqlEngine,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Heartbeats far apart: after its first message the stream stays silent.
    settings = PolicySettings(port=0, data_dir=tmp_path, heartbeat_secs=300, watch_poll_secs=60)
    quiet = PolicyServer(settings, PolicyService(settings, db=pg)).start()
    engine = Engine("forbid (principal, action, resource);", SCHEMA, ENTITIES)
    follower = Follower(
        engine, quiet.target, quiet.service.public_key, backoff_secs=0.05, stale_secs=0.3
    ).start()
    try:
        status = follower.wait_for(lambda s: s.stale >= 2 and s.connected)
        assert status.reconnects >= 2 and status.mode == "enforce"
    finally:
        follower.stop()
        quiet.stop()
        quiet.service.close()


def test_a_bundle_over_grpcs_default_message_limit_reaches_the_follower(
    server: PolicyServer,  # noqa: F811
) -> None:
    # entities.json of about 5 MiB: over grpcio's default 4 MiB receive limit.
    people = [
        {"uid": {"type": "User", "id": f"user-{i:06d}-{'x' * 80}"}, "attrs": {}, "parents": []}
        for i in range(45_000)
    ]
    big = {**PUBLIC_ONLY, "entities.json": json.dumps(json.loads(ENTITIES) + people)}
    assert len(big["entities.json"]) > 5 * 1024 * 1024
    v = server.service.create_draft(big, "ana").version
    server.service.publish(v, "ana")
    engine = Engine("forbid (principal, action, resource);", SCHEMA, ENTITIES)
    follower = Follower(engine, server.target, server.service.public_key).start()
    try:
        follower.wait_for(lambda s: s.version == v)
        assert verdict(engine, "open") == "allow"
    finally:
        follower.stop()


def test_svc_pdp_process_follows_a_policy_service(
    server: PolicyServer,  # noqa: F811
    pg: SqlEngine,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`svc pdp --policy URL --public-key FILE` (docs/api.md) as a process: a publish is served;
    a tampered bundle is refused while the old one keeps serving; `--bundle` and `--policy`
    are exclusive."""
    service = server.service
    key = tmp_path / "policy.pub"
    key.write_text(signing.public_key_text(service.public_key))
    pdp = Pdp("--policy", server.url, "--public-key", str(key), "--port", "0", "--no-watch")
    try:
        base = f"http://127.0.0.1:{pdp.port()}"
        # Nothing published yet: not ready, and nothing is allowed.
        assert httpx.get(f"{base}/readyz").status_code == 503

        def http_verdict(doc: str) -> str:
            body = {
                "principal": {"type": "User", "id": "alice"},
                "action": "view",
                "resource": {"type": "Doc", "id": doc},
            }
            r = httpx.post(f"{base}/v1/access/evaluation", json=body)
            return str(r.json()["verdict"]) if r.status_code == 200 else f"http {r.status_code}"

        v1 = service.create_draft(PUBLIC_ONLY, "ana").version
        service.publish(v1, "ana")
        wait_until(lambda: http_verdict("open") == "allow", timeout=30)
        assert http_verdict("closed") == "deny"
        assert httpx.get(f"{base}/readyz").json()["ready"] is True

        # v2's stored files altered after signing: refused, v1 keeps serving.
        v2 = service.create_draft(CLOSED_ONLY, "ana").version
        tampered = {**CLOSED_ONLY, "p.cedar": "permit (principal, action, resource);"}
        service.publish(v2, "ana")
        wait_until(lambda: http_verdict("closed") == "allow", timeout=30)
        service.publish(v1, "ana")
        wait_until(lambda: http_verdict("open") == "allow", timeout=30)
        with pg.begin() as c:
            c.execute(
                text("UPDATE bundles SET files = :f WHERE version = :v"),
                {"f": json.dumps(tampered), "v": v2},
            )
        service.publish(v2, "ana")
        wait_until(lambda: "bundle_error" in httpx.get(f"{base}/readyz").json(), timeout=30)
        assert "does not verify" in httpx.get(f"{base}/readyz").json()["bundle_error"]
        assert (http_verdict("open"), http_verdict("closed")) == ("allow", "deny")
    finally:
        assert pdp.stop() == 0, pdp.log
    assert f"bundle version {v2} refused" in pdp.log

    def refused(*args: str) -> str:
        p = Pdp(*args)
        assert p.proc.wait() == 2
        p._reader.join()
        return p.log

    both = refused("--policy", server.url, "--public-key", str(key), "--bundle", str(tmp_path))
    assert "either --bundle DIR or --policy" in both
    assert "public_key is not" in refused("--policy", server.url)


def generation(k: int) -> dict[str, str]:
    """A bundle whose one policy is named `gen-<k>`: a decision names the bundle it came from."""
    return {
        **PUBLIC_ONLY,
        "p.cedar": f'@id("gen-{k}")\npermit (principal, action == Action::"view", resource)\n'
        "when { resource.public };\n",
    }


OPEN_DOC = {
    "principal": {"type": "User", "id": "alice"},
    "action": "view",
    "resource": {"type": "Doc", "id": "open"},
}


class Checks:
    """A steady stream of checks against one decision point, in a thread: counts failures and
    notes which bundle generation (its policy's name) each allowed decision came from."""

    def __init__(self, port: int) -> None:
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        self.sent = 0
        self.failed: list[str] = []
        self.seen: set[str] = set()
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = self.client.post("/v1/access/evaluation", json=OPEN_DOC)
                ok = r.status_code == 200 and r.json()["verdict"] == "allow"
                if ok:
                    self.last = r.json()["policies"][0]
                    self.seen.add(self.last)
                else:
                    self.failed.append(f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as e:
                self.failed.append(repr(e))
            self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


def test_publishes_every_second_under_a_steady_stream_of_checks(
    server: PolicyServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A publish every second while checks run against 2 decision point
    processes: no check fails and each decision point serves every publish; one restarted
    mid-stream starts on the active version and follows the next publishes."""
    service = server.service
    key = tmp_path / "policy.pub"
    key.write_text(signing.public_key_text(service.public_key))
    service.publish(service.create_draft(generation(0), "ana").version, "ana")
    args = ("--policy", server.url, "--public-key", str(key), "--port", "0")
    a, b = Pdp(*args), Pdp(*args)
    restarted: Pdp | None = None
    streams = [Checks(a.port()), Checks(b.port())]
    try:
        for s in streams:
            wait_until(lambda s=s: s.seen, timeout=30)

        def publish(k: int, on: list[Checks]) -> None:
            started = time.monotonic()
            service.publish(service.create_draft(generation(k), "ana").version, "ana")
            for s in on:
                wait_until(lambda s=s: s.last == f"gen-{k}", timeout=30, every=0.01)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

        for k in range(1, 6):
            publish(k, streams)
        # b stops; publishes go on; b starts again on the active version.
        streams[1].stop()
        assert b.stop() == 0, b.log
        for k in range(6, 9):
            publish(k, streams[:1])
        restarted = Pdp(*args)
        again = Checks(restarted.port())
        wait_until(lambda: again.seen, timeout=30)
        assert again.seen == {"gen-8"}  # caught up before its first answer
        streams.append(again)
        for k in range(9, 12):
            publish(k, [streams[0], again])
    finally:
        for s in streams:
            if not s._stop.is_set():
                s.stop()
        for p in (a, b, restarted):
            if p is not None:
                assert p.stop() == 0, p.log
    first, before_restart, after_restart = streams
    assert first.failed == [] and before_restart.failed == [] and after_restart.failed == []
    assert first.seen == {f"gen-{k}" for k in range(12)}
    assert {f"gen-{k}" for k in range(1, 6)} <= before_restart.seen
    assert after_restart.seen == {f"gen-{k}" for k in range(8, 12)}
    assert min(s.sent for s in streams) > 0
