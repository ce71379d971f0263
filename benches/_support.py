"""Helpers the benchmarks share (docs/benchmarks.md): quantiles, PostgreSQL, processes.

Imported by ``benches/bench_*.py`` run as scripts (``python benches/bench_x.py`` puts
``benches/`` first on ``sys.path``):

* ``pct``: the nearest-rank quantile of a list of numbers;
* ``postgres_url`` and ``Schema``: the suite's PostgreSQL (``SVC_TEST_POSTGRES_URL``, else
  ``scripts/dev-postgres.sh``, as tests/conftest.py does) and a fresh schema of it, dropped by
  ``drop``;
* ``free_port``: a port free now, found with ``svc.common.net.tcp_listener``;
* ``ServiceProcess``: a ``svc ... serve`` child process, started and waited for until its
  ``/readyz`` answers 200, stopped with SIGTERM; its standard error is drained by a thread and
  kept (``log``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import psycopg
from sqlalchemy.engine import URL, make_url

from svc.common.net import tcp_listener

__all__ = ["REPO", "SVC", "Schema", "ServiceProcess", "free_port", "pct", "postgres_url"]

REPO = Path(__file__).resolve().parent.parent
#: The ``svc`` command next to the running Python (the checkout's virtual environment).
SVC = Path(sys.executable).parent / "svc"


def pct(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank. Raises IndexError when empty."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def postgres_url() -> str:
    """``SVC_TEST_POSTGRES_URL``, else the URL of ``scripts/dev-postgres.sh`` (started).

    Raises:
        subprocess.CalledProcessError: the script failed to start PostgreSQL.

    """
    url = os.environ.get("SVC_TEST_POSTGRES_URL")
    if url:
        return url
    script = REPO / "scripts" / "dev-postgres.sh"
    subprocess.run([str(script), "start"], check=True, capture_output=True, timeout=600)
    out = subprocess.run([str(script), "url"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


class Schema:
    """A fresh PostgreSQL schema named ``<prefix>_<random>``; ``url`` selects it.

    ``url`` is the SQLAlchemy URL with ``options=-csearch_path=<schema>`` (``url_text`` its
    text, password included); ``drop`` removes the schema and everything in it.
    """

    def __init__(self, base: str, prefix: str = "bench") -> None:
        url = make_url(base)
        self.name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.name}"')
        self.url: URL = url.update_query_dict({"options": f"-csearch_path={self.name}"})
        self.url_text = self.url.render_as_string(hide_password=False)

    def drop(self) -> None:
        """Drops the schema (cascade)."""
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')


def free_port() -> int:
    """A port free now (``svc.common.net.tcp_listener`` on port 0, closed)."""
    s = tcp_listener("127.0.0.1", 0)
    try:
        return int(s.getsockname()[1])
    finally:
        s.close()


class ServiceProcess:
    """A ``svc`` child process serving HTTP on ``port``; returns once ``/readyz`` answers 200.

    Args:
        args: the ``svc`` arguments (``["challenge", "serve", "--port", ...]``).
        port: the port it serves ``/readyz`` on.
        env: extra environment variables.
        ready_path: the readiness route.

    Raises:
        RuntimeError: the process exited before it was ready (its standard error in the text).

    """

    def __init__(
        self,
        args: Sequence[str],
        port: int,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/readyz",
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [str(SVC), *args],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        with httpx.Client(base_url=self.url, timeout=5) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"svc {' '.join(args[:2])} exited: {self.log[-2000:]}")
                try:
                    if c.get(ready_path).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def log(self) -> str:
        """What the process wrote to standard error so far."""
        return "".join(self.lines)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def stop(self) -> int:
        """SIGTERM, then waits; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait()
