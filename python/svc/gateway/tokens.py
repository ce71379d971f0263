"""Agent tokens at the gateway: who is calling, from ``Authorization: Bearer <JWT>``.

docs/gateway.md#agent-tokens has the rules; they come from docs/architecture.md ("Agent
tokens", "Trusted app issuers"):

* A token is a JWT (RFC 7519) signed with RS256 or ES256 (RFC 7518 section 3.1; ``none``,
  HS* and anything else refused before a key is looked up, so an RSA public key can never be
  used as an HMAC secret) by a key of its issuer's JWK Set (RFC 7517), fetched over ``https://``
  (``svc.common.auth.JwksSource``: pyjwt's ``PyJWKClient``, cached, fetched again on an unknown
  ``kid`` at most every 30 s). ``iss``, ``aud``, ``exp`` and ``sub`` are required.
* Its issuer is a **trusted app** (``TrustedApps``: the context service's
  ``/v1/directory/trusted-apps``, or a file), whose ``aud`` it must name, or the install's
  **identity provider** (``person_issuer``).
* A trusted app's token with ``act`` is a token exchange result (RFC 8693 section 4.1):
  ``act.sub`` is the agent (``ServiceAccount``), ``sub`` the person it acts for (``Human``,
  ``on_behalf_of``). Without ``act`` it is the agent's own client-credentials token (RFC 6749
  section 4.4) and ``sub`` is the agent. The agent's id must start with ``<app name>.``: a token
  for another app's agent, or for a person alone, is refused.
* The identity provider's token makes the caller that person (``human_present`` true).
* ``svc_human_present`` (boolean) and ``svc_work_item_id`` (string) become the decision
  request's ``human_present`` and ``work_item_id`` (docs/api.md).

Every refusal is a ``TokenError``, answered 401 with ``WWW-Authenticate: Bearer
error="invalid_token"`` (RFC 6750 section 3.1). Tokens are never logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from svc.common.auth import JwksSource, decode_verified, read_unverified
from svc.common.auth_settings import AuthConfigError
from svc.gateway.settings import GatewaySettings

__all__ = [
    "HUMAN",
    "SERVICE_ACCOUNT",
    "AgentIdentity",
    "AgentTokenVerifier",
    "TokenError",
    "TrustedApp",
    "TrustedApps",
    "parse_trusted_apps",
]

log = logging.getLogger("svc.gateway.tokens")

HUMAN = "Human"
SERVICE_ACCOUNT = "ServiceAccount"
_MAX_QUOTED = 128


def _q(value: object) -> str:
    """A claim value quoted for an error text: at most 128 characters, escaped."""
    return str(value)[:_MAX_QUOTED].encode("unicode_escape").decode("ascii")


class TokenError(Exception):
    """A refused agent token: the gateway answers 401 ``invalid_token`` with ``detail``.

    Args:
        detail: what was wrong, for the problem's ``detail`` (never the token itself).
        missing: True when no bearer token was sent (RFC 6750 section 3.1: no error code then).

    """

    def __init__(self, detail: str, missing: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.missing = missing

    def www_authenticate(self) -> str:
        """The ``WWW-Authenticate`` value of the 401 (RFC 6750 section 3)."""
        if self.missing:
            return 'Bearer realm="svc-gateway"'
        return 'Bearer realm="svc-gateway", error="invalid_token"'


@dataclass(frozen=True)
class TrustedApp:
    """An app trusted to sign agent tokens (docs/context.md, the directory's trusted apps).

    Attributes:
        name: the app's name; its agents' ids start with ``<name>.``.
        iss: the ``iss`` of its tokens.
        jwks_url: its JWK Set, ``https://`` only.
        aud: the ``aud`` its tokens must name.

    """

    name: str
    iss: str
    jwks_url: str
    aud: str


def parse_trusted_apps(raw: Any) -> list[TrustedApp]:
    """Trusted apps from a JSON value.

    Args:
        raw: a list, or ``{"trusted_apps": [...]}`` (the context service's answer), of
            ``{"name", "iss", "jwks_url", "aud"}``.

    Returns:
        The apps; an entry whose JWKS is not ``https://`` or that lacks a field is skipped and
        logged (nobody is trusted by a malformed entry).

    Raises:
        ValueError: the value is neither shape.

    """
    items = raw.get("trusted_apps") if isinstance(raw, Mapping) else raw
    if not isinstance(items, list):
        raise ValueError('expected a list of trusted apps or {"trusted_apps": [...]}')
    apps = []
    for item in items:
        fields = {
            k: item.get(k) if isinstance(item, Mapping) else None
            for k in ("name", "iss", "jwks_url", "aud")
        }
        if not all(isinstance(v, str) and v for v in fields.values()):
            log.error("trusted app skipped: it lacks one of name, iss, jwks_url, aud: %r", item)
            continue
        if urlparse(str(fields["jwks_url"])).scheme != "https":
            log.error("trusted app %s skipped: its JWKS is not https://", fields["name"])
            continue
        apps.append(TrustedApp(**fields))  # type: ignore[arg-type]
    return apps


class TrustedApps:
    """The trusted apps in force, replaced whole by whoever reads them (``svc.gateway.service``).

    Readers see one list or the next, never a mix. ``loaded`` is False until the first list is
    in: until then every app's token is refused (a person's own token still verifies).
    """

    def __init__(self, apps: list[TrustedApp] | None = None) -> None:
        self._by_iss: dict[str, TrustedApp] = {}
        self.loaded = False
        if apps is not None:
            self.replace(apps)

    def replace(self, apps: list[TrustedApp]) -> None:
        """Puts `apps` in force.

        One app per ``iss``: the first by name wins, the others are logged.
        """
        by_iss: dict[str, TrustedApp] = {}
        for app in sorted(apps, key=lambda a: a.name):
            if app.iss in by_iss:
                log.error(
                    "trusted apps %s and %s share iss %s; %s is used",
                    by_iss[app.iss].name,
                    app.name,
                    app.iss,
                    by_iss[app.iss].name,
                )
                continue
            by_iss[app.iss] = app
        if set(by_iss.values()) != set(self._by_iss.values()):
            log.info(
                "trusted apps: %s", ", ".join(sorted(a.name for a in by_iss.values())) or "none"
            )
        self._by_iss = by_iss
        self.loaded = True

    def by_iss(self, iss: str) -> TrustedApp | None:
        """The app whose tokens carry `iss`, or None."""
        return self._by_iss.get(iss)

    def by_name(self, name: str) -> TrustedApp | None:
        """The app called `name`, or None (it is not trusted, or no longer)."""
        return next((a for a in self._by_iss.values() if a.name == name), None)

    def names(self) -> list[str]:
        """The trusted apps' names, sorted."""
        return sorted(a.name for a in self._by_iss.values())


@dataclass(frozen=True)
class AgentIdentity:
    """Who a verified token says is calling, as the decision request names it (docs/api.md).

    Attributes:
        principal: ``{"type", "id"}``: the agent (``ServiceAccount``) or the person (``Human``).
        on_behalf_of: the person a token exchange result acts for, else None.
        human_present: ``svc_human_present``; None when the token does not say (a person's own
            token: True).
        work_item_id: ``svc_work_item_id``, or None.
        issuer: the trusted app's name, or ``person`` for the identity provider's tokens.
        expires_at: the token's ``exp`` (Unix seconds).

    """

    principal: dict[str, str]
    on_behalf_of: dict[str, str] | None
    human_present: bool | None
    work_item_id: str | None
    issuer: str
    expires_at: float

    def request_fields(self) -> dict[str, Any]:
        """The decision request's identity fields (docs/api.md).

        ``principal`` and, when set, ``on_behalf_of``, ``human_present``, ``work_item_id``.
        """
        out: dict[str, Any] = {"principal": dict(self.principal)}
        if self.on_behalf_of is not None:
            out["on_behalf_of"] = dict(self.on_behalf_of)
        if self.human_present is not None:
            out["human_present"] = self.human_present
        if self.work_item_id is not None:
            out["work_item_id"] = self.work_item_id
        return out

    def key(self) -> tuple[str, str, str, str]:
        """``(principal type, id, on_behalf_of type, id)``: whose challenge waits these are."""
        obo = self.on_behalf_of or {"type": "", "id": ""}
        return (self.principal["type"], self.principal["id"], obo["type"], obo["id"])


class AgentTokenVerifier:
    """Verifies agent tokens against the trusted apps and the identity provider (module docs).

    ``verify`` may fetch a JWKS (blocking, at most ``10 s``): call it from a worker thread. A
    verified token is kept (``token_cache_entries``, at most ``token_cache_secs`` and never past
    its ``exp``), and a kept token of an app that is no longer trusted is refused at once.

    Args:
        settings: the gateway's settings (``person_*``, ``jwks_*``, ``leeway_secs``,
            ``token_cache_*``).
        apps: the trusted apps in force.

    Raises:
        AuthConfigError: ``person_jwks_url`` is not ``https://`` or ``jwks_ca_file`` cannot be
            read.

    """

    def __init__(self, settings: GatewaySettings, apps: TrustedApps) -> None:
        self.settings = settings
        self.apps = apps
        self._ca = Path(settings.jwks_ca_file) if settings.jwks_ca_file else None
        self._sources: dict[str, JwksSource] = {}
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[AgentIdentity, float]] = OrderedDict()
        if settings.person_jwks_url is not None:
            self._source(settings.person_jwks_url)

    def _source(self, url: str) -> JwksSource:
        """The cached JWKS source of `url` (``https://`` only)."""
        with self._lock:
            src = self._sources.get(url)
            if src is None:
                if urlparse(url).scheme != "https":
                    raise AuthConfigError(f"a JWKS must be fetched over https://: `{url}`")
                src = JwksSource(url, self._ca, self.settings.jwks_refresh_secs)
                self._sources[url] = src
            return src

    def cached(self, token: str) -> AgentIdentity | None:
        """The identity of an already verified `token` still in the cache, else None.

        No I/O: safe on the event loop.
        """
        with self._lock:
            hit = self._cache.get(token)
            if hit is None:
                return None
            ident, until = hit
            if time.time() >= until or (
                ident.issuer != "person" and self.apps.by_name(ident.issuer) is None
            ):
                del self._cache[token]
                return None
            self._cache.move_to_end(token)
            return ident

    def verify(self, token: str) -> AgentIdentity:
        """Verifies `token` (module docs).

        Args:
            token: the bearer token (after ``Bearer ``).

        Returns:
            The caller's identity.

        Raises:
            TokenError: any rule is broken: not a JWT; ``alg`` not RS256/ES256; an issuer that
                is neither a trusted app nor the identity provider; no key for its ``kid``; a
                bad signature; expired or not yet valid; another ``aud``; a missing ``exp``,
                ``iss``, ``aud`` or ``sub``; an agent outside the app's ``<name>.`` prefix; an
                app's token for a person alone; a malformed ``act``, ``svc_human_present`` or
                ``svc_work_item_id``; the JWKS cannot be fetched.

        """
        hit = self.cached(token)
        if hit is not None:
            return hit
        alg, kid, iss = read_unverified(token, "agent", TokenError)
        s = self.settings
        app: TrustedApp | None = None
        if s.person_issuer is not None and iss == s.person_issuer:
            assert s.person_jwks_url is not None
            jwks_url, audience = s.person_jwks_url, s.person_audience
        else:
            app = self.apps.by_iss(iss)
            if app is None:
                raise TokenError(f"the token's issuer `{_q(iss)}` is not a trusted app")
            jwks_url, audience = app.jwks_url, app.aud
        try:
            key = self._source(jwks_url).key_for(kid, alg)
        except AuthConfigError as e:
            log.warning("agent token refused: %s", e)
            raise TokenError(f"the keys of issuer `{_q(iss)}` cannot be fetched now") from None
        if key is None:
            raise TokenError(f"no {alg} key with kid `{_q(kid)}` in the issuer's JWKS")
        claims = decode_verified(token, key.key, alg, audience, iss, s.leeway_secs, TokenError)
        ident = self._identity(claims, app)
        self._keep(token, ident)
        return ident

    def _identity(self, claims: dict[str, Any], app: TrustedApp | None) -> AgentIdentity:
        """The identity a verified token's claims give (module docs)."""
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise TokenError("the token's `sub` is not a non-empty string")
        present = claims.get("svc_human_present")
        if present is not None and not isinstance(present, bool):
            raise TokenError("`svc_human_present` is not a boolean")
        work = claims.get("svc_work_item_id")
        if work is not None and (not isinstance(work, str) or not work):
            raise TokenError("`svc_work_item_id` is not a non-empty string")
        act = claims.get("act")
        exp = float(claims["exp"])
        if app is None:
            if act is not None:
                raise TokenError(
                    "a token of the identity provider names the person alone; agents acting for "
                    "a person use a trusted app's token exchange result (`act`)"
                )
            return AgentIdentity(
                {"type": HUMAN, "id": sub},
                None,
                True if present is None else present,
                work,
                "person",
                exp,
            )
        prefix = f"{app.name}."
        if act is not None:
            agent = act.get("sub") if isinstance(act, Mapping) else None
            if not isinstance(agent, str) or not agent:
                raise TokenError("the token's `act` has no `sub` (RFC 8693 section 4.1)")
            if not agent.startswith(prefix) or len(agent) == len(prefix):
                raise TokenError(
                    f"app `{app.name}` may sign only for service accounts `{prefix}*`, not "
                    f"`{_q(agent)}`"
                )
            if sub.startswith(prefix):
                raise TokenError("a token exchange result names the person in `sub`, not an agent")
            return AgentIdentity(
                {"type": SERVICE_ACCOUNT, "id": agent},
                {"type": HUMAN, "id": sub},
                present,
                work,
                app.name,
                exp,
            )
        if not sub.startswith(prefix) or len(sub) == len(prefix):
            raise TokenError(
                f"app `{app.name}` may sign only for its service accounts `{prefix}*` (acting "
                f"for a person in `act`), not for `{_q(sub)}` alone"
            )
        return AgentIdentity(
            {"type": SERVICE_ACCOUNT, "id": sub}, None, present, work, app.name, exp
        )

    def _keep(self, token: str, ident: AgentIdentity) -> None:
        s = self.settings
        if s.token_cache_entries == 0 or s.token_cache_secs == 0:
            return
        until = min(ident.expires_at + s.leeway_secs, time.time() + s.token_cache_secs)
        with self._lock:
            self._cache[token] = (ident, until)
            self._cache.move_to_end(token)
            while len(self._cache) > s.token_cache_entries:
                self._cache.popitem(last=False)
