"""The README's copy-paste examples, run against a fresh `svc up` (issue: svc up, item 3).

A block is checked when the line before its opening fence is ``<!-- readme-check -->``:

* ```` ```console ```` blocks: each ``$ `` line (with ``\\`` continuations) is run with bash; the
  lines after it, up to the next ``$ ``, are its output as the README shows it. A command ending
  in `` &`` with ``--port 808N`` is a server the rest of its block talks to: it is started on a
  free port (``808N`` in that block's commands is replaced by it), must accept connections before
  the next command runs, and is stopped (SIGTERM, exit code 0) when the block ends;
* ```` ```python ```` blocks: run with this interpreter; the ```` ```text ```` block right after
  is the output.

Outputs are compared as JSON with the values that differ on every run (ids, times, latencies)
masked; an output that is not JSON is compared as text. Ports 8080-8082 (outside a block's own
server) and the default data directory are replaced by the test install's.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from uphelp import Up, free_base_port, start_up

README = Path(__file__).resolve().parents[1] / "README.md"
MARK = "<!-- readme-check -->"
VOLATILE = {
    "qid",
    "decision_qid",
    "at",
    "received_at",
    "ingest_id",
    "latency_us",
    "challenge_qid",
    "plan_qid",
}
_PORT = re.compile(r"(localhost|127\.0\.0\.1):808([0-2])")
_SERVER_PORT = re.compile(r"--port 808([0-2])\b")


@dataclass
class Example:
    """One command (or program) and the output the README shows for it."""

    line: int
    kind: str  # "shell", "python" or "server" (a `$ ... &` line: runs while its block does)
    code: str
    expected: str
    block: int = 0  # README line of the block's first line, shared by the block's examples


def examples(text: str) -> list[Example]:
    lines = text.splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != MARK:
            i += 1
            continue
        fence = lines[i + 1].strip()
        j = i + 2
        body: list[str] = []
        while lines[j].strip() != "```":
            body.append(lines[j])
            j += 1
        if fence == "```console":
            out += _console(body, i + 3)
        elif fence == "```python":
            k = j + 1
            while not lines[k].strip():
                k += 1
            assert lines[k].strip() == "```text", f"README line {k + 1}: expected ```text output"
            m = k + 1
            expected: list[str] = []
            while lines[m].strip() != "```":
                expected.append(lines[m])
                m += 1
            out.append(Example(i + 3, "python", "\n".join(body), "\n".join(expected), i + 3))
            j = m
        else:
            raise AssertionError(f"README line {i + 2}: {MARK} before {fence}")
        i = j + 1
    return out


def _console(body: list[str], first: int) -> list[Example]:
    out: list[Example] = []
    k = 0
    while k < len(body):
        assert body[k].startswith("$ "), f"README line {first + k}: expected `$ command`"
        start = first + k
        cmd = [body[k][2:]]
        while not _complete("\n".join(cmd)):
            k += 1
            cmd.append(body[k])
        k += 1
        expected: list[str] = []
        while k < len(body) and not body[k].startswith("$ "):
            expected.append(body[k])
            k += 1
        code = "\n".join(cmd)
        if code.endswith(" &") and not code.endswith("&& &"):
            assert not "\n".join(expected).strip(), f"README line {start}: output after a server"
            out.append(Example(start, "server", code.removesuffix("&").rstrip(), "", first))
        else:
            out.append(Example(start, "shell", code, "\n".join(expected), first))
    return out


def _complete(cmd: str) -> bool:
    """Whether a shell command ends here (no trailing backslash, every quote closed)."""
    if cmd.endswith("\\"):
        return False
    try:
        shlex.split(cmd)
    except ValueError:
        return False
    return True


def mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<varies>" if k in VOLATILE else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def parse(text: str) -> Any:
    """The JSON documents of an output (one per line, or one over several lines)."""
    text = text.strip()
    if not text:
        return []
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError:
        return [text]  # a plain-text output, compared as it stands


def localise(code: str, up: Up, ports: dict[int, int] | None = None) -> str:
    """`code` with README port 808N replaced by `ports[N]` (a block's own server) or else by the
    test install's port N, and the default data directory by the test install's."""
    own = ports or {}

    def port(m: re.Match[str]) -> str:
        n = int(m.group(2))
        return f"{m.group(1)}:{own.get(n, up.port + n)}"

    code = _PORT.sub(port, code)
    return code.replace("~/.local/share/svc", str(up.data_dir))


@contextmanager
def background(ex: Example, ports: dict[int, int], cwd: Path, path: str) -> Iterator[None]:
    """Runs a README `$ ... --port 808N &` server on a free port (recorded in `ports[N]`) until
    the block ends: yields once it accepts TCP connections on 127.0.0.1; then SIGTERM, and its
    exit code must be 0. Raises AssertionError when it exits before accepting or stops badly."""
    m = _SERVER_PORT.search(ex.code)
    assert m, f"README line {ex.line}: a background server needs --port 808N"
    port = free_base_port()
    ports[int(m.group(1))] = port
    code = ex.code[: m.start()] + f"--port {port}" + ex.code[m.end() :]
    proc = subprocess.Popen(
        ["bash", "-c", f"export PATH={path}:$PATH; exec {code}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"README line {ex.line}: exited with {proc.returncode}: {proc.communicate()[1]}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"README line {ex.line}: never listened"
                time.sleep(0.1)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, f"README line {ex.line}: stopped with {proc.returncode}: {err}"


@pytest.fixture(scope="module")
def readme_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    up = start_up(tmp_path_factory.mktemp("readme-up"))
    yield up
    code, _, err = up.stop()
    assert code == 0, err


def test_readme_has_checked_examples() -> None:
    found = examples(README.read_text())
    kinds = {e.kind for e in found}
    assert kinds == {"shell", "python", "server"}
    text = " ".join(e.code for e in found)
    for route in ("/v1/access/evaluation", "/v1/access/plan", "/access/v1/evaluation"):
        assert route in text
    assert "grpc" in text.lower()


def test_readme_examples_answer_as_shown(readme_up: Up) -> None:
    venv_bin = str(Path(sys.executable).parent)
    with ExitStack() as servers:
        ports: dict[int, int] = {}
        block = -1
        for ex in examples(README.read_text()):
            if ex.block != block:
                servers.close()  # the previous block's servers stop with it
                ports, block = {}, ex.block
            if ex.kind == "server":
                servers.enter_context(background(ex, ports, README.parent, venv_bin))
                continue
            check_example(ex, localise(ex.code, readme_up, ports), venv_bin)


def check_example(ex: Example, code: str, venv_bin: str) -> None:
    """Runs one README command or program (`code`: already localised) from the repository's
    root and compares its standard output with what the README shows (see the module's doc)."""
    if ex.kind == "shell":
        r = subprocess.run(
            ["bash", "-c", f"export PATH={venv_bin}:$PATH; set -o pipefail; {code}"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=README.parent,
        )
    else:
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=README.parent,
        )
    assert r.returncode == 0, f"README line {ex.line}: {r.stderr}"
    got, want = mask(parse(r.stdout)), mask(parse(ex.expected))
    for _ in range(20):  # a read of the history may come before the loader stored the row
        if got == want or " -d " in code or ex.kind != "shell":
            break
        time.sleep(0.5)
        r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
        got = mask(parse(r.stdout))
    assert got == want, f"README line {ex.line}:\n{ex.code}\ngot  {r.stdout}\nwant {ex.expected}"
