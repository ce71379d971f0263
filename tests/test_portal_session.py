"""People's sign-in to the portal, its session and CSRF (docs/portal.md#sign-in).

Against the demo OpenID Connect provider (oidc-provider-mock, `svc.challenge.dev_idp`) in a
thread and the portal on a real port (tests/portalkit.py). Covered: the authorization code flow
with PKCE (the authorization request carries an S256 `code_challenge`, `state` and `nonce`);
the session cookie's attributes; `GET /api/v1/me`; a tampered or unknown cookie; a callback
with a forged `state`; sign-out revoking the session server-side, so a copy of the cookie is
refused afterwards; every state-changing request refused without the session's CSRF token,
with another session's, or from another origin; a sign-in again opening a new session; a
redirect target off the site ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from portalkit import World, pg_schema
from svc.portal.sessions import COOKIE


@pytest.fixture(scope="module")
def world(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with pg_schema(postgres_url) as url:
        w = World(url, tmp_path_factory.mktemp("portal-session"))
        try:
            yield w
        finally:
            w.close()


def slug(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/problem+json"), r.text
    return str(r.json()["type"]).removeprefix("urn:svc:problem:")


def test_sign_in_is_the_code_flow_with_pkce_and_a_safe_cookie(world: World) -> None:
    c = httpx.Client(base_url=world.portal.url, timeout=30)
    r = c.get("/auth/login", params={"next": "/decisions"})
    assert r.status_code in (302, 303)
    q = parse_qs(urlsplit(r.headers["location"]).query)
    assert r.headers["location"].startswith(world.oidc.issuer)
    assert q["response_type"] == ["code"] and q["code_challenge_method"] == ["S256"]
    assert len(q["code_challenge"][0]) >= 43 and q["state"][0] and q["nonce"][0]
    assert q["redirect_uri"] == [f"{world.portal.url}/auth/callback"]
    assert q["client_id"] == ["svc-portal"]
    r = httpx.post(r.headers["location"], data={"sub": "ana"}, timeout=30)
    assert r.status_code in (302, 303)
    r = c.get(r.headers["location"])
    assert r.status_code == 303 and r.headers["location"] == "/decisions"
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and COOKIE in v)
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "samesite", "max-age", "path"} <= attrs, cookie
    assert "samesite=lax" in cookie.lower() and "secure" not in attrs  # http:// public URL
    me = c.get("/api/v1/me").json()
    assert me["user"] == "ana" and len(me["csrf"]) >= 32 and me["expires_at"]
    c.close()


def test_no_tampered_or_unknown_session(world: World) -> None:
    assert slug(world.http.get("/api/v1/me")) == "unauthenticated"
    ana = world.sign_in("ana")
    value = ana.cookies[COOKIE]
    for bad in (value[:-2] + "xx", "x" + value, "", "not-a-cookie"):
        r = httpx.get(f"{world.portal.url}/api/v1/me", cookies={COOKIE: bad})
        assert r.status_code == 401 and slug(r) == "unauthenticated", bad
    ana.close()


def test_a_forged_state_is_refused(world: World) -> None:
    c = httpx.Client(base_url=world.portal.url, timeout=30)
    r = c.get("/auth/login")
    r = httpx.post(r.headers["location"], data={"sub": "ana"}, timeout=30)
    target = urlsplit(r.headers["location"])
    q = parse_qs(target.query)
    r = c.get("/auth/callback", params={"code": q["code"][0], "state": "forged"})
    assert r.status_code == 403 and slug(r) == "sign-in-refused"
    assert COOKIE not in c.cookies
    # Another browser (without the sign-in cookie) cannot complete the flow either.
    r = httpx.get(f"{world.portal.url}/auth/callback?{target.query}")
    assert r.status_code == 403 and slug(r) == "sign-in-refused"
    c.close()


def test_sign_out_revokes_the_session_server_side(world: World) -> None:
    bo = world.sign_in("bo")
    stolen = bo.cookies[COOKIE]
    r = bo.post("/auth/logout", headers={"x-csrf-token": ""})
    assert r.status_code == 403 and slug(r) == "csrf-refused"
    r = bo.post("/auth/logout")
    assert r.status_code == 204
    assert (
        'svc_portal_session=""' in r.headers["set-cookie"] or "Max-Age=0" in r.headers["set-cookie"]
    )
    r = httpx.get(f"{world.portal.url}/api/v1/me", cookies={COOKIE: stolen})
    assert r.status_code == 401 and slug(r) == "unauthenticated"
    r = httpx.post(
        f"{world.portal.url}/auth/logout",
        cookies={COOKIE: stolen},
        headers={"x-csrf-token": bo.headers["x-csrf-token"]},
    )
    assert r.status_code == 401
    bo.close()


def test_state_changing_requests_need_the_sessions_csrf_token(world: World) -> None:
    ana = world.sign_in("ana")
    cy = world.sign_in("cy")
    assert ana.headers["x-csrf-token"] != cy.headers["x-csrf-token"]
    for headers in (
        {"x-csrf-token": ""},
        {"x-csrf-token": cy.headers["x-csrf-token"]},
        {"x-csrf-token": ana.headers["x-csrf-token"] + "x"},
        {"origin": "https://evil.example.com"},
    ):
        r = ana.post("/auth/logout", headers=headers)
        assert r.status_code == 403 and slug(r) == "csrf-refused", headers
    assert ana.get("/api/v1/me").status_code == 200  # none of them signed ana out
    r = ana.post("/auth/logout", headers={"origin": world.portal.url})
    assert r.status_code == 204
    cy.close()
    ana.close()


def test_signing_in_again_opens_a_new_session_and_next_stays_on_site(world: World) -> None:
    c = world.sign_in("ana")
    first = c.cookies[COOKIE]
    r = c.get("/auth/login", params={"next": "//evil.example.com/x"})
    r2 = httpx.post(r.headers["location"], data={"sub": "ana"}, timeout=30)
    r3 = c.get(r2.headers["location"])
    assert r3.status_code == 303 and r3.headers["location"] == "/"
    assert c.cookies[COOKIE] != first
    r = httpx.get(f"{world.portal.url}/api/v1/me", cookies={COOKIE: first})
    assert r.status_code == 401  # the old session is gone
    c.close()


def test_credentials_come_before_the_body(world: World) -> None:
    """GraphQL, the agents API and MCP refuse a caller without credentials before reading its
    body (issue 43): a deep or oversized body gets 401, not 400 or 413; the web app's files,
    sign-in and the probes stay open."""
    base = world.portal.url
    deep = ("[" * 10_000 + "]" * 10_000).encode()
    huge = b"[" * (world.settings.max_body_bytes + 1024)
    routes = [
        ("POST", "/graphql"),
        ("PUT", "/api/v1/agents/copilot.x"),
        ("GET", "/api/v1/agents"),
        ("DELETE", "/api/v1/agents/copilot.x"),
        ("POST", "/mcp"),
    ]
    for method, path in routes:
        for body in (deep, huge):
            for headers in ({}, {"authorization": "Bearer not-a-jwt"}):
                r = httpx.request(
                    method,
                    base + path,
                    content=body,
                    headers={"content-type": "application/json", **headers},
                    timeout=60,
                )
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text[:200])
                assert slug(r) == "unauthenticated"
    # With credentials the same bodies get their own refusals.
    app = {"authorization": f"Bearer {world.copilot.mint('copilot', 'svc-portal')}"}
    r = httpx.put(f"{base}/api/v1/agents/copilot.x", content=deep, headers=app)
    assert r.status_code == 400 and slug(r) == "invalid-json", r.text[:200]
    r = httpx.put(f"{base}/api/v1/agents/copilot.x", content=huge, headers=app, timeout=60)
    assert r.status_code == 413 and slug(r) == "payload-too-large", r.text[:200]
    ana = world.sign_in("ana")
    r = ana.post("/graphql", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and slug(r) == "invalid-json", r.text[:200]
    ana.close()
    for path in ("/healthz", "/version", "/", "/decisions"):
        assert httpx.get(base + path).status_code == 200, path
    assert httpx.get(f"{base}/auth/login").status_code in (302, 303)
