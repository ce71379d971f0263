"""Settings of the context service (svc-context): ``SVC_CONTEXT_*`` (docs/context.md#settings).

One settings class for the component (docs/architecture.md#code-layout-and-conventions), with
defaults that run locally: a SQLite file in the working directory, port 8080 on 127.0.0.1.
``ContextAuthSettings`` holds the bearer-token settings of the ``/v1`` routes
(``SVC_CONTEXT_AUTH*``, audience ``svc-context``; docs/auth.md); the SCIM routes take the
identity provider's own token instead (``scim_token``).
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from svc.common.auth_settings import AuthSettings
from svc.common.settings import ServiceSettings

__all__ = ["ContextAuthSettings", "ContextSettings"]


class ContextSettings(ServiceSettings, component="context"):
    """Settings of svc-context (docs/context.md#settings).

    Read from the environment (``SVC_CONTEXT_<NAME>``) or given as keyword arguments (tests,
    ``svc context serve`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    database_url: str = "sqlite:///svc-context.db"
    """SQLAlchemy URL: ``postgresql+psycopg://...`` in production, a SQLite file in ``svc up``."""
    scim_token: SecretStr | None = None
    """The bearer token the identity provider sends to ``/scim/v2/`` (RFC 6750); at least 32
    characters. Unset: every SCIM request is refused with 401."""
    scim_max_results: int = Field(default=200, ge=1, le=10_000)
    """Most resources in one SCIM list response (``filter.maxResults``, RFC 7643 section 5)."""
    max_batch_items: int = Field(default=1_000, ge=1, le=100_000)
    """Most items in one batch write or read of resources, work items or service accounts."""
    max_risk_scores: int = Field(default=200_000, ge=1, le=10_000_000)
    """Most scores in one ``POST /v1/risk``: the reasoner sends a whole cycle's in one request
    (docs/reasoner.md#publishing)."""
    risk_history_days: int = Field(default=90, ge=30, le=3660)
    """UTC days of each principal's risk score history kept (``GET /v1/risk-history``; the
    portal shows 30, the least); older days go once a day, but for each principal's newest."""
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    """Largest request body, SCIM included: a larger one gets a 413 problem before it is read,
    and only after the caller's token is checked (docs/context.md#limits). The default fits a
    reasoner cycle of ``max_risk_scores`` scores."""
    max_changes: int = Field(default=1_000, ge=1, le=100_000)
    """Most changes in one answer of a watch or change feed."""
    max_wait_secs: float = Field(default=25.0, ge=0, le=300)
    """Longest wait of a long-polling watch (``wait_secs``) before it answers with no change."""
    poll_secs: float = Field(default=1.0, gt=0, le=60)
    """How often a waiting watch reads the database again, so changes another replica wrote
    reach it too (a write through this process wakes it at once)."""


class ContextAuthSettings(AuthSettings, component="context"):
    """The ``/v1`` routes' bearer-token settings: ``SVC_CONTEXT_AUTH*``, audience ``svc-context``.

    Callers (docs/auth.md): connectors, decision points, the reasoner, the portal.
    """

    auth_audience: str = "svc-context"
    """The ``aud`` a token must name."""
