"""Settings of the MCP gateway (svc-gateway): ``SVC_GATEWAY_*`` (docs/gateway.md#settings).

``GatewaySettings`` derives from ``ServiceSettings`` (``host``, ``port``;
docs/architecture.md#code-layout-and-conventions). The upstream MCP servers and how each tool's
call names its resource are ``Upstream`` and ``ToolMapping`` records, given inline
(``SVC_GATEWAY_UPSTREAMS`` as JSON) or in a JSON file (``upstreams_file``). Where a service the
gateway follows is not configured (context, challenge, policy), a file setting stands in for it
(trusted apps, containments, outage tiers).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from svc.common.settings import ServiceSettings, list_setting

__all__ = [
    "GatewaySettings",
    "ToolMapping",
    "Upstream",
    "load_upstreams",
    "parse_json_setting",
    "read_token_file",
]

#: An upstream's name: the ``{upstream}`` of ``/mcp/{upstream}`` and of
#: ``Tool::"<upstream>/<tool>"``.
UPSTREAM_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class ToolMapping(BaseModel):
    """How one tool's call names the resource it touches (docs/gateway.md#tool-mappings).

    Attributes:
        resource_arg: the call argument holding the resource's id (None: the call names no
            resource and only ``call`` on the tool is checked).
        resource_type: the resource's entity type (``Document``); required with
            ``resource_arg``.
        read_only: True: the call is checked as ``read`` on the resource, else as ``write``.
        action_class: the intake event's ``action_class`` (default ``read`` or ``write`` as
            ``read_only`` says).

    """

    model_config = ConfigDict(extra="forbid")

    resource_arg: str | None = None
    resource_type: str | None = None
    read_only: bool = False
    action_class: str | None = None

    @model_validator(mode="after")
    def _both_or_none(self) -> ToolMapping:
        """``resource_arg`` and ``resource_type`` come together."""
        if (self.resource_arg is None) != (self.resource_type is None):
            raise ValueError("`resource_arg` and `resource_type` are given together or not at all")
        return self

    @property
    def action(self) -> Literal["read", "write"]:
        """The action checked on the resource: ``read`` for a read-only tool, else ``write``."""
        return "read" if self.read_only else "write"

    @property
    def event_class(self) -> str:
        """The intake event's ``action_class``."""
        return self.action_class or self.action


class Upstream(BaseModel):
    """One upstream MCP server (docs/gateway.md#upstreams).

    Exactly one of ``url`` (Streamable HTTP, ``http(s)://host:port/mcp``) and ``command`` (a
    stdio server started by the gateway: the program and its arguments) is given.

    Attributes:
        url: the upstream's Streamable HTTP endpoint.
        command: the stdio server's command line.
        env: environment variables of the stdio server (added to a minimal default set).
        cwd: working directory of the stdio server.
        headers: HTTP headers sent to a Streamable HTTP upstream (its own credentials).
        tools: per tool name, how its call names a resource; a tool not listed is checked as
            ``call`` only, and its event's ``action_class`` is ``call``.

    """

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    tools: dict[str, ToolMapping] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> Upstream:
        """Exactly one of ``url`` and ``command``; a URL is http(s); a command is not empty."""
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of `url` (Streamable HTTP) and `command` (stdio)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"`url` must be http:// or https://: `{self.url}`")
        if self.command is not None and not self.command:
            raise ValueError("`command` is empty")
        return self


def _check_upstreams(upstreams: dict[str, Upstream]) -> dict[str, Upstream]:
    for name in upstreams:
        if not UPSTREAM_NAME.match(name) or name == "challenges":
            raise ValueError(
                f"upstream name `{name}`: lowercase letters, digits, `-` and `_`, 1 to 63 "
                "characters, not `challenges`"
            )
    return upstreams


def load_upstreams(path: str | Path) -> dict[str, Upstream]:
    """The upstreams of a JSON file: ``{"<name>": {<Upstream fields>}, ...}``.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON or an upstream is malformed (pydantic's ValidationError is
            a ValueError), or a name is not allowed.

    """
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of upstreams by name")
    return _check_upstreams({k: Upstream.model_validate(v) for k, v in raw.items()})


class GatewaySettings(ServiceSettings, component="gateway"):
    """Settings of svc-gateway (docs/gateway.md#settings).

    Read from the environment (``SVC_GATEWAY_<NAME>``) or given as keyword arguments (tests,
    ``svc gateway`` options).

    Raises:
        pydantic.ValidationError: a setting is malformed or out of range.

    """

    upstreams: dict[str, Upstream] = Field(default_factory=dict)
    """The upstream MCP servers by name, JSON (``{"docs": {"url": "http://..."}}``); merged
    with ``upstreams_file``'s (this wins)."""
    upstreams_file: str | None = None
    """A JSON file of upstreams by name (the same shape as ``upstreams``), read at start."""
    public_url: str | None = None
    """The base URL agents reach this gateway at, for ``svc/challenge_wait``; unset: taken from
    each request's ``Host``."""
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``Host`` values accepted on ``/mcp/...`` besides the defaults (DNS rebinding protection,
    docs/gateway.md#dns-rebinding-protection): ``name:port``, or ``name:*`` for any port. The
    defaults are ``127.0.0.1``, ``localhost`` and ``[::1]`` with the port the request came in
    on, and ``public_url``'s host."""
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``Origin`` values accepted on ``/mcp/...`` besides the defaults (``http://`` and the
    loopback names with the port the request came in on, and ``public_url``'s origin):
    ``scheme://name:port``, or ``scheme://name:*`` for any port. A request without
    ``Origin`` (an MCP client that is not a browser) is not refused for it. Both: a JSON list or
    comma-separated."""
    pdp_url: str = "http://127.0.0.1:8080"
    """The decision point (``http://host:port``): ``POST /v1/access/evaluation`` and
    ``POST /v1/access/challenge`` (docs/api.md)."""
    pdp_token_file: str | None = None
    """File holding the bearer token sent to the decision point (audience ``svc-pdp``; read
    again for every connection's first request and on a 401)."""
    pdp_timeout_ms: int = Field(default=2000, ge=10, le=60_000)
    """How long a check waits for the decision point before the call counts as an outage."""
    upstream_timeout_secs: float = Field(default=60.0, gt=0, le=3600)
    """How long a forwarded request waits for its upstream's answer."""
    challenge_url: str | None = None
    """The challenge service (``http://host:port``) whose ``WatchContainments`` feed the
    gateway follows (docs/challenges.md); unset: ``containments_file``."""
    challenge_token_file: str | None = None
    """File holding the bearer token sent to the challenge service (audience
    ``svc-challenge``)."""
    containments_file: str | None = None
    """Without ``challenge_url``: a JSON list of contained principals (``[{"type", "id"}]``),
    read again when it changes."""
    policy_url: str | None = None
    """The policy service (``http://host:port``) whose ``GetOutageFallback`` gives the tools'
    outage tiers (docs/policy.md#outage-fallbacks); unset: ``fallback_file``."""
    policy_token_file: str | None = None
    """File holding the bearer token sent to the policy service."""
    fallback_file: str | None = None
    """Without ``policy_url``: a JSON object of outage tiers by tool pattern
    (``{"docs/*": "fail_open", "*": "fail_closed"}``), read again when it changes; neither:
    every tool fails closed."""
    fallback_refresh_secs: float = Field(default=10.0, gt=0, le=3600)
    """How often the outage tiers are read again (policy service or file)."""
    cached_allow_secs: float = Field(default=300.0, ge=0, le=86_400)
    """Tier ``cached``: how old an allow of the same principal, tool and resource may be to be
    replayed while the decision point is unreachable."""
    context_url: str | None = None
    """The context service (``http://host:port``) whose ``/v1/directory/trusted-apps`` lists
    the apps whose agent tokens are accepted (docs/context.md); unset: ``trusted_apps_file``."""
    context_token_file: str | None = None
    """File holding the bearer token sent to the context service (audience ``svc-context``)."""
    trusted_apps_file: str | None = None
    """Without ``context_url``: a JSON list of trusted apps (``[{"name", "iss", "jwks_url",
    "aud"}]``), read again when it changes."""
    trust_refresh_secs: float = Field(default=5.0, gt=0, le=10)
    """How often the trusted apps are read again: a newly trusted or removed app applies
    within this (docs/architecture.md#trusted-app-issuers: about ten seconds)."""
    feed_max_staleness_secs: float = Field(default=30.0, gt=0, le=86_400)
    """Longest time a followed feed (the trusted apps, the containment list, the outage
    tiers) may go without a successful read before /readyz answers 503 naming it
    (docs/gateway.md#readiness-and-feeds); the last good list keeps serving meanwhile. Above
    ``trust_refresh_secs`` and ``fallback_refresh_secs``: keep it a few times them."""
    person_issuer: str | None = None
    """The ``iss`` of the install's identity provider: a person's own token makes the caller
    that person (docs/architecture.md#agent-tokens); unset: people's tokens are refused."""
    person_jwks_url: str | None = None
    """The identity provider's JWKS (``https://``); required with ``person_issuer``."""
    person_audience: str = "svc-gateway"
    """The ``aud`` a person's own token must name."""
    jwks_ca_file: str | None = None
    """PEM CA bundle of the JWKS servers (a private CA); unset: the system's CAs."""
    jwks_refresh_secs: float = Field(default=300.0, gt=0, le=86_400)
    """How long an issuer's JWKS is used before it is fetched again (an unknown ``kid``
    fetches it sooner, at most every 30 s)."""
    leeway_secs: int = Field(default=30, ge=0, le=300)
    """Clock skew allowed on ``exp`` and ``nbf``."""
    token_cache_entries: int = Field(default=10_000, ge=0, le=1_000_000)
    """Verified tokens kept (until their ``exp``, at most ``token_cache_secs``); 0: none."""
    token_cache_secs: float = Field(default=60.0, ge=0, le=3600)
    """Longest trust in a cached verified token (a removed app's tokens stop within it)."""
    intake_url: str | None = None
    """The intake (``http://host:port``): each forwarded call becomes an event
    (docs/intake.md); unset: no events."""
    intake_token_file: str | None = None
    """File holding the intake token."""
    intake_batch_max: int = Field(default=500, ge=1, le=1000)
    """Most events in one ``POST /v1/events``."""
    intake_flush_secs: float = Field(default=1.0, gt=0, le=60)
    """Longest time an event waits for its batch to fill."""
    intake_queue_bound: int = Field(default=10_000, ge=1, le=10_000_000)
    """Events held while the intake is slow or down; past it new events are dropped (counted
    in ``svc_gateway_events_dropped_total`` and logged)."""

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        """Accepts a JSON list or a comma-separated string (``list_setting``)."""
        return list_setting(v)

    @field_validator("upstreams")
    @classmethod
    def _names(cls, v: dict[str, Upstream]) -> dict[str, Upstream]:
        """Upstream names are path segments (``UPSTREAM_NAME``), not ``challenges``."""
        return _check_upstreams(v)

    @model_validator(mode="after")
    def _pairs(self) -> GatewaySettings:
        """``person_issuer`` needs ``person_jwks_url``; the feeds' bound exceeds their polls.

        Only the polls of the feeds followed count (trusted apps, outage tiers, the containments
        file).
        """
        if self.person_issuer is not None and self.person_jwks_url is None:
            raise ValueError("`person_issuer` needs `person_jwks_url`")
        polls = {
            "trust_refresh_secs": self.trust_refresh_secs
            if self.context_url or self.trusted_apps_file
            else 0.0,
            "fallback_refresh_secs": self.fallback_refresh_secs
            if self.policy_url or self.fallback_file
            else 0.0,
            # The containments file is read every second (svc.gateway.service).
            "the containments file's 1 s poll": 1.0
            if self.containments_file and not self.challenge_url
            else 0.0,
        }
        name, slowest = max(polls.items(), key=lambda kv: kv[1])
        if self.feed_max_staleness_secs <= slowest:
            raise ValueError(
                f"`feed_max_staleness_secs` ({self.feed_max_staleness_secs:g}) must be above "
                f"`{name}` ({slowest:g}): a feed read that often would look stale while healthy"
            )
        return self

    def all_upstreams(self) -> dict[str, Upstream]:
        """``upstreams_file``'s upstreams with ``upstreams`` laid over them.

        Raises:
            OSError, ValueError: as ``load_upstreams``.

        """
        out = load_upstreams(self.upstreams_file) if self.upstreams_file else {}
        return {**out, **self.upstreams}


def read_token_file(path: str | None) -> str | None:
    """The stripped text of a token file, or None when no file is set.

    Raises:
        OSError: the file cannot be read.

    """
    if path is None:
        return None
    return Path(path).read_text(encoding="utf-8").strip() or None


def parse_json_setting(text: str) -> Any:
    """JSON text of a file setting (``containments_file``, ``fallback_file``, ...).

    Raises:
        ValueError: not JSON.

    """
    return json.loads(text)
