"""The portal's settings and command line (docs/portal.md#settings, #running-it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from svc.portal.settings import PortalSettings

SVC = Path(sys.executable).parent / "svc"


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValidationError, match="set together"):
        PortalSettings(person_issuer="https://idp.example.com")
    with pytest.raises(ValidationError, match="https://"):
        PortalSettings(person_issuer="https://idp", person_jwks_url="http://idp/jwks")
    with pytest.raises(ValidationError, match="max_page_size"):
        PortalSettings(max_page_size=0)
    with pytest.raises(ValidationError, match="trust_refresh_secs"):
        PortalSettings(trust_refresh_secs=11)  # a trust change must apply within ten seconds
    with pytest.raises(ValidationError, match="extra"):
        PortalSettings(colour="red")  # type: ignore[call-arg]
    s = PortalSettings()
    assert (s.host, s.port, s.dev, s.max_query_depth) == ("127.0.0.1", 8080, False, 10)


def test_serve_refuses_a_public_bind_without_https(tmp_path: Path) -> None:
    env = {**os.environ, "SVC_PORTAL_HOST": "0.0.0.0"}
    r = subprocess.run(
        [str(SVC), "portal", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert "refusing to listen on 0.0.0.0" in r.stderr
    r = subprocess.run(
        [str(SVC), "portal", "serve", "--max-page-size", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "max_page_size" in r.stderr.replace("-", "_"), r.stderr


def test_schema_command_prints_the_sdl() -> None:
    from svc.portal.gql import schema_sdl

    r = subprocess.run([str(SVC), "portal", "schema"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout == schema_sdl()
