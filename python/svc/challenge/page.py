"""The challenge page: what a person opens from a notification (docs/challenges.md#the-page).

Served by svc-challenge on its one port (``install_page`` adds it to the probes' FastAPI app):

* ``GET /challenge/{qid}?t=<link token>`` opens a challenge. The token (``svc.challenge.links``)
  must verify for that challenge; the person then signs in with the install's OpenID Connect
  provider; the token is used (recorded once, ``ChallengeService.use_link``) only when the
  signed-in user is its recipient, and the session then holds the challenge. A forwarded,
  reused or tampered link is refused (403 problem).
* ``GET /auth/login``, ``GET /auth/callback``, ``POST /auth/logout``: sign-in through Authlib's
  Starlette client, authorization code flow with PKCE (RFC 7636, ``S256``), ``state`` and the ID
  token's ``nonce`` checked (OpenID Connect Core 1.0 sections 3.1.2 and 3.1.3.7). The user name
  is the ID token's ``oidc_username_claim``. The session is a Starlette ``SessionMiddleware``
  cookie: signed, ``HttpOnly``, ``SameSite=Lax``, ``Secure`` when the page URL is https. It
  carries a random session id; signing out records that id as used up in the database
  (``link_uses``, as a used link token is, ``session:<id>``), so a copy of the old cookie is
  refused on every replica from then on, not only in the browser that signed out.
* ``GET /keys``: the person's security keys (register, change, remove).
* ``/page/api/...``: the JSON the pages' JavaScript calls. Every ``POST`` takes a JSON body and
  the session's CSRF token in the ``X-CSRF-Token`` header. Answers go through the same
  ``ChallengeService`` methods as the gRPC API (``begin_verification``, ``finish_verification``,
  ``justify``, ``decide``, the key operations), so the page and the API share every rule; the
  person is always the signed-in user, never a field of the request.

Errors are RFC 9457 problems (``svc.common.problems``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from authlib.integrations.starlette_client import OAuth, OAuthError
from fastapi import APIRouter, Body, FastAPI, Header, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session
from starlette.middleware.sessions import SessionMiddleware
from starlette.staticfiles import StaticFiles

from svc.challenge.links import LinkRefused
from svc.challenge.models import LinkUseRow
from svc.challenge.service import ChallengeError, ChallengeInfo, ChallengeService, SecurityKey
from svc.common.problems import Problem

__all__ = ["SESSION_COOKIE", "install_page"]

log = logging.getLogger("svc.challenge.page")

STATIC = Path(__file__).parent / "static"
#: The page's session cookie.
SESSION_COOKIE = "svc_challenge_session"
#: Content-Security-Policy of the HTML pages: scripts and styles from the page's own origin
#: only, no framing.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_STATUS = {
    "invalid_argument": 400,
    "permission_denied": 403,
    "not_found": 404,
    "failed_precondition": 409,
    "unavailable": 503,
}
_KIND_WHY = {
    "verification": "touch a security key registered to you (with its PIN or fingerprint)",
    "justification": "write why this is needed",
    "approval": "an approver approves or rejects",
}


def _problem(e: ChallengeError) -> Problem:
    status = _STATUS.get(e.code, 400)
    slug = e.code.replace("_", "-")
    return Problem(status, slug, slug.replace("-", " ").capitalize(), e.message)


def _refused(detail: str) -> Problem:
    return Problem(403, "forbidden", "Forbidden", detail)


def _time(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _challenge_json(c: ChallengeInfo, user: str) -> dict[str, Any]:
    """A challenge for the page's script: what it shows and which answers ``user`` may give."""
    pending = c.state == "pending"
    is_person, is_approver = user == c.person, user == c.approver
    justified = "justification" not in c.kinds or "justification" in c.satisfied
    return {
        "qid": c.qid,
        "state": c.state,
        "principal": asdict(c.principal),
        "on_behalf_of": asdict(c.on_behalf_of) if c.on_behalf_of else None,
        "action": c.action,
        "resource": asdict(c.resource),
        "kinds": c.kinds,
        "satisfied": c.satisfied,
        "why": [f"{k}: {_KIND_WHY.get(k, k)}" for k in c.kinds],
        "person": c.person,
        "approver": c.approver,
        "created_at": _time(c.created_at),
        "expires_at": _time(c.expires_at),
        "grant_expires_at": _time(c.grant_expires_at),
        "decided_by": c.decided_by,
        "justification": c.justification,
        "reason": c.reason,
        "you": user,
        "can_verify": pending
        and is_person
        and "verification" in c.kinds
        and "verification" not in c.satisfied,
        "can_justify": pending
        and is_person
        and "justification" in c.kinds
        and "justification" not in c.satisfied,
        "can_decide": pending and is_approver and "approval" in c.kinds and justified,
    }


def _key_json(k: SecurityKey) -> dict[str, Any]:
    return {
        "credential_id": k.credential_id,
        "name": k.name,
        "sign_count": k.sign_count,
        "created_at": _time(k.created_at),
        "last_used_at": _time(k.last_used_at),
    }


def _html(name: str) -> FileResponse:
    return FileResponse(
        STATIC / name,
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"},
    )


#: The ``link_uses`` key of a signed-out session: this prefix and the session's id.
_SIGNED_OUT = "session:"


class _SignedOut:
    """The sessions signed out, kept in the challenge database (module docs).

    Args:
        service: the service layer (its database and clock).

    """

    def __init__(self, service: ChallengeService) -> None:
        self.service = service

    def holds(self, sid: str) -> bool:
        """Whether the session ``sid`` was signed out (on any replica)."""
        with Session(self.service.db) as s:
            return s.get(LinkUseRow, _SIGNED_OUT + sid) is not None

    def add(self, sid: str, user: str) -> None:
        """Records the session ``sid`` of ``user`` as signed out (idempotent)."""
        with Session(self.service.db) as s:
            s.add(
                LinkUseRow(
                    jti=_SIGNED_OUT + sid,
                    challenge_qid="",
                    recipient=user[:512],
                    event="signed-out",
                    used_at=self.service.clock(),
                )
            )
            try:
                s.commit()
            except IntegrityError:  # signed out at the same moment through another request
                pass


def _user(request: Request) -> str | None:
    """The signed-in user, or None: no session, one without an id, or one signed out."""
    user = request.session.get("user")
    sid = request.session.get("sid")
    if not (isinstance(user, str) and user and isinstance(sid, str) and sid):
        return None
    signed_out: _SignedOut = request.app.state.challenge_signed_out
    if signed_out.holds(sid):
        request.session.clear()
        return None
    return user


def _signed_in(request: Request) -> str:
    user = _user(request)
    if user is None:
        raise Problem(401, "unauthenticated", "Unauthenticated", "sign in first")
    return user


def _opened(request: Request, qid: str) -> bool:
    return qid in request.session.get("opened", [])


def _check_csrf(request: Request, token: str | None) -> str:
    """The signed-in user of a POST whose ``X-CSRF-Token`` matches the session's."""
    user = _signed_in(request)
    expected = request.session.get("csrf")
    if not token or not isinstance(expected, str) or not hmac.compare_digest(token, expected):
        raise _refused("missing or wrong X-CSRF-Token header")
    return user


def _str(body: dict[str, Any], name: str, limit: int = 100_000) -> str:
    value = body.get(name, "")
    if not isinstance(value, str) or len(value) > limit:
        raise Problem(400, "invalid-argument", "Invalid argument", f"`{name}`: expected text")
    return value


#: A POST's JSON object body, and its ``X-CSRF-Token`` header.
_JsonBody = Annotated[dict[str, Any], Body()]
_Csrf = Annotated[str | None, Header()]


def _router(service: ChallengeService, oauth: OAuth, username_claim: str) -> APIRouter:
    """The page's routes (module docs)."""
    router = APIRouter(include_in_schema=False)

    def call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ChallengeError as e:
            raise _problem(e) from None

    @router.get("/challenge/{qid}")
    def open_challenge(request: Request, qid: str, t: str | None = None) -> Response:
        token = t or request.session.get("pending_links", {}).get(qid)
        if token is not None:
            try:
                claims = service.links.verify(token, qid)
            except LinkRefused as e:
                request.session.get("pending_links", {}).pop(qid, None)
                raise _refused(str(e)) from None
        user = _user(request)
        if user is None:
            if token is None:
                raise _refused("open this page from the link of its notification")
            request.session["pending_links"] = {qid: token}
            request.session["next"] = f"/challenge/{qid}"
            return RedirectResponse(request.url_for("login"), status_code=303)
        if token is not None and not _opened(request, qid):
            request.session.get("pending_links", {}).pop(qid, None)
            call(service.use_link, claims, user)
            request.session["opened"] = [*request.session.get("opened", [])[-49:], qid]
            log.info("challenge %s opened on the page by %s", qid, user)
        if not _opened(request, qid):
            raise _refused("open this page from the link of its notification")
        call(service.challenge_for, qid, user)
        if t is not None:  # drop the token from the address bar
            return RedirectResponse(request.url_for("open_challenge", qid=qid), status_code=303)
        return _html("challenge.html")

    @router.get("/keys")
    def keys_page(request: Request) -> Response:
        if _user(request) is None:
            request.session["next"] = "/keys"
            return RedirectResponse(request.url_for("login"), status_code=303)
        return _html("keys.html")

    @router.get("/auth/login", name="login")
    async def login(request: Request) -> Response:
        redirect_uri = request.url_for("auth_callback")
        try:
            out: Response = await oauth.idp.authorize_redirect(request, redirect_uri)
        except Exception as e:
            log.error("sign-in: the identity provider does not answer: %s", e)
            raise Problem(
                503, "unavailable", "Unavailable", "the identity provider does not answer"
            ) from None
        return out

    @router.get("/auth/callback", name="auth_callback")
    async def auth_callback(request: Request) -> Response:
        try:
            token = await oauth.idp.authorize_access_token(request)
        except OAuthError as e:
            log.warning("sign-in refused: %s", e)
            raise _refused(f"sign-in failed: {e.error}") from None
        claims = token.get("userinfo") or {}
        name = claims.get(username_claim)
        if not isinstance(name, str) or not name:
            raise _refused(f"the identity provider sent no `{username_claim}` claim")
        pending = request.session.get("pending_links", {})
        target = request.session.get("next", "/keys")
        request.session.clear()  # a new session for the new user (session fixation)
        request.session.update(
            {
                "user": name,
                "sid": secrets.token_urlsafe(24),
                "csrf": secrets.token_urlsafe(32),
                "pending_links": pending,
            }
        )
        log.info("%s signed in to the challenge page", name)
        local = isinstance(target, str) and target.startswith("/") and not target.startswith("//")
        return RedirectResponse(target if local else "/keys", status_code=303)

    @router.post("/auth/logout")
    def logout(request: Request, x_csrf_token: _Csrf = None) -> Response:
        user = _check_csrf(request, x_csrf_token)
        request.app.state.challenge_signed_out.add(request.session["sid"], user)
        log.info("%s signed out of the challenge page", user)
        request.session.clear()
        return Response(status_code=204)

    # -- JSON for the pages' script

    @router.get("/page/api/me")
    def me(request: Request) -> dict[str, Any]:
        return {"user": _signed_in(request), "csrf": request.session.get("csrf")}

    def opened_challenge(request: Request, qid: str, user: str) -> None:
        """Refuses a challenge this session did not open with its link."""
        if not _opened(request, qid):
            raise _refused("open this page from the link of its notification")

    @router.get("/page/api/challenges/{qid}")
    def get_challenge(request: Request, qid: str) -> dict[str, Any]:
        user = _signed_in(request)
        opened_challenge(request, qid, user)
        info = call(service.challenge_for, qid, user)
        out = _challenge_json(info, user)
        out["has_keys"] = bool(service.list_security_keys(user))
        return out

    @router.post("/page/api/challenges/{qid}/verification/begin")
    def begin_verification(
        request: Request, qid: str, x_csrf_token: _Csrf = None
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        opened_challenge(request, qid, user)
        ceremony_id, options = call(service.begin_verification, qid, user)
        return {"ceremony_id": ceremony_id, "options_json": options}

    @router.post("/page/api/challenges/{qid}/verification/finish")
    def finish_verification(
        request: Request,
        qid: str,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        opened_challenge(request, qid, user)
        info = call(
            service.finish_verification,
            _str(body, "ceremony_id", 64),
            user,
            _str(body, "credential_json"),
        )
        return _challenge_json(info, user)

    @router.post("/page/api/challenges/{qid}/justify")
    def justify(
        request: Request,
        qid: str,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        opened_challenge(request, qid, user)
        info = call(service.justify, qid, user, _str(body, "text"))
        return _challenge_json(info, user)

    @router.post("/page/api/challenges/{qid}/decide")
    def decide(
        request: Request,
        qid: str,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        opened_challenge(request, qid, user)
        approve = body.get("approve")
        if not isinstance(approve, bool):
            raise Problem(400, "invalid-argument", "Invalid argument", "`approve`: true or false")
        info = call(service.decide, qid, user, approve, _str(body, "reason"))
        return _challenge_json(info, user)

    @router.get("/page/api/keys")
    def list_keys(request: Request) -> dict[str, Any]:
        user = _signed_in(request)
        return {"keys": [_key_json(k) for k in service.list_security_keys(user)]}

    @router.post("/page/api/keys/register/begin")
    def begin_registration(
        request: Request,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        ceremony_id, options = call(service.begin_key_registration, user, _str(body, "name"))
        return {"ceremony_id": ceremony_id, "options_json": options}

    @router.post("/page/api/keys/change/begin")
    def begin_change(
        request: Request,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        change = call(
            service.begin_key_change, user, _str(body, "credential_id"), _str(body, "name")
        )
        return asdict(change)

    @router.post("/page/api/keys/register/finish")
    def finish_registration(
        request: Request,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> dict[str, Any]:
        user = _check_csrf(request, x_csrf_token)
        key, replaced = call(
            service.finish_key_registration,
            _str(body, "ceremony_id", 64),
            user,
            _str(body, "credential_json"),
            _str(body, "assertion_json"),
        )
        return {"key": _key_json(key), "replaced_credential_id": replaced}

    @router.post("/page/api/keys/remove")
    def remove_key(
        request: Request,
        body: _JsonBody,
        x_csrf_token: _Csrf = None,
    ) -> Response:
        user = _check_csrf(request, x_csrf_token)
        call(service.remove_security_key, user, _str(body, "credential_id"))
        return Response(status_code=204)

    return router


def install_page(app: FastAPI, service: ChallengeService) -> None:
    """Adds the challenge page to ``app`` (module docs), when ``oidc_issuer`` is set.

    Args:
        app: the service's FastAPI app (the probes'), before it serves.
        service: the service layer; its settings name the provider (``oidc_issuer``,
            ``oidc_client_id``, ``oidc_client_secret_file``, ``oidc_username_claim``), the
            session's length (``page_session_secs``) and the page's URL (``page_url``: an https
            one makes the cookie ``Secure``).

    Raises:
        ValueError: ``oidc_issuer`` is unset.
        OSError: the client secret file cannot be read.

    """
    settings = service.settings
    if not settings.oidc_issuer:
        raise ValueError("the challenge page needs oidc_issuer")
    secret: str | None = None
    if settings.oidc_client_secret_file:
        secret = Path(settings.oidc_client_secret_file).read_text(encoding="utf-8").strip()
    oauth = OAuth()
    oauth.register(
        name="idp",
        client_id=settings.oidc_client_id,
        client_secret=secret,
        server_metadata_url=settings.oidc_issuer.rstrip("/") + "/.well-known/openid-configuration",
        client_kwargs={
            "scope": "openid profile email",
            "code_challenge_method": "S256",
            "token_endpoint_auth_method": "client_secret_basic" if secret else "none",
        },
    )
    # The cookie's key is derived from the link key, so every replica reading the same
    # link_key_file accepts the same sessions.
    session_key = hmac.new(service.links.key, b"svc-challenge-page-session", hashlib.sha256)
    app.state.challenge_signed_out = _SignedOut(service)
    app.add_middleware(
        SessionMiddleware,
        secret_key=session_key.hexdigest(),
        session_cookie=SESSION_COOKIE,
        max_age=settings.page_session_secs,
        same_site="lax",
        https_only=settings.page_url.startswith("https://"),
    )
    app.include_router(_router(service, oauth, settings.oidc_username_claim))
    app.mount("/page/static", StaticFiles(directory=STATIC), name="page-static")
