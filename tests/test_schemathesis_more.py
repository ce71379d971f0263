"""schemathesis over the HTTP APIs tests/test_schemathesis.py leaves out (issue 43).

* the history's routes (``/v1/history``) with bearer tokens on;
* the reasoner's app (its probes and ``POST /v1/cycles``), with the context, challenge and
  policy services it reads served for real and the history on chDB;
* the probe apps of the connectors and the reporter;
* the gateway's own routes (probes, the challenge wait) with a trusted app's agent token, the
  wait answered by the decision point;
* the decision point's HTTP API (``svc pdp`` with tokens on), from a document written here
  after docs/api.md: it serves none of its own;
* the portal's REST routes (the agents API with a trusted app's token, ``/api/v1/me`` with a
  signed-in session; tests/portalkit.py starts it with what it calls) and its sign-in routes.

Each is served for real on 127.0.0.1 (uvicorn through ``apifuzz.serve``, or the component's
own server) and every request carries a valid credential, so it reaches past the check. Every
built-in check runs (``apifuzz.load``): no 5xx, every answer as the document says (an error is
an RFC 9457 problem).

Budget: ``SVC_HARDENING_FUZZ_EXAMPLES`` (default 10) examples per operation and phase, as in
tests/test_schemathesis.py; the file runs in about 40 s on the shared two cores.
"""

from __future__ import annotations

import json
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
from hypothesis import given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

import apifuzz
from gwkit import Issuer, JwksServer
from portalkit import World, pg_schema
from serverkit import wait_until
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
from svc.gateway.app import create_app as gateway_app
from svc.gateway.app import health_app as gateway_health
from svc.gateway.service import GatewayService
from svc.gateway.settings import GatewaySettings
from svc.gateway.tokens import AgentTokenVerifier
from svc.history.service import create_app as history_app
from svc.policy.app import PolicyServer
from svc.policy.settings import PolicySettings
from svc.portal.app import create_app as portal_app
from svc.reasoner.app import create_app as reasoner_app
from svc.reasoner.clients import ChallengeClient, ContextClient, PolicyClient
from svc.reasoner.service import ReasonerService
from svc.reasoner.settings import ReasonerAuthSettings, ReasonerSettings
from svc.reporter.app import create_app as reporter_app
from svc.reporter.service import Reporter
from svc.reporter.settings import ReporterSettings
from svc.web import PROBLEM_RESPONSE, PROBLEM_SCHEMA
from test_pdp_standalone import Pdp

EXAMPLES = int(os.environ.get("SVC_HARDENING_FUZZ_EXAMPLES", "10"))
FUZZ = settings(apifuzz.FUZZ_SETTINGS, max_examples=EXAMPLES)
CALLER = "svc-fuzz-admin"
CORP = Path(__file__).parent / "testdata" / "bundles" / "corp"
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)

_ISSUER_DIR = Path(tempfile.mkdtemp(prefix="svc-fuzz-issuer-"))
ISSUER = LocalIssuer(_ISSUER_DIR / "issuer")
TOKEN = ISSUER.mint(CALLER, ["svc-history", "svc-reasoner"], 24 * 3600)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def auth_of(cls: Any) -> Any:
    return cls(auth_issuer=ISSUER.issuer, auth_jwks=ISSUER.jwks_url, auth_callers=[CALLER])


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


# -- the decision point's HTTP API, from a document written here ------------------------------

#: The decision point serves no OpenAPI document; this one says what docs/api.md ("HTTP
#: routes", "AuthZEN 1.0", "Challenge waits") does, no stricter.
_REF = {
    "type": "object",
    "required": ["type", "id"],
    "properties": {"type": {"type": "string"}, "id": {"type": "string"}},
}
_PROPS = {"type": "object"}
_ZEN_ENTITY = {
    "type": "object",
    "required": ["type", "id"],
    "properties": {"type": {"type": "string"}, "id": {"type": "string"}, "properties": _PROPS},
}
_ZEN_ACTION = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
_PAGE = {
    "type": "object",
    "properties": {"token": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
}
_PDP_BODIES: dict[str, dict[str, Any]] = {
    "/v1/access/evaluation": {
        "type": "object",
        "required": ["principal", "action", "resource"],
        "properties": {
            "principal": _REF,
            "action": {"type": "string"},
            "resource": _REF,
            "on_behalf_of": _REF,
            "context": {"type": "object"},
            "entities": {"type": "array", "items": {"type": "object"}},
        },
    },
    "/v1/access/plan": {"type": "object"},
    "/v1/access/challenge": {
        "type": "object",
        "required": ["challenge_qid", "principal"],
        "properties": {
            "challenge_qid": {"type": "string"},
            "principal": _REF,
            "on_behalf_of": _REF,
            "wait_secs": {"type": "integer", "minimum": 0, "maximum": 1},
        },
    },
    "/access/v1/evaluation": {
        "type": "object",
        "required": ["subject", "action", "resource"],
        "properties": {
            "subject": _ZEN_ENTITY,
            "action": _ZEN_ACTION,
            "resource": _ZEN_ENTITY,
            "context": {"type": "object"},
        },
    },
    # The top-level members are defaults each item takes; they are checked as part of an item,
    # and an invalid item is an error entry of a 200 answer, not a 400 of the batch.
    "/access/v1/evaluations": {
        "type": "object",
        "properties": {
            "subject": {},
            "action": {},
            "resource": {},
            "context": {},
            "evaluations": {"type": "array", "maxItems": 20, "items": {"type": "object"}},
            "options": {"type": "object"},
        },
    },
    "/access/v1/search/subject": {
        "type": "object",
        "required": ["subject", "action", "resource"],
        "properties": {
            "subject": {"type": "object", "properties": {"type": {"type": "string"}}},
            "action": _ZEN_ACTION,
            "resource": _ZEN_ENTITY,
            "page": _PAGE,
        },
    },
    "/access/v1/search/resource": {
        "type": "object",
        "required": ["subject", "action", "resource"],
        "properties": {
            "subject": _ZEN_ENTITY,
            "action": _ZEN_ACTION,
            "resource": {"type": "object", "properties": {"type": {"type": "string"}}},
            "page": _PAGE,
        },
    },
    "/access/v1/search/action": {
        "type": "object",
        "required": ["subject", "resource"],
        "properties": {"subject": _ZEN_ENTITY, "resource": _ZEN_ENTITY, "page": _PAGE},
    },
}
_JSON_ANSWER = {"content": {"application/json": {"schema": {"type": "object"}}}}


def pdp_document() -> dict[str, Any]:
    """An OpenAPI 3.1 document of the decision point's JSON routes and probes (docs/api.md)."""
    problem = {"description": "a problem", **PROBLEM_RESPONSE}
    paths: dict[str, Any] = {}
    for path, body in _PDP_BODIES.items():
        paths[path] = {
            "post": {
                "operationId": path.strip("/").replace("/", "_"),
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                },
                "responses": {
                    "200": {"description": "the answer", **_JSON_ANSWER},
                    "4XX": problem,
                },
            }
        }
    for path in ("/healthz", "/version", "/.well-known/authzen-configuration"):
        paths[path] = {
            "get": {
                "operationId": path.strip("/").replace("/", "_"),
                "responses": {"200": {"description": "the answer", **_JSON_ANSWER}, "4XX": problem},
            }
        }
    paths["/readyz"] = {
        "get": {
            "operationId": "readyz",
            "responses": {
                "200": {"description": "ready", **_JSON_ANSWER},
                "503": {"description": "not ready", **PROBLEM_RESPONSE},
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "svc-pdp", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": {"Problem": PROBLEM_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


PDP_TOKEN = ISSUER.mint(CALLER, ["svc-pdp"], 24 * 3600)
pdp_schema = apifuzz.load(pdp_document(), headers={"Authorization": f"Bearer {PDP_TOKEN}"})


@pytest.fixture(scope="module")
def pdp_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("pdp")
    chal_settings = ChallengeSettings(
        port=0,
        database_url=f"sqlite:///{data / 'challenge.db'}",
        link_key_file=str(data / "link.key"),
    )
    challenge = ChallengeServer(
        chal_settings, auth=ChallengeAuthSettings(auth="none"), outbox=False
    ).start()
    proc = Pdp(
        "--bundle", str(CORP), "--port", "0", "--no-watch", "--challenge", challenge.url,
        "--auth-issuer", ISSUER.issuer, "--auth-jwks", ISSUER.jwks_url, "--auth-callers", CALLER,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{proc.port()}"
        wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, timeout=60)
        yield base
    finally:
        assert proc.stop() == 0, proc.log
        challenge.stop()
        challenge.service.close()


def test_the_decision_point_decides_for_its_caller_only(pdp_url: str) -> None:
    check = {
        "principal": {"type": "Human", "id": "alice"},
        "action": "view",
        "resource": {"type": "Document", "id": "design"},
    }
    url = f"{pdp_url}/v1/access/evaluation"
    assert httpx.post(url, json=check).status_code == 401
    r = httpx.post(url, json=check, headers={"Authorization": f"Bearer {PDP_TOKEN}"})
    assert r.status_code == 200 and r.json()["verdict"] in ("allow", "deny", "challenge"), r.text


@pdp_schema.parametrize()
@FUZZ
def test_pdp_api_fuzz(case: Any, pdp_url: str) -> None:
    case.call_and_validate(base_url=pdp_url)


# -- the gateway's own routes: the probes and the challenge wait, with an agent's token -------

#: A trusted app's key; its agent token is what the challenge wait takes (docs/gateway.md).
COPILOT = Issuer("https://copilot.example.com", "RS256")
AGENT_TOKEN = COPILOT.mint("ana", "svc-gateway", act="copilot.assistant", lifetime=24 * 3600)


def _gateway_document() -> dict[str, Any]:
    service = GatewayService(GatewaySettings(port=0))
    verifier = AgentTokenVerifier(service.settings, service.apps)
    return dict(gateway_health(service, verifier).openapi())


gateway_schema = apifuzz.load(
    _gateway_document(), headers={"Authorization": f"Bearer {AGENT_TOKEN}"}
)


@pytest.fixture(scope="module")
def gateway_url(pdp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway (no upstream) trusting COPILOT, waiting on challenges at the decision point."""
    tmp = tmp_path_factory.mktemp("gw")
    jwks = JwksServer(tmp)
    apps = tmp / "apps.json"
    app = {"name": "copilot", "iss": COPILOT.iss, "jwks_url": jwks.publish("copilot", COPILOT)}
    apps.write_text(json.dumps([{**app, "aud": "svc-gateway"}]))
    pdp_token = tmp / "pdp.token"
    pdp_token.write_text(PDP_TOKEN)
    settings = GatewaySettings(
        port=0,
        pdp_url=pdp_url,
        pdp_token_file=str(pdp_token),
        trusted_apps_file=str(apps),
        jwks_ca_file=str(jwks.ca_file),
    )
    try:
        with apifuzz.serve(gateway_app(GatewayService(settings))) as base:
            wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, timeout=60)
            yield base
    finally:
        jwks.close()


def test_the_gateway_s_challenge_wait_takes_the_agent_s_token(gateway_url: str) -> None:
    url = f"{gateway_url}/mcp/challenges/01a202af-c813-7a31-b2c4-0d5e6f708192"
    assert httpx.get(url).status_code == 401
    r = httpx.get(url, headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
    assert r.status_code == 404 and r.json()["type"] == "urn:svc:problem:challenge-not-found"


@gateway_schema.parametrize()
@FUZZ
def test_gateway_routes_fuzz(case: Any, gateway_url: str) -> None:
    case.call_and_validate(base_url=gateway_url)


# -- the portal's REST routes: the agents API with an app's token, the session's with a person's


@pytest.fixture(scope="module")
def portal(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The portal with what it calls (tests/portalkit.py), the apps copilot and billing trusted."""
    with pg_schema(postgres_url) as url:
        w = World(url, tmp_path_factory.mktemp("portal"))
        try:
            yield w
        finally:
            w.close()


@pytest.fixture(scope="module")
def portal_headers(portal: World) -> dict[str, str]:
    """An app token of copilot and the session (cookie, CSRF token) of ana, who signed in."""
    session = portal.sign_in("ana")
    cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    return {
        "Authorization": f"Bearer {portal.copilot.mint('copilot', 'svc-portal', lifetime=86400)}",
        "Cookie": cookie,
        "X-CSRF-Token": session.headers["x-csrf-token"],
    }


def test_the_portal_s_agents_api_takes_the_app_s_token(
    portal: World, portal_headers: dict[str, str]
) -> None:
    url = f"{portal.portal.url}/api/v1/agents/copilot.fuzz"
    body = {"owner": "ana", "ai": True}
    assert httpx.put(url, json=body).status_code == 401
    token = {"Authorization": portal_headers["Authorization"]}
    assert httpx.put(url, json=body, headers=token).status_code in (200, 201)
    me = httpx.get(f"{portal.portal.url}/api/v1/me", headers=portal_headers)
    assert me.status_code == 200 and me.json()["user"] == "ana", me.text


def test_portal_api_fuzz(portal: World, portal_headers: dict[str, str]) -> None:
    """Every operation of the portal's document, data that fits it and data that does not.

    The document is the app's own (the one it serves in dev mode); it needs a running portal's
    settings, so the operations are walked here rather than parametrized at import.
    """
    document = dict(portal_app(portal.settings, portal.service).openapi())
    schema = apifuzz.load(document)
    labels = []
    for result in schema.get_all_operations():
        op = result.ok()
        labels.append(op.label)
        for mode in GenerationMode:

            @given(case=op.as_strategy(generation_mode=mode))
            @FUZZ
            def run(case: Any) -> None:
                case.call_and_validate(base_url=portal.portal.url, headers=portal_headers)

            try:
                run()
            except Unsatisfiable:
                # No parameter and no body: nothing in the request can break the document.
                assert mode is GenerationMode.NEGATIVE, op.label
    assert "PUT /api/v1/agents/{agent_id}" in labels and "GET /api/v1/me" in labels, labels


def _auth_document() -> dict[str, Any]:
    """The portal's sign-in routes (docs/portal.md), which its own document leaves out."""
    problem = {"description": "a problem", **PROBLEM_RESPONSE}

    def query(*names: str) -> list[dict[str, Any]]:
        return [{"name": n, "in": "query", "schema": {"type": "string"}} for n in names]

    return {
        "openapi": "3.1.0",
        "info": {"title": "svc-portal sign-in", "version": "1"},
        "paths": {
            "/auth/login": {
                "get": {
                    "operationId": "login",
                    "parameters": query("next"),
                    "responses": {"302": {"description": "to the provider"}, "4XX": problem},
                }
            },
            "/auth/callback": {
                "get": {
                    "operationId": "callback",
                    "parameters": query("code", "state", "error", "iss"),
                    "responses": {"303": {"description": "signed in"}, "4XX": problem},
                }
            },
            "/auth/logout": {
                # The web app's catch-all route matches every GET, so `Allow` names GET too;
                # it answers 404 for a path under /auth/ (svc.portal.webapp).
                "get": {"operationId": "logout_get", "responses": {"4XX": problem}},
                "post": {
                    "operationId": "logout",
                    "responses": {"204": {"description": "signed out"}, "4XX": problem},
                },
            },
        },
        "components": {"schemas": {"Problem": PROBLEM_SCHEMA}},
    }


portal_auth_schema = apifuzz.load(_auth_document())


@pytest.fixture(scope="module")
def bo_session(portal: World) -> dict[str, str]:
    """Another person's session (cookie and CSRF token): the fuzzed sign-out revokes it."""
    session = portal.sign_in("bo")
    cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    return {"Cookie": cookie, "X-CSRF-Token": session.headers["x-csrf-token"]}


@portal_auth_schema.parametrize()
@FUZZ
def test_portal_sign_in_routes_fuzz(case: Any, portal: World, bo_session: dict[str, str]) -> None:
    headers = bo_session if case.path == "/auth/logout" else None
    case.call_and_validate(base_url=portal.portal.url, headers=headers, allow_redirects=False)
