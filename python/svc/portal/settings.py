"""Settings of the portal (svc-portal): ``SVC_PORTAL_*`` (docs/portal.md#settings).

One settings class for the component (docs/architecture.md#code-layout-and-conventions),
deriving from ``ServiceSettings`` (``host``, ``port``), with defaults that run locally against
``svc up``'s ports. The portal stores nothing: it holds the base URL of each service it calls
and a file with the bearer token it sends each one (read at each call, so a renewed projected
service-account token is picked up; docs/auth.md), the install's OpenID Connect provider people
sign in with, the key its session cookie is signed with, how agent tokens of trusted apps are
fetched and checked, and the limits of its APIs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from svc.common.settings import ServiceSettings

__all__ = ["PortalSettings", "read_token_file"]


class PortalSettings(ServiceSettings, component="portal"):
    """Settings of svc-portal (docs/portal.md#settings).

    Read from the environment (``SVC_PORTAL_<NAME>``) or given as keyword arguments (tests,
    ``svc portal serve`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    pdp_url: str = "http://127.0.0.1:8080"
    """The decision point (``http://host:port``) every portal operation is checked with
    (``view`` or ``administer`` on ``PortalArea::"<area>"``), and whose AuthZEN searches answer
    "who can" (docs/search.md)."""
    pdp_token_file: str | None = None
    """File holding the bearer token sent to the decision point (audience ``svc-pdp``)."""
    history_url: str | None = "http://127.0.0.1:8082"
    """The history's read-only routes (``/v1/history/...``, docs/history.md#http-routes); unset:
    the decision queries answer ``unavailable``."""
    history_token_file: str | None = None
    """File holding the bearer token sent to the history (audience ``svc-history``)."""
    policy_url: str | None = "http://127.0.0.1:8083"
    """The policy service (gRPC ``svc.policy.v1.PolicyService``, docs/policy.md); unset: the
    policy operations answer ``unavailable``."""
    policy_token_file: str | None = None
    """File holding the bearer token sent to the policy service (audience ``svc-policy``)."""
    context_url: str = "http://127.0.0.1:8084"
    """The context service (docs/context.md): service accounts (the agents API), the directory,
    trusted apps, risk scores, investigations."""
    context_token_file: str | None = None
    """File holding the bearer token sent to the context service (audience ``svc-context``)."""
    challenge_url: str | None = "http://127.0.0.1:8085"
    """The challenge service (gRPC ``svc.challenge.v1.ChallengeService``,
    docs/challenges.md): challenges, containments, security keys; unset: those operations
    answer ``unavailable``."""
    challenge_token_file: str | None = None
    """File holding the bearer token sent to the challenge service (audience
    ``svc-challenge``)."""
    call_timeout_secs: float = Field(default=10.0, gt=0, le=120)
    """Timeout of one call to another service; past it the operation answers ``unavailable``
    (HTTP 503)."""

    public_url: str = "http://localhost:8089"
    """The portal's address as people's browsers reach it (``http(s)://host:port``): the OpenID
    Connect redirect URI is ``<public_url>/auth/callback``, and an ``https://`` URL makes the
    session cookie ``Secure``."""
    oidc_issuer: str | None = None
    """The install's OpenID Connect provider (issuer URL; discovery at
    ``<issuer>/.well-known/openid-configuration``) people sign in with; unset: nobody can sign
    in, and only the agents API serves."""
    oidc_client_id: str = "svc-portal"
    """The portal's client id at the provider."""
    oidc_client_secret_file: str | None = None
    """File holding the portal's client secret (``client_secret_basic``; read on start); unset:
    a public client (PKCE only)."""
    oidc_username_claim: str = "preferred_username"
    """The ID-token claim holding the user name the portal's checks name as
    ``Human::"<user name>"``."""
    session_key_file: str | None = None
    """File holding the key that signs the session cookie (made, 32 random bytes base64url,
    when missing; every replica reads the same file). Unset: a key in memory, so sessions end
    with the process."""
    session_secs: int = Field(default=8 * 3600, ge=60, le=7 * 86_400)
    """How long a sign-in lasts (the session cookie's ``Max-Age`` and the server-side
    session's lifetime)."""
    max_sessions: int = Field(default=100_000, ge=1, le=10_000_000)
    """Most live sessions kept (server side; the oldest are signed out first past it)."""

    jwks_ca_file: str | None = None
    """PEM CA bundle of the trusted apps' JWKS servers, for a private CA (default: the
    system's)."""
    jwks_refresh_secs: float = Field(default=300.0, gt=0, le=86_400)
    """How long a trusted app's JWKS is used before it is fetched again (an unknown ``kid``
    fetches it at once, at most every 30 s)."""
    trust_refresh_secs: float = Field(default=5.0, gt=0, le=10)
    """How often the trusted apps are read again from the context service (at most 10 s, so a
    newly trusted or removed app applies within about ten seconds)."""
    leeway_secs: int = Field(default=30, ge=0, le=300)
    """Clock skew allowed on ``exp`` and ``nbf`` of an app's token, in seconds."""
    person_issuer: str | None = None
    """The ``iss`` of the install's identity provider's access tokens, which make an MCP caller
    that person (``/mcp``); unset: only agents acting for a person (trusted apps' token
    exchange results) call the MCP endpoint."""
    person_jwks_url: str | None = None
    """The identity provider's JWKS (``https://``), with ``person_issuer``."""
    person_audience: str = "svc-portal"
    """The ``aud`` the identity provider's and the trusted apps' tokens for ``/mcp`` name."""
    intake_url: str | None = None
    """The intake (``http://host:port``) each MCP tool call is sent to as an event
    (docs/intake.md); unset: no events."""
    intake_token_file: str | None = None
    """File holding the intake token (read at each batch)."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    """Largest request body (agents API and GraphQL)."""

    max_query_depth: int = Field(default=10, ge=1, le=100)
    """GraphQL: the deepest selection a query may nest (strawberry's ``QueryDepthLimiter``;
    a top-level field is depth 0, so ``{ bundle { files { name } } }`` is depth 2)."""
    max_aliases: int = Field(default=15, ge=0, le=1000)
    """GraphQL: most aliases in one query."""
    max_tokens: int = Field(default=2000, ge=50, le=100_000)
    """GraphQL: most lexical tokens in one document."""
    max_page_size: int = Field(default=200, ge=1, le=10_000)
    """Most rows of one page of any list (decisions, challenges, people, ...)."""
    model_url: str | None = None
    """An OpenAI-compatible chat-completions API (``http://127.0.0.1:11434/v1``) the assistant
    asks, offering it only the portal's read-only operations; unset: no assistant."""
    model_name: str = "gpt-4o-mini"
    """The model asked."""
    model_api_key_file: str | None = None
    """File holding the model service's API key (read at each question)."""
    assistant_max_steps: int = Field(default=6, ge=1, le=20)
    """Most rounds of tool calls the assistant makes for one question."""
    max_subscriptions: int = Field(default=10, ge=1, le=1000)
    """GraphQL: most subscriptions one websocket connection holds at once."""
    dev: bool = False
    """Development only: GraphQL introspection and the GraphiQL IDE at ``/graphql``. Off in an
    install: the schema is in ``python/svc/portal/schema.graphql``."""
    allow_any_query: bool = False
    """Development and tests only: GraphQL runs any operation, not only the web app's
    persisted ones (``persisted-operations.json`` of the build; docs/portal.md#the-web-app).
    ``dev`` implies it."""
    web_dir: str | None = None
    """The built web app (``index.html``, ``assets/``, ``persisted-operations.json``); unset:
    the package's own ``svc/portal/static`` (``make web``)."""

    @model_validator(mode="after")
    def _check(self) -> PortalSettings:
        """``person_issuer`` and an ``https://`` ``person_jwks_url`` come together."""
        if (self.person_issuer is None) != (self.person_jwks_url is None):
            raise ValueError("person_issuer and person_jwks_url are set together or not at all")
        if self.person_jwks_url is not None and not _https(self.person_jwks_url):
            raise ValueError(f"person_jwks_url must be https://, not `{self.person_jwks_url}`")
        return self


def _https(url: str) -> bool:
    return url.startswith("https://")


def read_token_file(path: str | Path | None) -> str | None:
    """The stripped text of a token file, or None when no file is set or it is empty.

    Args:
        path: the file (a projected service-account token, renewed in place), or None.

    Raises:
        OSError: the file is set but cannot be read.

    """
    if path is None:
        return None
    return Path(path).read_text(encoding="utf-8").strip() or None
