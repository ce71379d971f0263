"""`svc check` and `svc validate`, run as a user would (subprocess of the installed script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORP = REPO / "tests" / "testdata" / "bundles" / "corp"


def svc(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "svc.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_prints_the_decision(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(
        json.dumps(
            {
                "principal": {"type": "Human", "id": "alice"},
                "action": "delete",
                "resource": {"type": "Document", "id": "design"},
            }
        )
    )
    out = svc("check", "--bundle", str(CORP), str(req))
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["verdict"] == "challenge" and body["challenges"] == ["verification"]
    record = json.loads(
        svc("check", "--record", "--mode", "monitor", "--bundle", str(CORP), str(req)).stdout
    )
    assert record["mode"] == "monitor" and record["action"] == "delete"
    assert svc("check", "--exit-code", "--bundle", str(CORP), str(req)).returncode == 1


def test_check_reads_stdin_and_cedar_cli_requests(cedar_examples: Path) -> None:
    app = cedar_examples / "document_cloud"
    for f in sorted((app / "ALLOW").glob("*.json")):
        out = svc("check", "--bundle", str(app), "-", stdin=f.read_text())
        assert json.loads(out.stdout)["verdict"] == "allow", f


def test_check_bad_input_exits_2_with_the_reason(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(
        '{"principal": {"type": "Human", "id": "alice"}, "action": "fly", '
        '"resource": {"type": "Document", "id": "design"}}'
    )
    out = svc("check", "--bundle", str(CORP), str(req))
    assert out.returncode == 2 and "unknown action `fly`" in out.stderr
    req.write_text("{not json")
    out = svc("check", "--bundle", str(CORP), str(req))
    assert out.returncode == 2 and "not JSON" in out.stderr
    out = svc(
        "check", "--bundle", str(REPO / "tests/testdata/bad_bundles/validation_errors"), str(req)
    )
    assert out.returncode == 2 and "policies.cedar:3:8" in out.stderr
    out = svc("check", "--bundle", str(CORP), str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "cannot read request" in out.stderr


def test_validate_lists_policies() -> None:
    out = svc("validate", "--bundle", str(CORP))
    assert out.returncode == 0 and "bob-views-roadmap" in out.stdout


def test_python_m_svc_is_the_svc_command() -> None:
    """`python -m svc` runs the same command as the `svc` script."""
    r = subprocess.run(
        [sys.executable, "-m", "svc", "validate", "--bundle", str(CORP)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "owner-full-access" in r.stdout
    usage = subprocess.run(
        [sys.executable, "-m", "svc", "--help"], capture_output=True, text=True, timeout=120
    )
    assert usage.returncode == 0 and "Usage: svc" in usage.stdout, usage.stdout
