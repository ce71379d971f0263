# strawberry's field decorators are untyped for mypy; the resolvers' own annotations are what
# strawberry reads to build the schema.
# mypy: disable-error-code="untyped-decorator"
"""The portal's GraphQL API at ``/graphql`` (strawberry; docs/portal.md#graphql).

One schema over the service layer (``svc.portal.service.PortalService``): each field calls one
service operation as the signed-in person, and the operation checks the person with the
decision point first (``view`` for queries, ``administer`` for mutations, on the field's
``PortalArea``). The resolvers only translate: service records to GraphQL types, and errors to
GraphQL errors whose ``extensions`` say what happened:

* a refused check: ``code: FORBIDDEN`` with ``decision_qid`` (the decision in the decision
  log), ``verdict``, ``action``, ``area``, ``policies`` and, for a challenge, ``challenge_qid``;
* a refused request: ``code`` the problem's slug upper-cased (``INVALID_ARGUMENT``,
  ``NOT_FOUND``, ...), ``status`` and ``errors`` (``[{field, message}]``);
* a service that does not answer: ``code: SERVICE_UNAVAILABLE``;
* anything else: masked as ``Unexpected error.`` (the log has it).

Limits (``make_schema``): query depth (strawberry's ``QueryDepthLimiter``), aliases
(``MaxAliasesLimiter``) and lexical tokens (``MaxTokensLimiter``, enforced by graphql-core's
parser), every page's size (``first``, at most ``max_page_size``), and introspection off
(``DisableIntrospection``) unless ``dev``. ``schema.graphql`` beside this file is the schema's
SDL (``svc portal schema``); a test compares it with the code.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import anyio.to_thread
import strawberry
from google.protobuf import json_format
from graphql import GraphQLError
from strawberry.extensions import (
    DisableIntrospection,
    MaskErrors,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    QueryDepthLimiter,
)
from strawberry.fastapi import BaseContext
from strawberry.scalars import JSON
from strawberry.types import Info

from svc.common.problems import Problem
from svc.policy.policytests import whole_numbers
from svc.portal.assistant import Assistant
from svc.portal.service import AREAS, Denied, PortalService
from svc.portal.sessions import Session
from svc.portal.settings import PortalSettings
from svc.portal.webapp import PersistedOperations, persisted_only

__all__ = ["Context", "make_schema", "schema_sdl"]

log = logging.getLogger("svc.portal.graphql")
T = TypeVar("T")


class Context(BaseContext):
    """What every resolver gets: the signed-in session and the service layer."""

    def __init__(self, session: Session, service: PortalService) -> None:
        super().__init__()
        self.session = session
        self.service = service

    @property
    def person(self) -> str:
        """The signed-in user name."""
        return self.session.user


async def _call(info: Info[Context, None], fn: Callable[..., T], *args: Any) -> T:
    """Runs a service operation as the signed-in person in a worker thread (module docs).

    Raises:
        GraphQLError: the operation's refusal, with its ``extensions``.

    """
    ctx = info.context
    try:
        return await anyio.to_thread.run_sync(lambda: fn(ctx.person, *args))
    except Denied as e:
        raise GraphQLError(e.detail, extensions=e.extensions()) from None
    except Problem as p:
        code = p.slug.upper().replace("-", "_")
        ext: dict[str, Any] = {"code": code, "status": p.status}
        if p.errors:
            ext["errors"] = [{"field": x.field, "message": x.message} for x in p.errors]
        raise GraphQLError(p.detail, extensions=ext) from None


def _ts(msg: Any, name: str) -> datetime | None:
    """A protobuf ``Timestamp`` field as an aware UTC datetime, None when unset."""
    if not msg.HasField(name):
        return None
    t = getattr(msg, name)
    return datetime.fromtimestamp(t.seconds + t.nanos / 1e9, UTC)


def _aware(t: datetime | None) -> datetime | None:
    """A time without an offset is taken as UTC."""
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


def _iso(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


# -- types -------------------------------------------------------------------------------


@strawberry.type(
    description="An entity reference (docs/architecture.md#entities-and-the-base-schema)."
)
class EntityRef:
    type: str
    id: str


@strawberry.input(description="An entity reference: its Cedar type and id.")
class EntityRefInput:
    type: str
    id: str

    def as_dict(self) -> dict[str, str]:
        """``{"type", "id"}``."""
        return {"type": self.type, "id": self.id}


def _ref(value: Any) -> EntityRef | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return EntityRef(type=str(value.get("type", "")), id=str(value.get("id", "")))
    if not value.type and not value.id:
        return None
    return EntityRef(type=value.type, id=value.id)


@strawberry.type(description="The signed-in person.")
class Me:
    user: str
    expires_at: datetime


@strawberry.type(
    description="What the signed-in person may do in one portal area: the decision point's "
    "answers to `view` and `administer` (each a decision in the log)."
)
class AreaAccess:
    area: str
    view: bool
    administer: bool
    own: bool = strawberry.field(
        description="May view and administer their own records here (`context.own`: their "
        "challenges, their security keys)."
    )
    view_reason: str | None = strawberry.field(description="Why `view` was refused.")
    administer_reason: str | None = strawberry.field(description="Why `administer` was refused.")


@strawberry.type(description="A person of the directory, as the identity provider provisions them.")
class Person:
    user_name: str
    display_name: str | None
    active: bool
    removed: bool
    department: str | None
    title: str | None
    manager: str | None
    groups: list[str]


@strawberry.type(description="A registered service account (an agent among them).")
class ServiceAccount:
    id: str
    owner: str
    ai: bool
    groups: list[str]
    description: str
    app: str


@strawberry.type(description="An app trusted to sign agent tokens.")
class TrustedApp:
    name: str
    iss: str
    jwks_url: str
    aud: str
    created_at: datetime | None


@strawberry.input(description="An app to trust: its name, `iss`, JWKS URL (https) and `aud`.")
class TrustedAppInput:
    name: str
    iss: str
    jwks_url: str
    aud: str


@strawberry.type(description="The reasoner's risk score of a principal, 0 to 100, and why.")
class RiskScore:
    principal: EntityRef
    score: int
    reason: str
    factors: JSON = strawberry.field(description="The score's factors, as the reasoner wrote them.")
    details: JSON
    updated_at: datetime | None


@strawberry.type(description="A principal's risk score on one UTC day.")
class RiskDay:
    day: str = strawberry.field(description="The UTC day, `YYYY-MM-DD`.")
    score: int | None = strawberry.field(
        description="The score in force at the day's end (now, for today); null before any."
    )
    high: int | None = strawberry.field(description="The highest score in force that day.")
    published: bool = strawberry.field(
        description="Whether the reasoner published a score that day (else it kept the "
        "day before's)."
    )


@strawberry.type(description="An investigation of a principal.")
class Investigation:
    id: str
    principal: str
    reason: str
    opened_by: str
    opened_at: datetime | None
    status: str
    closed_by: str | None
    closed_at: datetime | None
    resolution: str


@strawberry.type(description="A page of an AuthZEN search, with the search's decision id.")
class SearchPage:
    results: list[EntityRef]
    next_token: str | None
    decision_qid: str | None


@strawberry.type(description="A contained principal: denied everything until lifted.")
class Containment:
    principal: EntityRef
    reason: str
    author: str
    contained_at: datetime | None


@strawberry.type(description="The answer of a contain: the containment and whether it is new.")
class ContainResult:
    containment: Containment
    changed: bool


@strawberry.enum(description="A challenge's state (docs/challenges.md#states).")
class ChallengeState(enum.Enum):
    ANY = 0
    PENDING = 1
    PASSED = 2
    REJECTED = 3
    EXPIRED = 4


@strawberry.type(description="A step-up challenge (docs/challenges.md).")
class Challenge:
    qid: str
    state: ChallengeState
    principal: EntityRef | None
    on_behalf_of: EntityRef | None
    action: str
    resource: EntityRef | None
    kinds: list[str]
    satisfied: list[str]
    person: str
    approver: str
    decision_qid: str
    created_at: datetime | None
    expires_at: datetime | None
    grant_expires_at: datetime | None
    decided_by: str
    justification: str
    reason: str


@strawberry.type(description="A security key (WebAuthn credential) of a person.")
class SecurityKey:
    credential_id: str
    person: str
    name: str
    sign_count: int
    created_at: datetime | None
    last_used_at: datetime | None


@strawberry.enum(description="A bundle version's state (docs/policy.md#operations).")
class BundleState(enum.Enum):
    UNSPECIFIED = 0
    DRAFT = 1
    ACTIVE = 2
    SUPERSEDED = 3


@strawberry.type(description="One file of a bundle.")
class BundleFile:
    name: str
    content: str


@strawberry.input(description="One file of a draft: a flat name and its text.")
class BundleFileInput:
    name: str
    content: str


@strawberry.type(description="A policy bundle version (docs/policy.md).")
class Bundle:
    version: int
    state: BundleState
    author: str
    comment: str
    created_at: datetime | None
    published_at: datetime | None
    digest: str
    policies: list[str]
    warnings: list[str]
    files: list[BundleFile]


@strawberry.type(description="A problem of a draft's validation, at `file:line:column`.")
class DraftProblem:
    field: str
    message: str


@strawberry.type(description="A draft: stored (`bundle`) or refused with every problem.")
class DraftResult:
    bundle: Bundle | None
    problems: list[DraftProblem]


@strawberry.enum(description="An enforcement mode (docs/architecture.md#monitor-and-enforce).")
class Mode(enum.Enum):
    UNSPECIFIED = 0
    ENFORCE = 1
    MONITOR = 2


@strawberry.type(description="The install's mode and the mode of automated containments.")
class Enforcement:
    mode: Mode
    containment_mode: Mode


@strawberry.type(description="A recorded change of a mode.")
class EnforcementChange:
    id: int
    at: datetime | None
    author: str
    containment: bool
    from_mode: Mode
    to_mode: Mode
    reason: str


@strawberry.type(description="A recorded decision (docs/history.md#queries).")
class Decision:
    qid: str
    at: datetime
    call: str
    principal: EntityRef | None
    on_behalf_of: EntityRef | None
    action: str | None
    resource: EntityRef | None
    verdict: str | None
    outcome: str | None
    challenges: list[str]
    policies: list[str]
    mode: str
    would: str | None
    challenge_qid: str | None
    work_item: str | None
    assigned: bool
    risk_score: int | None
    policy_version: int | None
    principals_version: int | None
    pdp: str | None
    on_behalf_of_outcome: JSON | None = strawberry.field(
        description="The person's own part of a check an agent made for them."
    )


@strawberry.type(description="A page of decisions, oldest first, and where the next one starts.")
class DecisionPage:
    decisions: list[Decision]
    end_cursor: str | None
    has_next_page: bool
    scanned: int = strawberry.field(description="History rows this page read.")


class StatsBucket(enum.Enum):
    HOUR = "hour"
    DAY = "day"


@strawberry.type(description="One time bucket of the decision history (UTC).")
class DecisionBucket:
    at: datetime = strawberry.field(description="The bucket's start.")
    allow: int = strawberry.field(description="Checks allowed.")
    deny: int = strawberry.field(description="Checks denied.")
    challenge: int = strawberry.field(description="Checks challenged.")
    would_deny: int = strawberry.field(
        description="Monitor-mode checks and plans that enforcement would have denied."
    )
    would_challenge: int = strawberry.field(
        description="Monitor-mode checks and plans that enforcement would have challenged."
    )
    plans: int = strawberry.field(description="Query plans made.")
    events: int = strawberry.field(description="Events taken in by the intake.")


@strawberry.type(description="A principal or resource and how many of its decisions denied.")
class DeniedCount:
    entity: EntityRef
    count: int


@strawberry.type(
    description="Decisions by verdict and events per bucket, and the most denied principals "
    "and resources, over a range (docs/portal.md#the-web-app)."
)
class DecisionStats:
    buckets: list[DecisionBucket] = strawberry.field(
        description="Oldest first; only buckets with a decision or an event."
    )
    top_denied_principals: list[DeniedCount]
    top_denied_resources: list[DeniedCount]


def _stats(d: dict[str, Any]) -> DecisionStats:
    def ranked(rows: list[dict[str, Any]]) -> list[DeniedCount]:
        return [
            DeniedCount(entity=EntityRef(type=r["type"], id=r["id"]), count=int(r["count"]))
            for r in rows
        ]

    buckets = []
    for b in d["buckets"]:
        at = b["at"]
        buckets.append(
            DecisionBucket(
                at=at if isinstance(at, datetime) else datetime.fromisoformat(str(at)),
                **{
                    k: int(b[k])
                    for k in (
                        "allow",
                        "deny",
                        "challenge",
                        "would_deny",
                        "would_challenge",
                        "plans",
                        "events",
                    )
                },
            )
        )
    return DecisionStats(
        buckets=buckets,
        top_denied_principals=ranked(d["top_denied_principals"]),
        top_denied_resources=ranked(d["top_denied_resources"]),
    )


@strawberry.type(
    description="What switching a mode scope from monitor to enforce would have turned into "
    "denials over one window (docs/portal.md#the-web-app)."
)
class ModeImpact:
    hours: int = strawberry.field(description="The window: this hour and the `hours - 1` before.")
    since: datetime = strawberry.field(description="The window's first instant (a full hour).")
    until: datetime
    would_deny: int = strawberry.field(
        description="Install scope: monitor-mode checks and plans enforcement would have denied."
    )
    would_challenge: int = strawberry.field(
        description="Install scope: monitor-mode checks and plans enforcement would have "
        "challenged."
    )
    would_contain: int | None = strawberry.field(
        description="Containment scope: the reasoner's would-contains (investigations of kind "
        "`would_contain`) opened in the window; null for one who may not view investigations."
    )


@strawberry.type(
    description="An attribute path a deciding policy reads or tests with `has`, with the value "
    "svc can know (docs/portal.md#explanations)."
)
class PolicyRead:
    path: str = strawberry.field(
        description="As Cedar writes it, kept whole: `principal.department`, "
        '`resource.owner.manager`, `context.risk_score`, `Group::"admins".lead`.'
    )
    read: bool = strawberry.field(description="The policy reads the value.")
    has: bool = strawberry.field(description="The policy tests its presence with `has`.")
    lines: list[int] = strawberry.field(description="1-based lines of the policy's file.")
    status: str = strawberry.field(
        description="`value` (found), `absent` (no such attribute: `has` is false) or "
        "`unknown` (svc cannot tell; `note` says why)."
    )
    value: JSON | None = strawberry.field(
        description="The value, in Cedar's JSON (an entity is `{__entity: {type, id}}`)."
    )
    source: str | None = strawberry.field(
        description="`decision` (the decision record), `directory` (the context service "
        "now) or `bundle` (the active bundle's entities now)."
    )
    as_of: datetime | None = strawberry.field(
        description="When the value held: the decision's time for a recorded one, else when "
        "the portal read it (the current value, not the one at decision time)."
    )
    note: str | None


@strawberry.type(description="A policy that decided, as the active bundle has it.")
class DecidingPolicy:
    name: str
    file: str | None
    text: str | None = strawberry.field(description="Its source as written, annotations included.")
    effect: str | None = strawberry.field(description="`permit` or `forbid`.")
    start_line: int | None = strawberry.field(description="Its first line in `file` (1-based).")
    end_line: int | None = strawberry.field(description="Its last line in `file`.")
    entities: list[str] = strawberry.field(
        description='The entity literals it names, scope included (`Group::"admins"`).'
    )
    reads: list[PolicyRead] = strawberry.field(
        description="The attribute paths it reads, with their values."
    )


@strawberry.type(description="An audit event (docs/intake.md) that carries a decision's qid.")
class DecisionEvent:
    ingest_id: str
    at: datetime
    system: str | None
    action: str
    resource: EntityRef | None
    outcome: str | None
    tool: str | None
    attributes: JSON | None


@strawberry.type(
    description="A decision and why: its policies' text and what they read, and its challenge now."
)
class Explanation:
    decision: Decision
    policies: list[DecidingPolicy] = strawberry.field(
        description="The policies that decided the principal's check (an agent's, when it "
        "acted for a person)."
    )
    person_policies: list[DecidingPolicy] = strawberry.field(
        description="When an agent acted for a person: the policies that decided the person's "
        "own check, read with the person as `principal`; else empty."
    )
    challenge: Challenge | None
    events: list[DecisionEvent] = strawberry.field(
        description="Its principal's events within ten minutes after it that carry its qid."
    )


@strawberry.type(description="One file's difference between two bundles.")
class FileDiff:
    file: str
    change: str = strawberry.field(description="`added`, `removed` or `changed`.")
    diff: str = strawberry.field(description="A unified diff.")


@strawberry.type(description="A recorded decision the bundle decides otherwise.")
class ChangedDecision:
    qid: str
    at: datetime | None
    principal: str
    action: str
    resource: str
    recorded: str
    draft: str
    error: str


@strawberry.type(
    description="A policy test decided under a bundle (docs/policy.md#policy-tests): passed, or "
    "what it expected and what it got."
)
class TestResult:
    name: str
    passed: bool
    expected: str
    got: str = strawberry.field(description="`allow`, `deny`, `challenge`, or `error`.")
    policies: list[str] = strawberry.field(description="The deciding policies.")
    error: str | None
    notes: list[str] = strawberry.field(
        description="Snapshot entities the bundle's schema refused, left out."
    )


@strawberry.type(description="Every saved policy test decided under a bundle version.")
class TestRun:
    version: int
    passed: int
    failed: int
    results: list[TestResult]


@strawberry.type(
    description="A saved policy test: a decision's request, the entities it is decided with (a "
    "snapshot taken when saved) and the verdict expected."
)
class PolicyTest:
    name: str
    principal: EntityRef
    action: str
    resource: EntityRef
    on_behalf_of: EntityRef | None
    context: JSON
    entities: JSON = strawberry.field(description="Cedar entities (JSON entity shape).")
    contained: list[EntityRef]
    expect: str = strawberry.field(description="`allow`, `deny` or `challenge`.")
    saved_by: str
    from_decision: str | None
    created_at: datetime | None


@strawberry.type(description="A test just saved, and its result under the active bundle.")
class SavedTest:
    test: PolicyTest
    active: TestResult | None


@strawberry.type(description="A dry run's counts of changed decisions and a sample of them.")
class DryRun:
    version: int
    decisions: int
    unchanged: int
    allow_to_deny: int
    deny_to_allow: int
    to_challenge: int
    from_challenge: int
    errors: int
    truncated: bool
    sample: list[ChangedDecision]
    tests: TestRun | None = strawberry.field(
        description="Every saved policy test decided under the bundle."
    )
    entities: str = strawberry.field(
        description="What the checks were decided with: `directory` (the bundle's entities plus "
        "the context service's principals and the resources the checks name, as a decision "
        "point decides) or `bundle` (the bundle's own entities alone; `notes` say why)."
    )
    directory_version: int = strawberry.field(
        description="The principals snapshot's version when `entities` is `directory`, else 0."
    )
    notes: list[str] = strawberry.field(
        description="What the dry run could not use (no context service, resources past the cap)."
    )


@strawberry.enum(description="The gateway's tier for a tool while no decision point answers.")
class OutageTier(enum.Enum):
    UNSPECIFIED = 0
    FAIL_CLOSED = 1
    CACHED = 2
    FAIL_OPEN = 3


@strawberry.type(description="An outage tier entry (docs/policy.md#outage-fallbacks).")
class OutageFallback:
    tool: str
    tier: OutageTier
    author: str
    updated_at: datetime | None
    reason: str


@strawberry.type(description="A recorded decision decided again under a bundle.")
class WhatIf:
    qid: str
    recorded: str | None
    version: int
    verdict: str = strawberry.field(description="`allow`, `deny`, `challenge`, or `error`.")
    challenges: list[str]
    policies: list[str]
    error: str | None


# -- conversions -------------------------------------------------------------------------


def _test_result(m: Any) -> TestResult:
    return TestResult(
        name=m.name,
        passed=bool(m.passed),
        expected=m.expected,
        got=m.got,
        policies=list(m.policies),
        error=m.error or None,
        notes=list(m.notes),
    )


def _test_run(m: Any) -> TestRun:
    return TestRun(
        version=int(m.version),
        passed=int(m.passed),
        failed=int(m.failed),
        results=[_test_result(r) for r in m.results],
    )


def _policy_test(m: Any) -> PolicyTest:
    r = m.request
    return PolicyTest(
        name=m.name,
        principal=EntityRef(type=r.principal.type, id=r.principal.id),
        action=r.action,
        resource=EntityRef(type=r.resource.type, id=r.resource.id),
        on_behalf_of=_ref({"type": r.on_behalf_of.type, "id": r.on_behalf_of.id})
        if r.HasField("on_behalf_of")
        else None,
        context=whole_numbers(json_format.MessageToDict(r.context)),
        entities=cast(JSON, [whole_numbers(json_format.MessageToDict(e)) for e in m.entities]),
        contained=[EntityRef(type=c.type, id=c.id) for c in m.contained],
        expect=m.expect,
        saved_by=m.saved_by,
        from_decision=m.from_decision or None,
        created_at=_ts(m, "created_at"),
    )


def _fallback(m: Any) -> OutageFallback:
    return OutageFallback(
        tool=m.tool,
        tier=OutageTier(int(m.tier)),
        author=m.author,
        updated_at=_ts(m, "updated_at"),
        reason=m.reason,
    )


def _deciding_policy(p: dict[str, Any]) -> DecidingPolicy:
    """A deciding policy of ``PortalService.explain`` as its GraphQL type."""
    return DecidingPolicy(
        **{k: v for k, v in p.items() if k != "reads"},
        reads=[
            PolicyRead(
                **{k: v for k, v in r.items() if k != "as_of"},
                as_of=datetime.fromisoformat(r["as_of"]) if r["as_of"] else None,
            )
            for r in p["reads"]
        ],
    )


def _decision(d: dict[str, Any]) -> Decision:
    at = d["at"]
    return Decision(
        qid=d["qid"],
        at=datetime.fromisoformat(at) if isinstance(at, str) else at,
        call=d.get("call", "check"),
        principal=_ref(d.get("principal")),
        on_behalf_of=_ref(d.get("on_behalf_of")),
        action=d.get("action"),
        resource=_ref(d.get("resource")),
        verdict=d.get("verdict"),
        outcome=d.get("outcome"),
        challenges=list(d.get("challenges") or []),
        policies=list(d.get("policies") or []),
        mode=d.get("mode", ""),
        would=d.get("would"),
        challenge_qid=d.get("challenge_qid"),
        work_item=d.get("work_item"),
        assigned=bool(d.get("assigned")),
        risk_score=d.get("risk_score"),
        policy_version=d.get("policy_version"),
        principals_version=d.get("principals_version"),
        pdp=d.get("pdp"),
        on_behalf_of_outcome=d.get("on_behalf_of_outcome"),
    )


def _person(d: dict[str, Any]) -> Person:
    return Person(
        user_name=d["user_name"],
        display_name=d.get("display_name"),
        active=bool(d.get("active")),
        removed=bool(d.get("removed")),
        department=d.get("department"),
        title=d.get("title"),
        manager=d.get("manager"),
        groups=list(d.get("groups", [])),
    )


def _sa(d: dict[str, Any]) -> ServiceAccount:
    return ServiceAccount(
        id=d["id"],
        owner=d["owner"],
        ai=bool(d.get("ai")),
        groups=list(d.get("groups", [])),
        description=d.get("description", ""),
        app=d.get("app", ""),
    )


def _app(d: dict[str, Any]) -> TrustedApp:
    return TrustedApp(
        name=d["name"],
        iss=d["iss"],
        jwks_url=d["jwks_url"],
        aud=d["aud"],
        created_at=_iso(d.get("created_at")),
    )


def _investigation(d: dict[str, Any]) -> Investigation:
    return Investigation(
        id=d["id"],
        principal=d["principal"],
        reason=d["reason"],
        opened_by=d["opened_by"],
        opened_at=_iso(d.get("opened_at")),
        status=d["status"],
        closed_by=d.get("closed_by"),
        closed_at=_iso(d.get("closed_at")),
        resolution=d.get("resolution", ""),
    )


def _search(d: dict[str, Any]) -> SearchPage:
    return SearchPage(
        results=[r for r in (_ref(x) for x in d.get("results", [])) if r is not None],
        next_token=d.get("next_token"),
        decision_qid=d.get("qid"),
    )


def _containment(m: Any) -> Containment:
    return Containment(
        principal=_ref(m.principal) or EntityRef(type="", id=""),
        reason=m.reason,
        author=m.author,
        contained_at=_ts(m, "contained_at"),
    )


def _challenge(m: Any) -> Challenge:
    return Challenge(
        qid=m.qid,
        state=ChallengeState(int(m.state)),
        principal=_ref(m.principal),
        on_behalf_of=_ref(m.on_behalf_of) if m.HasField("on_behalf_of") else None,
        action=m.action,
        resource=_ref(m.resource),
        kinds=list(m.kinds),
        satisfied=list(m.satisfied),
        person=m.person,
        approver=m.approver,
        decision_qid=m.decision_qid,
        created_at=_ts(m, "created_at"),
        expires_at=_ts(m, "expires_at"),
        grant_expires_at=_ts(m, "grant_expires_at"),
        decided_by=m.decided_by,
        justification=m.justification,
        reason=m.reason,
    )


def _key(m: Any) -> SecurityKey:
    return SecurityKey(
        credential_id=m.credential_id,
        person=m.person,
        name=m.name,
        sign_count=int(m.sign_count),
        created_at=_ts(m, "created_at"),
        last_used_at=_ts(m, "last_used_at"),
    )


def _bundle(m: Any) -> Bundle:
    return Bundle(
        version=int(m.version),
        state=BundleState(int(m.state)),
        author=m.author,
        comment=m.comment,
        created_at=_ts(m, "created_at"),
        published_at=_ts(m, "published_at"),
        digest=m.digest,
        policies=list(m.policies),
        warnings=list(m.warnings),
        files=[BundleFile(name=f.name, content=f.content) for f in m.files],
    )


def _enforcement(m: Any) -> Enforcement:
    return Enforcement(mode=Mode(int(m.mode)), containment_mode=Mode(int(m.containment_mode)))


def _change(m: Any) -> EnforcementChange:
    return EnforcementChange(
        id=int(m.id),
        at=_ts(m, "at"),
        author=m.author,
        containment=int(m.scope) == 2,
        from_mode=Mode(int(m.from_mode)),
        to_mode=Mode(int(m.to_mode)),
        reason=m.reason,
    )


# -- the schema ---------------------------------------------------------------------------


@strawberry.type(description="Queries; each is checked as `view` on its portal area.")
class Query:
    @strawberry.field(description="The signed-in person (no check).")
    def me(self, info: Info[Context, None]) -> Me:
        s = info.context.session
        return Me(user=s.user, expires_at=datetime.fromtimestamp(s.expires_at, UTC))

    @strawberry.field(
        description="What the signed-in person may do in each portal area (the web app shows "
        "or disables its controls by it); every area is checked as `view` and `administer`."
    )
    async def access(self, info: Info[Context, None]) -> list[AreaAccess]:
        svc, person = info.context.service, info.context.person

        def check(action: Any, area: Any, own: bool = False) -> str | None:
            try:
                svc.authorize(person, action, area, own=own)
            except Denied as e:
                return e.detail
            return None

        def all_areas() -> list[AreaAccess]:
            out = []
            for area in AREAS:
                view, admin = check("view", area), check("administer", area)
                own = area in ("challenges", "keys") and check("administer", area, True) is None
                out.append(
                    AreaAccess(
                        area=area,
                        view=view is None,
                        administer=admin is None,
                        own=own,
                        view_reason=view,
                        administer_reason=admin,
                    )
                )
            return out

        try:
            return await anyio.to_thread.run_sync(all_areas)
        except Problem as p:
            code = p.slug.upper().replace("-", "_")
            raise GraphQLError(p.detail, extensions={"code": code, "status": p.status}) from None

    @strawberry.field(
        description="Searches the decision history, oldest first: one principal's or one "
        "resource's decisions (at most one of the two), or, naming neither, those matching at "
        "least one other filter; with cursor paging (`after`: the previous page's "
        "`endCursor`). Area `decisions`."
    )
    async def decisions(
        self,
        info: Info[Context, None],
        principal: EntityRefInput | None = None,
        resource: EntityRefInput | None = None,
        action: str | None = None,
        verdict: str | None = None,
        policy: str | None = None,
        mode: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        first: int = 50,
        after: str | None = None,
    ) -> DecisionPage:
        svc = info.context.service

        def run(person: str) -> dict[str, Any]:
            return svc.decisions(
                person,
                principal=principal.as_dict() if principal else None,
                resource=resource.as_dict() if resource else None,
                action=action,
                verdict=verdict,
                policy=policy,
                mode=mode,
                since=_aware(since),
                until=_aware(until),
                first=first,
                after=after,
            )

        out = await _call(info, run)
        return DecisionPage(
            decisions=[_decision(d) for d in out["decisions"]],
            end_cursor=out["end_cursor"],
            has_next_page=out["has_next_page"],
            scanned=out["scanned"],
        )

    @strawberry.field(
        description="Decisions by verdict and events per bucket, and the `top` most denied "
        "principals and resources, over `[since, until)` (default the last day). One aggregate "
        "in the history. Area `decisions`."
    )
    async def decision_stats(
        self,
        info: Info[Context, None],
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: StatsBucket = StatsBucket.HOUR,
        top: int = 5,
    ) -> DecisionStats:
        svc = info.context.service

        def run(person: str) -> dict[str, Any]:
            return svc.decision_stats(
                person, since=_aware(since), until=_aware(until), bucket=bucket.value, top=top
            )

        return _stats(await _call(info, run))

    @strawberry.field(
        description="A decision and why: the policies that decided with their text and what "
        "they read, and the challenge it opened. Area `decisions`."
    )
    async def explain_decision(self, info: Info[Context, None], qid: str) -> Explanation | None:
        out = await _call(info, info.context.service.explain, qid)
        if out is None:
            return None
        return Explanation(
            decision=_decision(out["decision"]),
            policies=[_deciding_policy(p) for p in out["policies"]],
            person_policies=[_deciding_policy(p) for p in out["person_policies"]],
            challenge=_challenge(out["challenge"]) if out["challenge"] is not None else None,
            events=[
                DecisionEvent(
                    ingest_id=e["ingest_id"],
                    at=datetime.fromisoformat(e["at"]) if isinstance(e["at"], str) else e["at"],
                    system=e.get("system"),
                    action=e["action"],
                    resource=_ref(e.get("resource")),
                    outcome=e.get("outcome"),
                    tool=e.get("tool"),
                    attributes=e.get("attributes"),
                )
                for e in out["events"]
            ],
        )

    @strawberry.field(
        description="Decides a recorded decision again under a bundle version (default the "
        "active one), with the bundle's entities and the directory's current records of its "
        "principal, person and resource, as dry runs do. Areas `decisions` and `policies`."
    )
    async def what_if(
        self, info: Info[Context, None], qid: str, version: int | None = None
    ) -> WhatIf | None:
        out = await _call(info, info.context.service.redecide, qid, version)
        return WhatIf(**out) if out is not None else None

    @strawberry.field(
        description="A question answered by the model with the portal's read-only operations, "
        "each made as the signed-in person. Area `assistant`."
    )
    async def ask(self, info: Info[Context, None], question: str) -> AssistantAnswer:
        assistant = Assistant(info.context.service.settings, info.context.service)
        out = await _call(info, assistant.ask, question)
        return AssistantAnswer(
            answer=out["answer"], steps=[AssistantStep(**x) for x in out["steps"]]
        )

    @strawberry.field(description="The directory's people. Area `directory`.")
    async def people(
        self, info: Info[Context, None], include_removed: bool = False
    ) -> list[Person]:
        rows = await _call(info, info.context.service.people, include_removed)
        return [_person(r) for r in rows]

    @strawberry.field(description="Registered service accounts (of one app). Area `directory`.")
    async def service_accounts(
        self, info: Info[Context, None], app: str | None = None
    ) -> list[ServiceAccount]:
        rows = await _call(info, info.context.service.service_accounts, app)
        return [_sa(r) for r in rows]

    @strawberry.field(description="Apps trusted to sign agent tokens. Area `directory`.")
    async def trusted_apps(self, info: Info[Context, None]) -> list[TrustedApp]:
        rows = await _call(info, info.context.service.trusted_apps)
        return [_app(r) for r in rows]

    @strawberry.field(
        description="Risk scores with their factors, highest first. Area `directory`."
    )
    async def risk_scores(
        self, info: Info[Context, None], min_score: int = 0, first: int = 50
    ) -> list[RiskScore]:
        rows = await _call(info, info.context.service.risk_scores, min_score, first)
        return [
            RiskScore(
                principal=_ref(r["principal"]) or EntityRef(type="", id=""),
                score=r["score"],
                reason=r.get("reason", ""),
                factors=cast(JSON, r.get("factors") or []),
                details=cast(JSON, r.get("details") or {}),
                updated_at=_iso(r.get("updated_at")),
            )
            for r in rows
        ]

    @strawberry.field(
        description="A principal's risk score per UTC day over the last `days` (default 30), "
        "oldest first, from the context service's per-day history "
        "(docs/context.md#risk-scores). Area `directory`."
    )
    async def risk_history(
        self, info: Info[Context, None], principal: EntityRefInput, days: int = 30
    ) -> list[RiskDay]:
        out = await _call(info, info.context.service.risk_history, principal.as_dict(), days)
        return [RiskDay(**d) for d in out["days"]]

    @strawberry.field(description="Investigations, newest first. Area `investigations`.")
    async def investigations(
        self, info: Info[Context, None], status: str | None = None
    ) -> list[Investigation]:
        rows = await _call(info, info.context.service.investigations, status)
        return [_investigation(r) for r in rows]

    @strawberry.field(
        description="Which principals of a type may take an action on a resource (AuthZEN "
        "subject search). Area `policies`."
    )
    async def who_can(
        self,
        info: Info[Context, None],
        action: str,
        resource: EntityRefInput,
        principal_type: str = "Human",
        first: int = 50,
    ) -> SearchPage:
        out = await _call(
            info, info.context.service.who_can, action, resource.as_dict(), principal_type, first
        )
        return _search(out)

    @strawberry.field(
        description="Which resources of a type a principal may take an action on (AuthZEN "
        "resource search). Area `policies`."
    )
    async def reachable(
        self,
        info: Info[Context, None],
        principal: EntityRefInput,
        action: str,
        resource_type: str,
        first: int = 50,
    ) -> SearchPage:
        out = await _call(
            info, info.context.service.reachable, principal.as_dict(), action, resource_type, first
        )
        return _search(out)

    @strawberry.field(description="Every contained principal. Area `containments`.")
    async def containments(self, info: Info[Context, None]) -> list[Containment]:
        rows = await _call(info, info.context.service.containments)
        return [_containment(m) for m in rows]

    @strawberry.field(
        description="Challenges, newest first: with `mine`, those the signed-in person answers "
        "or approves (checked with `context.own`); with `principal`, only those of that "
        "principal's requests. Area `challenges`."
    )
    async def challenges(
        self,
        info: Info[Context, None],
        mine: bool = True,
        state: ChallengeState = ChallengeState.ANY,
        first: int = 50,
        principal: EntityRefInput | None = None,
    ) -> list[Challenge]:
        svc = info.context.service
        of = principal.as_dict() if principal is not None else None

        def run(person: str) -> list[Any]:
            return svc.challenges(person, mine=mine, state=state.value, first=first, principal=of)

        rows = await _call(info, run)
        return [_challenge(m) for m in rows]

    @strawberry.field(
        description="A person's security keys (default the signed-in person's own, checked "
        "with `context.own`). Area `keys`."
    )
    async def security_keys(
        self, info: Info[Context, None], person: str | None = None
    ) -> list[SecurityKey]:
        rows = await _call(info, info.context.service.security_keys, person)
        return [_key(m) for m in rows]

    @strawberry.field(description="Bundle versions, newest first, without files. Area `policies`.")
    async def bundles(self, info: Info[Context, None], first: int = 50) -> list[Bundle]:
        rows = await _call(info, info.context.service.bundles, first)
        return [_bundle(m) for m in rows]

    @strawberry.field(
        description="One bundle with its files; the active one without `version`. Area `policies`."
    )
    async def bundle(self, info: Info[Context, None], version: int | None = None) -> Bundle | None:
        m = await _call(info, info.context.service.bundle, version)
        return _bundle(m) if m is not None else None

    @strawberry.field(
        description="A bundle's difference from another (default: the active one), file by "
        "file. Area `policies`."
    )
    async def bundle_diff(
        self, info: Info[Context, None], version: int, against: int | None = None
    ) -> list[FileDiff]:
        rows = await _call(info, info.context.service.bundle_diff, version, against)
        return [FileDiff(**r) for r in rows]

    @strawberry.field(
        description="Decides the recorded checks of a time range again under a bundle version "
        "(the policy service's dry run). Area `policies`."
    )
    async def dry_run(
        self,
        info: Info[Context, None],
        version: int,
        since: datetime,
        until: datetime | None = None,
        sample: int = 20,
    ) -> DryRun:
        m = await _call(
            info, info.context.service.dry_run, version, _aware(since), _aware(until), sample
        )
        return DryRun(
            version=int(m.version),
            decisions=int(m.decisions),
            unchanged=int(m.unchanged),
            allow_to_deny=int(m.allow_to_deny),
            deny_to_allow=int(m.deny_to_allow),
            to_challenge=int(m.to_challenge),
            from_challenge=int(m.from_challenge),
            errors=int(m.errors),
            truncated=bool(m.truncated),
            sample=[
                ChangedDecision(
                    qid=c.qid,
                    at=_ts(c, "at"),
                    principal=c.principal,
                    action=c.action,
                    resource=c.resource,
                    recorded=c.recorded,
                    draft=c.draft,
                    error=c.error,
                )
                for c in m.sample
            ],
            tests=_test_run(m.tests) if m.HasField("tests") else None,
            entities=m.entities or "bundle",
            directory_version=int(m.directory_version),
            notes=list(m.notes),
        )

    @strawberry.field(description="Every saved policy test, by name. Area `policies`.")
    async def policy_tests(self, info: Info[Context, None]) -> list[PolicyTest]:
        rows = await _call(info, info.context.service.policy_tests)
        return [_policy_test(m) for m in rows]

    @strawberry.field(
        description="Every saved policy test decided under a bundle version (0: the active "
        "one). Area `policies`."
    )
    async def run_policy_tests(self, info: Info[Context, None], version: int = 0) -> TestRun:
        return _test_run(await _call(info, info.context.service.run_policy_tests, version))

    @strawberry.field(description="The gateway's outage tiers. Area `enforcement`.")
    async def outage_fallbacks(self, info: Info[Context, None]) -> list[OutageFallback]:
        rows = await _call(info, info.context.service.outage_fallbacks)
        return [_fallback(m) for m in rows]

    @strawberry.field(description="The enforcement modes. Area `enforcement`.")
    async def enforcement(self, info: Info[Context, None]) -> Enforcement:
        return _enforcement(await _call(info, info.context.service.enforcement))

    @strawberry.field(
        description="Per window of the last `hours` (default 24 and 168): the decisions monitor "
        "mode recorded as would-deny or would-challenge and the reasoner's would-contains, what "
        "switching to enforce would have turned into denials or containments. Areas "
        "`enforcement` and `decisions` (and `investigations` for the would-contains)."
    )
    async def enforcement_impact(
        self, info: Info[Context, None], hours: list[int] | None = None
    ) -> list[ModeImpact]:
        rows = await _call(info, info.context.service.enforcement_impact, tuple(hours or (24, 168)))
        return [ModeImpact(**r) for r in rows]

    @strawberry.field(description="The modes' change log, newest first. Area `enforcement`.")
    async def enforcement_changes(
        self, info: Info[Context, None], first: int = 50
    ) -> list[EnforcementChange]:
        rows = await _call(info, info.context.service.enforcement_changes, first)
        return [_change(m) for m in rows]


@strawberry.type(description="Mutations; each is checked as `administer` on its portal area.")
class Mutation:
    @strawberry.mutation(description="Trusts (or changes) an app. Area `directory`.")
    async def trust_app(self, info: Info[Context, None], app: TrustedAppInput) -> TrustedApp:
        body = {"name": app.name, "iss": app.iss, "jwks_url": app.jwks_url, "aud": app.aud}
        return _app(await _call(info, info.context.service.trust_app, body))

    @strawberry.mutation(
        description="Stops trusting an app; false when it was not. Area `directory`."
    )
    async def untrust_app(self, info: Info[Context, None], name: str) -> bool:
        return bool(await _call(info, info.context.service.untrust_app, name))

    @strawberry.mutation(description="Closes an investigation. Area `investigations`.")
    async def close_investigation(
        self, info: Info[Context, None], id: str, resolution: str = ""
    ) -> Investigation:
        out = await _call(info, info.context.service.close_investigation, id, resolution)
        return _investigation(out)

    @strawberry.mutation(
        description="Contains a principal: every decision point denies it (`svc:contained`). "
        "Area `containments`."
    )
    async def contain(
        self, info: Info[Context, None], principal: EntityRefInput, reason: str
    ) -> ContainResult:
        m, changed = await _call(info, info.context.service.contain, principal.as_dict(), reason)
        return ContainResult(containment=_containment(m), changed=changed)

    @strawberry.mutation(
        description="Lifts a containment; false when there was none. Area `containments`."
    )
    async def lift(
        self, info: Info[Context, None], principal: EntityRefInput, reason: str = ""
    ) -> bool:
        return bool(await _call(info, info.context.service.lift, principal.as_dict(), reason))

    @strawberry.mutation(
        description="Approves or rejects a challenge as its approver (the signed-in person; "
        "checked with `context.own`). Area `challenges`."
    )
    async def decide_challenge(
        self, info: Info[Context, None], qid: str, approve: bool, reason: str = ""
    ) -> Challenge:
        return _challenge(await _call(info, info.context.service.decide, qid, approve, reason))

    @strawberry.mutation(
        description="Removes one of the signed-in person's security keys. Area `keys`."
    )
    async def remove_security_key(self, info: Info[Context, None], credential_id: str) -> bool:
        await _call(info, info.context.service.remove_security_key, credential_id)
        return True

    @strawberry.mutation(
        description="Removes every security key of a person (a lost key); answers how many. "
        "Area `keys`."
    )
    async def reset_security_keys(self, info: Info[Context, None], person: str, reason: str) -> int:
        return int(await _call(info, info.context.service.reset_security_keys, person, reason))

    @strawberry.mutation(
        description="Validates files and stores them as a draft; a refused draft answers every "
        "problem by file, line and column. Area `policies`."
    )
    async def create_draft(
        self, info: Info[Context, None], files: list[BundleFileInput], comment: str = ""
    ) -> DraftResult:
        pairs = [(f.name, f.content) for f in files]
        bundle, problems = await _call(info, info.context.service.create_draft, pairs, comment)
        return DraftResult(
            bundle=_bundle(bundle) if bundle is not None else None,
            problems=[DraftProblem(field=p["field"], message=p["message"]) for p in problems],
        )

    @strawberry.mutation(
        description="Signs and activates a bundle version once its policy tests pass; a failing "
        "test refuses it (`FAILED_PRECONDITION`, a field `tests[<name>]` per test) unless named "
        "in `acceptFailingTests`, which the publish records. Area `policies`."
    )
    async def publish_bundle(
        self,
        info: Info[Context, None],
        version: int,
        accept_failing_tests: list[str] | None = None,
    ) -> Bundle:
        return _bundle(
            await _call(info, info.context.service.publish, version, accept_failing_tests or [])
        )

    @strawberry.mutation(
        description="Saves a recorded decision as a policy test: its request, a snapshot of the "
        "entities that decide it, and its verdict (or `expect`: allow, deny, challenge) as the "
        "one expected. Every dry run and publish decides it again. Area `policies`."
    )
    async def save_decision_as_test(
        self, info: Info[Context, None], qid: str, name: str, expect: str | None = None
    ) -> SavedTest:
        m = await _call(info, info.context.service.save_decision_as_test, qid, name, expect)
        return SavedTest(
            test=_policy_test(m.test),
            active=_test_result(m.active) if m.HasField("active") else None,
        )

    @strawberry.mutation(description="Deletes a policy test. Area `policies`.")
    async def delete_policy_test(self, info: Info[Context, None], name: str) -> bool:
        return await _call(info, info.context.service.delete_policy_test, name)

    @strawberry.mutation(
        description="Sets a tool's outage tier (`<upstream>/<tool>`, `<upstream>/*` or `*`). "
        "Area `enforcement`."
    )
    async def set_outage_fallback(
        self, info: Info[Context, None], tool: str, tier: OutageTier, reason: str = ""
    ) -> OutageFallback:
        m = await _call(info, info.context.service.set_outage_fallback, tool, tier.value, reason)
        return _fallback(m)

    @strawberry.mutation(
        description="Sets the install's mode, or with `containment` the mode of automated "
        "containments. Area `enforcement`."
    )
    async def set_enforcement(
        self, info: Info[Context, None], mode: Mode, reason: str = "", containment: bool = False
    ) -> Enforcement:
        out = await _call(
            info, info.context.service.set_enforcement, containment, mode.value, reason
        )
        return _enforcement(out)


@strawberry.type(description="A tool call the assistant made (as the signed-in person).")
class AssistantStep:
    tool: str
    arguments: JSON
    ok: bool


@strawberry.type(description="The assistant's answer and the tool calls made for it.")
class AssistantAnswer:
    answer: str
    steps: list[AssistantStep]


@strawberry.type(description="A containment as it changes: `contained` false when lifted.")
class ContainmentEvent:
    contained: bool
    containment: Containment


async def _stream(info: Info[Context, None], agen: AsyncIterator[T]) -> AsyncIterator[T]:
    """A service stream with its refusals as GraphQL errors (as ``_call``)."""
    try:
        async for item in agen:
            yield item
    except Denied as e:
        raise GraphQLError(e.detail, extensions=e.extensions()) from None
    except Problem as p:
        code = p.slug.upper().replace("-", "_")
        raise GraphQLError(p.detail, extensions={"code": code, "status": p.status}) from None


@strawberry.type(
    description="Subscriptions (graphql-transport-ws only); each is checked as `view` when it "
    "starts."
)
class Subscription:
    @strawberry.subscription(
        description="Every containment, then each contain and lift as it happens. Area "
        "`containments`."
    )
    async def containment_changes(
        self, info: Info[Context, None]
    ) -> AsyncIterator[ContainmentEvent]:
        svc, person = info.context.service, info.context.person
        async for contained, m in _stream(info, svc.watch_containments(person)):
            yield ContainmentEvent(contained=contained, containment=_containment(m))

    @strawberry.subscription(
        description="The signed-in person's challenges as they open and change (checked with "
        "`context.own`). Area `challenges`."
    )
    async def my_challenges(self, info: Info[Context, None]) -> AsyncIterator[Challenge]:
        svc, person = info.context.service, info.context.person
        async for m in _stream(info, svc.watch_my_challenges(person)):
            yield _challenge(m)

    @strawberry.subscription(
        description="The challenges queue, live: every challenge (the newest 1,000), then each "
        "that opens or changes state. With `mine` only those the signed-in person answers or "
        "approves (checked with `context.own`), else everyone's. Area `challenges`."
    )
    async def challenge_changes(
        self, info: Info[Context, None], mine: bool = True
    ) -> AsyncIterator[Challenge]:
        svc, person = info.context.service, info.context.person
        async for m in _stream(info, svc.watch_challenges(person, mine=mine)):
            yield _challenge(m)


def _mask(error: GraphQLError) -> bool:
    """Masks errors that are not the portal's own (an exception a resolver did not expect)."""
    return error.original_error is not None and not isinstance(error.original_error, GraphQLError)


def make_schema(
    settings: PortalSettings, operations: PersistedOperations | None = None
) -> strawberry.Schema:
    """The schema with the limits of `settings` (module docs).

    Args:
        settings: ``max_query_depth``, ``max_aliases``, ``max_tokens``, ``dev``.
        operations: the web app's persisted operations; when given, only they run (unless
            they allow any), on HTTP and on the websocket (``svc.portal.webapp``).

    Returns:
        The strawberry schema.

    """
    # Factories: strawberry makes a fresh extension for each request.
    extensions: list[Any] = [
        lambda: QueryDepthLimiter(max_depth=settings.max_query_depth),
        lambda: MaxAliasesLimiter(max_alias_count=settings.max_aliases),
        lambda: MaxTokensLimiter(max_token_count=settings.max_tokens),
        lambda: MaskErrors(should_mask_error=_mask),
    ]
    if not settings.dev:
        extensions.append(DisableIntrospection)
    if operations is not None and not operations.allow_any:
        extensions.insert(0, persisted_only(operations))
    return strawberry.Schema(
        query=Query, mutation=Mutation, subscription=Subscription, extensions=extensions
    )


def schema_sdl() -> str:
    """The schema's SDL, as ``schema.graphql`` holds it (limits do not change it)."""
    schema = strawberry.Schema(query=Query, mutation=Mutation, subscription=Subscription)
    return schema.as_str() + "\n"
