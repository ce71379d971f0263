"""The README's copy-paste examples, run against a fresh `svc up` (issue: svc up, item 3).

A block is checked when the line before its opening fence is ``<!-- readme-check -->``:

* ```` ```console ```` blocks: each ``$ `` line (with ``\\`` continuations) is run with bash; the
  lines after it, up to the next ``$ ``, are its output as the README shows it;
* ```` ```python ```` blocks: run with this interpreter; the ```` ```text ```` block right after
  is the output.

Outputs are compared as JSON with the values that differ on every run (ids, times, latencies)
masked. Ports 8080-8082 and the default data directory are replaced by the test install's.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from uphelp import Up, start_up

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


@dataclass
class Example:
    """One command (or program) and the output the README shows for it."""

    line: int
    kind: str  # "shell" or "python"
    code: str
    expected: str


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
            out.append(Example(i + 3, "python", "\n".join(body), "\n".join(expected)))
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
        out.append(Example(start, "shell", "\n".join(cmd), "\n".join(expected)))
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
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def localise(code: str, up: Up) -> str:
    code = _PORT.sub(lambda m: f"{m.group(1)}:{up.port + int(m.group(2))}", code)
    return code.replace("~/.local/share/svc", str(up.data_dir))


@pytest.fixture(scope="module")
def readme_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    up = start_up(tmp_path_factory.mktemp("readme-up"))
    yield up
    code, _, err = up.stop()
    assert code == 0, err


def test_readme_has_checked_examples() -> None:
    found = examples(README.read_text())
    kinds = {e.kind for e in found}
    assert kinds == {"shell", "python"}
    text = " ".join(e.code for e in found)
    for route in ("/v1/access/evaluation", "/v1/access/plan", "/access/v1/evaluation"):
        assert route in text
    assert "grpc" in text.lower()


def test_readme_examples_answer_as_shown(readme_up: Up) -> None:
    venv_bin = str(Path(sys.executable).parent)
    for ex in examples(README.read_text()):
        code = localise(ex.code, readme_up)
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
        assert got == want, (
            f"README line {ex.line}:\n{ex.code}\ngot  {r.stdout}\nwant {ex.expected}"
        )
