"""The control plane refuses junk cleanly: no poisoned feed, no 5xx, no internals (issue 43).

Each finding of the attack on the control plane is rerun here against real servers on
127.0.0.1 (uvicorn or hypercorn, as the services run), and named in its test:

* a lone surrogate (``"\\ud800"``, sent as the JSON escape) in a resource's or a work item's
  ``attrs`` was stored and then made ``/v1/resources/changes`` and every read answer 500 for
  good: now every kind of junk is written to every write route of the context service and then
  every feed is read (``test_junk_to_every_write_route_leaves_every_feed_readable``);
* SCIM answered 500 to an unauthenticated 10,000-deep JSON, parsed a 50 MB unauthenticated
  body, and ``/v1`` answered 422 or 404 before 401 (``test_the_token_comes_before_the_body``);
* Connect errors of the policy and challenge services showed Python internals and echoed a
  5 MB field (``test_connect_errors_are_short_and_safe``);
* the challenge page's justify answered 500 to a lone surrogate, and its sign-out left the old
  cookie valid (``test_sign_out_revokes_the_page_session_and_justify_refuses_junk``);
* ``challenge.db``, ``context.db`` and ``policy.db`` were world-readable
  (``test_data_files_are_private``);
* one 900 KB ``document_id`` became a 900 KB log line (``test_log_fields_are_bounded``).
"""

from __future__ import annotations

import json
import logging
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import apifuzz
from svc.challenge.app import ChallengeServer
from svc.challenge.dev_idp import DevIdentityProvider
from svc.challenge.directory import StaticDirectory
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeSettings
from svc.common.auth import LocalIssuer
from svc.common.auth_settings import PolicyAuthSettings
from svc.common.limits import parse_json
from svc.common.logbounds import MAX_LOG_FIELD_CHARS, install_log_bounds
from svc.context.app import create_app
from svc.context.service import ContextService
from svc.context.settings import ContextAuthSettings, ContextSettings
from svc.policy.app import PolicyServer
from svc.policy.settings import PolicySettings

PROBLEM = "application/problem+json"
SCIM_TOKEN = "scim-" + "s" * 40
CALLER = "svc-hardening-admin"
#: The most bytes an error answer may take: a detail is short whatever was sent.
MAX_ERROR_BYTES = 4096
#: Where a refusal could show Python internals.
INTERNALS = re.compile(r"Traceback|object is not|codec can't|Error\(|<class |0x[0-9a-f]{6}")


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer") / "issuer")


@pytest.fixture(scope="module")
def token(issuer: LocalIssuer) -> str:
    return issuer.mint(CALLER, ["svc-context", "svc-policy", "svc-challenge"], 3600)


class Context:
    """The context service with bearer tokens on, over SQLite in a data directory."""

    def __init__(self, data: Path, issuer: LocalIssuer, token: str, **overrides: Any) -> None:
        self.data = data
        self.settings = ContextSettings(
            database_url=f"sqlite:///{data / 'context.db'}", scim_token=SCIM_TOKEN, **overrides
        )
        self.service = ContextService(self.settings)
        auth = ContextAuthSettings(
            auth_issuer=issuer.issuer, auth_jwks=issuer.jwks_url, auth_callers=[CALLER]
        )
        self.app = create_app(self.service, self.settings, auth)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.scim_headers = {
            "Authorization": f"Bearer {SCIM_TOKEN}",
            "Content-Type": "application/scim+json",
        }


@pytest.fixture(scope="module")
def context(
    tmp_path_factory: pytest.TempPathFactory, issuer: LocalIssuer, token: str
) -> Iterator[tuple[Context, str]]:
    data = tmp_path_factory.mktemp("ctx") / "data"
    data.mkdir(mode=0o755)
    ctx = Context(data, issuer, token, max_body_bytes=2 * 1024 * 1024)
    with apifuzz.serve(ctx.app) as base:
        yield ctx, base
    ctx.service.close()


def assert_clean_refusal(r: httpx.Response, sent: str = "", ctx: Any = "") -> dict[str, Any]:
    """A 4xx problem (or SCIM error) of bounded size naming no internals nor echoing `sent`."""
    assert 400 <= r.status_code < 500, (ctx, r.status_code, r.text[:500])
    assert len(r.content) <= MAX_ERROR_BYTES, (ctx, len(r.content))
    assert not INTERNALS.search(r.text), (ctx, r.text[:500])
    if len(sent) >= 64:
        assert sent[:64] not in r.text, ctx
    body: dict[str, Any] = r.json()
    if r.headers["content-type"].startswith(PROBLEM):
        assert body["status"] == r.status_code and body["type"].startswith("urn:svc:problem:")
    else:  # SCIM's own errors (RFC 7644 section 3.12)
        assert "urn:ietf:params:scim:api:messages:2.0:Error" in body["schemas"], (ctx, body)
    return body


# -- junk, and where it goes ------------------------------------------------------------------

LONG = "x" * 900_000
#: Raw JSON texts of values that must never be stored: `\ud800` alone, as a key, paired wrongly.
SURROGATES = ['"\\ud800"', '"a\\udfffb"', '{"\\ud800": 1}', '["ok", "\\udbff\\u0041"]']


def assert_scim_error(r: httpx.Response, status: int) -> dict[str, Any]:
    """``r`` is a short SCIM ``Error`` document of ``status`` (RFC 7644 section 3.12)."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/scim+json"), r.headers
    assert len(r.content) <= MAX_ERROR_BYTES and not INTERNALS.search(r.text), r.text[:300]
    body: dict[str, Any] = r.json()
    assert body["schemas"] == ["urn:ietf:params:scim:api:messages:2.0:Error"], body
    assert body["status"] == str(status) and body["detail"], body
    return body


def deep(n: int) -> str:
    return "[" * n + "]" * n


def write_routes(slot: str) -> dict[str, tuple[str, str, str]]:
    """Every write route of the context service: (method, path, JSON text with `slot` in it).

    `slot` is a raw JSON value placed where the route stores free-form data or an id.
    """
    ref = '{"type": "Human", "id": "ana"}'
    return {
        "resources.attrs": (
            "POST",
            "/v1/resources",
            f'{{"resources": [{{"type": "Document", "id": "d1", "attrs": {{"x": {slot}}}}}]}}',
        ),
        "resources.id": (
            "POST",
            "/v1/resources",
            f'{{"resources": [{{"type": "Document", "id": {slot}}}]}}',
        ),
        "resources.parents": (
            "POST",
            "/v1/resources",
            f'{{"resources": [{{"type": "Document", "id": "d2", '
            f'"parents": [{{"type": "Folder", "id": {slot}}}]}}]}}',
        ),
        "work_items.attrs": (
            "POST",
            "/v1/work-items",
            f'{{"work_items": [{{"id": "jira:A-1", "status": "open", "attrs": {{"k": {slot}}}}}]}}',
        ),
        "work_items.links": (
            "POST",
            "/v1/work-items",
            f'{{"work_items": [{{"id": "jira:A-2", "status": "open", '
            f'"links": [{{"type": "Document", "id": {slot}}}]}}]}}',
        ),
        "service_accounts": (
            "POST",
            "/v1/service-accounts",
            f'{{"service_accounts": [{{"id": "app.bot", "owner": "ana", "description": {slot}}}]}}',
        ),
        "risk": (
            "POST",
            "/v1/risk",
            f'{{"scores": [{{"principal": {ref}, "score": 5, "details": {{"d": {slot}}}}}]}}',
        ),
        "trusted_apps": (
            "POST",
            "/v1/directory/trusted-apps",
            f'{{"name": "app1", "iss": {slot}, "jwks_url": "https://x.example/j", "aud": "a"}}',
        ),
        "investigations": (
            "POST",
            "/v1/investigations",
            f'{{"principal": {ref}, "reason": "r", "opened_by": "ana", "evidence": {{"e": {slot}}}}}',
        ),
        "investigations.close": (
            "POST",
            "/v1/investigations/1/close",
            f'{{"closed_by": "ana", "resolution": {slot}}}',
        ),
        "resources.delete": ("POST", "/v1/resources/delete", f'{{"resources": [{slot}]}}'),
        "work_items.delete": ("POST", "/v1/work-items/delete", f'{{"ids": [{slot}]}}'),
        "scim.user": (
            "POST",
            "/scim/v2/Users",
            '{"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], '
            f'"userName": {slot}, "displayName": "x"}}',
        ),
        "scim.user.name": (
            "POST",
            "/scim/v2/Users",
            '{"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], '
            f'"userName": "bo", "name": {{"givenName": {slot}}}}}',
        ),
        "scim.group": (
            "POST",
            "/scim/v2/Groups",
            '{"schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"], '
            f'"displayName": {slot}}}',
        ),
    }


#: Where the slot is an id or a name the decision point or the gateway matches: printable text.
ID_SLOTS = frozenset(
    {
        "resources.id",
        "resources.parents",
        "work_items.links",
        "trusted_apps",
        "scim.user",
        "scim.group",
    }
)

#: Junk values (raw JSON) that every write route must refuse wherever they are put.
JUNK: dict[str, str] = {
    **{f"surrogate{i}": s for i, s in enumerate(SURROGATES)},
    "deep-10000": deep(10_000),
    "deep-65": deep(65),
    "control-chars": '"a\\u0000b\\u001fc"',
    # Python reads these as floats and writes them back as NaN/Infinity, which is not JSON.
    "nan": "NaN",
    "overflow": "1e400",
    "huge-900k": json.dumps(LONG),
}


def test_junk_to_every_write_route_leaves_every_feed_readable(
    context: tuple[Context, str],
) -> None:
    ctx, base = context
    h = httpx.Client(base_url=base, headers=ctx.headers, timeout=60)
    stored: dict[str, list[str]] = {}
    for junk_name, junk in JUNK.items():
        for route, (method, path, text) in write_routes(junk).items():
            headers = ctx.scim_headers if path.startswith("/scim/") else {}
            r = h.request(method, path, content=text.encode(), headers=headers)
            if r.status_code < 300:
                # Only what can be served back may be stored: a control character in free
                # text (not an id) is valid JSON and valid Unicode.
                assert junk_name == "control-chars", (route, junk_name, r.status_code)
                assert route not in ID_SLOTS, (route, "an id with a control character")
                stored.setdefault(junk_name, []).append(route)
                continue
            assert_clean_refusal(r, sent=LONG if junk_name == "huge-900k" else "", ctx=route)
    # Invalid UTF-8 and a byte order mark, on every route.
    for route, (method, path, text) in write_routes('"ok"').items():
        for raw in (text.encode()[:-3] + b"\xff\xfe}", b"\xef\xbb\xbf" + text.encode()):
            headers = ctx.scim_headers if path.startswith("/scim/") else {}
            r = h.request(method, path, content=raw, headers=headers)
            assert_clean_refusal(r, ctx=(route, raw[:8]))
    # A paired surrogate (an emoji) is a character: stored and served back.
    ok = h.post(
        "/v1/resources",
        content=b'{"resources": [{"type": "Document", "id": "emoji", "attrs": '
        b'{"t": "\\ud83d\\ude00"}}]}',
        headers={"content-type": "application/json"},
    )
    assert ok.status_code == 200, ok.text
    # Every feed and every read still answers, with what was stored.
    reads = [
        ("GET", "/v1/principals", None),
        ("GET", "/v1/principals/watch?after=0", None),
        ("GET", "/v1/feeds", None),
        ("GET", "/v1/resources/changes?after=0", None),
        ("GET", "/v1/work-items/changes?after=0", None),
        ("GET", "/v1/resources?type=Document", None),
        ("POST", "/v1/resources/get", {"resources": [{"type": "Document", "id": "d1"}]}),
        ("POST", "/v1/work-items/get", {"ids": ["jira:A-1", "jira:A-2"]}),
        ("GET", "/v1/service-accounts", None),
        ("GET", "/v1/risk", None),
        ("GET", "/v1/directory/people", None),
        ("GET", "/v1/directory/groups", None),
        ("GET", "/v1/directory/trusted-apps", None),
        ("GET", "/v1/investigations", None),
    ]
    for method, path, body in reads:
        r = h.request(method, path, json=body)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        r.content.decode("utf-8")  # strict: valid UTF-8 throughout
    scim = httpx.get(f"{base}/scim/v2/Users", headers=ctx.scim_headers)
    assert scim.status_code == 200, scim.text[:300]
    got = h.post("/v1/resources/get", json={"resources": [{"type": "Document", "id": "emoji"}]})
    assert "\U0001f600" in got.text
    assert set(stored) <= {"control-chars"}


def test_the_token_comes_before_the_body(context: tuple[Context, str]) -> None:
    ctx, base = context
    bad = {"Authorization": "Bearer not-a-jwt"}
    cases: list[tuple[str, str, dict[str, str], bytes]] = [
        # SCIM: 10,000-deep JSON and 50 MB, with no token and with a wrong one.
        ("POST", "/scim/v2/Users", {}, deep(10_000).encode()),
        ("POST", "/scim/v2/Users", {"Authorization": "Bearer wrong"}, deep(10_000).encode()),
        ("POST", "/scim/v2/Users", {}, b"[" * (50 * 1024 * 1024)),
        # /v1: a body FastAPI would refuse (422), a route that does not exist (404).
        ("POST", "/v1/resources", {}, b'{"resources": 5}'),
        ("POST", "/v1/resources", bad, b"not json"),
        ("GET", "/v1/no-such-route", {}, b""),
        ("DELETE", "/v1/directory/trusted-apps/x", bad, b""),
        ("POST", "/v1/risk", {}, b"[" * (50 * 1024 * 1024)),
    ]
    for method, path, headers, body in cases:
        r = httpx.request(
            method,
            base + path,
            content=body,
            headers={"content-type": "application/json", **headers},
            timeout=120,
        )
        assert r.status_code == 401, (path, headers, r.status_code, r.text[:200])
        if path.startswith("/scim/v2/"):
            assert_scim_error(r, 401)
        else:
            assert r.headers["content-type"].startswith(PROBLEM)
        assert r.headers["www-authenticate"].startswith("Bearer")
    # With the right token, the same junk gets the body's own refusal, never a 5xx; on SCIM's
    # paths as a SCIM Error document (RFC 7644 section 3.12).
    deep_scim = httpx.post(
        f"{base}/scim/v2/Users", content=deep(10_000).encode(), headers=ctx.scim_headers
    )
    assert assert_scim_error(deep_scim, 400)["scimType"] == "invalidSyntax"
    surrogate = httpx.post(
        f"{base}/scim/v2/Users",
        content=b'{"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "\\ud800"}',
        headers=ctx.scim_headers,
    )
    assert "surrogate" in assert_scim_error(surrogate, 400)["detail"]
    big_scim = httpx.post(
        f"{base}/scim/v2/Groups",
        content=b"[" * (3 * 1024 * 1024),
        headers=ctx.scim_headers,
        timeout=120,
    )
    assert "SVC_CONTEXT_MAX_BODY_BYTES" in assert_scim_error(big_scim, 413)["detail"]
    big = httpx.post(
        f"{base}/v1/risk",
        content=b"[" * (3 * 1024 * 1024),
        headers={**ctx.headers, "content-type": "application/json"},
        timeout=120,
    )
    assert big.status_code == 413 and "SVC_CONTEXT_MAX_BODY_BYTES" in big.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
        for _ in range(64):
            yield b" " * 65536

    streamed = httpx.post(
        f"{base}/v1/risk",
        content=chunks(),
        headers={**ctx.headers, "content-type": "application/json"},
        timeout=120,
    )
    assert streamed.status_code == 413, streamed.text[:200]
    # FastAPI's 422 is a 400 problem naming the parameter, not echoing it.
    junk = "z" * 10_000
    r = httpx.get(f"{base}/v1/risk", params={"min_score": junk}, headers=ctx.headers)
    body = assert_clean_refusal(r, sent=junk)
    assert r.status_code == 400 and body["errors"][0]["field"] == "min_score", body
    # The probes and SCIM's discovery document take no token.
    for path in ("/healthz", "/readyz", "/version", "/metrics", "/scim/v2/ServiceProviderConfig"):
        assert httpx.get(base + path).status_code == 200, path


def test_parse_json_refuses_what_cannot_be_served_back() -> None:
    assert parse_json(b'{"t": "\\ud83d\\ude00", "n": [1, {"a": null}]}') == {
        "t": "\U0001f600",
        "n": [1, {"a": None}],
    }
    assert parse_json(deep(64)) is not None
    for bad, why in [
        (b'"\\ud800"', "lone surrogate"),
        (b'{"\\udc00": 1}', "lone surrogate"),
        ('"\ud800"', "lone surrogate"),
        (deep(65).encode(), "deeper than 64"),
        (deep(100_000).encode(), "deeper than 64"),
        (b"\xff", "not UTF-8"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b"{", "not JSON"),
        (b"NaN-ish", "not JSON"),
        (b"[NaN]", "not JSON"),
        (b'{"a": Infinity}', "not JSON"),
        (b"[1e400]", "out of a float's range"),
        (b"[-1E+0309]", "out of a float's range"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_json(bad)


# -- Connect -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyServer]:
    data = tmp_path_factory.mktemp("pol") / "data"
    settings = PolicySettings(port=0, data_dir=data, database_url=f"sqlite:///{data / 'policy.db'}")
    data.mkdir(mode=0o755)
    srv = PolicyServer(settings).start()
    yield srv
    srv.stop()
    srv.service.close()


def connect(base: str, service: str, method: str, body: bytes, ctype: str) -> httpx.Response:
    return httpx.post(
        f"{base}/{service}/{method}", content=body, headers={"content-type": ctype}, timeout=60
    )


FIVE_MB = "y" * (5 * 1024 * 1024)


def test_connect_errors_are_short_and_safe(policy: PolicyServer, tmp_path: Path) -> None:
    challenge = ChallengeServer(
        ChallengeSettings(
            port=0,
            database_url=f"sqlite:///{tmp_path / 'challenge.db'}",
            link_key_file=str(tmp_path / "link.key"),
        ),
        outbox=False,
    ).start()
    try:
        calls = [
            (policy.url, "svc.policy.v1.PolicyService", "CreateDraft", b'{"files": 5}'),
            (policy.url, "svc.policy.v1.PolicyService", "CreateDraft", b'{"files": [5]}'),
            (
                policy.url,
                "svc.policy.v1.PolicyService",
                "CreateDraft",
                b'{"files": [{"name": "\\ud800", "content": "x"}], "author": "a"}',
            ),
            (
                policy.url,
                "svc.policy.v1.PolicyService",
                "CreateDraft",
                json.dumps(
                    {
                        "files": [
                            {"name": FIVE_MB, "content": "permit(principal, action, resource);"}
                        ]
                    }
                ).encode(),
            ),
            (
                policy.url,
                "svc.policy.v1.PolicyService",
                "SetEnforcement",
                json.dumps({"mode": FIVE_MB, "author": FIVE_MB}).encode(),
            ),
            (policy.url, "svc.policy.v1.PolicyService", "ListBundles", deep(10_000).encode()),
            (policy.url, "svc.policy.v1.PolicyService", "ListBundles", b"\xff\xfe"),
            (policy.url, "svc.policy.v1.PolicyService", "GetBundle", b'{"version": "x"}'),
            (challenge.url, "svc.challenge.v1.ChallengeService", "Justify", b'{"qid": [1]}'),
            (
                challenge.url,
                "svc.challenge.v1.ChallengeService",
                "Justify",
                b'{"qid": "q", "person": "ana", "text": "\\ud800"}',
            ),
            (
                challenge.url,
                "svc.challenge.v1.ChallengeService",
                "Contain",
                json.dumps(
                    {"principal": {"type": "Human", "id": FIVE_MB}, "reason": FIVE_MB}
                ).encode(),
            ),
            (
                challenge.url,
                "svc.challenge.v1.ChallengeService",
                "FinishKeyRegistration",
                json.dumps({"person": "ana", "ceremony_id": "c", "credential_json": "5"}).encode(),
            ),
        ]
        for base, service, method, body in calls:
            r = connect(base, service, method, body, "application/json")
            assert 400 <= r.status_code < 500, (method, r.status_code, r.text[:300])
            assert len(r.content) <= MAX_ERROR_BYTES, (method, len(r.content))
            assert not INTERNALS.search(r.text), (method, r.text[:300])
            assert FIVE_MB[:64] not in r.text, method
            assert r.json()["code"] in {
                "invalid_argument",
                "not_found",
                "failed_precondition",
                "resource_exhausted",
            }
        # Binary junk over gRPC-style protobuf: INVALID_ARGUMENT, no parser text.
        r = connect(
            policy.url,
            "svc.policy.v1.PolicyService",
            "CreateDraft",
            b"\x0a\xff\xff\xff\xff\x0f",
            "application/proto",
        )
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
        assert not INTERNALS.search(r.text)
        # The probes' apps answer problems for junk too.
        for base in (policy.url, challenge.url):
            r = httpx.post(f"{base}/v1/anything", content=deep(10_000).encode())
            assert r.status_code in (400, 404), r.text
            assert r.headers["content-type"].startswith(PROBLEM)
    finally:
        challenge.stop()
        challenge.service.close()


def test_unauthenticated_paths_of_the_policy_service_get_401_first(
    tmp_path: Path, issuer: LocalIssuer
) -> None:
    settings = PolicySettings(
        port=0, data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'policy.db'}"
    )
    auth = PolicyAuthSettings(
        auth_issuer=issuer.issuer, auth_jwks=issuer.jwks_url, auth_callers=[CALLER]
    )
    srv = PolicyServer(settings, auth=auth).start()
    try:
        for path in ("/v1/anything", "/openapi-x", "/svc.policy.v1.PolicyService/GetActive"):
            r = httpx.post(
                srv.url + path,
                content=deep(10_000).encode(),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 401, (path, r.status_code, r.text[:200])
        assert httpx.get(srv.url + "/readyz").status_code == 200
    finally:
        srv.stop()
        srv.service.close()


# -- the challenge page ------------------------------------------------------------------------


def sign_in(page: httpx.Client, idp_form: str, user: str) -> None:
    """The authorization code flow through the dev provider's form, as a browser follows it."""
    form = httpx.post(idp_form, data={"sub": user}, timeout=30)
    assert form.status_code == 302, form.text[:300]
    callback = httpx.URL(form.headers["location"])
    done = page.get(callback.raw_path.decode())
    assert done.status_code == 303, done.text[:300]


def test_sign_out_revokes_the_page_session_and_justify_refuses_junk(tmp_path: Path) -> None:
    idp = DevIdentityProvider(users=["ana"]).start()
    secret = tmp_path / "client-secret"
    secret.write_text("page-secret\n")
    data = tmp_path / "data"
    settings = ChallengeSettings(
        database_url=f"sqlite:///{data / 'challenge.db'}",
        port=0,
        rp_id="localhost",
        origins=["http://localhost"],
        page_url="http://localhost/challenge",
        oidc_issuer=idp.issuer,
        oidc_client_secret_file=str(secret),
        link_key_file=str(tmp_path / "link.key"),
    )
    service = ChallengeService(settings, directory=StaticDirectory(managers={}))
    srv = ChallengeServer(settings, service, outbox=False).start()
    try:
        page = httpx.Client(base_url=srv.url, timeout=30)
        login = page.get("/auth/login")
        assert login.status_code in (302, 303, 307), login.text[:300]
        sign_in(page, login.headers["location"], "ana")
        me = page.get("/page/api/me")
        assert me.status_code == 200 and me.json()["user"] == "ana", me.text
        csrf = me.json()["csrf"]
        copy = dict(page.cookies)  # what a thief of the cookie holds
        # Justify with a lone surrogate: a 400 problem, not a 500.
        j = page.post(
            "/page/api/challenges/q/justify",
            content=b'{"text": "\\ud800"}',
            headers={"x-csrf-token": csrf, "content-type": "application/json"},
        )
        assert assert_clean_refusal(j)["type"] == "urn:svc:problem:invalid-json"
        assert page.post("/auth/logout", headers={"x-csrf-token": csrf}).status_code == 204
        # The old cookie is refused on the server, not only dropped by the browser ...
        stale = httpx.get(f"{srv.url}/page/api/me", cookies=copy)
        assert stale.status_code == 401, stale.text
        # ... on every replica: a second server over the same database refuses it too.
        other = ChallengeServer(settings.model_copy(update={"port": 0}), outbox=False).start()
        try:
            assert httpx.get(f"{other.url}/page/api/me", cookies=copy).status_code == 401
        finally:
            other.stop()
            other.service.close()
        # Signing in again gives a new session that works.
        again = httpx.Client(base_url=srv.url, timeout=30)
        sign_in(again, again.get("/auth/login").headers["location"], "ana")
        assert again.get("/page/api/me").status_code == 200
    finally:
        srv.stop()
        service.close()
        idp.stop()


# -- files and logs ----------------------------------------------------------------------------


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_data_files_are_private(
    context: tuple[Context, str], policy: PolicyServer, tmp_path: Path
) -> None:
    ctx, _ = context
    assert mode(ctx.data / "context.db") == 0o600
    assert mode(ctx.data) == 0o700  # made 0755 by the fixture: narrowed
    pol = Path(policy.settings.database_url.removeprefix("sqlite:///"))
    assert mode(pol) == 0o600 and mode(pol.parent) == 0o700
    key = Path(policy.settings.data_dir) / "policy-signing.key"
    assert mode(key) == 0o600
    challenge = ChallengeService(
        ChallengeSettings(
            database_url=f"sqlite:///{tmp_path / 'new' / 'challenge.db'}",
            link_key_file=str(tmp_path / "link.key"),
        )
    )
    try:
        assert mode(tmp_path / "new" / "challenge.db") == 0o600
        assert mode(tmp_path / "new") == 0o700
        assert mode(tmp_path / "link.key") == 0o600
    finally:
        challenge.close()


def test_log_fields_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    install_log_bounds()  # as every app's harden() does
    document_id = "d" * 900_000
    with caplog.at_level(logging.INFO, logger="svc.gateway"):
        logging.getLogger("svc.gateway").info(
            "blocked %s/%s for %s: %s", "docs", "read", document_id, ValueError(document_id)
        )
        logging.getLogger("svc.gateway").info(document_id)
    lines = [r.getMessage() for r in caplog.records if r.name == "svc.gateway"]
    assert len(lines) == 2
    for line in lines:
        assert len(line) < 3 * MAX_LOG_FIELD_CHARS, len(line)
        assert "(900000 chars)" in line


def test_the_intake_token_comes_before_path_and_body(kafka_bootstrap: str) -> None:
    """Unknown intake paths without the intake token were 404 (docs/intake.md#routes): now 401."""
    from svc.intake.app import create_app as intake_app
    from svc.intake.settings import IntakeSettings

    token = "intake-" + "i" * 40
    settings = IntakeSettings(
        kafka_url=kafka_bootstrap,
        topic="svc-hardening-unused",
        token=token,
        transactional_id="svc-hardening-intake",
        broker_timeout_secs=3.0,
        max_body_bytes=1024 * 1024,
    )
    with apifuzz.serve(intake_app(settings)) as base:
        for method, path, headers, body in [
            ("GET", "/v1/no-such-route", {}, b""),
            ("POST", "/no-such-route", {}, deep(10_000).encode()),
            ("POST", "/v1/events", {}, b"[" * (8 * 1024 * 1024)),
            ("POST", "/v1/events/cloud-audit-trail", {}, deep(10_000).encode()),
            ("PUT", "/v1/events", {"Authorization": "Basic x"}, b"{}"),
        ]:
            r = httpx.request(
                method,
                base + path,
                content=body,
                headers={"content-type": "application/json", **headers},
                timeout=120,
            )
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
            assert r.headers["content-type"].startswith(PROBLEM)
            assert r.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.post(
            base + "/v1/events",
            content=b"[" * (8 * 1024 * 1024),
            headers={"Authorization": "Bearer " + "w" * 40},
            timeout=120,
        )
        assert wrong.status_code == 403, wrong.text[:200]
        right = {"Authorization": f"Bearer {token}"}
        assert httpx.get(base + "/v1/no-such-route", headers=right).status_code == 404
        big = httpx.post(base + "/v1/events", content=b"[" * (2 * 1024 * 1024), headers=right)
        assert big.status_code == 413, big.text[:200]
        for path in ("/healthz", "/version", "/metrics", "/openapi.json"):
            assert httpx.get(base + path).status_code == 200, path


def test_a_900kb_document_id_makes_no_900kb_log_line_in_the_decision_point(
    context: tuple[Context, str], issuer: LocalIssuer, tmp_path: Path
) -> None:
    """One agent's 900 KB ``document_id`` became a 900 KB line of the decision point's log: its
    follower named the whole id when the context service refused to fetch it. Rerun through
    ``svc pdp`` as a process, following the context service; its standard error is read."""
    from test_context_follow import POLICIES, SCHEMA
    from test_pdp_standalone import Pdp

    _, base = context
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "schema.cedarschema").write_text(SCHEMA)
    (bundle / "policies.cedar").write_text(POLICIES)
    token_file = tmp_path / "context.token"
    token_file.write_text(issuer.mint(CALLER, "svc-context", 3600) + "\n")
    pdp = Pdp(
        "--bundle", str(bundle), "--port", "0", "--no-watch",
        "--context", base, "--context-token-file", str(token_file),
        "--context-fetch-timeout-ms", "30000",
    )  # fmt: skip
    document_id = "d" * 900_000
    try:
        url = f"http://127.0.0.1:{pdp.port()}/v1/access/evaluation"
        r = httpx.post(
            url,
            json={
                "principal": {"type": "Human", "id": "ana"},
                "action": "read",
                "resource": {"type": "Document", "id": document_id},
            },
            timeout=60,
        )
        assert r.status_code < 500, r.text[:300]
        assert len(r.content) < MAX_ERROR_BYTES + 2048, len(r.content)
    finally:
        assert pdp.stop() == 0, pdp.log[-2000:]
    lines = pdp.log.splitlines()
    assert any("fetch" in line for line in lines), pdp.log[-2000:]  # the refusal was logged
    longest = max(len(line) for line in lines)
    assert longest < 3 * MAX_LOG_FIELD_CHARS, (longest, max(lines, key=len)[:300])
