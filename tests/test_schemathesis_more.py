"""schemathesis over the HTTP APIs tests/test_schemathesis.py leaves out (issue 43).

The history's routes (``/v1/history``) with bearer tokens on, the reasoner's app (its probes
and ``POST /v1/cycles``, with the context, challenge and policy services it reads served for
real and the history on chDB), and the probe apps of the connectors and the reporter. Each is
served by uvicorn on 127.0.0.1 (``apifuzz.serve``) and every request carries a valid token,
so it reaches past the token check. Every built-in check runs (``apifuzz.load``): no 5xx, every
answer as the app's own OpenAPI document says (an error is an RFC 9457 problem).

Budget: ``SVC_HARDENING_FUZZ_EXAMPLES`` (default 10) examples per operation and phase, as in
tests/test_schemathesis.py.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from clickhouse_connect.driver.client import Client
from hypothesis import settings

import apifuzz
from svc import history
from svc.challenge.app import ChallengeServer
from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.common.auth import LocalIssuer
from svc.common.auth_settings import HistoryAuthSettings, PolicyAuthSettings
from svc.connectors.app import create_app as connectors_app
from svc.connectors.service import ConnectorsService
from svc.connectors.settings import ConnectorsSettings
from svc.context.app import create_app as context_app
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.history.service import create_app as history_app
from svc.policy.app import PolicyServer
from svc.policy.settings import PolicySettings
from svc.reasoner.app import create_app as reasoner_app
from svc.reasoner.clients import ChallengeClient, ContextClient, PolicyClient
from svc.reasoner.service import ReasonerService
from svc.reasoner.settings import ReasonerAuthSettings, ReasonerSettings
from svc.reporter.app import create_app as reporter_app
from svc.reporter.service import Reporter
from svc.reporter.settings import ReporterSettings

EXAMPLES = int(os.environ.get("SVC_HARDENING_FUZZ_EXAMPLES", "10"))
FUZZ = settings(apifuzz.FUZZ_SETTINGS, max_examples=EXAMPLES)
CALLER = "svc-fuzz-admin"
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)

_ISSUER_DIR = Path(tempfile.mkdtemp(prefix="svc-fuzz-issuer-"))
ISSUER = LocalIssuer(_ISSUER_DIR / "issuer")
TOKEN = ISSUER.mint(CALLER, ["svc-history", "svc-reasoner"], 24 * 3600)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def auth_of(cls: Any) -> Any:
    return cls(auth_issuer=ISSUER.issuer, auth_jwks=ISSUER.jwks_url, auth_callers=[CALLER])


@pytest.fixture(scope="module")
def chdb_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb://{tmp_path_factory.mktemp('chdb')}"


def _history_client(chdb_root: str) -> Client:
    client = history.connect(
        f"{chdb_root}?database=fz_{uuid.uuid4().hex[:8]}", create_database=True
    )
    history.migrate(client)
    return client


# -- the history's routes, authenticated -----------------------------------------------------


@pytest.fixture(scope="module")
def history_url(chdb_root: str) -> Iterator[str]:
    client = _history_client(chdb_root)
    with apifuzz.serve(
        history_app(client, auth=auth_of(HistoryAuthSettings), now=lambda: NOW)
    ) as base:
        yield base


HISTORY_OPENAPI = history_app(None, auth=HistoryAuthSettings(auth="none")).openapi()  # type: ignore[arg-type]
history_schema = apifuzz.load(HISTORY_OPENAPI, headers=AUTH)


def test_history_refuses_a_request_without_its_token(history_url: str) -> None:
    r = httpx.get(f"{history_url}/v1/history/totals")
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    assert httpx.get(f"{history_url}/v1/history/totals", headers=AUTH).status_code == 200


@history_schema.parametrize()
@FUZZ
def test_history_api_fuzz(case: Any, history_url: str) -> None:
    case.call_and_validate(base_url=history_url)


# -- the reasoner: probes and POST /v1/cycles, its dependencies served for real ---------------


@pytest.fixture(scope="module")
def reasoner_url(chdb_root: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("rsn")
    ctx_settings = ContextSettings(database_url=f"sqlite:///{data / 'context.db'}")
    ctx = ContextService(ctx_settings)
    pol_settings = PolicySettings(
        port=0, data_dir=data, database_url=f"sqlite:///{data / 'policy.db'}"
    )
    chal_settings = ChallengeSettings(
        port=0,
        database_url=f"sqlite:///{data / 'challenge.db'}",
        link_key_file=str(data / "link.key"),
    )
    with apifuzz.serve(
        context_app(ctx, ctx_settings, ContextAuthSettings(auth="none"))
    ) as context_url:
        policy = PolicyServer(pol_settings, auth=PolicyAuthSettings(auth="none")).start()
        challenge = ChallengeServer(
            chal_settings, auth=ChallengeAuthSettings(auth="none"), outbox=False
        ).start()
        try:
            s = ReasonerSettings(
                context_url=context_url,
                challenge_url=challenge.url,
                policy_url=policy.url,
                lease_url=f"file://{data / 'reasoner.lease'}",
            )
            service = ReasonerService(
                s,
                _history_client(chdb_root),
                ContextClient(s.context_url),
                ChallengeClient(s.challenge_url),
                PolicyClient(s.policy_url),
            )
            with apifuzz.serve(reasoner_app(s, service, auth_of(ReasonerAuthSettings))) as base:
                yield base
        finally:
            challenge.stop()
            challenge.service.close()
            policy.stop()
            policy.service.close()
    ctx.close()


def _reasoner_openapi() -> dict[str, Any]:
    s = ReasonerSettings(lease_url=None)
    return dict(
        reasoner_app(s, ReasonerService(s, None, None, None, None)).openapi()  # type: ignore[arg-type]
    )


reasoner_schema = apifuzz.load(_reasoner_openapi(), headers=AUTH)


def test_the_reasoner_runs_a_cycle_for_its_caller_only(reasoner_url: str) -> None:
    assert httpx.post(f"{reasoner_url}/v1/cycles", json={}).status_code == 401
    r = httpx.post(
        f"{reasoner_url}/v1/cycles", json={"at": NOW.isoformat()}, headers=AUTH, timeout=120
    )
    # 409 while the cycle the app runs at start is still running.
    assert r.status_code in (200, 409), r.text


@reasoner_schema.parametrize()
@FUZZ
def test_reasoner_api_fuzz(case: Any, reasoner_url: str) -> None:
    case.call_and_validate(base_url=reasoner_url, timeout=120)


# -- the probe apps of the connectors and the reporter ---------------------------------------


def _connectors(data: Path) -> Any:
    # No source configured: the loop has nothing to poll, the probes answer.
    s = ConnectorsSettings(port=0, state_path=str(data / "state.db"))
    return connectors_app(s, ConnectorsService(s))


def _reporter() -> Any:
    # No portal configured: nothing is sent, the probes answer.
    s = ReporterSettings(port=0, install_id="0b6a4c1e-8d2f-4a53-9e1b-2f1c3d4e5f60")
    return reporter_app(s, Reporter(s))


_probe_dir = Path(tempfile.mkdtemp(prefix="svc-fuzz-probes-"))
connectors_schema = apifuzz.load(dict(_connectors(_probe_dir).openapi()))
reporter_schema = apifuzz.load(dict(_reporter().openapi()))


@pytest.fixture(scope="module")
def connectors_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with apifuzz.serve(_connectors(tmp_path_factory.mktemp("conn"))) as base:
        yield base


@pytest.fixture(scope="module")
def reporter_url() -> Iterator[str]:
    with apifuzz.serve(_reporter()) as base:
        yield base


@connectors_schema.parametrize()
@FUZZ
def test_connectors_probes_fuzz(case: Any, connectors_url: str) -> None:
    case.call_and_validate(base_url=connectors_url)


@reporter_schema.parametrize()
@FUZZ
def test_reporter_probes_fuzz(case: Any, reporter_url: str) -> None:
    case.call_and_validate(base_url=reporter_url)
