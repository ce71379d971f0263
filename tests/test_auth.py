"""Every API knows its callers (docs/auth.md).

Against real processes: a `svc pdp` child process with bearer-token checks on (every HTTP
route and gRPC method of the decision point), and one `svc up` (the history's routes, the
caller token it writes, the intake keeping its own token). Each refused token gets the right
status and the same text over HTTP and gRPC; the probes answer without a token; a
non-loopback bind without authentication refuses to start.

Tokens are minted by `svc.common.auth.LocalIssuer` (an ES256 key in a temporary directory, the
one `svc up` reads from its data directory) or signed by hand where a token must be wrong in a
way the issuer never is (another key under the issuer's `kid`, `alg: none`, HS256 keyed with
the public key).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serverkit import PROBLEM, metric, wait_until
from svc import registry
from svc.authz.v1 import authz_pb2, authz_pb2_grpc
from svc.common.auth import (
    AuthConfigError,
    HistoryAuthSettings,
    LocalIssuer,
    PdpAuthSettings,
    is_loopback,
)
from svc.common.component import Role
from svc.pdp import Engine, Server
from svc.pdp.server import StandaloneOptions, serve_bundle
from test_pdp_standalone import Pdp
from uphelp import Up, run_svc, start_up

CORP = Path(__file__).parent / "testdata" / "bundles" / "corp"
CALLERS = ["app.orders", "gateway"]
ISS = "https://issuer.test"

ALICE = {"type": "Human", "id": "alice"}
CHECK = {"principal": ALICE, "action": "delete", "resource": {"type": "Document", "id": "design"}}
PLAN = {"principal": ALICE, "action": "view", "resource_type": "Document"}
WAIT = {"challenge_qid": "01a202b3-e183-730f-b9ee-51e49dfc56dc", "principal": ALICE}
AZ = {
    "subject": ALICE,
    "action": {"name": "view"},
    "resource": {"type": "Document", "id": "design"},
}
AZS = {"subject": ALICE, "evaluations": [{k: v for k, v in AZ.items() if k != "subject"}]}

#: Every HTTP route of the decision point that needs a token, its body and the status a
#: good token gets (no challenge service in standalone mode: 503 after the token check).
PDP_ROUTES = [
    ("/v1/access/evaluation", CHECK, 200),
    ("/v1/access/plan", PLAN, 200),
    ("/v1/access/challenge", WAIT, 503),
    ("/access/v1/evaluation", AZ, 200),
    ("/access/v1/evaluations", AZS, 200),
]
PUBLIC_ROUTES = [
    "/healthz",
    "/readyz",
    "/version",
    "/metrics",
    "/.well-known/authzen-configuration",
]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def private_key(issuer: LocalIssuer) -> Any:
    return serialization.load_pem_private_key(
        (issuer.directory / "key.pem").read_bytes(), password=None
    )


def claims(iss: str, sub: str, aud: str | list[str], **over: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": iss, "sub": sub, "aud": aud, "iat": now, "exp": now + 600, **over}


def bad_tokens(issuer: LocalIssuer, other: LocalIssuer, aud: str) -> dict[str, tuple[str, str]]:
    """Tokens that must get 401, by name, with a phrase the refusal's detail must contain."""
    iss = issuer.issuer
    caller = CALLERS[0]
    good = claims(iss, caller, aud)
    no_sub = {k: v for k, v in good.items() if k != "sub"}
    none_head = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    unsigned = f"{none_head}.{b64(json.dumps(good).encode())}."
    public_pem = (
        private_key(issuer)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    hs_head = b64(json.dumps({"alg": "HS256", "kid": issuer.kid}).encode())
    hs_body = b64(json.dumps(good).encode())
    hs_sig = hmac.new(public_pem, f"{hs_head}.{hs_body}".encode(), hashlib.sha256).digest()
    return {
        "expired": (
            issuer.mint(caller, aud, 60, now=time.time() - 3600),
            "expired",
        ),
        "wrong-audience": (issuer.mint(caller, "svc-somewhere-else", 600), "audience"),
        "wrong-issuer": (
            issuer.mint(caller, aud, 600, claims={"iss": "https://elsewhere.test"}),
            "issuer",
        ),
        "alg-none": (unsigned, "algorithm `none` is not accepted"),
        "hs256-keyed-with-the-public-key": (f"{hs_head}.{hs_body}.{b64(hs_sig)}", "HS256"),
        "another-key-same-kid": (
            jwt.encode(good, private_key(other), algorithm="ES256", headers={"kid": issuer.kid}),
            "signature does not verify",
        ),
        "another-issuers-key": (other.mint(caller, aud, 600), "no key with kid"),
        "no-sub": (
            jwt.encode(no_sub, private_key(issuer), algorithm="ES256", headers={"kid": issuer.kid}),
            "`sub`",
        ),
        "not-yet-valid": (
            issuer.mint(caller, aud, 7200, now=time.time() + 3600),
            "not valid yet",
        ),
        "not-a-jwt": ("this-is-not-a-jwt", "not a JWT"),
    }


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer") / "issuer", issuer=ISS)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    """Another key with the same `iss`: what a forger without the issuer's key has."""
    return LocalIssuer(tmp_path_factory.mktemp("other") / "issuer", issuer=ISS)


# ------------------------------------------------------------------------- the decision point


@pytest.fixture(scope="module")
def pdp(issuer: LocalIssuer) -> Iterator[str]:
    """`svc pdp` over the corp bundle with bearer tokens of `issuer` for CALLERS."""
    proc = Pdp(
        "--bundle", str(CORP), "--port", "0", "--no-watch",
        "--auth-issuer", issuer.issuer, "--auth-jwks", issuer.jwks_url,
        "--auth-callers", ",".join(CALLERS), "--auth-leeway-secs", "0",
    )  # fmt: skip
    try:
        yield f"127.0.0.1:{proc.port()}"
    finally:
        assert proc.stop() == 0, proc.log


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def assert_401(r: httpx.Response, phrase: str | None, realm: str, ctx: str = "") -> str:
    assert r.status_code == 401, (ctx, r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["type"] == "urn:svc:problem:unauthenticated" and body["status"] == 401, body
    assert body["title"]
    challenge = r.headers["www-authenticate"]
    assert challenge.startswith(f'Bearer realm="{realm}"'), challenge
    if phrase is None:  # no token: no error code (RFC 6750 section 3.1)
        assert "error=" not in challenge
        assert "Authorization: Bearer" in body["detail"]
    else:
        assert 'error="invalid_token"' in challenge
        assert phrase in body["detail"], (ctx, body)
    return str(body["detail"])


def assert_403(r: httpx.Response, sub: str) -> str:
    assert r.status_code == 403, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["type"] == "urn:svc:problem:caller-not-allowed" and body["status"] == 403
    assert f"`{sub}`" in body["detail"]
    return str(body["detail"])


def grpc_calls(stub: authz_pb2_grpc.AuthorizerStub) -> dict[str, Any]:
    ref = authz_pb2.EntityRef
    return {
        "Check": lambda md: stub.Check(
            authz_pb2.CheckRequest(
                principal=ref(**ALICE), action="delete", resource=ref(type="Document", id="design")
            ),
            metadata=md,
            timeout=10,
        ),
        "BatchCheck": lambda md: stub.BatchCheck(
            authz_pb2.BatchCheckRequest(
                checks=[
                    authz_pb2.CheckRequest(
                        principal=ref(**ALICE),
                        action=action,
                        resource=ref(type="Document", id="design"),
                    )
                    for action in ("view", "delete")
                ]
            ),
            metadata=md,
            timeout=10,
        ),
        "Plan": lambda md: stub.Plan(
            authz_pb2.PlanRequest(principal=ref(**ALICE), action="view", resource_type="Document"),
            metadata=md,
            timeout=10,
        ),
        "WaitForChallenge": lambda md: stub.WaitForChallenge(
            authz_pb2.WaitForChallengeRequest(
                challenge_qid=WAIT["challenge_qid"], principal=ref(**ALICE)
            ),
            metadata=md,
            timeout=10,
        ),
    }


def grpc_refusal(call: Any, md: list[tuple[str, str]]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(md)
    return info.value


def test_every_decision_point_route_refuses_bad_tokens(
    pdp: str, issuer: LocalIssuer, other: LocalIssuer
) -> None:
    bad = bad_tokens(issuer, other, "svc-pdp")
    unlisted = issuer.mint("app.unlisted", "svc-pdp", 600)
    good = issuer.mint(CALLERS[1], "svc-pdp", 600)
    with httpx.Client(base_url=f"http://{pdp}", timeout=10) as c:
        for path, body, ok in PDP_ROUTES:
            assert_401(c.post(path, json=body), None, "svc-pdp")
            assert_401(
                c.post(path, json=body, headers={"authorization": "Basic YTpi"}), None, "svc-pdp"
            )
            for name, (token, phrase) in bad.items():
                r = c.post(path, json=body, headers=auth(token))
                assert_401(r, phrase, "svc-pdp", f"{path} {name}")
            assert_403(c.post(path, json=body, headers=auth(unlisted)), "app.unlisted")
            r = c.post(path, json=body, headers=auth(good))
            assert r.status_code == ok, (path, r.text)
        # A refused request is a problem before its body is even read: a bad body with no
        # token is 401, not 400.
        assert_401(c.post("/v1/access/evaluation", content=b"{"), None, "svc-pdp")
        # Unknown routes do not tell a caller without a token which routes exist.
        assert_401(c.get("/no/such/route"), None, "svc-pdp")
        assert metric(c.get("/metrics").text, "svc_pdp_requests_rejected_total", status="401") > 0


def test_every_grpc_method_refuses_bad_tokens_with_the_same_text(
    pdp: str, issuer: LocalIssuer, other: LocalIssuer
) -> None:
    bad = bad_tokens(issuer, other, "svc-pdp")
    unlisted = issuer.mint("app.unlisted", "svc-pdp", 600)
    good = issuer.mint(CALLERS[0], "svc-pdp", 600)
    with grpc.insecure_channel(pdp) as ch, httpx.Client(base_url=f"http://{pdp}") as c:
        stub = authz_pb2_grpc.AuthorizerStub(ch)
        for method, call in grpc_calls(stub).items():
            err = grpc_refusal(call, [])
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, method
            assert "authorization" in (err.details() or "")
            for name, (token, phrase) in bad.items():
                err = grpc_refusal(call, [("authorization", f"Bearer {token}")])
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (method, name)
                http_detail = c.post("/v1/access/evaluation", json=CHECK, headers=auth(token))
                assert err.details() == http_detail.json()["detail"], (method, name)
                assert phrase in (err.details() or ""), (method, name)
            err = grpc_refusal(call, [("authorization", f"Bearer {unlisted}")])
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, method
            assert "`app.unlisted` is not allowed" in (err.details() or "")
        md = [("authorization", f"Bearer {good}")]
        calls = grpc_calls(stub)
        assert calls["Check"](md).verdict == authz_pb2.VERDICT_CHALLENGE
        verdicts = [r.verdict for r in calls["BatchCheck"](md).results]
        assert verdicts == [authz_pb2.VERDICT_ALLOW, authz_pb2.VERDICT_CHALLENGE]
        assert calls["Plan"](md).outcome == authz_pb2.PLAN_OUTCOME_CONDITIONAL
        err = grpc_refusal(calls["WaitForChallenge"], md)
        assert err.code() == grpc.StatusCode.UNAVAILABLE  # past the token check: no svc-challenge


def test_a_refused_large_body_does_not_break_the_next_request(
    pdp: str, issuer: LocalIssuer
) -> None:
    """The refused request's body is left unread, so its connection is closed, and says so:
    a keep-alive client then opens a new one instead of writing into a closing connection."""
    good = auth(issuer.mint(CALLERS[0], "svc-pdp", 600))
    big = {**CHECK, "context": {"pad": "x" * 900_000}}
    with httpx.Client(base_url=f"http://{pdp}", timeout=30) as c:
        for _ in range(3):
            r = c.post("/v1/access/evaluation", json=big)
            assert_401(r, None, "svc-pdp")
            assert r.headers.get("connection") == "close"
            assert c.post("/v1/access/evaluation", json=CHECK, headers=good).status_code == 200


def test_probes_and_grpc_health_need_no_token(pdp: str) -> None:
    with httpx.Client(base_url=f"http://{pdp}", timeout=10) as c:
        for path in PUBLIC_ROUTES:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
    with grpc.insecure_channel(pdp) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "svc.authz.v1.Authorizer"):
            got = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert got.status == health_pb2.HealthCheckResponse.SERVING


def test_a_token_without_kid_is_checked_against_the_keys_without_one(
    tmp_path: Path, issuer: LocalIssuer
) -> None:
    """A JWKS whose key has no `kid` (as some issuers publish) still verifies tokens."""
    jwks = {"keys": [{k: v for k, v in issuer.jwks["keys"][0].items() if k != "kid"}]}
    engine = Engine.from_bundle_dir(CORP)
    server = Server(engine, port=0, auth_issuer=ISS, auth_callers=CALLERS)
    assert server.set_jwks(json.dumps(jwks)) == 1
    port = server.start()
    try:
        server.set_ready(bundle=True, containments=True)
        token = jwt.encode(
            claims(ISS, CALLERS[0], "svc-pdp"), private_key(issuer), algorithm="ES256"
        )
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/access/evaluation", json=CHECK, headers=auth(token)
        )
        assert r.status_code == 200, r.text
        kid_token = issuer.mint(CALLERS[0], "svc-pdp", 600)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/access/evaluation", json=CHECK, headers=auth(kid_token)
        )
        assert_401(r, f"no key with kid `{issuer.kid}`", "svc-pdp")
    finally:
        server.stop()


def test_a_jwks_without_a_usable_key_is_refused(issuer: LocalIssuer) -> None:
    server = Server(Engine.from_bundle_dir(CORP), port=0, auth_issuer=ISS, auth_callers=CALLERS)
    with pytest.raises(ValueError, match="no RS256 or ES256"):
        server.set_jwks(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}))
    with pytest.raises(ValueError, match="not a JWK Set"):
        server.set_jwks("[]")
    with pytest.raises(ValueError, match="auth_callers is empty"):
        Server(Engine.from_bundle_dir(CORP), port=0, auth_issuer=ISS, auth_callers=[])
    with pytest.raises(RuntimeError, match="checks no tokens"):
        Server(Engine.from_bundle_dir(CORP), port=0).set_jwks(json.dumps(issuer.jwks))


def test_cached_tokens_end_at_exp_and_at_a_key_rotation(
    tmp_path: Path, issuer: LocalIssuer, other: LocalIssuer
) -> None:
    """A repeat caller is served from the cache, but never past its token's `exp`, and a new
    JWKS (the control plane reloads it every `auth_jwks_refresh_secs`) drops every entry."""
    jwks = tmp_path / "jwks.json"
    shutil.copy(issuer.jwks_path, jwks)
    settings = PdpAuthSettings(
        auth_issuer=ISS,
        auth_jwks=jwks.as_uri(),
        auth_callers=CALLERS,
        auth_leeway_secs=0,
        auth_jwks_refresh_secs=0.2,
    )
    options = StandaloneOptions(port=0, watch=False, auth=settings)
    with serve_bundle(CORP, options) as server, httpx.Client(timeout=10) as c:
        url = f"http://127.0.0.1:{server.port}/v1/access/evaluation"

        def status(token: str) -> int:
            return c.post(url, json=CHECK, headers=auth(token)).status_code

        short = issuer.mint(CALLERS[0], "svc-pdp", 2)
        assert status(short) == 200
        assert status(short) == 200  # cached
        wait_until(
            lambda: time.time() > jwt.decode(short, options={"verify_signature": False})["exp"] + 1
        )
        r = c.post(url, json=CHECK, headers=auth(short))
        assert_401(r, "expired", "svc-pdp")

        old = issuer.mint(CALLERS[0], "svc-pdp", 600)
        new = other.mint(CALLERS[0], "svc-pdp", 600)
        assert status(old) == 200 and status(old) == 200
        assert status(new) == 401
        shutil.copy(other.jwks_path, jwks)  # the issuer rotates its key
        wait_until(lambda: status(new) == 200, timeout=30)
        assert status(old) == 401


# ------------------------------------------------------------------------- refusing to start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_non_loopback_bind_without_auth_refuses_to_start() -> None:
    port = free_port()
    r = run_svc("pdp", "--bundle", str(CORP), "--host", "0.0.0.0", "--port", str(port), timeout=120)
    assert r.returncode == 2, r.stderr
    assert "refusing to listen on 0.0.0.0 without authentication" in r.stderr
    assert "SVC_PDP_AUTH_ISSUER" in r.stderr and "SVC_PDP_AUTH_ROLES" in r.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing was bound
    with pytest.raises(AuthConfigError, match="refusing to listen on ::"):
        with serve_bundle(CORP, StandaloneOptions(host="::", port=0, watch=False)):
            pass
    with pytest.raises(AuthConfigError, match="SVC_HISTORY_AUTH_ISSUER"):
        HistoryAuthSettings().check_bind("0.0.0.0")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host)
        HistoryAuthSettings().check_bind(host)
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com"):
        assert not is_loopback(host)


def test_incomplete_auth_settings_are_refused_by_name(issuer: LocalIssuer) -> None:
    r = run_svc("pdp", "--bundle", str(CORP), "--port", "0", "--auth", "jwt", timeout=120)
    assert r.returncode == 2
    for name in (
        "SVC_PDP_AUTH_ISSUER",
        "SVC_PDP_AUTH_JWKS",
        "SVC_PDP_AUTH_ROLES (or SVC_PDP_AUTH_CALLERS)",
    ):
        assert name in r.stderr, r.stderr
    r = run_svc(
        "pdp", "--bundle", str(CORP), "--port", "0", "--auth-issuer", ISS,
        "--auth-jwks", "http://plain.test/jwks", "--auth-callers", "a", timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "https:// URL or a file:// path" in r.stderr, r.stderr
    missing = Path(issuer.directory / "no-such.json").as_uri()
    r = run_svc(
        "pdp", "--bundle", str(CORP), "--port", "0", "--auth-issuer", ISS,
        "--auth-jwks", missing, "--auth-callers", "a", timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "cannot load the JWKS" in r.stderr, r.stderr


def test_the_environment_configures_auth(
    issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SVC_PDP_AUTH_ISSUER", ISS)
    monkeypatch.setenv("SVC_PDP_AUTH_JWKS", issuer.jwks_url)
    monkeypatch.setenv("SVC_PDP_AUTH_CALLERS", '["a", "b"]')
    s = PdpAuthSettings()
    assert s.enabled and s.auth_callers == ["a", "b"] and s.auth_audience == "svc-pdp"
    assert s.caller_roles == {"a": "operator", "b": "operator"}  # the compatible form
    monkeypatch.setenv(
        "SVC_PDP_AUTH_ROLES", '{"b": "app", "system:serviceaccount:shop:c": "gateway"}'
    )
    s = PdpAuthSettings()
    assert s.caller_roles == {
        "a": "operator",
        "b": "app",
        "system:serviceaccount:shop:c": "gateway",
    }
    monkeypatch.setenv("SVC_PDP_AUTH_ROLES", "b=app, system:serviceaccount:shop:c=gateway")
    assert PdpAuthSettings().caller_roles["system:serviceaccount:shop:c"] == "gateway"
    monkeypatch.setenv("SVC_PDP_AUTH_ROLES", "b=root")
    with pytest.raises(ValueError, match="unknown role `root`"):
        PdpAuthSettings()
    monkeypatch.setenv("SVC_PDP_AUTH_ROLES", "no-role-here")
    with pytest.raises(ValueError, match="is not `sub=role`"):
        PdpAuthSettings()
    monkeypatch.delenv("SVC_PDP_AUTH_ROLES")
    monkeypatch.setenv("SVC_PDP_AUTH", "none")
    assert not PdpAuthSettings().enabled


# ------------------------------------------------------------------------- svc up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    u = start_up(tmp_path_factory.mktemp("auth-up"), "--bundle", str(CORP))
    yield u
    code, _, err = u.stop()
    assert code == 0, err


HISTORY_ROUTES = [
    ("/v1/history/decisions", {"principal": "Human::alice"}),
    ("/v1/history/events", {"principal": "Human::alice"}),
    ("/v1/history/counts", {"principal": "Human::alice"}),
    ("/v1/history/totals", {}),
]


def test_svc_up_writes_a_caller_token_for_both_components(up: Up) -> None:
    d = up.data_dir
    token_file = d / "caller.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((d / "issuer" / "key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((d / "issuer").stat().st_mode) == 0o700
    assert str(token_file) in "".join(up.stdout)
    got = jwt.decode(up.caller_token, options={"verify_signature": False})
    # Every component that admits the operator, as the registry says; the five core ones at least.
    assert got["sub"] == "svc-local"
    assert set(got["aud"]) == set(registry.audiences_of(Role.OPERATOR))
    assert {"svc-pdp", "svc-history", "svc-policy", "svc-context", "svc-challenge"} <= set(
        got["aud"]
    )
    assert got["exp"] - got["iat"] >= 8 * 3600  # a working day
    r = httpx.post(f"{up.pdp}/v1/access/evaluation", json=CHECK, headers=up.auth, timeout=10)
    assert r.status_code == 200, r.text
    assert_401(
        httpx.post(f"{up.pdp}/v1/access/evaluation", json=CHECK, timeout=10), None, "svc-pdp"
    )
    with grpc.insecure_channel(up.pdp.removeprefix("http://")) as ch:
        calls = grpc_calls(authz_pb2_grpc.AuthorizerStub(ch))
        assert calls["Check"]([("authorization", f"Bearer {up.caller_token}")]).decision_qid
        assert grpc_refusal(calls["Check"], []).code() == grpc.StatusCode.UNAUTHENTICATED
    r = httpx.get(f"{up.history}/v1/history/totals", headers=up.auth, timeout=10)
    assert r.status_code == 200, r.text


def test_every_history_route_refuses_bad_tokens(up: Up, other: LocalIssuer) -> None:
    issuer = LocalIssuer(up.data_dir / "issuer")  # the key svc up made, read from its data dir
    bad = bad_tokens(issuer, other, "svc-history")
    # The token svc up's decision point admits the demo traffic with: not a history caller.
    demo = issuer.mint("svc-demo", "svc-history", 600)
    pdp_only = issuer.mint("svc-local", "svc-pdp", 600)
    good = issuer.mint("svc-local", "svc-history", 600)
    with httpx.Client(base_url=up.history, timeout=10) as c:
        for path, params in HISTORY_ROUTES:
            assert_401(c.get(path, params=params), None, "svc-history")
            for name, (token, phrase) in bad.items():
                r = c.get(path, params=params, headers=auth(token))
                assert_401(r, phrase, "svc-history", f"{path} {name}")
            assert_403(c.get(path, params=params, headers=auth(demo)), "svc-demo")
            assert_401(
                c.get(path, params=params, headers=auth(pdp_only)), "audience", "svc-history"
            )
            r = c.get(path, params=params, headers=auth(good))
            assert r.status_code == 200, (path, r.text)
        # The token is checked before the parameters: no token and a bad parameter is 401.
        assert_401(c.get("/v1/history/decisions", params={"limit": "x"}), None, "svc-history")
        for path in ("/healthz", "/readyz", "/version", "/metrics"):
            assert c.get(path).status_code == 200, path


def test_intake_keeps_its_own_token(up: Up) -> None:
    event = {
        "events": [
            {
                "at": "2026-01-01T00:00:00Z",
                "system": "docs",
                "action": "read",
                "principal": ALICE,
                "resource": {"type": "Document", "id": "design"},
            }
        ]
    }
    with httpx.Client(base_url=up.intake, timeout=30) as c:
        r = c.post("/v1/events", json=event)
        assert r.status_code == 401 and r.headers["content-type"].startswith(PROBLEM)
        assert (
            c.post("/v1/events", json=event, headers=auth("not-the-intake-token")).status_code
            == 403
        )
        # A caller token of the decision point and the history is not the intake's token.
        assert c.post("/v1/events", json=event, headers=up.auth).status_code == 403
        r = c.post("/v1/events", json=event, headers=auth(up.token))
        assert r.status_code == 202, r.text


def test_the_issuer_key_is_kept_and_the_caller_token_renewed_across_restarts(
    tmp_path: Path,
) -> None:
    first = start_up(tmp_path, "--bundle", str(CORP))
    try:
        token, kid = first.caller_token, LocalIssuer(tmp_path / "issuer").kid
    finally:
        assert first.stop()[0] == 0
    again = start_up(tmp_path, "--bundle", str(CORP))
    try:
        assert LocalIssuer(tmp_path / "issuer").kid == kid
        assert again.caller_token != token
        # The old token is still valid: same key, not expired.
        r = httpx.post(f"{again.pdp}/v1/access/evaluation", json=CHECK, headers=auth(token))
        assert r.status_code == 200, r.text
    finally:
        assert again.stop()[0] == 0
