"""`svc policy` as a person uses it: the service as a real process (SQLite, as under `svc up`),
and the client commands as real processes talking to it over gRPC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from svc.policy.cli import parse_since, target
from test_policy import BAD, CLOSED_ONLY, PUBLIC_ONLY

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def svc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "svc", "policy", *args],
        capture_output=True,
        text=True,
        env=env or ENV,
        check=False,
    )


def write_bundle(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir()
    for name, content in files.items():
        (directory / name).write_text(content)
    return directory


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    admin = tmp_path / "admin.key"
    made = svc("keygen", str(admin))
    assert made.returncode == 0, made.stderr
    assert "key id" in made.stdout and (tmp_path / "admin.key.pub").exists()
    assert svc("keygen", str(admin)).returncode == 2  # never overwritten
    env = {
        **ENV,
        "SVC_POLICY_BREAK_GLASS_KEYS": json.dumps(
            {"ana": (tmp_path / "admin.key.pub").read_text()}
        ),
    }
    log = (tmp_path / "policy.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "svc",
            "policy",
            "--port",
            "0",
            "--database-url",
            f"sqlite:///{tmp_path / 'policy.db'}",
            "--data-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the socket listens
    assert line.startswith("svc-policy listening on 127.0.0.1:"), (
        tmp_path / "policy.log"
    ).read_text()
    yield line.split()[-1], admin
    proc.send_signal(signal.SIGTERM)
    assert proc.wait() == 0, (tmp_path / "policy.log").read_text()[-3000:]
    log.close()
    assert (tmp_path / "policy-signing.key").exists()  # made on first start


def test_cli_draft_publish_mode_rollback(service: tuple[str, Path], tmp_path: Path) -> None:
    url, admin = service
    bad = svc("draft", str(BAD / "validation_errors"), "--url", url)
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT" in bad.stderr
    assert "  policies.cedar:3:8: policy `a`:" in bad.stderr
    assert "  policies.cedar:6:22: policy `b`:" in bad.stderr

    for n, files in ((1, PUBLIC_ONLY), (2, CLOSED_ONLY)):
        d = svc(
            "draft", str(write_bundle(tmp_path / f"b{n}", files)), "--url", url, "--author", "ana"
        )
        assert d.returncode == 0, d.stderr
        assert d.stdout.startswith(f"version {n}  draft  by ana")
        p = svc("publish", str(n), "--url", url, "--author", "ana")
        assert (
            p.returncode == 0 and f"version {n}  active" in p.stdout and "signed by key" in p.stdout
        )

    m = svc("mode", "monitor", "--url", url, "--author", "ana", "--reason", "trial")
    assert m.returncode == 0 and m.stdout.startswith("changed: mode monitor")
    assert svc("mode", "sideways", "--url", url).returncode == 2

    r = svc("rollback", "1", "--key", str(admin), "--admin", "ana", "--url", url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "version 1 active (was 2)"
    intruder = tmp_path / "intruder.key"
    svc("keygen", str(intruder))
    refused = svc("rollback", "2", "--key", str(intruder), "--admin", "ana", "--url", url)
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr

    a = svc("active", "--url", url)
    assert a.returncode == 0
    assert a.stdout.splitlines()[0] == "mode monitor, containment mode monitor"
    assert "version 1  active" in a.stdout
    listed = svc("bundles", "--url", url).stdout
    assert listed.index("version 2  superseded") < listed.index("version 1  active")

    # No history store configured: the dry run is refused, named.
    dry = svc("dry-run", "2", "--since", "24h", "--url", url)
    assert dry.returncode == 1 and "UNAVAILABLE" in dry.stderr and "history_dsn" in dry.stderr


def test_cli_helpers() -> None:
    assert target("http://127.0.0.1:8080/") == "127.0.0.1:8080"
    assert target("127.0.0.1:9") == "127.0.0.1:9"
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert parse_since("24h", now) == now - timedelta(hours=24)
    assert parse_since("2026-01-01T00:00:00Z", now) == datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(Exception, match="offset"):
        parse_since("2026-01-01T00:00:00", now)


def test_cli_sends_a_caller_token(tmp_path: Path) -> None:
    """`svc policy --auth-*` checks callers (docs/auth.md); the client commands send `--token`,
    `SVC_POLICY_TOKEN`, or the data directory's `caller.token` (as `svc up` writes it)."""
    from svc.common.auth import LocalIssuer

    issuer = LocalIssuer(tmp_path / "issuer")
    data = tmp_path / "data"
    data.mkdir()
    env = {**ENV, "SVC_DATA_DIR": str(data)}
    env.pop("SVC_POLICY_TOKEN", None)
    log = (tmp_path / "policy.log").open("w")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "svc", "policy", "--port", "0", "--data-dir", str(tmp_path)),
            *("--database-url", f"sqlite:///{tmp_path / 'policy.db'}"),
            *("--auth-issuer", issuer.issuer, "--auth-jwks", issuer.jwks_url),
            *("--auth-callers", "svc-local"),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().split()[-1]
    try:
        bare = svc("active", "--url", url, env=env)
        assert bare.returncode == 1 and "UNAUTHENTICATED" in bare.stderr
        token = issuer.mint("svc-local", "svc-policy", 600)
        given = svc("active", "--url", url, "--token", token, env=env)
        # Past the token check: the service answers that nothing is published yet.
        assert given.stdout.startswith("mode enforce"), given.stderr
        assert "NOT_FOUND: nothing is published yet" in given.stderr
        from_env = svc("bundles", "--url", url, env={**env, "SVC_POLICY_TOKEN": token})
        assert from_env.returncode == 0, from_env.stderr
        (data / "caller.token").write_text(issuer.mint("svc-other", "svc-policy", 600) + "\n")
        other = svc("active", "--url", url, env=env)
        assert other.returncode == 1 and "PERMISSION_DENIED" in other.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait() == 0, (tmp_path / "policy.log").read_text()[-3000:]
        log.close()
    wide = svc("--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path), env=env)
    assert wide.returncode == 2 and "refusing to listen on 0.0.0.0" in wide.stderr


def test_migrate_is_idempotent_and_names_the_revision(tmp_path: Path) -> None:
    """`svc policy migrate` (the chart's pre-upgrade Job) applies the schema once, then again
    changes nothing; both times it prints the head revision."""
    from typer.testing import CliRunner

    from svc.cli import app
    from svc.policy.migrate import HEAD, current_revision

    url = f"sqlite:///{tmp_path / 'policy.db'}"
    runner = CliRunner()
    for _ in range(2):
        r = runner.invoke(app, ["policy", "migrate", "--database-url", url])
        assert r.exit_code == 0, r.output
        assert r.output.strip() == f"policy schema at revision {HEAD}"
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        assert current_revision(engine) == HEAD
    finally:
        engine.dispose()


def test_cli_policy_tests_guard_a_publish(service: tuple[str, Path], tmp_path: Path) -> None:
    """docs/policy.md#policy-tests from the command line: list, run under a version, publish
    refused while a test fails and allowed with it accepted, delete."""
    import grpc
    from google.protobuf import struct_pb2

    from svc.policy.v1 import policy_pb2 as pb
    from svc.policy.v1 import policy_pb2_grpc as pb_grpc

    url, _ = service
    for n, files in ((1, PUBLIC_ONLY), (2, CLOSED_ONLY)):
        d = svc("draft", str(write_bundle(tmp_path / f"b{n}", files)), "--url", url)
        assert d.returncode == 0, d.stderr
    first = svc("publish", "1", "--url", url, "--author", "ana")
    assert first.returncode == 0 and "tests under version 1: 0 passed, 0 failed" in first.stdout
    entity = struct_pb2.Struct()
    entity.update({"uid": {"type": "Doc", "id": "open"}, "attrs": {"public": True}, "parents": []})
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.SaveTest(
            pb.SaveTestRequest(
                author="ana",
                test=pb.PolicyTest(
                    name="open stays open",
                    expect="allow",
                    entities=[entity],
                    request=pb.TestRequest(
                        principal=pb.EntityRef(type="User", id="alice"),
                        action="view",
                        resource=pb.EntityRef(type="Doc", id="open"),
                    ),
                ),
            )
        )
    listed = svc("tests", "--url", url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("open stays open: User::alice view Doc::open expects allow")
    assert "saved by ana" in listed.stdout
    ok = svc("tests", "--run", "0", "--url", url)
    assert ok.returncode == 0 and "tests under version 1: 1 passed, 0 failed" in ok.stdout
    failing = svc("tests", "--run", "2", "--url", url)
    assert failing.returncode == 1
    assert "  FAILED open stays open: expected allow, got deny" in failing.stdout

    refused = svc("publish", "2", "--url", url, "--author", "ana")
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr
    assert "  tests[open stays open]: expected allow, got deny" in refused.stderr
    accepted = svc(
        "publish", "2", "--url", url, "--author", "ana",
        "--accept-failing-test", "open stays open",
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert "version 2  active" in accepted.stdout
    assert "tests under version 2: 0 passed, 1 failed" in accepted.stdout

    gone = svc("test-delete", "open stays open", "--url", url, "--author", "ana")
    assert gone.returncode == 0 and gone.stdout.strip() == "deleted open stays open"
    assert svc("tests", "--url", url).stdout == ""
    again = svc("test-delete", "open stays open", "--url", url)
    assert again.returncode == 1 and "NOT_FOUND" in again.stderr
