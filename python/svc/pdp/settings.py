"""Settings of the decision point in standalone mode (``svc pdp``; docs/api.md lists them).

``PdpSettings`` holds every ``svc pdp`` option but ``--bundle`` and the bearer-token ones
(``svc.common.auth.PdpAuthSettings``), with its default written once here: the command line's
options are made from its fields (``svc.common.cli``), and ``svc.pdp.server.StandaloneOptions``
derives from it. Read from ``SVC_PDP_<NAME>`` (the broker from ``SVC_KAFKA_URL``); the decision
log's durability comes from ``svc.pdp.log_settings.DecisionLogSettings``. This module does not
load the decision core's extension.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from svc.common.settings import ServiceSettings, kafka_url_field
from svc.common.topics import DECISIONS_TOPIC
from svc.pdp.log_settings import DecisionLogSettings

__all__ = ["PdpSettings"]


class PdpSettings(ServiceSettings, DecisionLogSettings, component="pdp"):
    """Settings of ``svc pdp`` (docs/api.md, "Running it"): ``SVC_PDP_<NAME>``.

    Raises:
        pydantic.ValidationError: a setting is malformed or out of its range, ``kafka_url``
            is not a broker URL, or ``policy`` is set without ``public_key``. The mode is
            checked by the engine when it starts (``RequestError``).

    """

    mode: str = "enforce"
    """monitor or enforce, reported with decisions (docs/architecture.md#monitor-and-enforce)."""
    max_body_bytes: int = Field(default=1_048_576, ge=1)
    """Largest request body (HTTP body or gRPC message); larger get 413."""
    workers: int = Field(default=0, ge=0)
    """Worker threads (0: one per core)."""
    public_url: str | None = None
    """Base URL for AuthZEN discovery (default: from the request's Host)."""
    watch: bool = True
    """Reload the bundle when its files change (with --bundle)."""
    policy: str | None = None
    """The policy service to follow instead of a bundle directory (host:port or
    http://host:port; docs/policy.md#watchactive): its active bundle, verified with
    public_key, and its mode."""
    public_key: Path | None = None
    """The policy service's signing public key (PEM, svc policy keygen's FILE.pub); required
    with policy."""
    policy_token_file: Path | None = None
    """A file holding the bearer token sent to the policy service (read again at each
    reconnect, as a projected service-account token is renewed); none: no token."""
    context: str | None = None
    """The context service to follow (http://host:port; docs/context.md): its principals
    snapshot and watch fill the entity store, and resources and work items a check names and
    the store lacks are fetched from it by id. /readyz answers 503 until the snapshot is
    loaded. None: the bundle's entities only."""
    context_token_file: Path | None = None
    """A file holding the bearer token sent to the context service (audience svc-context;
    read again for every request, as a projected service-account token is renewed); none:
    no token."""
    context_fetch_timeout_ms: int = Field(default=200, ge=1, le=60_000)
    """How long a check waits for a resource it lacks to be fetched from the context service;
    past it the check is decided without it (svc_pdp_resource_fetches_total{outcome})."""
    challenge: str | None = None
    """The challenge service (http://host:port; docs/challenges.md#the-decision-point): a
    challenge verdict calls its Resolve and answers the challenge_qid (a passed challenge
    allows the retry, a rejected one denies), challenge waits are answered from its
    challenges, and its containment list is followed (WatchContainments; /readyz answers 503
    until it is loaded). None: challenge verdicts carry no challenge_qid, waits answer 503,
    and the containment list is the bundle's (empty)."""
    challenge_token_file: Path | None = None
    """A file holding the bearer token sent to the challenge service (audience
    svc-challenge; read again for every call); none: no token."""
    challenge_timeout_ms: int = Field(default=2_000, ge=1, le=60_000)
    """How long a check waits for Resolve (and a wait for GetChallenge); past it the verdict
    stays challenge without a challenge_qid (svc_pdp_challenge_calls_total{outcome})."""
    feed_max_staleness_secs: float = Field(default=30.0, gt=0, le=86_400)
    """Longest time a followed feed (bundle, principals, resources, work items, containments)
    may go without a successful sync before /readyz answers 503 naming it
    (docs/api.md#readiness-and-feeds); the last good state keeps serving meanwhile. Keep it a
    few times the feeds' heartbeats (5 s); the context service's long polls wait a third of
    it (at most 10 s)."""
    noop_routes: bool = False
    """Also serve the benchmark ceiling (POST /v1/noop, NoopAuthorizer)."""
    plan_max_age_secs: int = Field(default=300, ge=0)
    """max_age_secs of query plans (docs/plans.md)."""
    kafka_url: str | None = kafka_url_field(None)
    """Broker for the decision log (kafka://host:port, a bootstrap list or local:///path);
    none: no decision log."""
    spool_dir: Path = Path(".svc/pdp-spool")
    """Decision-log spool: every record is written there before it is sent (broker outages;
    kept across restarts)."""
    log_queue_bound: int = Field(default=100_000, ge=1)
    """Decision records held in memory for one group commit; when reached the commit starts
    at once."""
    spool_max_bytes: int = Field(default=1 << 30, ge=1)
    """Largest spool not yet acknowledged by the broker; records past it are dropped and
    counted (refused with 503 in durable mode)."""
    decisions_topic: str = DECISIONS_TOPIC
    """Decision-log topic."""
    max_batch_items: int = Field(default=1_000, ge=1)
    """Most evaluations per AuthZEN batch (400 beyond)."""
    search_max_limit: int = Field(default=1_000, ge=1, le=100_000)
    """Largest AuthZEN search page: a larger page.limit is lowered to it (docs/search.md)."""
    max_inline_entities: int = Field(default=1_000, ge=0)
    """Most inline entities per check (400 beyond)."""
    max_entity_depth: int = Field(default=64, ge=1)
    """Longest parent chain of an inline, stored or bundle entity."""

    @model_validator(mode="after")
    def _check_policy(self) -> PdpSettings:
        """``policy`` needs ``public_key``: a bundle is never served unverified."""
        if self.policy and self.public_key is None:
            raise ValueError(
                "policy is set but public_key is not: a followed bundle is served only once "
                "its signature verifies (docs/bundles.md#signed-bundles)"
            )
        return self
