"""Bearer-token settings of a component, apart from the verification (``svc.common.auth``).

``AuthSettings`` and its components' subclasses (``PdpAuthSettings``, ``HistoryAuthSettings``,
``PolicyAuthSettings``),
``AuthConfigError`` and ``is_loopback``: what the command line needs to make its ``--auth-*``
options and check them, without loading the JWT, cryptography and web libraries the
verification uses. ``svc.common.auth`` re-exports all of it; docs/auth.md lists the settings.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from svc.common.settings import ComponentSettings, list_setting

__all__ = [
    "AuthConfigError",
    "AuthSettings",
    "HistoryAuthSettings",
    "PdpAuthSettings",
    "PolicyAuthSettings",
    "is_loopback",
]


class AuthConfigError(ValueError):
    """The authentication settings cannot work (the message names the setting and the fix)."""


def is_loopback(host: str) -> bool:
    """Whether binding `host` listens on this machine only.

    Args:
        host: an address (``127.0.0.1``, ``::1``, ``0.0.0.0``) or a host name.

    Returns:
        True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); False for anything
        else, the wildcard addresses and other host names included.

    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class AuthSettings(ComponentSettings):
    """Bearer-token settings of one component (docs/auth.md lists them per component).

    A group of settings every component that checks callers has, not a component of its own:
    each component's subclass names the component (``ComponentSettings``' ``component``
    keyword, so the prefix is the component's) and fixes the audience (``PdpAuthSettings``:
    ``SVC_PDP_AUTH*``, ``svc-pdp``; ``HistoryAuthSettings``: ``SVC_HISTORY_AUTH*``,
    ``svc-history``). The component's command line takes them as ``--auth-*`` options
    (``svc.common.cli``).

    Raises:
        pydantic.ValidationError: with ``auth = "jwt"`` (the default once an issuer is set),
            the issuer, the JWKS or the callers are missing, or the JWKS is neither an
            ``https://`` URL nor a ``file://`` path.

    """

    auth: Literal["jwt", "none"] | None = None
    """``jwt`` checks bearer tokens; ``none`` serves everyone (loopback binds only). Default:
    ``jwt`` when ``auth_issuer`` is set, else ``none``."""
    auth_issuer: str | None = None
    """The one accepted ``iss``. In Kubernetes, the cluster's service-account token issuer
    (``kubectl get --raw /.well-known/openid-configuration``'s ``issuer``)."""
    auth_jwks: str | None = None
    """Where the issuer's keys are: ``https://...`` (Kubernetes: the ``jwks_uri`` of that
    document) or ``file:///path/jwks.json`` (``svc up``'s local issuer)."""
    auth_jwks_ca_file: Path | None = None
    """PEM file of the CA that signed the JWKS server's certificate (default: the system's)."""
    auth_audience: str = "svc"
    """The ``aud`` a token must name: the component (``svc-pdp``, ``svc-history``)."""
    auth_callers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """The ``sub`` values allowed to call (the callers table of docs/auth.md); JSON list or
    comma-separated."""
    auth_jwks_refresh_secs: float = Field(default=300.0, gt=0, le=86_400)
    """Seconds between JWKS reloads (key rotation)."""
    auth_leeway_secs: int = Field(default=30, ge=0, le=300)
    """Clock skew allowed on ``exp`` and ``nbf``, in seconds."""

    @field_validator("auth_callers", mode="before")
    @classmethod
    def _split_callers(cls, v: Any) -> Any:
        """Accepts a JSON list or a comma-separated string."""
        return list_setting(v)

    @model_validator(mode="after")
    def _check(self) -> AuthSettings:
        """Resolves ``auth`` and checks that ``jwt`` has what it needs."""
        if self.auth is None:
            self.auth = "jwt" if self.auth_issuer else "none"
        if self.auth == "none":
            return self
        env = self.env_name
        missing = [
            env(name)
            for name, value in (
                ("auth_issuer", self.auth_issuer),
                ("auth_jwks", self.auth_jwks),
                ("auth_callers", self.auth_callers),
            )
            if not value
        ]
        if missing:
            raise ValueError(
                f"{self.component}: auth is jwt but {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set (docs/auth.md)"
            )
        scheme = urlparse(self.auth_jwks or "").scheme
        if scheme not in ("https", "file"):
            raise ValueError(
                f"{self.component}: {env('auth_jwks')} must be an https:// URL or a file:// "
                f"path, not `{self.auth_jwks}`"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether bearer tokens are checked."""
        return self.auth == "jwt"

    def check_bind(self, host: str) -> None:
        """Refuses to serve beyond this machine without authentication.

        Args:
            host: the address the component will bind.

        Raises:
            AuthConfigError: auth is off and `host` is not a loopback address.

        """
        if self.enabled or is_loopback(host):
            return
        env = self.env_name
        raise AuthConfigError(
            f"{self.component}: refusing to listen on {host} without authentication: anyone "
            f"who reaches the port could call it. Set {env('auth_issuer')}, "
            f"{env('auth_jwks')} and {env('auth_callers')} (docs/auth.md), or bind to "
            "127.0.0.1"
        )


class PdpAuthSettings(AuthSettings, component="pdp"):
    """The decision point's bearer-token settings: ``SVC_PDP_AUTH*``, audience ``svc-pdp``.

    Adds the verified-token cache of the Rust listener (docs/auth.md, "Cost").
    """

    auth_audience: str = "svc-pdp"
    """The ``aud`` a token must name."""
    auth_cache_entries: int = Field(default=10_000, ge=0, le=1_000_000)
    """Verified tokens kept (an LRU map keyed by the token); 0 verifies every request."""
    auth_cache_ttl_secs: int = Field(default=60, ge=1, le=3600)
    """Longest time a cached verification is trusted (the token's ``exp`` may end it sooner)."""


class HistoryAuthSettings(AuthSettings, component="history"):
    """The history's bearer-token settings: ``SVC_HISTORY_AUTH*``, audience ``svc-history``."""

    auth_audience: str = "svc-history"
    """The ``aud`` a token must name."""


class PolicyAuthSettings(AuthSettings, component="policy"):
    """The policy service's bearer-token settings: ``SVC_POLICY_AUTH*``, audience ``svc-policy``.

    Its callers (docs/auth.md's table): the decision points and gateways that follow
    ``WatchActive``, and the admin CLI (``svc policy draft``, ``publish``, ...).
    """

    auth_audience: str = "svc-policy"
    """The ``aud`` a token must name."""
