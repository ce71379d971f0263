"""The release wheel (docs/dev.md, "The release wheel"): built once with maturin, installed in a
new virtual environment that has nothing else, it carries complete metadata, `svc --version`
prints the release, and `svc up` serves from it alone.

Building reuses the release artefacts in the Cargo target directory (`CARGO_TARGET_DIR`, as the
Makefile sets it), so after `make build` the build only links; the install fetches the run-time
dependencies from the package index (pip's cache makes it quick after the first run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import httpx
import pytest

from uphelp import Up, start_up

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RELEASE = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def _run(*cmd: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, f"{cmd}: {r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel (`maturin build --release`) and the sdist (`maturin sdist`) in a fresh
    directory. `make wheel` builds the wheel from the sdist instead (`--sdist`), which compiles
    the crates again from a temporary directory; building from the checkout reuses what
    `make build` compiled."""
    out = tmp_path_factory.mktemp("dist")
    env = {
        **os.environ,
        "CARGO_TARGET_DIR": os.environ.get(
            "CARGO_TARGET_DIR", str(Path.home() / ".cache" / "svc-target")
        ),
    }
    _run(BIN / "maturin", "build", "--release", "-o", out, env=env)
    _run(BIN / "maturin", "sdist", "-o", out, env=env)
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (whl,) = dist.glob("svc-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with only the wheel (and what it requires) installed."""
    root = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", root)
    _run(root / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel)
    return root


def clean_env(venv: Path) -> dict[str, str]:
    """An environment that sees the new venv only: no PYTHONPATH, no svc settings."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "USER")}
    return {**keep, "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "VIRTUAL_ENV": str(venv)}


def test_wheel_and_sdist_carry_complete_metadata(dist: Path, wheel: Path) -> None:
    (sdist,) = dist.glob("svc-*.tar.gz")
    assert sdist.name == f"svc-{RELEASE}.tar.gz"
    with tarfile.open(sdist) as t:
        files = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        pkg_info = Parser().parsestr(t.extractfile(f"svc-{RELEASE}/PKG-INFO").read().decode())  # type: ignore[union-attr]
    assert (pkg_info["Name"], pkg_info["Version"]) == ("svc", RELEASE)
    # Everything a build from source needs: the workspace, the binding, the protos, Python.
    for f in (
        "Cargo.toml",
        "Cargo.lock",
        "pyproject.toml",
        "LICENSE",
        "crates/pdp_py/src/lib.rs",
        "proto/svc/authz/v1/authz.proto",
        "python/svc/cli.py",
    ):
        assert f in files, f
    name, version, python, abi, platform = wheel.name.removesuffix(".whl").split("-")
    assert (name, version, python, abi) == ("svc", RELEASE, "cp311", "abi3")
    assert platform.startswith("manylinux_") and platform.endswith("_x86_64")
    with zipfile.ZipFile(wheel) as z:
        info = f"svc-{RELEASE}.dist-info"
        meta = Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        names = set(z.namelist())
    assert (meta["Name"], meta["Version"]) == ("svc", RELEASE)
    assert meta["License-Expression"] == "Apache-2.0"
    assert f"{info}/licenses/LICENSE" in names
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Summary"]
    assert "svc=svc.cli:app" in entry_points.replace(" ", "")
    # What runs needs the extension, the generated gRPC modules and the page's static files.
    assert "svc/_pdp_core.abi3.so" in names
    for pkg in ("authz", "policy", "challenge"):
        assert f"svc/{pkg}/v1/{pkg}_pb2.py" in names
        assert f"svc/{pkg}/v1/{pkg}_pb2_grpc.py" in names
    assert "svc/challenge/static/challenge.html" in names
    assert any(n.startswith("svc/demo/bundle/") for n in names)
    # Nothing that is only for tests or development.
    assert not any(n.startswith(("tests/", "benches/")) for n in names)


def test_svc_version_prints_the_release(venv: Path) -> None:
    out = _run(venv / "bin" / "svc", "--version", env=clean_env(venv))
    assert out.strip() == RELEASE


@pytest.fixture(scope="module")
def installed_up(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    up = start_up(
        tmp_path_factory.mktemp("up-wheel"),
        "--demo",
        command=[str(venv / "bin" / "svc")],
        env=clean_env(venv),
    )
    try:
        yield up
    finally:
        code, _, err = up.stop()
        assert code == 0, err


def test_svc_up_serves_from_the_installed_wheel(installed_up: Up) -> None:
    """The demo install from the wheel alone: every component ready, and the decision point
    decides (a stranger reading a document is denied)."""
    for k in range(6):
        url = f"http://127.0.0.1:{installed_up.port + k}"
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200, url
    assert RELEASE in str(httpx.get(f"{installed_up.pdp}/version", timeout=10).json())
    r = httpx.post(
        f"{installed_up.pdp}/v1/access/evaluation",
        json={
            "principal": {"type": "Human", "id": "nobody-in-the-directory"},
            "action": "read",
            "resource": {"type": "Document", "id": "any"},
        },
        headers=installed_up.auth,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["verdict"] == "deny" and r.json()["qid"]
