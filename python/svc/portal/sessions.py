"""People's sessions: OpenID Connect sign-in, the session cookie, CSRF (docs/portal.md#sign-in).

* **Sign-in** is the authorization code flow with PKCE (RFC 7636, ``S256``) at the install's
  OpenID Connect provider, through Authlib's Starlette client, as the challenge page does
  (``svc.challenge.page``): ``state`` is checked on the callback, the ID token's signature (the
  provider's JWKS), issuer, audience and ``nonce`` too (OpenID Connect Core 1.0, sections 3.1.2
  and 3.1.3.7). The flow's own state (``state``, ``nonce``, the code verifier) lives in a short
  signed cookie of its own (``svc_portal_login``, Starlette's ``SessionMiddleware``, 10 minutes).
* **The session** is held by the portal (``SessionStore``): a random id (256 bits) mapped to the
  user name, a CSRF token and an expiry. The cookie ``svc_portal_session`` carries only the id,
  signed with the session key (itsdangerous, HMAC-SHA256): ``HttpOnly``, ``SameSite=Lax``,
  ``Secure`` when the portal's public URL is ``https://``, ``Path=/``, ``Max-Age`` the session's
  length. **Signing out revokes the session server-side**: a copy of the cookie is worth nothing
  afterwards. Sessions live in the process: a restart signs everyone out, and replicas need
  sticky sessions (or one replica).
* **CSRF**: every state-changing request (``POST /graphql``, ``POST /auth/logout``) must carry
  the session's CSRF token in ``X-CSRF-Token`` (from ``GET /api/v1/me``), compared in constant
  time, and an ``Origin`` header, when sent, must be the portal's own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer

from svc.common.auth import write_secret

__all__ = ["COOKIE", "LOGIN_COOKIE", "Session", "SessionStore", "load_session_key"]

log = logging.getLogger("svc.portal.sessions")

#: The session cookie (the signed session id).
COOKIE = "svc_portal_session"
#: The sign-in flow's cookie (Authlib's state, nonce and code verifier).
LOGIN_COOKIE = "svc_portal_login"


def load_session_key(path: str | None) -> bytes:
    """The key that signs session cookies.

    Args:
        path: a file holding it (base64url); made with 32 random bytes (mode 0600) when
            missing, so every replica reading the same file accepts the same cookies. None: a
            key made in memory (sessions end with the process anyway).

    Returns:
        The key's bytes (at least 32).

    Raises:
        OSError: the file cannot be read or written.
        ValueError: the file holds fewer than 32 bytes of key.

    """
    if path is None:
        return secrets.token_bytes(32)
    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        write_secret(p, base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("="))
    text = p.read_text(encoding="utf-8").strip()
    key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(key) < 32:
        raise ValueError(f"the session key in {path} is shorter than 32 bytes")
    return key


@dataclass(frozen=True)
class Session:
    """A signed-in person's session.

    Attributes:
        sid: the session id (random, 256 bits, base64url).
        user: the user name (the ID token's username claim): ``Human::"<user>"``.
        csrf: the CSRF token state-changing requests carry in ``X-CSRF-Token``.
        created_at: Unix seconds.
        expires_at: Unix seconds.

    """

    sid: str
    user: str
    csrf: str
    created_at: float
    expires_at: float

    def csrf_ok(self, token: str | None) -> bool:
        """Whether `token` is this session's CSRF token (constant-time comparison)."""
        return bool(token) and hmac.compare_digest(str(token), self.csrf)


class SessionStore:
    """The live sessions, in this process (module docs); thread-safe.

    Args:
        key: the cookie signing key (``load_session_key``).
        ttl_secs: a session's length.
        max_sessions: most live sessions; past it the oldest is signed out.

    """

    def __init__(self, key: bytes, ttl_secs: int, max_sessions: int) -> None:
        self._key = key
        self._signer = URLSafeTimedSerializer(key, salt="svc-portal-session")
        self.ttl_secs = ttl_secs
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def derived_key(self, label: str) -> str:
        """A key for another purpose derived from the session key: hex HMAC-SHA256 of `label`."""
        return hmac.new(self._key, label.encode(), hashlib.sha256).hexdigest()

    def create(self, user: str) -> tuple[Session, str]:
        """Opens a session for `user`.

        Returns:
            ``(session, cookie value)``: the value is the signed session id.

        """
        now = time.time()
        s = Session(
            secrets.token_urlsafe(32), user, secrets.token_urlsafe(32), now, now + self.ttl_secs
        )
        with self._lock:
            self._sessions[s.sid] = s
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return s, self._signer.dumps(s.sid)

    def get(self, cookie: str | None) -> Session | None:
        """The live session a cookie value names.

        Returns:
            The session, or None for a value that is unsigned, tampered or too old, or a
            session that expired, was signed out or is unknown to this process.

        """
        if not cookie:
            return None
        try:
            sid = self._signer.loads(cookie, max_age=self.ttl_secs)
        except BadSignature:
            return None
        if not isinstance(sid, str):
            return None
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return None
            if time.time() >= s.expires_at:
                del self._sessions[sid]
                return None
            return s

    def revoke(self, sid: str) -> bool:
        """Signs a session out; False when it was not live."""
        with self._lock:
            return self._sessions.pop(sid, None) is not None

    def __len__(self) -> int:
        """The number of sessions held (expired ones included until they are next read)."""
        with self._lock:
            return len(self._sessions)
