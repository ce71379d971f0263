"""Settings of the challenge service (svc-challenge): ``SVC_CHALLENGE_*`` (docs/challenges.md).

One settings class for the component (docs/architecture.md#code-layout-and-conventions), deriving
from ``ServiceSettings`` (``host``, ``port``), with defaults that run locally: a SQLite file in the
working directory, port 8080 on 127.0.0.1, no chat webhook. ``ChallengeAuthSettings`` holds who
may call (``SVC_CHALLENGE_AUTH*``, audience ``svc-challenge``; docs/auth.md); without it the
service binds loopback addresses only (``svc.challenge.app.serve``).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from svc.common.auth_settings import AuthSettings
from svc.common.settings import ServiceSettings

__all__ = ["ChallengeAuthSettings", "ChallengeSettings"]


class ChallengeSettings(ServiceSettings, component="challenge"):
    """Settings of svc-challenge (docs/challenges.md#settings).

    Read from the environment (``SVC_CHALLENGE_<NAME>``) or given as keyword arguments (tests,
    ``svc challenge serve`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    database_url: str = "sqlite:///svc-challenge.db"
    """SQLAlchemy URL: ``postgresql+psycopg://...`` in production, a SQLite file in ``svc up``."""
    challenge_ttl_secs: int = Field(default=900, ge=10, le=7 * 86_400)
    """How long a challenge waits for its answer: ``expires_at`` is its opening plus this. A
    rejected challenge denies its fingerprint until then too."""
    grant_ttl_secs: int = Field(default=3600, ge=10, le=7 * 86_400)
    """How long a passed challenge allows its exact fingerprint: ``grant_expires_at`` is the
    moment it passed plus this."""
    max_justification_chars: int = Field(default=4000, ge=1, le=100_000)
    """Longest justification text."""
    heartbeat_secs: float = Field(default=5.0, gt=0, le=300)
    """Time between heartbeats of ``WatchChallenges`` and ``WatchContainments`` while nothing
    changes."""
    watch_poll_secs: float = Field(default=1.0, gt=0, le=60)
    """How often a watch reads the database again, so changes made through another replica
    reach its watchers too (a change through this replica wakes them at once)."""
    context_url: str | None = None
    """The context service (``http://host:port``) whose ``/v1/directory/...`` routes name the
    owners and managers who answer challenges (docs/context.md); unset: nobody but the person
    and a policy-named approver can be found."""
    context_token_file: str | None = None
    """File holding the bearer token sent to the context service (read at each call, so a
    renewed token is picked up)."""
    pdp_url: str | None = None
    """The decision point (``http://host:port``) asked whether an approver may ``approve`` the
    challenge's resource, at ``Resolve`` and at ``Decide`` (docs/challenges.md#who-answers);
    unset: approvers are not checked."""
    pdp_token_file: str | None = None
    """File holding the bearer token sent to the decision point (audience ``svc-pdp``; read at
    each call)."""
    intake_url: str | None = None
    """The intake (``http://host:port``) how challenges end is sent to as audit events
    (rejected, expired, verification failed: docs/reasoner.md#challenges-that-failed, which
    the reasoner scores); unset: no events."""
    intake_token_file: str | None = None
    """File holding the intake token (docs/intake.md; read at each batch)."""
    rp_id: str = "localhost"
    """The WebAuthn relying party id: the host name of the page people touch their key on
    (WebAuthn Level 3, section 5.1.4)."""
    rp_name: str = "svc"
    """The relying party's name shown by the authenticator."""
    origins: list[str] = Field(default_factory=lambda: ["http://localhost:8084"])
    """The origins a WebAuthn response may come from (the challenge page's), JSON list."""
    ceremony_ttl_secs: int = Field(default=300, ge=10, le=3600)
    """How long a registration or verification ceremony may take between begin and finish."""
    webhook_url: str | None = None
    """Slack-compatible incoming webhook the notifications are POSTed to; unset: notifications
    stay in the outbox, unsent."""
    webhook_attempts: int = Field(default=4, ge=1, le=20)
    """Tries of one notification in one round (tenacity), before it waits for the next."""
    webhook_backoff_secs: float = Field(default=0.5, gt=0, le=60)
    """First wait between tries; each next wait doubles, up to ``webhook_backoff_max_secs``."""
    webhook_backoff_max_secs: float = Field(default=60.0, gt=0, le=3600)
    """Longest wait between tries, and between rounds of a notification the webhook refuses."""
    webhook_timeout_secs: float = Field(default=10.0, gt=0, le=120)
    """Timeout of one webhook POST."""
    outbox_poll_secs: float = Field(default=1.0, gt=0, le=60)
    """How often the outbox worker looks for notifications to send when none woke it."""
    page_url: str = "http://localhost:8084/challenge"
    """Base of the link a notification carries (``<page_url>/<qid>?t=<link token>``): the
    challenge page this service serves (``svc.challenge.page``), ``http(s)://host:port/challenge``
    as the people's browsers reach it."""
    link_key_file: str | None = None
    """File holding the HMAC key that signs the page's link tokens (made, 32 random bytes
    base64url, when missing); unset: a key held in memory, so links end with the process. Every
    replica reads the same file. The page's session cookie is signed with a key derived from
    it too."""
    link_ttl_secs: int = Field(default=86_400, ge=60, le=30 * 86_400)
    """How long a link token is valid after its notification was written."""
    oidc_issuer: str | None = None
    """The install's OpenID Connect provider (its issuer URL; discovery at
    ``<issuer>/.well-known/openid-configuration``) people sign in to the page with; unset: the
    page is not served."""
    oidc_client_id: str = "svc-challenge"
    """The page's client id at the provider."""
    oidc_client_secret_file: str | None = None
    """File holding the page's client secret (read on start); unset: a public client
    (PKCE only)."""
    oidc_username_claim: str = "preferred_username"
    """The ID-token claim holding the user name challenges name as ``person`` and ``approver``."""
    page_session_secs: int = Field(default=8 * 3600, ge=60, le=7 * 86_400)
    """How long a page sign-in lasts (the session cookie's ``Max-Age``)."""

    @field_validator("rp_id")
    @classmethod
    def _check_rp_id(cls, v: str) -> str:
        """A host name, no scheme or port."""
        if not v or "/" in v or ":" in v:
            raise ValueError(f"`{v}`: expected a host name such as example.com")
        return v


class ChallengeAuthSettings(AuthSettings, component="challenge"):
    """Who may call svc-challenge: ``SVC_CHALLENGE_AUTH*``, audience ``svc-challenge``.

    Callers (docs/auth.md): decision points (Resolve, WatchContainments), the gateway, the
    reasoner (Contain), the portal.
    """

    auth_audience: str = "svc-challenge"
    """The ``aud`` a token must name."""
