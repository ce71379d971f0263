"""Standalone mode (docs/api.md, issue item 3): `svc pdp --bundle DIR` and `serve_bundle`.

* `svc pdp` as a real process on a copy of a Cedar example app: decides over HTTP, reloads the
  bundle when its files change (a broken bundle keeps the old one serving, shown on `/readyz`
  and `svc_pdp_bundle_error`; a fixed one is put in force), and exits 0 on SIGTERM;
* `serve_bundle` in-process for every example app: each request of its ALLOW and DENY folders
  decides as the folder says over HTTP, gRPC and AuthZEN.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from serverkit import (
    assert_problem,
    authzen_request,
    check_json,
    check_request,
    metric,
    wait_until,
)
from svc.authz.v1 import authz_pb2_grpc
from svc.pdp.server import StandaloneOptions, serve_bundle
from test_bundles import _example_requests

SVC = Path(sys.executable).parent / "svc"
EVAL = "/v1/access/evaluation"
SERVING = re.compile(r"svc-pdp serving .* on http://127\.0\.0\.1:(\d+) ")


class Pdp:
    """`svc pdp` running as a child process; its standard error is collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(SVC), "pdp", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def port(self) -> int:
        def bound() -> int | None:
            assert self.proc.poll() is None, self.log
            m = SERVING.search(self.log)
            return int(m.group(1)) if m else None

        return int(wait_until(bound, timeout=30))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._reader.join(timeout=5)


@pytest.fixture
def app_copy(cedar_examples: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "document_cloud"
    shutil.copytree(cedar_examples / "document_cloud", dst)
    return dst


def _request(app: Path, folder: str, name: str) -> Any:
    return json.loads((app / folder / name).read_text())


BROKEN = "permit (principal, action, resource) when { principal.  };\n"
BLANKET_FORBID = '@id("svc-test-forbid")\nforbid (principal, action, resource);\n'


def test_svc_pdp_reloads_its_bundle_and_stops_on_sigterm(app_copy: Path) -> None:
    pdp = Pdp("--bundle", str(app_copy), "--port", "0")
    try:
        port = pdp.port()
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        allowed = _request(app_copy, "ALLOW", "alice_view_alice_public.json")
        denied = _request(
            app_copy, "DENY", sorted(p.name for p in (app_copy / "DENY").glob("*.json"))[0]
        )

        def verdict(body: Any = allowed) -> dict[str, Any]:
            r = c.post(EVAL, json=body)
            assert r.status_code == 200, r.text
            return dict(r.json())

        assert verdict()["verdict"] == "allow"
        assert verdict(denied)["verdict"] == "deny"
        ready = c.get("/readyz").json()
        assert ready["ready"] is True and "bundle_error" not in ready
        version = ready["policy_version"]

        # A broken policy file: the old bundle keeps serving, the error is shown and counted.
        (app_copy / "zz_test.cedar").write_text(BROKEN)
        ready = wait_until(lambda: "bundle_error" in (j := c.get("/readyz").json()) and j)
        assert c.get("/readyz").status_code == 200
        assert "zz_test.cedar" in ready["bundle_error"], ready
        assert ready["policy_version"] == version
        text = c.get("/metrics").text
        assert metric(text, "svc_pdp_bundle_error") == 1
        assert metric(text, "svc_pdp_bundle_reloads_total", result="error") >= 1
        assert verdict()["verdict"] == "allow"
        assert "bundle reload failed, the previous bundle keeps serving" in pdp.log

        # Fixed (now a valid policy that changes the decision): the error clears and the new
        # bundle is in force.
        (app_copy / "zz_test.cedar").write_text(BLANKET_FORBID)
        ready = wait_until(lambda: "bundle_error" not in (j := c.get("/readyz").json()) and j)
        assert ready["policy_version"] > version
        got = wait_until(lambda: (v := verdict())["verdict"] == "deny" and v)
        assert got["policies"] == ["svc-test-forbid"]
        text = c.get("/metrics").text
        assert metric(text, "svc_pdp_bundle_error") == 0
        assert metric(text, "svc_pdp_bundle_reloads_total", result="ok") >= 1

        # A file that is not part of a bundle changes nothing (waits over the 300 ms debounce).
        time.sleep(1)
        reloads = metric(c.get("/metrics").text, "svc_pdp_bundle_reloads_total", result="ok")
        (app_copy / "notes.txt").write_text("not a bundle file")
        time.sleep(1)
        assert (
            metric(c.get("/metrics").text, "svc_pdp_bundle_reloads_total", result="ok") == reloads
        )
        # Removing a policy file reloads too.
        (app_copy / "zz_test.cedar").unlink()
        wait_until(lambda: verdict()["verdict"] == "allow")
        c.close()
    finally:
        code = pdp.stop()
    assert code == 0, pdp.log


def test_svc_pdp_monitor_mode_grpc_and_authzen(app_copy: Path) -> None:
    pdp = Pdp("--bundle", str(app_copy), "--port", "0", "--mode", "monitor", "--no-watch")
    try:
        port = pdp.port()
        name = sorted(p.name for p in (app_copy / "DENY").glob("*.json"))[0]
        denied = _request(app_copy, "DENY", name)
        r = httpx.post(f"http://127.0.0.1:{port}{EVAL}", json=denied)
        assert r.json()["verdict"] == "deny" and r.json()["mode"] == "monitor"
        body, _ = authzen_request(denied)
        got = httpx.post(f"http://127.0.0.1:{port}/access/v1/evaluation", json=body).json()
        assert got["decision"] is True and got["context"]["verdict"] == "deny"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = authz_pb2_grpc.AuthorizerStub(ch).Check(check_request(denied), timeout=10)
            assert check_json(resp)["mode"] == "monitor"
        # No svc-challenge in standalone mode.
        wait = {"challenge_qid": "q", "principal": {"type": "User", "id": "alice"}}
        problem = assert_problem(
            httpx.post(f"http://127.0.0.1:{port}/v1/access/challenge", json=wait), 503
        )
        assert "svc-challenge" in problem["detail"]
    finally:
        code = pdp.stop()
    assert code == 0, pdp.log


def test_svc_pdp_refuses_a_broken_bundle_and_a_taken_port(app_copy: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(app_copy, broken)
    (broken / "zz.cedar").write_text(BROKEN)
    r = subprocess.run(
        [str(SVC), "pdp", "--bundle", str(broken), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "zz.cedar" in r.stderr, r.stderr
    r = subprocess.run(
        [str(SVC), "pdp", "--bundle", str(app_copy), "--port", "0", "--mode", "audit"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "audit" in r.stderr, r.stderr
    with serve_bundle(app_copy, StandaloneOptions(port=0, watch=False)) as server:
        r = subprocess.run(
            [str(SVC), "pdp", "--bundle", str(app_copy), "--port", str(server.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and str(server.port) in r.stderr, r.stderr


# -------------------------------------------------------------------------------------------
# serve_bundle in-process, every example app


def _apps(cedar_examples: Path) -> list[Path]:
    return [p for p in sorted(cedar_examples.iterdir()) if p.is_dir()]


@pytest.fixture
def apps(cedar_examples: Path) -> Iterator[list[Path]]:
    yield _apps(cedar_examples)


def test_serve_bundle_decides_every_example_request_as_its_folder_says(apps: list[Path]) -> None:
    checked = 0
    for app in apps:
        with serve_bundle(app, StandaloneOptions(port=0, watch=False)) as server:
            assert server.ready
            base = f"http://127.0.0.1:{server.port}"
            with (
                httpx.Client(base_url=base, timeout=10) as c,
                grpc.insecure_channel(base[7:]) as ch,
            ):
                assert c.get("/readyz").json()["ready"] is True
                stub = authz_pb2_grpc.AuthorizerStub(ch)
                for f, verdict in _example_requests(app):
                    body = json.loads(f.read_text())
                    r = c.post(EVAL, json=body)
                    assert r.status_code == 200, (f, r.text)
                    got = r.json()
                    assert got["verdict"] == verdict, f
                    view = {k: v for k, v in got.items() if k != "qid"}
                    grpc_got = check_json(stub.Check(check_request(body), timeout=10))
                    assert {k: v for k, v in grpc_got.items() if k != "qid"} == view, f
                    az, _ = authzen_request(body)
                    az_got = c.post("/access/v1/evaluation", json=az).json()
                    assert az_got["decision"] is (verdict == "allow"), f
                    assert az_got["context"]["policies"] == got["policies"], f
                    checked += 1
    assert checked >= 20


def test_serve_bundle_reloads_in_process(app_copy: Path) -> None:
    opts = StandaloneOptions(port=0, mode="monitor")
    with serve_bundle(app_copy, opts) as server:
        c = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10)
        allowed = _request(app_copy, "ALLOW", "alice_view_alice_public.json")
        assert c.post(EVAL, json=allowed).json() | {"qid": ""} == {
            "qid": "",
            "verdict": "allow",
            "challenges": [],
            "policies": c.post(EVAL, json=allowed).json()["policies"],
            "mode": "monitor",
        }
        (app_copy / "policies.cedar").write_text(
            (app_copy / "policies.cedar").read_text() + "\n" + BLANKET_FORBID
        )
        wait_until(lambda: c.post(EVAL, json=allowed).json()["verdict"] == "deny")
        (app_copy / "policies.cedarschema").write_text("entity Broken = { x: Nope };")
        wait_until(lambda: "bundle_error" in c.get("/readyz").json())
        assert c.post(EVAL, json=allowed).json()["policies"] == ["svc-test-forbid"]
        c.close()
    assert not server.running


def test_svc_pdp_process_serves_every_example_app_as_it_stands(cedar_examples: Path) -> None:
    """`svc pdp --bundle APP` (the command, as a user runs it) on each Cedar example app."""
    served, decided = 0, 0
    for app in _apps(cedar_examples):
        requests = list(_example_requests(app))
        pdp = Pdp("--bundle", str(app), "--port", "0", "--no-watch")
        try:
            base = f"http://127.0.0.1:{pdp.port()}"
            assert httpx.get(f"{base}/readyz", timeout=10).json()["ready"] is True
            for f, verdict in requests:
                r = httpx.post(f"{base}{EVAL}", json=json.loads(f.read_text()), timeout=10)
                assert r.status_code == 200 and r.json()["verdict"] == verdict, (f, r.text)
                decided += 1
        finally:
            assert pdp.stop() == 0, pdp.log
        served += 1
    assert served == len(_apps(cedar_examples)) >= 5 and decided >= 20
