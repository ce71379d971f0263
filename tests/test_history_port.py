"""`svc history load --port`: the loader's probes and history routes on its own port.

The chart's history Deployment (helm/svc, docs/deploy.md) runs `svc history load --port 8080`
and probes `/healthz` and `/readyz` there (docs/architecture.md#what-every-component-serves).
Run as a user would: a subprocess of `svc`, chDB in a temporary directory and the embedded
topic log (`local://`) as the broker, so it needs no server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from svc.common.net import tcp_listener

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    """A port free on 127.0.0.1 right now (bound for a moment, then released)."""
    sock = tcp_listener("127.0.0.1", 0)
    try:
        return int(sock.getsockname()[1])
    finally:
        sock.close()


def _svc(tmp: Path, *args: str) -> subprocess.Popen[str]:
    """Starts `svc history load` over chDB and the embedded log in `tmp`, plus `args`."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "svc.cli",
            "history",
            "load",
            "--dsn",
            f"chdb://{tmp / 'history'}",
            "--kafka",
            f"local://{tmp / 'broker.db'}",
            "--migrate",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(url: str, proc: subprocess.Popen[str]) -> httpx.Response:
    """Polls `url`/readyz until it answers 200; fails with the process's output if it exits."""
    while True:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"svc history load exited {proc.returncode}: {out}{err}")
        try:
            answer = httpx.get(f"{url}/readyz", timeout=2)
        except httpx.TransportError:
            answer = None
        if answer is not None and answer.status_code == 200:
            return answer
        time.sleep(0.2)


def test_load_serves_probes_and_routes_then_stops_on_sigterm(tmp_path: Path) -> None:
    """The probes answer, `/readyz` carries the loader's health, the routes read the store, and
    SIGTERM ends the loader and the port with exit code 0 and the counters as JSON."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _svc(tmp_path, "--port", str(port))
    try:
        ready = _wait_ready(url, proc)
        assert ready.json()["loader"]["ready"] is True
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
        version = httpx.get(f"{url}/version", timeout=5).json()
        assert version["component"] == "svc-history"
        assert "svc_history_loader_batches" in httpx.get(f"{url}/metrics", timeout=5).text
        totals = httpx.get(f"{url}/v1/history/totals", timeout=5)
        assert totals.status_code == 200
        assert totals.json() == {"decisions": 0, "events": 0, "rejected": 0}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["records"] == 0


def test_load_refuses_a_public_port_without_authentication(tmp_path: Path) -> None:
    """`--host 0.0.0.0` without `SVC_HISTORY_AUTH_*` is refused (exit 2) naming the settings
    (docs/auth.md, "Loopback only without authentication")."""
    proc = _svc(tmp_path, "--host", "0.0.0.0", "--port", str(_free_port()))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in err
    assert "SVC_HISTORY_AUTH_ISSUER" in err
