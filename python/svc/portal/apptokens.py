"""The trusted apps' own tokens, as the agents API takes them (docs/portal.md#agents-api).

docs/architecture.md ("Trusted app issuers") has the rules: an app trusted by an admin (the
context service's ``/v1/directory/trusted-apps``: name, ``iss``, JWKS URL, ``aud``) registers
its agents under a token it signs itself with ``sub`` equal to its name. So a token is admitted
only when

* it is a JWT (RFC 7519) signed with RS256 or ES256 (RFC 7518 section 3.1); ``none``, HS* and
  anything else are refused before a key is looked up, so a public key never serves as an
  HMAC secret;
* its ``iss`` is a trusted app's, its key is in that app's JWK Set (RFC 7517) fetched over
  ``https://`` only (``svc.common.auth.JwksSource``: pyjwt's ``PyJWKClient``, cached, fetched
  again on an unknown ``kid`` at most every 30 s), and its signature verifies;
* it names the app's ``aud``, has not expired (``exp``, ``nbf`` with ``leeway_secs``), and
  carries ``exp``, ``iss``, ``aud`` and ``sub``;
* ``sub`` is the app's own name and there is no ``act``: an agent's token (``sub`` an agent, or
  a token exchange result naming a person) is not the app's.

The same library and the same pieces as the MCP gateway's agent tokens (``svc.gateway.tokens``:
``TrustedApp``, ``TrustedApps``, ``parse_trusted_apps``; docs/gateway.md#agent-tokens). The
trusted apps are read again from the context service every ``trust_refresh_secs`` (at most
10 s), so a newly trusted or removed app applies within about ten seconds. Tokens are never
logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from svc.common.auth import JwksSource, decode_verified, read_unverified
from svc.common.auth_settings import AuthConfigError
from svc.gateway.tokens import TrustedApp, TrustedApps, parse_trusted_apps

__all__ = ["AppTokenError", "AppTokenVerifier", "TrustedApp"]

log = logging.getLogger("svc.portal.apptokens")

_MAX_QUOTED = 128


def _q(value: object) -> str:
    """A claim value quoted for an error text: at most 128 characters, escaped."""
    return str(value)[:_MAX_QUOTED].encode("unicode_escape").decode("ascii")


class AppTokenError(Exception):
    """A refused app token: answered 401 ``unauthenticated`` with ``detail``.

    Args:
        detail: what was wrong (never the token itself).
        missing: True when no bearer token was sent (RFC 6750 section 3.1: no error code then).

    """

    def __init__(self, detail: str, missing: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.missing = missing

    def www_authenticate(self, realm: str = "svc-portal") -> str:
        """The ``WWW-Authenticate`` value of the 401 (RFC 6750 section 3)."""
        if self.missing:
            return f'Bearer realm="{realm}"'
        return f'Bearer realm="{realm}", error="invalid_token"'


class TrustedAppsUnavailable(Exception):
    """The trusted apps were never read: the context service has not answered yet."""


class AppTokenVerifier:
    """Verifies trusted apps' own tokens (module docs).

    ``verify`` may fetch the trusted apps or a JWKS (blocking, at most ~10 s each): call it
    from a worker thread.

    Args:
        fetch_apps: returns the context service's trusted apps as JSON (a list, or
            ``{"trusted_apps": [...]}``); raises on failure (the apps in force stay).
        refresh_secs: how often the apps are read again (at most 10 s).
        ca_file: PEM CA bundle of the JWKS servers (None: the system's).
        jwks_refresh_secs: how long a JWKS is used before it is fetched again.
        leeway_secs: clock skew allowed on ``exp`` and ``nbf``.

    """

    def __init__(
        self,
        fetch_apps: Callable[[], Any],
        refresh_secs: float = 5.0,
        ca_file: str | None = None,
        jwks_refresh_secs: float = 300.0,
        leeway_secs: int = 30,
    ) -> None:
        self._fetch = fetch_apps
        self.refresh_secs = refresh_secs
        self.apps = TrustedApps()
        self._read_at = float("-inf")
        self._ca = Path(ca_file) if ca_file else None
        self._jwks_refresh = jwks_refresh_secs
        self._leeway = leeway_secs
        self._lock = threading.Lock()
        self._sources: dict[str, JwksSource] = {}

    def refresh(self, force: bool = False) -> None:
        """Reads the trusted apps again when ``refresh_secs`` have passed (or when forced).

        Raises:
            TrustedAppsUnavailable: the read failed and no list was ever read.

        """
        with self._lock:
            now = time.monotonic()
            if not force and now - self._read_at < self.refresh_secs:
                return
            try:
                apps = parse_trusted_apps(self._fetch())
            except Exception as e:  # any failure of the read keeps the list in force
                log.warning("the trusted apps cannot be read now: %s", e)
                if not self.apps.loaded:
                    raise TrustedAppsUnavailable(str(e)) from None
                return
            self.apps.replace(apps)
            self._read_at = now

    def _source(self, url: str) -> JwksSource:
        with self._lock:
            src = self._sources.get(url)
            if src is None:
                if urlparse(url).scheme != "https":
                    raise AuthConfigError(f"a JWKS must be fetched over https://: `{url}`")
                src = JwksSource(url, self._ca, self._jwks_refresh)
                self._sources[url] = src
            return src

    def verify(self, token: str) -> TrustedApp:
        """Verifies an app's own token (module docs).

        Args:
            token: the bearer token (after ``Bearer ``).

        Returns:
            The app the token is from.

        Raises:
            AppTokenError: not a JWT; ``alg`` not RS256/ES256; an issuer that is no trusted
                app; no key for its ``kid``; a bad signature; expired or not yet valid;
                another ``aud``; a missing ``exp``, ``iss``, ``aud`` or ``sub``; ``sub`` not
                the app's name; an ``act`` claim; the app's JWKS cannot be fetched.
            TrustedAppsUnavailable: the trusted apps were never read.

        """
        alg, kid, iss = read_unverified(token, "app", AppTokenError)
        self.refresh()
        app = self.apps.by_iss(iss)
        if app is None:
            raise AppTokenError(f"the token's issuer `{_q(iss)}` is not a trusted app")
        try:
            key = self._source(app.jwks_url).key_for(kid, alg)
        except AuthConfigError as e:
            log.warning("app token of %s refused: %s", app.name, e)
            raise AppTokenError(f"the keys of app `{app.name}` cannot be fetched now") from None
        if key is None:
            raise AppTokenError(f"no {alg} key with kid `{_q(kid)}` in app `{app.name}`'s JWKS")
        claims = decode_verified(token, key.key, alg, app.aud, iss, self._leeway, AppTokenError)
        if "act" in claims:
            raise AppTokenError(
                "the agents API takes the app's own token; this one acts for someone (`act`)"
            )
        sub = claims.get("sub")
        if sub != app.name:
            raise AppTokenError(
                f"the token's `sub` is `{_q(sub)}`, not the app's name `{app.name}`: the agents "
                "API takes the app's own token, not an agent's or a person's"
            )
        return app
