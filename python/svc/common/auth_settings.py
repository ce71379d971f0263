"""Bearer-token settings of a component, apart from the verification (``svc.common.auth``).

``AuthSettings`` and its components' subclasses (``PdpAuthSettings``, ``HistoryAuthSettings``,
``PolicyAuthSettings``),
``AuthConfigError`` and ``is_loopback``: what the command line needs to make its ``--auth-*``
options and check them, without loading the JWT, cryptography and web libraries the
verification uses. ``svc.common.auth`` re-exports all of it; docs/auth.md lists the settings.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from svc.common.component import Role
from svc.common.roles import admitted, check_roles, roles_of
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
            the issuer, the JWKS or the callers (``auth_roles`` or ``auth_callers``) are
            missing, or the JWKS is neither an ``https://`` URL nor a ``file://`` path; a role
            of ``auth_roles`` is unknown.

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
    auth_roles: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Each allowed caller's role: ``{"<sub>": "<role>"}`` as a JSON object, or
    ``sub=role,sub=role``. A role (``svc.common.component.Role``) may call the methods
    docs/auth.md's matrix (``svc.common.roles.METHODS``) gives it, and nothing else."""
    auth_callers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """The compatible form of ``auth_roles``: ``sub`` values that may call every method (role
    ``operator``, what a listed caller could do before roles); JSON list or comma-separated.
    A ``sub`` that ``auth_roles`` names takes the role named there."""
    auth_jwks_refresh_secs: float = Field(default=300.0, gt=0, le=86_400)
    """Seconds between JWKS reloads (key rotation)."""
    auth_leeway_secs: int = Field(default=30, ge=0, le=300)
    """Clock skew allowed on ``exp`` and ``nbf``, in seconds."""

    @field_validator("auth_callers", mode="before")
    @classmethod
    def _split_callers(cls, v: Any) -> Any:
        """Accepts a JSON list or a comma-separated string."""
        return list_setting(v)

    @field_validator("auth_roles", mode="before")
    @classmethod
    def _split_roles(cls, v: Any) -> Any:
        """Accepts a JSON object or ``sub=role`` pairs separated by commas."""
        if not isinstance(v, str):
            return v
        s = v.strip()
        if s.startswith("{"):
            return json.loads(s)
        out: dict[str, str] = {}
        for pair in (p.strip() for p in s.split(",")):
            if not pair:
                continue
            sub, eq, role = pair.rpartition("=")
            if not eq or not sub.strip():
                raise ValueError(f"`{pair[:64]}` is not `sub=role`")
            out[sub.strip()] = role.strip()
        return out

    @field_validator("auth_roles")
    @classmethod
    def _known_roles(cls, v: dict[str, str]) -> dict[str, str]:
        """Every role is one of ``svc.common.roles.ROLES``."""
        check_roles(v, cls.env_name("auth_roles"))
        return v

    @property
    def caller_roles(self) -> dict[str, str]:
        """Every admitted caller's role: ``auth_callers`` as ``operator``, then ``auth_roles``."""
        return {**dict.fromkeys(self.auth_callers, Role.OPERATOR), **self.auth_roles}

    @model_validator(mode="after")
    def _check(self) -> AuthSettings:
        """Resolves ``auth`` and checks that ``jwt`` has what it needs."""
        if self.auth is None:
            self.auth = "jwt" if self.auth_issuer else "none"
        if self.auth == "none":
            return self
        env = self.env_name
        missing = [
            name
            for name, value in (
                (env("auth_issuer"), self.auth_issuer),
                (env("auth_jwks"), self.auth_jwks),
                (f"{env('auth_roles')} (or {env('auth_callers')})", self.caller_roles),
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
            f"{env('auth_jwks')} and {env('auth_roles')} (docs/auth.md), or bind to "
            "127.0.0.1"
        )


class PdpAuthSettings(AuthSettings, component="pdp"):
    """The decision point's bearer-token settings: ``SVC_PDP_AUTH*``, audience ``svc-pdp``.

    Adds the verified-token cache of the Rust listener (docs/auth.md, "Cost"). Every method of
    the decision point admits the same roles (``svc.common.roles.METHODS["pdp"]``), and its
    Rust listener admits callers by ``sub``: once validated, ``auth_callers`` holds every
    caller whose role it admits (``caller_roles`` is unchanged by that), which is what the
    listener is given.
    """

    auth_audience: str = "svc-pdp"
    """The ``aud`` a token must name."""
    auth_cache_entries: int = Field(default=10_000, ge=0, le=1_000_000)
    """Verified tokens kept (an LRU map keyed by the token); 0 verifies every request."""
    auth_cache_ttl_secs: int = Field(default=60, ge=1, le=3600)
    """Longest time a cached verification is trusted (the token's ``exp`` may end it sooner)."""

    @model_validator(mode="after")
    def _admitted(self) -> PdpAuthSettings:
        """``auth_callers`` becomes the callers whose role may call the decision point."""
        if self.auth == "jwt":
            roles = self.caller_roles
            self.auth_callers = admitted("pdp", roles)
            if not self.auth_callers:
                raise ValueError(
                    f"{self.component}: no caller of {self.env_name('auth_roles')} has a role "
                    f"that may call the decision point ({', '.join(sorted(roles_of('pdp')))}; "
                    "docs/auth.md)"
                )
        return self


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
