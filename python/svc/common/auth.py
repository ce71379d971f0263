"""Who may call a component: bearer-token settings, verification and the local issuer.

Every svc API other than ``/healthz``, ``/readyz``, ``/version`` and ``/metrics`` takes
``Authorization: Bearer <JWT>`` (RFC 6750 section 2.1): a JWT (RFC 7519) signed with RS256 or
ES256 by a key of the configured issuer's JWKS (RFC 7517), whose ``iss`` is that issuer, whose
``aud`` names the component (``svc-pdp``, ``svc-history``), which has not expired, and whose
``sub`` is one of the callers the component's settings list, each with its role; each method
admits only the roles ``svc.common.roles.METHODS`` lists for it. docs/auth.md has the callers
table, the method matrix, every setting and the answers; the intake keeps its own token
(docs/intake.md).

This module holds what the Python side of every component shares:

* ``AuthSettings`` (and ``PdpAuthSettings``, ``HistoryAuthSettings``, ``PolicyAuthSettings``):
  the settings, read from ``SVC_<COMPONENT>_AUTH*`` environment variables or given as keyword
  arguments (defined in ``svc.common.auth_settings``, which loads none of the libraries below,
  and re-exported);
* ``JwksSource``: the issuer's keys from an ``https://`` URL (pyjwt's ``PyJWKClient``, with an
  optional CA file) or a ``file://`` path, refreshed for key rotation;
* ``Verifier``: pyjwt verification (RS256/ES256 only; ``exp``, ``iss``, ``aud``, ``sub``
  required), the caller check and the caller's role (``verify``), the method check
  (``authorize``) and the person the portal acts for (``acting_for``), raising ``AuthError``
  (401 or 403);
* ``bearer_dependency``: the FastAPI dependency (``HTTPBearer``) the Python services put on
  their routes: it finds the route's method in the matrix itself;
* ``current_caller`` and ``author_of``: the verified caller of the request being served (a
  context variable the dependency and ``svc.common.connect.BearerInterceptor`` set), and the
  author a change is recorded under: the caller, never a request field;
* ``LocalIssuer``: the issuer ``svc up`` runs, an ES256 key kept in ``<data dir>/issuer/`` with
  its JWKS beside it, which mints caller tokens.

The decision point's listener is Rust and verifies tokens itself (``crates/pdp_server/src/
auth.rs``), with the same rules and texts; ``svc.pdp.server`` loads its JWKS through
``JwksSource`` and hands it over. Tokens are never logged.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import anyio.to_thread
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from svc.common.auth_settings import (
    AuthConfigError,
    AuthSettings,
    HistoryAuthSettings,
    PdpAuthSettings,
    PolicyAuthSettings,
    is_loopback,
)
from svc.common.component import Role
from svc.common.problems import Problem
from svc.common.roles import allowed

__all__ = [
    "ACCEPTED_ALGORITHMS",
    "LOCAL_ISSUER",
    "PERSON_HEADER",
    "REQUIRED_CLAIMS",
    "AuthConfigError",
    "AuthError",
    "AuthSettings",
    "Caller",
    "HistoryAuthSettings",
    "JwksSource",
    "LocalIssuer",
    "PdpAuthSettings",
    "PolicyAuthSettings",
    "Verifier",
    "author_of",
    "bearer_dependency",
    "current_caller",
    "decode_verified",
    "es256_public_jwk",
    "is_loopback",
    "person_of",
    "read_unverified",
    "remember_verified",
    "set_current_caller",
    "write_secret",
]

log = logging.getLogger("svc.auth")

#: The only signature algorithms accepted (RFC 7518 section 3.1: RS256 and ES256).
ACCEPTED_ALGORITHMS = ("RS256", "ES256")

#: Claims every token must carry (RFC 7519 section 4.1).
REQUIRED_CLAIMS = ("exp", "iss", "aud", "sub")

#: ``iss`` of the tokens ``LocalIssuer`` mints (``svc up``'s issuer).
LOCAL_ISSUER = "urn:svc:local-issuer"

#: Seconds between two forced JWKS refreshes for an unknown ``kid`` (a token naming a key the
#: issuer rotated in); bounds what a flood of made-up ``kid`` values can cost.
UNKNOWN_KID_COOLDOWN_SECS = 30.0

#: Longest ``kid`` quoted back in an error.
_MAX_KID_QUOTED = 64

#: The header (gRPC: metadata entry) naming the person the portal acts for (docs/auth.md,
#: "Who made a change"), percent-encoded UTF-8 (RFC 3986 section 2.1); believed only from a
#: caller with the portal role.
PERSON_HEADER = "svc-acting-for"

#: Longest person name ``PERSON_HEADER`` may carry.
MAX_PERSON_CHARS = 256

MISSING_TOKEN = (
    "no bearer token: send `Authorization: Bearer <JWT>` (gRPC: the `authorization` metadata "
    "entry); see docs/auth.md"
)


@dataclass(frozen=True)
class AuthError(Exception):
    """A refused request.

    Attributes:
        status: 401 (no token, or a token that does not verify) or 403 (a valid token whose
            ``sub`` is not an allowed caller).
        detail: what was wrong, for the problem's ``detail`` (never the token itself).
        missing: True when no bearer token was sent (RFC 6750 section 3.1: no error code then).

    """

    status: int
    detail: str
    missing: bool = False

    def __str__(self) -> str:
        """``<status>: <detail>``."""
        return f"{self.status}: {self.detail}"

    def www_authenticate(self, realm: str) -> str | None:
        """The ``WWW-Authenticate`` challenge of a 401 (RFC 6750 section 3), else None."""
        if self.status != 401:
            return None
        if self.missing:
            return f'Bearer realm="{realm}"'
        return f'Bearer realm="{realm}", error="invalid_token"'


@dataclass(frozen=True)
class Caller:
    """A verified caller.

    Attributes:
        sub: the token's ``sub`` (an allowed caller).
        claims: every claim of the token.
        role: the caller's role (``Role``; the component's ``auth_roles`` setting).
        person: the person the portal acts for (``PERSON_HEADER``), or None.

    """

    sub: str
    claims: dict[str, Any]
    role: str = Role.OPERATOR
    person: str | None = None

    @property
    def author(self) -> str:
        """Who a change is recorded under: ``sub``, or ``<person> via <sub>`` for the portal."""
        return f"{self.person} via {self.sub}" if self.person else self.sub


_CURRENT: ContextVar[Caller | None] = ContextVar("svc_caller", default=None)


def current_caller() -> Caller | None:
    """The verified caller of the request being served; None when auth is off."""
    return _CURRENT.get()


def set_current_caller(caller: Caller | None) -> None:
    """Makes `caller` the request's caller (``bearer_dependency``, ``BearerInterceptor``)."""
    _CURRENT.set(caller)


#: The token this request's guard (``svc.common.limits.bearer_guard``) verified, and its caller.
_VERIFIED: ContextVar[tuple[Verifier, str, Caller] | None] = ContextVar(
    "svc_verified", default=None
)


def remember_verified(verifier: Verifier, token: str, caller: Caller) -> None:
    """Records that `verifier` verified `token` as `caller` in this request (the guard).

    ``bearer_dependency`` on the same verifier then takes the caller without verifying the same
    token a second time (a signature check costs about 0.25 ms). The record lives in the
    request's context only (a ``ContextVar`` set by the guard's task).
    """
    _VERIFIED.set((verifier, token, caller))


def _verified(verifier: Verifier, token: str) -> Caller | None:
    """The caller `verifier` verified `token` as earlier in this request, or None."""
    got = _VERIFIED.get()
    return got[2] if got is not None and got[0] is verifier and got[1] == token else None


def person_of(requested: str) -> str:
    """The person a request acts as: the one the portal acts for, else `requested`.

    For methods a person takes part in (a challenge's justification or approval): when the
    portal names the person it acts for (``PERSON_HEADER``), that person answers, whatever
    the request's own field says; the admin's command line names the person in the request.
    """
    caller = _CURRENT.get()
    return caller.person if caller is not None and caller.person else requested


def author_of(requested: str = "") -> str:
    """The author a change of the request being served is recorded under.

    Args:
        requested: the author the request names (a field such as ``author``), used only when
            auth is off (a loopback bind, where no caller is known).

    Returns:
        The verified caller's ``Caller.author`` (``svc-local``, ``alice via
        system:serviceaccount:svc:svc-portal``); with auth off, `requested`.

    """
    caller = _CURRENT.get()
    return caller.author if caller is not None else requested


def _ssl_context(ca_file: Path | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as e:
        raise AuthConfigError(f"cannot read the JWKS CA file {ca_file}: {e}") from e


class JwksSource:
    """The issuer's JWK Set (RFC 7517 section 5), from an ``https://`` URL or a ``file://`` path.

    Args:
        url: ``https://host/path`` (fetched with pyjwt's ``PyJWKClient``; redirects are not
            followed) or ``file:///abs/path``.
        ca_file: PEM CA bundle for the https server (default: the system's).
        refresh_secs: how long a loaded set is used before it is loaded again.

    Raises:
        AuthConfigError: another scheme, or an unreadable CA file.

    """

    def __init__(self, url: str, ca_file: Path | None = None, refresh_secs: float = 300.0) -> None:
        parsed = urlparse(url)
        self.url = url
        self.refresh_secs = refresh_secs
        self._lock = threading.Lock()
        self._keys: jwt.PyJWKSet | None = None
        self._loaded_at = 0.0
        self._forced_at = 0.0
        self._client: jwt.PyJWKClient | None = None
        self._path: Path | None = None
        if parsed.scheme == "https":
            self._client = jwt.PyJWKClient(
                url,
                cache_jwk_set=False,
                timeout=10,
                ssl_context=_ssl_context(ca_file),
                headers={"accept": "application/json"},
            )
        elif parsed.scheme == "file":
            self._path = Path(unquote(parsed.path))
        else:
            raise AuthConfigError(f"the JWKS must be an https:// URL or a file:// path: `{url}`")

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> JwksSource:
        """The source `settings` name (``auth_jwks``, ``auth_jwks_ca_file``, refresh).

        Raises:
            AuthConfigError: auth is off, or as the constructor.

        """
        if not settings.enabled or settings.auth_jwks is None:
            raise AuthConfigError(f"{settings.component}: auth is off; there is no JWKS")
        return cls(settings.auth_jwks, settings.auth_jwks_ca_file, settings.auth_jwks_refresh_secs)

    def document(self) -> dict[str, Any]:
        """Loads the JWK Set now.

        Returns:
            The JWK Set document (``{"keys": [...]}``).

        Raises:
            AuthConfigError: the file cannot be read, the URL cannot be fetched, or the answer
                is not a JSON object with a ``keys`` list.

        """
        try:
            if self._client is not None:
                doc = self._client.fetch_data()
            else:
                assert self._path is not None
                doc = json.loads(self._path.read_text(encoding="utf-8"))
        except (OSError, ValueError, jwt.PyJWKClientError) as e:
            raise AuthConfigError(f"cannot load the JWKS from {self.url}: {e}") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise AuthConfigError(f"the JWKS at {self.url} is not a JWK Set (no `keys` list)")
        return doc

    def keys(self, refresh: bool = False) -> jwt.PyJWKSet:
        """The parsed key set, loaded again once ``refresh_secs`` have passed (or when asked).

        Raises:
            AuthConfigError: loading failed and no set was loaded before (a failed reload keeps
                the previous set and is logged).

        """
        with self._lock:
            now = time.monotonic()
            stale = self._keys is None or now - self._loaded_at >= self.refresh_secs
            if stale or refresh:
                try:
                    self._keys = jwt.PyJWKSet.from_dict(self.document())
                    self._loaded_at = now
                except (AuthConfigError, jwt.PyJWTError) as e:
                    if self._keys is None:
                        raise AuthConfigError(
                            f"no usable key in the JWKS at {self.url}: {e}"
                        ) from e
                    log.warning("JWKS reload failed, the previous keys stay: %s", e)
                    self._loaded_at = now
            assert self._keys is not None
            return self._keys

    def key_for(self, kid: str | None, alg: str) -> jwt.PyJWK | None:
        """The signing key for a token's ``kid`` and ``alg``.

        An unknown ``kid`` reloads the set once (at most every 30 s), for a key the issuer has
        just rotated in. A token without ``kid`` gets the set's only key of that algorithm
        without a ``kid``, if there is exactly one.

        Returns:
            The key, or None when the set has none for this ``kid`` and algorithm.

        Raises:
            AuthConfigError: as ``keys``.

        """

        def find(keys: jwt.PyJWKSet) -> jwt.PyJWK | None:
            usable = [
                k for k in keys if k.public_key_use in (None, "sig") and k.algorithm_name == alg
            ]
            if kid is None:
                anonymous = [k for k in usable if k.key_id is None]
                return anonymous[0] if len(anonymous) == 1 else None
            return next((k for k in usable if k.key_id == kid), None)

        found = find(self.keys())
        if found is None and kid is not None:
            now = time.monotonic()
            if now - self._forced_at >= UNKNOWN_KID_COOLDOWN_SECS:
                self._forced_at = now
                found = find(self.keys(refresh=True))
        return found


def _quoted(text: str) -> str:
    return text[:_MAX_KID_QUOTED].encode("unicode_escape").decode("ascii")


def _quoted_sub(sub: str) -> str:
    return sub[:256].encode("unicode_escape").decode("ascii")


class Verifier:
    """Checks bearer tokens against one component's settings (module docs).

    Args:
        settings: the component's settings; auth must be on.
        source: where the keys come from (default: ``JwksSource.from_settings(settings)``).

    Raises:
        AuthConfigError: auth is off, or the JWKS source is unusable.

    """

    def __init__(self, settings: AuthSettings, source: JwksSource | None = None) -> None:
        if not settings.enabled:
            raise AuthConfigError(f"{settings.component}: auth is off; nothing to verify")
        self.settings = settings
        self.source = source or JwksSource.from_settings(settings)
        self.roles = settings.caller_roles
        self.callers = frozenset(self.roles)
        self.component = settings.component.removeprefix("svc-")
        legacy = sorted(set(settings.auth_callers) - set(settings.auth_roles))
        if legacy:
            log.warning(
                "%s: %s list%s caller%s without a role, which may call every method (role "
                "operator): %s; give each its role in %s (docs/auth.md)",
                settings.component,
                settings.env_name("auth_callers"),
                "s" if len(legacy) == 1 else "",
                "" if len(legacy) == 1 else "s",
                ", ".join(legacy[:20]),
                settings.env_name("auth_roles"),
            )

    def verify(self, token: str) -> Caller:
        """Verifies `token` and checks its caller.

        Args:
            token: the bearer token (the part after ``Bearer ``).

        Returns:
            The caller.

        Raises:
            AuthError: 401 for a token that is malformed, signed with another algorithm than
                RS256/ES256 (``none`` included), by a key the issuer's JWKS does not hold or
                with a bad signature, expired or not valid yet, of another issuer or audience,
                or without ``exp``/``iss``/``aud``/``sub``; 403 for a valid token whose ``sub``
                is not an allowed caller.
            AuthConfigError: the issuer's keys cannot be loaded.

        """
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthError(
                401,
                "the bearer token is not a JWT (RFC 7519: three base64url parts separated by dots)",
            ) from None
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise AuthError(401, "the token's header names no `alg`")
        if alg not in ACCEPTED_ALGORITHMS:
            raise AuthError(
                401,
                f"the token's algorithm `{_quoted(alg)}` is not accepted; tokens must be signed "
                "with RS256 or ES256",
            )
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthError(401, "the token's `kid` is not a string")
        key = self.source.key_for(kid, alg)
        if key is None:
            if kid is not None:
                raise AuthError(401, f"no key with kid `{_quoted(kid)}` in the issuer's JWKS")
            raise AuthError(
                401, f"the token names no `kid` and the issuer's JWKS has no {alg} key without one"
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=s.auth_audience,
                issuer=s.auth_issuer,
                leeway=s.auth_leeway_secs,
                options={"require": list(REQUIRED_CLAIMS)},
            )
        except jwt.InvalidSignatureError:
            raise AuthError(
                401, "the token's signature does not verify with the issuer's key"
            ) from None
        except jwt.ExpiredSignatureError:
            raise AuthError(401, "the token has expired (`exp`)") from None
        except jwt.ImmatureSignatureError:
            raise AuthError(401, "the token is not valid yet (`nbf`)") from None
        except jwt.InvalidIssuerError:
            raise AuthError(401, f"the token's issuer (`iss`) is not `{s.auth_issuer}`") from None
        except jwt.InvalidAudienceError:
            raise AuthError(
                401, f"the token's audience (`aud`) does not name `{s.auth_audience}`"
            ) from None
        except jwt.MissingRequiredClaimError as e:
            raise AuthError(
                401,
                f"the token has no `{e.claim}` claim (exp, iss, aud and sub are required)",
            ) from None
        except jwt.PyJWTError as e:
            raise AuthError(401, f"the bearer token does not verify: {e}") from None
        sub = claims.get("sub")
        if not isinstance(sub, str):
            raise AuthError(401, "the token's `sub` claim is not a string")
        if sub not in self.callers:
            raise AuthError(
                403,
                f"caller `{_quoted_sub(sub)}` is not allowed to call {s.auth_audience}; the "
                "allowed callers and their roles are a setting of this service "
                f"({s.env_name('auth_roles')}, docs/auth.md#roles-and-methods)",
            )
        return Caller(sub, claims, self.roles[sub])

    def authorize(self, caller: Caller, method: str) -> None:
        """Checks that `caller`'s role may call `method` (``svc.common.roles.METHODS``).

        Args:
            caller: a caller ``verify`` returned.
            method: ``"<METHOD> <path template>"`` or a gRPC method's name.

        Raises:
            AuthError: 403 naming the method, the role and the roles that may call it.

        """
        roles = allowed(self.component, method)
        if caller.role in roles:
            return
        who = ", ".join(sorted(roles)) or "none"
        raise AuthError(
            403,
            f"caller `{_quoted_sub(caller.sub)}` has the role `{caller.role}`, which may not call "
            f"`{method}` of {self.settings.auth_audience} (roles that may: {who}; "
            "docs/auth.md#roles-and-methods)",
        )

    def acting_for(self, caller: Caller, person: str | None) -> Caller:
        """`caller`, acting for `person` when the request names one (``PERSON_HEADER``).

        Only the portal acts for people: its token proves it is the portal, and the portal has
        signed the person in. A person named by any other caller is refused, not ignored.

        Args:
            caller: a caller ``verify`` returned.
            person: the header's value (percent-encoded UTF-8), or None when absent.

        Returns:
            `caller` with ``person`` set (or unchanged without a header).

        Raises:
            AuthError: 403 for a caller without the portal role; 401 for an empty, too long
                (over 256 characters) or non-printable name.

        """
        if person is None:
            return caller
        if caller.role != Role.PORTAL:
            raise AuthError(
                403,
                f"caller `{_quoted_sub(caller.sub)}` has the role `{caller.role}`; only the "
                f"portal may act for a person (`{PERSON_HEADER}`, docs/auth.md)",
            )
        name = unquote(person).strip()
        if not name or len(name) > MAX_PERSON_CHARS or not name.isprintable():
            raise AuthError(
                401,
                f"`{PERSON_HEADER}` must name a person: 1 to {MAX_PERSON_CHARS} printable "
                "characters",
            )
        return replace(caller, person=name)


#: Claims every app and agent token carries (RFC 7519 section 4.1).
REQUIRED_CLAIMS = ("exp", "iss", "aud", "sub")


def _claim_text(value: object) -> str:
    """A claim value quoted for an error text: at most 128 characters, escaped."""
    return str(value)[:128].encode("unicode_escape").decode("ascii")


def read_unverified(token: str, kind: str, error: type[Exception]) -> tuple[str, str | None, str]:
    """The ``alg``, ``kid`` and ``iss`` of a token before its signature is checked.

    What the gateway's agent tokens and the portal's app tokens share: the issuer names the
    JWK Set to verify against (RFC 7515 section 4.1, RFC 7519 section 4.1).

    Args:
        token: the bearer token.
        kind: who signs such tokens, in the error text (``agent``, ``app``).
        error: the exception class raised.

    Returns:
        ``(alg, kid, iss)``: ``alg`` one of ``ACCEPTED_ALGORITHMS``, ``kid`` a string or None.

    Raises:
        error: not a JWT; ``alg`` not RS256/ES256; ``kid`` not a string; no string ``iss``.

    """
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise error("the bearer token is not a JWT (RFC 7519)") from None
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in ACCEPTED_ALGORITHMS:
        raise error(
            f"the token's algorithm `{_claim_text(alg)}` is not accepted; {kind} tokens are "
            "signed with RS256 or ES256"
        )
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise error("the token's `kid` is not a string")
    iss = unverified.get("iss")
    if not isinstance(iss, str):
        raise error("the token has no `iss` claim (exp, iss, aud and sub are required)")
    return alg, kid, iss


def decode_verified(
    token: str,
    key: Any,
    alg: str,
    audience: str,
    issuer: str,
    leeway: float,
    error: type[Exception],
) -> dict[str, Any]:
    """The claims of `token` once its signature, times, issuer and audience verify (PyJWT).

    Args:
        token: the bearer token.
        key: the verification key from the issuer's JWK Set.
        alg: the token's algorithm (checked by ``read_unverified``).
        audience: the ``aud`` the token must name.
        issuer: the ``iss`` it must carry.
        leeway: seconds of clock skew allowed on ``exp`` and ``nbf``.
        error: the exception class raised.

    Returns:
        The claims; ``exp``, ``iss``, ``aud`` and ``sub`` are present.

    Raises:
        error: a bad signature, expired or not yet valid, another audience, a missing required
            claim, or any other PyJWT refusal (each named).

    """
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[alg],
            audience=audience,
            issuer=issuer,
            leeway=leeway,
            options={"require": list(REQUIRED_CLAIMS)},
        )
    except jwt.InvalidSignatureError:
        raise error("the token's signature does not verify") from None
    except jwt.ExpiredSignatureError:
        raise error("the token has expired (`exp`)") from None
    except jwt.ImmatureSignatureError:
        raise error("the token is not valid yet (`nbf`)") from None
    except jwt.InvalidAudienceError:
        raise error(
            f"the token's audience (`aud`) does not name `{_claim_text(audience)}`"
        ) from None
    except jwt.MissingRequiredClaimError as e:
        raise error(
            f"the token has no `{e.claim}` claim (exp, iss, aud and sub are required)"
        ) from None
    except jwt.PyJWTError as e:
        raise error(f"the token does not verify: {e}") from None
    return claims


def bearer_dependency(verifier: Verifier) -> Callable[..., Any]:
    """A FastAPI dependency that admits only the callers and roles `verifier` accepts.

    Put it on a route (``dependencies=[Depends(dep)]``) or take the ``Caller`` as a parameter.
    It verifies the token, finds the matched route's method (``"<METHOD> <path template>"``)
    in ``svc.common.roles.METHODS`` and checks the caller's role against it (a route the table
    does not list admits no one), reads ``PERSON_HEADER`` (the portal only), and makes the
    caller the request's ``current_caller``. Refusals raise ``svc.common.problems.Problem``:
    401 ``unauthenticated`` with ``WWW-Authenticate: Bearer`` (RFC 6750 section 3;
    ``error="invalid_token"`` when a token was sent), or 403 ``caller-not-allowed`` naming the
    method and the role; the app's problem handler answers them as RFC 9457 documents.

    Args:
        verifier: the component's verifier.

    Returns:
        The dependency (a coroutine function returning the ``Caller``).

    """
    scheme = HTTPBearer(auto_error=False, description="A JWT of an allowed caller (docs/auth.md)")
    realm = verifier.settings.auth_audience

    async def require_caller(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Depends(scheme),  # noqa: B008
    ) -> Caller:
        try:
            if credentials is None or not credentials.credentials.strip():
                raise AuthError(401, MISSING_TOKEN, missing=True)
            token = credentials.credentials.strip()
            caller = _verified(verifier, token)
            if caller is None:
                caller = await anyio.to_thread.run_sync(verifier.verify, token)
            route = request.scope.get("route")
            template = getattr(route, "path_format", request.url.path)
            method = "GET" if request.method == "HEAD" else request.method
            verifier.authorize(caller, f"{method} {template}")
            caller = verifier.acting_for(caller, request.headers.get(PERSON_HEADER))
        except AuthError as e:
            challenge = e.www_authenticate(realm)
            if e.status == 403:
                raise Problem(
                    403, "caller-not-allowed", "The caller is not allowed", e.detail
                ) from None
            raise Problem(
                401,
                "unauthenticated",
                "Authentication required",
                e.detail,
                headers={"WWW-Authenticate": challenge} if challenge else {},
            ) from None
        except AuthConfigError as e:
            log.error("cannot verify bearer tokens: %s", e)
            raise Problem(
                503,
                "auth-unavailable",
                "Authentication unavailable",
                "the issuer's keys cannot be loaded",
            ) from None
        set_current_caller(caller)
        return caller

    return require_caller


def write_secret(path: Path, text: str) -> None:
    """Writes `text` (plus a newline) to `path` with mode 0600, replacing it atomically.

    Raises:
        OSError: the file cannot be written.

    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def es256_public_jwk(key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    """The public JWK (RFC 7517, RFC 7518 section 6.2) of a P-256 signing key.

    Args:
        key: a private key on the P-256 curve.

    Returns:
        ``{"crv": "P-256", "kty": "EC", "x", "y", "kid", "use": "sig", "alg": "ES256"}``,
        ``kid`` the key's RFC 7638 thumbprint: base64url of SHA-256 over the required members,
        sorted, without whitespace.

    """
    numbers = key.public_key().public_numbers()
    jwk = {
        "crv": "P-256",
        "kty": "EC",
        "x": _b64(numbers.x.to_bytes(32, "big")),
        "y": _b64(numbers.y.to_bytes(32, "big")),
    }
    canonical = json.dumps(jwk, sort_keys=True, separators=(",", ":")).encode()
    return {**jwk, "kid": _b64(hashlib.sha256(canonical).digest()), "use": "sig", "alg": "ES256"}


class LocalIssuer:
    """``svc up``'s token issuer: an ES256 (P-256) key in `directory`, made on first use.

    `directory` (mode 0700) holds ``key.pem`` (the private key, PKCS #8, mode 0600; never
    leaves the machine) and ``jwks.json`` (its public JWK Set, RFC 7517, with the key's RFC 7638
    thumbprint as ``kid``), which the components read through ``file://``.

    Args:
        directory: where the key lives (``<data dir>/issuer``); created when missing.
        issuer: the ``iss`` of minted tokens.

    Raises:
        OSError: the directory or the key cannot be created or read.
        ValueError: ``key.pem`` is not a P-256 private key.

    """

    def __init__(self, directory: Path, issuer: str = LOCAL_ISSUER) -> None:
        self.directory = directory
        self.issuer = issuer
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)
        key_path = directory / "key.pem"
        if not key_path.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            try:
                fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(pem)
        loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey) or not isinstance(
            loaded.curve, ec.SECP256R1
        ):
            raise ValueError(f"{key_path} is not a P-256 private key")
        self._key = loaded
        jwk = es256_public_jwk(loaded)
        self.kid = jwk["kid"]
        self.jwks = {"keys": [jwk]}
        self.jwks_path = directory / "jwks.json"
        text = json.dumps(self.jwks, indent=2)
        if not self.jwks_path.exists() or self.jwks_path.read_text(encoding="utf-8") != text:
            tmp = self.jwks_path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.jwks_path)

    @property
    def jwks_url(self) -> str:
        """``file://`` URL of ``jwks.json`` (the ``auth_jwks`` setting)."""
        return self.jwks_path.resolve().as_uri()

    def mint(
        self,
        sub: str,
        audience: str | list[str],
        lifetime_secs: int,
        *,
        now: float | None = None,
        claims: dict[str, Any] | None = None,
    ) -> str:
        """A signed ES256 token.

        Args:
            sub: the caller (``svc-local``).
            audience: the component(s) it may call (``svc-pdp``, ``svc-history``).
            lifetime_secs: seconds until ``exp``.
            now: the issue time in Unix seconds (default: now).
            claims: more claims, laid over the standard ones.

        Returns:
            The compact JWT (RFC 7519 section 3).

        """
        t = int(time.time() if now is None else now)
        payload: dict[str, Any] = {
            "iss": self.issuer,
            "sub": sub,
            "aud": audience,
            "iat": t,
            "nbf": t,
            "exp": t + lifetime_secs,
            "jti": str(uuid.uuid4()),
            **(claims or {}),
        }
        return jwt.encode(payload, self._key, algorithm="ES256", headers={"kid": self.kid})
