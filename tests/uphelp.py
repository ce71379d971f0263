"""Running `svc up` as a user does (a child process) for the tests that need the whole install."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from svc.up import GATEWAY_OFFSET, PORT_COUNT, TOKEN_ISSUER_OFFSET, PortTaken, check_ports

SVC = [sys.executable, "-m", "svc.cli"]


def free_base_port(host: str = "127.0.0.1") -> int:
    """A port N with N to N+PORT_COUNT-1 free (what svc up binds)."""
    rng = random.Random()
    for _ in range(200):
        n = rng.randrange(20_000, 60_000)
        try:
            check_ports(host, {f"port {k}": n + k for k in range(PORT_COUNT)})
        except PortTaken:
            continue
        return n
    raise RuntimeError(f"no {PORT_COUNT} free consecutive ports")


@dataclass
class Up:
    """A running `svc up` child process."""

    proc: subprocess.Popen[str]
    port: int
    data_dir: Path
    stdout: list[str]
    stopped: tuple[int, str, str] | None = field(default=None, repr=False)

    @property
    def pdp(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def intake(self) -> str:
        return f"http://127.0.0.1:{self.port + 1}"

    @property
    def history(self) -> str:
        return f"http://127.0.0.1:{self.port + 2}"

    @property
    def policy(self) -> str:
        return f"http://127.0.0.1:{self.port + 3}"

    @property
    def context(self) -> str:
        return f"http://127.0.0.1:{self.port + 4}"

    @property
    def challenge(self) -> str:
        return f"http://127.0.0.1:{self.port + 5}"

    @property
    def gateway(self) -> str:
        """The gateway's base URL (``/mcp/{upstream}``)."""
        return f"http://127.0.0.1:{self.port + GATEWAY_OFFSET}"

    @property
    def token_issuer(self) -> str:
        """The demo token issuer's base URL (HTTPS; its CA in ``token-issuer/ca.pem``)."""
        return f"https://127.0.0.1:{self.port + TOKEN_ISSUER_OFFSET}"

    @property
    def scim_token(self) -> str:
        """The identity provider's SCIM token svc up keeps."""
        return (self.data_dir / "scim.token").read_text().strip()

    @property
    def token(self) -> str:
        """The intake token."""
        return (self.data_dir / "intake.token").read_text().strip()

    @property
    def caller_token(self) -> str:
        """The caller token svc up wrote for the decision point and the history."""
        return (self.data_dir / "caller.token").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        """Headers that carry the caller token."""
        return {"authorization": f"Bearer {self.caller_token}"}

    def totals(self) -> dict[str, int]:
        r = httpx.get(f"{self.history}/v1/history/totals", headers=self.auth, timeout=10)
        r.raise_for_status()
        return dict(r.json())

    def wait_totals(
        self, decisions: int = 0, events: int = 0, timeout: float = 60
    ) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            t = self.totals()
            if t["decisions"] >= decisions and t["events"] >= events:
                return t
            assert time.monotonic() < deadline, f"history stuck at {t}"
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str, str]:
        """Sends `sig`, waits; returns (exit code, all of stdout, stderr). Again after the
        first: the same answer."""
        if self.stopped is None:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            out, err = self.proc.communicate(timeout=90)
            self.stopped = self.proc.returncode, "".join(self.stdout) + out, err
        return self.stopped


def start_up(
    data_dir: Path,
    *args: str,
    port: int | None = None,
    ready_timeout: float = 180,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Up:
    """Starts `svc up --data-dir DIR --port N ARGS` and waits for its ready banner.

    `command` is how `svc` is run (default: this interpreter's `-m svc.cli`); `env` replaces
    the environment (default: this process's)."""
    port = port or free_base_port()
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*(command or SVC), "up", "--data-dir", str(data_dir), "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    deadline = time.monotonic() + ready_timeout
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"svc up exited with {proc.returncode} before ready: {err}")
        lines.append(line)
        if line.startswith("Ctrl-C stops"):
            break
        assert time.monotonic() < deadline, "svc up did not get ready"
    return Up(proc, port, data_dir, lines)


def run_svc(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Runs `svc ARGS` to completion."""
    return subprocess.run(
        [*SVC, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ}
    )


def get_json(url: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
    r = httpx.get(url, params=params, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()
