"""Least privilege per method (docs/auth.md#roles-and-methods): every caller role against every
method of every service, allowed exactly where ``svc.common.roles.METHODS`` says, and
docs/auth.md's matrix checked against that table.

Real servers on 127.0.0.1, with bearer-token checks on and one caller per role
(``test-<role>``), tokens minted by ``svc.common.auth.LocalIssuer``: the policy and challenge
services (gRPC, SQLite), the context service (HTTP, SQLite, under uvicorn), the history
(``svc history load`` as a child process on chDB and the embedded log) and the decision point
(the Rust listener). A refused call is a 403 problem ``urn:svc:problem:caller-not-allowed``
(gRPC ``PERMISSION_DENIED``) naming the method and the role; an allowed one is anything but
that (the empty requests sent are mostly refused as invalid, which is the point: the role
check came first and let them through).

The findings of issue 43 are rerun by name below: the decision point's and the challenge
service's credentials cannot add a trusted app; the decision point's and the gateway's cannot
publish a bundle or switch the mode; a policy change's author is the caller, not the request
field.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi.routing import APIRoute

import apifuzz
from svc import registry
from svc.authz.v1 import authz_pb2, authz_pb2_grpc
from svc.challenge.app import ChallengeServer
from svc.challenge.directory import StaticDirectory
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeAuthSettings, ChallengeSettings
from svc.challenge.v1 import challenge_pb2, challenge_pb2_grpc
from svc.common.auth import (
    PERSON_HEADER,
    LocalIssuer,
    PdpAuthSettings,
    PolicyAuthSettings,
    Verifier,
)
from svc.common.component import Role
from svc.common.roles import METHODS, ROLES, SERVICES, allowed, roles_of
from svc.context.app import create_app as create_context_app
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.history.service import create_app as create_history_app
from svc.pdp import Engine, Server
from svc.policy.app import PolicyServer
from svc.policy.service import PolicyService
from svc.policy.settings import PolicySettings
from svc.policy.v1 import policy_pb2, policy_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
CORP = REPO / "tests" / "testdata" / "bundles" / "corp"

#: One caller per role.
SUBJECTS = {role: f"test-{role}" for role in ROLES}
#: Every component's ``auth_roles``: each test caller with its role.
ROLE_SETTING = {sub: role for role, sub in SUBJECTS.items()}

REFUSAL = re.compile(r"has the role `(?P<role>[a-z]+)`, which may not call `(?P<method>[^`]+)`")


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer"))


def _auth(issuer: LocalIssuer) -> dict[str, Any]:
    return {"auth_issuer": issuer.issuer, "auth_jwks": issuer.jwks_url, "auth_roles": ROLE_SETTING}


def _token(issuer: LocalIssuer, role: str, audience: str) -> str:
    return issuer.mint(SUBJECTS[role], audience, 3600)


# --------------------------------------------------------------------------------- the table


def test_every_method_of_every_service_is_in_the_table() -> None:
    """The table lists the methods the services serve: exactly each proto's methods and the
    decision point's routes; every guarded route of the context service and the history."""
    for component, module in (("policy", policy_pb2), ("challenge", challenge_pb2)):
        name = SERVICES[component].rsplit(".", 1)[-1]
        methods = {m.name for m in module.DESCRIPTOR.services_by_name[name].methods}
        assert methods == set(METHODS[component]), component
    authorizer = authz_pb2.DESCRIPTOR.services_by_name["Authorizer"]
    grpc_pdp = {m.name for m in authorizer.methods}
    assert grpc_pdp == {m for m in METHODS["pdp"] if " " not in m}
    rust = _read("crates/pdp_server/src/http.rs")
    # `/v1/noop` is the benchmarks' route (`noop_routes`), behind the same check as the rest.
    http_pdp = set(re.findall(r'\.route\("(/[a-z/0-9]+)", post\(', rust)) - {"/v1/noop"}
    assert {f"POST {p}" for p in http_pdp} == {m for m in METHODS["pdp"] if " " in m}
    for component, app in (
        ("context", _context_app_for_routes()),
        ("history", create_history_app(None, auth=PolicyAuthSettings(auth="none"))),  # type: ignore[arg-type]
    ):
        routes = {
            f"{method} {r.path_format}"
            for r in app.routes
            if isinstance(r, APIRoute) and r.path.startswith("/v1/")
            for method in r.methods
        }
        # Every route served has its row (a route without one admits no caller at all).
        assert routes <= set(METHODS[component]), (component, routes - set(METHODS[component]))


def test_each_method_admits_only_known_roles_and_the_registrations_follow_the_table() -> None:
    """Every role of the table is a ``Role``; what `svc up`, `svc topology` and the chart let a
    role call (``Registration.callers``) is what the table gives it, apart from the apps'
    enforcement points, which only the chart names."""
    for component, methods in METHODS.items():
        for method, roles in methods.items():
            assert roles and roles <= set(ROLES), (component, method)
        assert set(registry.by_name(component).callers) == roles_of(component) - {Role.APP}
    pdp = set(METHODS["pdp"].values())
    assert len(pdp) == 1, "the decision point's listener admits by sub: one role set for all"


def _doc_matrix() -> dict[str, dict[str, frozenset[str]]]:
    """docs/auth.md's method matrix: component -> method -> the roles marked `yes`."""
    text = _read("docs/auth.md")
    section = text.split("## Roles and methods", 1)[1].split("\n## ", 1)[0]
    out: dict[str, dict[str, frozenset[str]]] = {}
    component = ""
    header: list[str] = []
    for line in section.splitlines():
        heading = re.match(r"### .*\(`(\w+)`\)", line)
        if heading:
            component = heading.group(1)
            out[component] = {}
            continue
        if not component or not line.startswith("| ") or "---" in line:
            continue  # the roles table above the matrix, separators
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Method":
            header = cells[1:]
            continue
        method = cells[0].strip("`")
        out[component][method] = frozenset(
            r for r, c in zip(header, cells[1:], strict=True) if c == "yes"
        )
    return out


def test_docs_auth_md_matrix_is_the_table() -> None:
    """docs/auth.md's matrix is ``METHODS``, row by row (regenerate it with
    ``python -m svc.common.roles`` when the table changes)."""
    assert _doc_matrix() == METHODS


# --------------------------------------------------------------------------------- gRPC


def _grpc_call(
    stub: Any, pb: Any, descriptor: Any, method: str, token: str
) -> grpc.RpcError | None:
    """Calls `method` with an empty request; the error it ended with, or None."""
    m = next(x for x in descriptor.methods if x.name == method)
    req = getattr(pb, m.input_type.name)()
    md = [("authorization", f"Bearer {token}")]
    try:
        if m.server_streaming:
            call = getattr(stub, method)(req, metadata=md, timeout=5)
            try:
                next(call)
            finally:
                call.cancel()
        else:
            getattr(stub, method)(req, metadata=md, timeout=30)
    except grpc.RpcError as e:
        return e
    return None


def _check_grpc(component: str, method: str, role: str, err: grpc.RpcError | None) -> None:
    code = err.code() if isinstance(err, grpc.Call) else None
    details = (err.details() or "") if isinstance(err, grpc.Call) else ""
    refused = code == grpc.StatusCode.PERMISSION_DENIED and REFUSAL.search(details)
    if role in allowed(component, method):
        assert not refused and code != grpc.StatusCode.UNAUTHENTICATED, (method, role, details)
    else:
        assert refused, (method, role, code, details)
        assert refused.group("role") == role and refused.group("method") == method


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory, issuer: LocalIssuer) -> Iterator[PolicyServer]:
    tmp = tmp_path_factory.mktemp("policy")
    settings = PolicySettings(port=0, data_dir=tmp, database_url=f"sqlite:///{tmp / 'policy.db'}")
    srv = PolicyServer(
        settings, PolicyService(settings), auth=PolicyAuthSettings(**_auth(issuer))
    ).start()
    yield srv
    srv.stop()
    srv.service.close()


@pytest.fixture(scope="module")
def challenge(
    tmp_path_factory: pytest.TempPathFactory, issuer: LocalIssuer
) -> Iterator[ChallengeServer]:
    tmp = tmp_path_factory.mktemp("challenge")
    settings = ChallengeSettings(
        port=0,
        database_url=f"sqlite:///{tmp / 'challenge.db'}",
        heartbeat_secs=0.2,
        watch_poll_secs=0.1,
        rp_id="localhost",
        origins=["https://localhost:8443"],
    )
    service = ChallengeService(settings, directory=StaticDirectory(owners={}, managers={}))
    srv = ChallengeServer(
        settings, service, auth=ChallengeAuthSettings(**_auth(issuer)), outbox=False
    ).start()
    yield srv
    srv.stop()
    service.close()


def test_policy_service_methods_by_role(policy: PolicyServer, issuer: LocalIssuer) -> None:
    descriptor = policy_pb2.DESCRIPTOR.services_by_name["PolicyService"]
    with grpc.insecure_channel(policy.target) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        for role in ROLES:
            token = _token(issuer, role, "svc-policy")
            for method in METHODS["policy"]:
                err = _grpc_call(stub, policy_pb2, descriptor, method, token)
                _check_grpc("policy", method, role, err)


def test_challenge_service_methods_by_role(challenge: ChallengeServer, issuer: LocalIssuer) -> None:
    descriptor = challenge_pb2.DESCRIPTOR.services_by_name["ChallengeService"]
    with grpc.insecure_channel(challenge.target) as channel:
        stub = challenge_pb2_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
        for role in ROLES:
            token = _token(issuer, role, "svc-challenge")
            for method in METHODS["challenge"]:
                err = _grpc_call(stub, challenge_pb2, descriptor, method, token)
                _check_grpc("challenge", method, role, err)


# --------------------------------------------------------------------------------- HTTP


def _path(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", template)


def _check_http(component: str, method: str, role: str, r: httpx.Response) -> None:
    if role in allowed(component, method):
        assert r.status_code not in (401, 403), (method, role, r.status_code, r.text)
        return
    assert r.status_code == 403, (method, role, r.status_code, r.text)
    problem = r.json()
    assert problem["type"] == "urn:svc:problem:caller-not-allowed", problem
    refused = REFUSAL.search(problem["detail"])
    assert refused and refused.group("role") == role and refused.group("method") == method


def _http_call(http: httpx.Client, method: str, token: str, **kwargs: Any) -> httpx.Response:
    verb, template = method.split(" ", 1)
    headers = {"authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
    body = {"json": {}} if verb == "POST" else {}
    return http.request(verb, _path(template), headers=headers, **body, **kwargs)


def _context_settings(tmp: Path) -> ContextSettings:
    return ContextSettings(port=0, database_url=f"sqlite:///{tmp / 'context.db'}")


def _context_app_for_routes() -> Any:
    settings = ContextSettings(port=0, database_url="sqlite://")
    return create_context_app(ContextService(settings), settings, ContextAuthSettings(auth="none"))


@pytest.fixture(scope="module")
def context(
    tmp_path_factory: pytest.TempPathFactory, issuer: LocalIssuer
) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("context")
    settings = _context_settings(tmp)
    service = ContextService(settings)
    app = create_context_app(service, settings, ContextAuthSettings(**_auth(issuer)))
    with apifuzz.serve(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        yield http
    service.close()


def test_context_service_routes_by_role(context: httpx.Client, issuer: LocalIssuer) -> None:
    for role in ROLES:
        token = _token(issuer, role, "svc-context")
        for method in METHODS["context"]:
            _check_http("context", method, role, _http_call(context, method, token))


def test_a_request_verifies_its_token_once(
    tmp_path: Path, issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard that checks the token before the body (svc.common.limits) hands the verified
    caller to the route's role check, which does not verify the same token again."""
    calls: list[str] = []
    verify = Verifier.verify

    def counting(self: Verifier, token: str) -> Any:
        calls.append(token)
        return verify(self, token)

    monkeypatch.setattr(Verifier, "verify", counting)
    settings = _context_settings(tmp_path)
    service = ContextService(settings)
    app = create_context_app(service, settings, ContextAuthSettings(**_auth(issuer)))
    try:
        with apifuzz.serve(app) as base:
            token = _token(issuer, Role.PORTAL, "svc-context")
            r = httpx.get(f"{base}/v1/principals", headers={"authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
            assert calls == [token]
            # A role the method does not admit is still refused after the one verification.
            calls.clear()
            token = _token(issuer, Role.DEMO, "svc-context")
            r = httpx.get(f"{base}/v1/principals", headers={"authorization": f"Bearer {token}"})
            assert r.status_code == 403, r.text
            assert calls == [token]
    finally:
        service.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_history_routes_by_role(tmp_path: Path, issuer: LocalIssuer) -> None:
    """`svc history load` with its routes behind roles (SVC_HISTORY_AUTH_ROLES)."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "python"),
        "SVC_HISTORY_AUTH_ISSUER": issuer.issuer,
        "SVC_HISTORY_AUTH_JWKS": issuer.jwks_url,
        "SVC_HISTORY_AUTH_ROLES": json.dumps(ROLE_SETTING),
    }
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "svc.cli", "history", "load",
            "--dsn", f"chdb://{tmp_path / 'history'}",
            "--kafka", f"local://{tmp_path / 'broker.db'}",
            "--migrate", "--port", str(port),
        ],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"svc history load exited {proc.returncode}: {out}{err}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        with httpx.Client(base_url=url, timeout=60) as http:
            for role in ROLES:
                token = _token(issuer, role, "svc-history")
                for method in METHODS["history"]:
                    _check_http("history", method, role, _http_call(http, method, token))
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_decision_point_methods_by_role(issuer: LocalIssuer) -> None:
    """The Rust listener admits the callers whose role may decide (``PdpAuthSettings``'
    ``auth_callers``); the others get its 403 / ``PERMISSION_DENIED``."""
    settings = PdpAuthSettings(**_auth(issuer))
    assert sorted(settings.auth_callers) == sorted(
        SUBJECTS[r] for r in ROLES if r in roles_of("pdp")
    )
    server = Server(
        Engine.from_bundle_dir(CORP),
        port=0,
        auth_issuer=issuer.issuer,
        auth_callers=settings.auth_callers,
    )
    server.set_jwks(json.dumps(issuer.jwks))
    port = server.start()
    server.set_ready(bundle=True, containments=True)
    descriptor = authz_pb2.DESCRIPTOR.services_by_name["Authorizer"]
    try:
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            stub = authz_pb2_grpc.AuthorizerStub(channel)  # type: ignore[no-untyped-call]
            for role in ROLES:
                token = _token(issuer, role, "svc-pdp")
                for method in METHODS["pdp"]:
                    ok = role in allowed("pdp", method)
                    if " " in method:
                        r = _http_call(http, method, token)
                        assert (r.status_code not in (401, 403)) == ok, (method, role, r.text)
                        if not ok:
                            assert r.json()["type"] == "urn:svc:problem:caller-not-allowed"
                    else:
                        err = _grpc_call(stub, authz_pb2, descriptor, method, token)
                        code = err.code() if isinstance(err, grpc.Call) else None
                        denied = code == grpc.StatusCode.PERMISSION_DENIED
                        assert denied != ok, (method, role, code)
    finally:
        server.stop()


# --------------------------------------------------------------------------------- findings


def test_finding_pdp_and_challenge_credentials_cannot_add_a_trusted_app(
    context: httpx.Client, issuer: LocalIssuer
) -> None:
    """Issue 43: the decision point's and the challenge service's own credentials could add a
    trusted app, which the gateway then trusted. Now 403, and nothing is stored."""
    app = {
        "name": "evil",
        "iss": "https://evil.example.com",
        "jwks_url": "https://evil.example.com/jwks.json",
        "aud": "svc-gateway",
    }
    for role in (Role.PDP, Role.CHALLENGE, Role.GATEWAY):
        token = _token(issuer, role, "svc-context")
        r = context.post(
            "/v1/directory/trusted-apps", json=app, headers={"authorization": f"Bearer {token}"}
        )
        _check_http("context", "POST /v1/directory/trusted-apps", role, r)
    operator = {"authorization": f"Bearer {_token(issuer, Role.OPERATOR, 'svc-context')}"}
    listed = context.get("/v1/directory/trusted-apps", headers=operator).json()["trusted_apps"]
    assert all(a["name"] != "evil" for a in listed)


def _rpc(fn: Any, req: Any, token: str, person: str | None = None) -> Any:
    md = [("authorization", f"Bearer {token}")]
    if person is not None:
        md.append((PERSON_HEADER, person))
    return fn(req, metadata=md, timeout=30)


def _bundle_files() -> list[policy_pb2.BundleFile]:
    return [
        policy_pb2.BundleFile(name=p.name, content=p.read_text())
        for p in sorted(CORP.iterdir())
        if p.is_file()
    ]


def test_finding_pdp_and_gateway_credentials_cannot_publish_or_switch_the_mode(
    policy: PolicyServer, issuer: LocalIssuer
) -> None:
    """Issue 43: the decision point's and the gateway's credentials could publish a bundle and
    switch the mode. Now PERMISSION_DENIED naming the method and the role; nothing changes."""
    with grpc.insecure_channel(policy.target) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        op = _token(issuer, Role.OPERATOR, "svc-policy")
        draft = _rpc(stub.CreateDraft, policy_pb2.CreateDraftRequest(files=_bundle_files()), op)
        before = _rpc(stub.GetEnforcement, policy_pb2.GetEnforcementRequest(), op).enforcement
        for role in (Role.PDP, Role.GATEWAY):
            token = _token(issuer, role, "svc-policy")
            for method, req in (
                ("CreateDraft", policy_pb2.CreateDraftRequest(files=_bundle_files())),
                ("Publish", policy_pb2.PublishRequest(version=draft.bundle.version)),
                (
                    "SetEnforcement",
                    policy_pb2.SetEnforcementRequest(
                        scope=policy_pb2.MODE_SCOPE_INSTALL, mode=policy_pb2.MODE_MONITOR
                    ),
                ),
            ):
                with pytest.raises(grpc.RpcError) as e:
                    _rpc(getattr(stub, method), req, token)
                _check_grpc("policy", method, role, e.value)
            # What they follow they still may read.
            _rpc(stub.GetEnforcement, policy_pb2.GetEnforcementRequest(), token)
        after = _rpc(stub.GetEnforcement, policy_pb2.GetEnforcementRequest(), op).enforcement
        assert after == before
        bundles = _rpc(stub.ListBundles, policy_pb2.ListBundlesRequest(), op).bundles
        (mine,) = [b for b in bundles if b.version == draft.bundle.version]
        assert mine.state == policy_pb2.BUNDLE_STATE_DRAFT


def test_finding_a_policy_changes_author_is_the_caller(
    policy: PolicyServer, issuer: LocalIssuer
) -> None:
    """Issue 43: a policy change's `author` was the request's. Now it is the verified caller;
    the portal's person (``svc-acting-for``) is recorded as `<person> via <portal>`, and only
    the portal may name one."""
    with grpc.insecure_channel(policy.target) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        op = _token(issuer, Role.OPERATOR, "svc-policy")
        portal = _token(issuer, Role.PORTAL, "svc-policy")
        draft = _rpc(
            stub.CreateDraft,
            policy_pb2.CreateDraftRequest(files=_bundle_files(), author="mallory"),
            op,
        ).bundle
        assert draft.author == SUBJECTS[Role.OPERATOR]
        _rpc(stub.Publish, policy_pb2.PublishRequest(version=draft.version, author="mallory"), op)
        changed = _rpc(
            stub.SetEnforcement,
            policy_pb2.SetEnforcementRequest(
                scope=policy_pb2.MODE_SCOPE_INSTALL,
                mode=policy_pb2.MODE_MONITOR,
                author="mallory",
                reason="test",
            ),
            portal,
            person="ana",
        )
        assert changed.change.author == f"ana via {SUBJECTS[Role.PORTAL]}"
        _rpc(
            stub.SetEnforcement,
            policy_pb2.SetEnforcementRequest(
                scope=policy_pb2.MODE_SCOPE_INSTALL, mode=policy_pb2.MODE_ENFORCE, reason="back"
            ),
            op,
        )
        changes = _rpc(
            stub.ListEnforcementChanges, policy_pb2.ListEnforcementChangesRequest(), op
        ).changes
        assert [c.author for c in changes[:2]] == [
            SUBJECTS[Role.OPERATOR],
            f"ana via {SUBJECTS[Role.PORTAL]}",
        ]
        # Only the portal acts for a person.
        with pytest.raises(grpc.RpcError) as e:
            _rpc(stub.GetEnforcement, policy_pb2.GetEnforcementRequest(), op, person="ana")
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only the portal may act for a person" in (e.value.details() or "")


def test_context_and_challenge_record_the_caller_as_author(
    context: httpx.Client, challenge: ChallengeServer, issuer: LocalIssuer
) -> None:
    """Who registers or retires a service account, opens or closes an investigation, contains
    or lifts a principal is the caller (the portal: `<person> via <portal>`)."""
    portal = {
        "authorization": f"Bearer {_token(issuer, Role.PORTAL, 'svc-context')}",
        PERSON_HEADER: "ana",
    }
    r = context.post(
        "/v1/service-accounts",
        json={
            "service_accounts": [{"id": "crm.agent", "owner": "ana", "ai": True}],
            "author": "mallory",
        },
        headers=portal,
    )
    assert r.status_code == 200, r.text
    changes = context.get("/v1/service-accounts/crm.agent/changes", headers=portal).json()
    assert changes["changes"][0]["author"] == f"ana via {SUBJECTS[Role.PORTAL]}"
    reasoner = {"authorization": f"Bearer {_token(issuer, Role.REASONER, 'svc-context')}"}
    r = context.post(
        "/v1/investigations",
        json={
            "principal": {"type": "Human", "id": "bo"},
            "reason": "test",
            "opened_by": "mallory",
        },
        headers=reasoner,
    )
    assert r.status_code == 201, r.text
    assert r.json()["opened_by"] == SUBJECTS[Role.REASONER]
    with grpc.insecure_channel(challenge.target) as channel:
        stub = challenge_pb2_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
        token = _token(issuer, Role.REASONER, "svc-challenge")
        got = _rpc(
            stub.Contain,
            challenge_pb2.ContainRequest(
                principal=challenge_pb2.EntityRef(type="Human", id="bo"),
                reason="test",
                author="mallory",
            ),
            token,
        )
        assert got.containment.author == SUBJECTS[Role.REASONER]


def test_the_portal_client_names_who_it_acts_for(
    context: httpx.Client, policy: PolicyServer, issuer: LocalIssuer
) -> None:
    """The portal's clients send ``svc-acting-for`` (percent-encoded UTF-8) with the person or
    app they act for, and the services record `<who> via <portal>`."""
    from svc.portal.clients import ContextClient, PolicyClient

    ctx = ContextClient(str(context.base_url), lambda: _token(issuer, Role.PORTAL, "svc-context"))
    try:
        ctx.put_service_account({"id": "zoe.agent", "owner": "ana", "ai": True}, author="zoë")
        assert ctx.delete_service_account("zoe.agent", author="zoë")
        changes = ctx.service_account_changes("zoe.agent")
        assert [c["author"] for c in changes] == [f"zoë via {SUBJECTS[Role.PORTAL]}"] * 2
    finally:
        ctx.close()
    pol = PolicyClient(policy.url, lambda: _token(issuer, Role.PORTAL, "svc-policy"))
    try:
        got = pol.call(
            "SetOutageFallback",
            policy_pb2.SetOutageFallbackRequest(
                tool="docs/*", tier=policy_pb2.OUTAGE_TIER_FAIL_OPEN, author="ana", reason="t"
            ),
        )
        assert got.fallback.author == f"ana via {SUBJECTS[Role.PORTAL]}"
    finally:
        pol.close()
    token = _token(issuer, Role.PORTAL, "svc-context")
    for bad in ("%00", "x" * 257, "%20"):
        r = context.get(
            "/v1/directory/people",
            headers={"authorization": f"Bearer {token}", PERSON_HEADER: bad},
        )
        assert r.status_code == 401 and "must name a person" in r.json()["detail"], bad


def _read(rel: str) -> str:
    return (REPO / rel).read_text(encoding="utf-8")
