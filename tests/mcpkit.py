"""Helpers for the tests that talk MCP to real server processes (tests/test_demo_tools.py,
tests/test_mcp_conformance.py): a free port, a child process serving on it, the environment a
child needs to import ``svc``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"
TESTS_DIR = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """This process's environment with ``python/`` and ``tests/`` first on ``PYTHONPATH``."""
    path = os.pathsep.join(
        p for p in (str(PYTHON_DIR), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(argv: Sequence[str], port: int, ready_timeout: float = 60) -> Iterator[str]:
    """Runs `argv` (a server that listens on 127.0.0.1:`port`) until the block ends.

    Yields ``http://127.0.0.1:<port>`` once the port accepts connections. Raises
    AssertionError with the child's output when it exits first or is not listening within
    `ready_timeout` seconds (a start-up limit, not a limit on the test).
    """
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"{argv} exited with {proc.returncode}: {out}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{argv} is not listening on {port}"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def python(*args: str) -> list[str]:
    """``[sys.executable, *args]``."""
    return [sys.executable, *args]


def wait_ready(base: str, ready_timeout: float = 60) -> None:
    """Waits until ``<base>/readyz`` answers 200 (a start-up limit, not a limit on the test)."""
    import httpx

    deadline = time.monotonic() + ready_timeout
    last = ""
    while True:
        try:
            r = httpx.get(f"{base}/readyz", timeout=5)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.TransportError as e:
            last = str(e)
        assert time.monotonic() < deadline, f"{base} not ready: {last}"
        time.sleep(0.1)
