"""The challenge service's logic, free of any transport (docs/challenges.md).

``ChallengeService`` keeps challenges, containments, security keys, WebAuthn ceremonies and the
notification outbox in its relational database (``svc.challenge.models``, migrated on start):

* ``resolve`` opens or finds the challenge of a request's fingerprint (``fingerprint``: principal,
  on_behalf_of, action, resource and the challenge kinds; the decision's qid is recorded, not part
  of it, so an agent's retry of the same request, which has a new qid, finds the challenge it
  passed); who answers comes from a ``Directory`` (docs/challenges.md#who-answers);
* ``justify``, ``decide`` and ``finish_verification`` answer a challenge's kinds; once every kind
  is answered it passes and its fingerprint is allowed until ``grant_expires_at``; a rejection
  denies it until ``expires_at``; expiry is read from the stored times (``effective_state``), so
  no sweeper is needed;
* security keys are registered and asserted with py_webauthn (WebAuthn Level 3,
  <https://www.w3.org/TR/webauthn-3/>), user verification required and the sign counter checked;
* ``contain`` and ``lift`` keep the containment list every decision point follows;
* every challenge change writes its notification to the outbox in the same transaction
  (``svc.challenge.notify`` sends them).

Errors are ``ChallengeError`` with a gRPC-style ``code`` the transport maps
(docs/architecture.md#identifiers-and-errors), naming the bad fields in ``violations``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import uuid_utils
import webauthn
from sqlalchemy import Engine as SqlEngine
from sqlalchemy import create_engine, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select
from webauthn.helpers import bytes_to_base64url
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from svc.challenge.directory import Directory, DirectoryUnavailable, StaticDirectory
from svc.challenge.links import LinkClaims, LinkTokens
from svc.challenge.migrate import migrate
from svc.challenge.models import (
    CeremonyRow,
    ChallengeRow,
    ContainmentEventRow,
    ContainmentRow,
    KeyResetRow,
    LinkUseRow,
    OutboxRow,
    SecurityKeyRow,
)
from svc.challenge.pdp_client import ApproverCheck, PdpUnavailable, token_file_reader
from svc.challenge.settings import ChallengeSettings
from svc.common.errors import ServiceError, Subscribers, Violation
from svc.common.files import private_sqlite

__all__ = [
    "KINDS",
    "STATES",
    "ChallengeError",
    "ChallengeInfo",
    "ChallengeService",
    "Containment",
    "KeyChange",
    "Ref",
    "SecurityKey",
    "Violation",
    "effective_state",
    "fingerprint",
    "link_recipient",
]

log = logging.getLogger("svc.challenge")

#: The challenge kinds a policy may name (docs/bundles.md#step-up-policies).
KINDS = ("approval", "justification", "verification")
#: The states a challenge reads as (docs/challenges.md#states).
STATES = ("pending", "passed", "rejected", "expired")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: Control characters free text (a justification, a reason) may not hold: tab and line breaks
#: may stay.
_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_MAX_LIST = 1000


class ChallengeError(ServiceError):
    """A refused operation.

    ``code`` is the gRPC status the transport answers (https://grpc.io/docs/guides/status-codes/);
    ``violations`` names every bad field (a ``google.rpc.BadRequest`` on the wire).
    """


@dataclass(frozen=True)
class Ref:
    """An entity reference ``{type, id}`` (docs/architecture.md#entities-and-the-base-schema)."""

    type: str
    id: str

    def __str__(self) -> str:
        """Cedar's form, ``Type::"id"``."""
        return f"{self.type}::{json.dumps(self.id)}"


@dataclass(frozen=True)
class ChallengeInfo:
    """A challenge as callers see it; ``state`` is the effective one (``effective_state``)."""

    qid: str
    state: str
    principal: Ref
    on_behalf_of: Ref | None
    action: str
    resource: Ref
    kinds: list[str]
    satisfied: list[str]
    fingerprint: str
    decision_qid: str
    last_decision_qid: str
    person: str
    approver: str
    created_at: datetime
    expires_at: datetime
    grant_expires_at: datetime | None
    decided_at: datetime | None
    decided_by: str
    justification: str
    reason: str
    version: int


@dataclass(frozen=True)
class Containment:
    """A contained principal with the reason and author of its containment."""

    principal: Ref
    reason: str
    author: str
    contained_at: datetime


@dataclass(frozen=True)
class KeyChange:
    """A started key change: the ceremony and the two WebAuthn options (JSON) it needs."""

    ceremony_id: str
    assertion_options_json: str
    options_json: str


@dataclass(frozen=True)
class SecurityKey:
    """A registered WebAuthn credential of a person (``credential_id`` in base64url)."""

    credential_id: str
    person: str
    name: str
    sign_count: int
    created_at: datetime
    last_used_at: datetime | None


def _utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _must_utc(t: datetime) -> datetime:
    out = _utc(t)
    assert out is not None
    return out


def fingerprint(
    principal: Ref, on_behalf_of: Ref | None, action: str, resource: Ref, kinds: Sequence[str]
) -> str:
    """The identity of a request's challenge (docs/challenges.md#fingerprint).

    Args:
        principal: who asks.
        on_behalf_of: the person an agent acts for, or None.
        action: the action's id.
        resource: what it asks for.
        kinds: the challenge kinds the verdict named (order and repeats do not matter).

    Returns:
        Hex SHA-256 of the canonical JSON array ``[principal, on_behalf_of, action, resource,
        sorted kinds]`` (entities as ``[type, id]``, on_behalf_of ``null`` when absent). The
        decision's qid is not part of it: a retry of the same request is the same fingerprint.

    """
    canonical = json.dumps(
        [
            [principal.type, principal.id],
            [on_behalf_of.type, on_behalf_of.id] if on_behalf_of else None,
            action,
            [resource.type, resource.id],
            sorted(set(kinds)),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def link_recipient(kinds: Sequence[str], person: str, approver: str, event: str) -> str:
    """Who a notification of ``event`` addresses, and so whose link token it carries.

    ``forwarded`` goes to the approver, and so does ``opened`` of a challenge whose only kind is
    ``approval`` (the person has nothing to answer); every other event goes to the person
    (docs/challenges.md#link-tokens).
    """
    if event == "forwarded" or (event == "opened" and set(kinds) == {"approval"}):
        return approver
    return person


def effective_state(row: ChallengeRow, now: datetime) -> str:
    """The state a stored challenge reads as at ``now``.

    ``pending`` past ``expires_at`` is ``expired``; every other stored state stands (a passed
    challenge whose grant has run out stays ``passed``, with ``grant_expires_at`` in the past).
    """
    if row.state == "pending" and now >= _must_utc(row.expires_at):
        return "expired"
    return row.state


def _info(row: ChallengeRow, now: datetime) -> ChallengeInfo:
    obo = Ref(row.obo_type, row.obo_id) if row.obo_type and row.obo_id is not None else None
    return ChallengeInfo(
        qid=row.qid,
        state=effective_state(row, now),
        principal=Ref(row.principal_type, row.principal_id),
        on_behalf_of=obo,
        action=row.action,
        resource=Ref(row.resource_type, row.resource_id),
        kinds=list(row.kinds),
        satisfied=list(row.satisfied),
        fingerprint=row.fingerprint,
        decision_qid=row.decision_qid,
        last_decision_qid=row.last_decision_qid,
        person=row.person,
        approver=row.approver,
        created_at=_must_utc(row.created_at),
        expires_at=_must_utc(row.expires_at),
        grant_expires_at=_utc(row.grant_expires_at),
        decided_at=_utc(row.decided_at),
        decided_by=row.decided_by,
        justification=row.justification,
        reason=row.reason,
        version=row.version,
    )


def _containment(row: ContainmentRow) -> Containment:
    return Containment(
        Ref(row.principal_type, row.principal_id),
        row.reason,
        row.author,
        _must_utc(row.contained_at),
    )


def _key(row: SecurityKeyRow) -> SecurityKey:
    return SecurityKey(
        credential_id=row.credential_id,
        person=row.person,
        name=row.name,
        sign_count=row.sign_count,
        created_at=_must_utc(row.created_at),
        last_used_at=_utc(row.last_used_at),
    )


def _check_text(value: str, name: str, bad: list[Violation], limit: int = 512) -> None:
    if not value or not value.strip():
        bad.append(Violation(name, "required"))
    elif len(value) > limit:
        bad.append(Violation(name, f"longer than {limit} characters"))
    elif _CONTROL.search(value):
        bad.append(Violation(name, "holds control characters"))


def _check_ref(ref: Ref | None, name: str, bad: list[Violation]) -> None:
    if ref is None:
        bad.append(Violation(name, "required"))
        return
    _check_text(ref.type, f"{name}.type", bad, 256)
    _check_text(ref.id, f"{name}.id", bad, 512)


def _findable(value: str, limit: int) -> bool:
    """Whether ``value`` can name a stored row: 1 to ``limit`` characters, no control ones."""
    return bool(value) and len(value) <= limit and not _CONTROL.search(value)


def _check_free_text(value: str, name: str, limit: int, bad: list[Violation]) -> None:
    if len(value) > limit:
        bad.append(Violation(name, f"longer than {limit} characters"))
    elif _TEXT_CONTROL.search(value):
        bad.append(Violation(name, "holds control characters"))


def _refuse(bad: list[Violation], message: str = "bad request") -> None:
    if bad:
        raise ChallengeError(
            "invalid_argument", f"{message}: {bad[0].field}: {bad[0].description}", bad
        )


def _base_type(entity_type: str) -> str:
    """``Acme::Human`` -> ``Human`` (docs/architecture.md#entities-and-the-base-schema)."""
    return entity_type.rsplit("::", 1)[-1]


def _lone_agent(principal: Ref, on_behalf_of: Ref | None) -> bool:
    """Whether the principal is a service account acting alone (its owner answers)."""
    return on_behalf_of is None and _base_type(principal.type) == "ServiceAccount"


def _user_handle(person: str) -> bytes:
    """The WebAuthn user handle of a person: SHA-256 of ``svc-person:<user name>``.

    Stable, 32 bytes (the most WebAuthn allows is 64) and no user name in the clear
    (WebAuthn Level 3, section 14.6.1).
    """
    return hashlib.sha256(f"svc-person:{person}".encode()).digest()


class ChallengeService:
    """The challenge service (docs/challenges.md): one per process, safe to call from threads.

    Args:
        settings: the service's settings.
        db: a SQLAlchemy engine to use instead of ``settings.database_url`` (tests).
        directory: who answers (owners, managers); default: a ``ContextDirectory`` over
            ``settings.context_url`` when set, else an empty ``StaticDirectory``.
        clock: the current time, aware UTC (tests of expiry inject their own).
        approvers: the decision point asked whether an approver may ``approve``
            (``svc.challenge.pdp_client``); default: an ``ApproverCheck`` over
            ``settings.pdp_url`` (token from ``pdp_token_file``) when set, else none (approvers
            are not checked).
        audit: called with one intake event when a challenge is rejected, found expired, or
            its verification fails (docs/reasoner.md#challenges-that-failed); None: no such
            events (``serve`` sets an ``IntakeSender``'s when ``settings.intake_url`` is set).

    On construction the database is migrated (``svc.challenge.migrate``).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or migrated.

    """

    def __init__(
        self,
        settings: ChallengeSettings,
        db: SqlEngine | None = None,
        directory: Directory | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        approvers: ApproverCheck | None = None,
        audit: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.audit = audit
        self.clock = clock
        if db is None:
            connect_args = (
                {"check_same_thread": False} if settings.database_url.startswith("sqlite") else {}
            )
            private_sqlite(settings.database_url)  # 0600 in 0700 (svc.common.files)
            db = create_engine(settings.database_url, connect_args=connect_args, pool_pre_ping=True)
        self.db = db
        self.revision = migrate(db)
        if directory is None:
            directory = self._default_directory()
        self.directory = directory
        if approvers is None and settings.pdp_url:
            approvers = ApproverCheck(settings.pdp_url, token_file_reader(settings.pdp_token_file))
        self.approvers = approvers
        self.links = LinkTokens.from_file(settings.link_key_file, settings.link_ttl_secs)
        self._subscribers = Subscribers()

    def _default_directory(self) -> Directory:
        url = self.settings.context_url
        if not url:
            return StaticDirectory()
        from pathlib import Path

        from svc.challenge.directory import ContextDirectory

        token_file = self.settings.context_token_file

        def token() -> str | None:
            if not token_file:
                return None
            try:
                return Path(token_file).read_text(encoding="utf-8").strip() or None
            except OSError as e:
                log.error("cannot read the context token file %s: %s", token_file, e)
                return None

        return ContextDirectory(url, token)

    # -- subscribers

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback()`` after every change (challenge, containment, outbox row).

        The callback runs in the changing thread; returns the function that unsubscribes it.
        """
        return self._subscribers.subscribe(callback)

    def _notify(self) -> None:
        self._subscribers.notify()

    def _outcome_event(self, row: ChallengeRow, action: str, at: datetime) -> dict[str, Any]:
        """The intake event telling how `row` ended (docs/reasoner.md#challenges-that-failed)."""
        event: dict[str, Any] = {
            "at": _must_utc(at).isoformat(),
            "system": "svc-challenge",
            "principal": {"type": row.principal_type, "id": row.principal_id},
            "action": action,
            "resource": {"type": row.resource_type, "id": row.resource_id},
            "outcome": "failure",
            "attributes": {
                "challenge_qid": row.qid,
                "decision_qid": row.last_decision_qid or row.decision_qid,
                "kinds": ",".join(row.kinds),
            },
        }
        if row.obo_type and row.obo_id and _base_type(row.principal_type) == "ServiceAccount":
            event["on_behalf_of"] = {"type": row.obo_type, "id": row.obo_id}
        return event

    def _emit(self, event: dict[str, Any] | None) -> None:
        """Hands `event` to the audit hook; a failing hook is logged, never raised."""
        if event is None or self.audit is None:
            return
        try:
            self.audit(event)
        except Exception:  # the answer stands whatever the audit does
            log.exception("audit hook failed for %s", event.get("action"))

    # -- outbox

    def _outbox(self, s: Session, row: ChallengeRow, event: str, now: datetime) -> None:
        """Adds the notification of a challenge change to the session's transaction."""
        s.add(
            OutboxRow(
                key=str(uuid_utils.uuid7()),
                challenge_qid=row.qid,
                event=event,
                payload={"text": self._message(row, event, now)},
                created_at=now,
                next_attempt_at=now,
            )
        )

    def _message(self, row: ChallengeRow, event: str, now: datetime) -> str:
        """The Slack-compatible ``text`` of a notification (mrkdwn: a link, code spans).

        The link is ``<page_url>/<qid>?t=<token>``, the token bound to the challenge, the
        notification's recipient (``link_recipient``) and event (docs/challenges.md#link-tokens).
        """
        who = f"`{row.principal_id}`"
        if row.obo_id:
            who += f" acting for `{row.obo_id}`"
        what = f"`{row.action}` on `{row.resource_type}::{row.resource_id}`"
        recipient = link_recipient(row.kinds, row.person, row.approver, event)
        token = self.links.mint(row.qid, recipient, event, now)
        url = f"{self.settings.page_url.rstrip('/')}/{row.qid}?t={token}"
        link = f"<{url}|challenge {row.qid}>"
        kinds = ", ".join(row.kinds)
        lines = {
            "opened": f"{who} asks to {what}. `{recipient}`, please answer ({kinds}): {link}",
            "forwarded": f"{who} asks to {what}. `{row.approver}`, please approve or reject; "
            f"the reason given: {json.dumps(row.justification)}. {link}",
            "passed": f"{who} may now {what}: {link} passed.",
            "rejected": f"{who} may not {what}: {link} was rejected by `{row.decided_by}`.",
            "answered": f"{link}: {', '.join(row.satisfied)} done; waiting for the rest.",
        }
        return lines.get(event, f"{link}: {event}")

    # -- challenges

    def _answerers(
        self, principal: Ref, on_behalf_of: Ref | None, kinds: Sequence[str], approver: str
    ) -> tuple[str, str]:
        """(person, approver) of a new challenge (docs/challenges.md#who-answers)."""
        lone_agent = _lone_agent(principal, on_behalf_of)
        try:
            if on_behalf_of is not None:
                person = on_behalf_of.id
            elif lone_agent:
                owner = self.directory.owner(principal.id)
                if owner is None:
                    raise ChallengeError(
                        "failed_precondition",
                        f"nobody answers for service account `{principal.id}`: the directory "
                        "names no owner",
                    )
                person = owner
            else:
                person = principal.id
            if "approval" not in kinds:
                return person, ""
            if approver:
                chosen = approver
            elif lone_agent:
                chosen = person
            else:
                manager = self.directory.manager(person)
                if manager is None:
                    raise ChallengeError(
                        "failed_precondition",
                        f"nobody approves for `{person}`: the directory names no manager and "
                        "no policy names an approver",
                    )
                chosen = manager
        except DirectoryUnavailable as e:
            log.error("resolve: %s", e)
            raise ChallengeError("unavailable", "the directory does not answer") from None
        if chosen == person and not lone_agent:
            raise ChallengeError(
                "failed_precondition", f"`{person}` cannot approve their own request"
            )
        return person, chosen

    def _may_approve(self, approver: str, resource: Ref) -> bool:
        """Whether the decision point lets ``approver`` ``approve`` ``resource``.

        True without ``approvers`` (nothing is checked).

        Raises:
            ChallengeError: ``unavailable`` when the decision point does not answer.

        """
        if self.approvers is None:
            return True
        try:
            return self.approvers.may_approve(approver, resource.type, resource.id)
        except PdpUnavailable as e:
            log.error("approve check of %s: %s", approver, e)
            raise ChallengeError(
                "unavailable", "the decision point does not answer whether the approver may approve"
            ) from None

    def resolve(
        self,
        principal: Ref,
        on_behalf_of: Ref | None,
        action: str,
        resource: Ref,
        kinds: Sequence[str],
        decision_qid: str = "",
        approver: str = "",
    ) -> tuple[ChallengeInfo, bool, bool]:
        """Opens or finds the challenge of a request (docs/challenges.md#resolve).

        The fingerprint's current challenge is returned while it is pending, passed with a live
        grant, or rejected before its ``expires_at``; otherwise (expired, grant run out,
        rejection over) a new one is opened and its notification written to the outbox in the
        same transaction. ``decision_qid`` is recorded (the first as ``decision_qid``, each
        later one as ``last_decision_qid``).

        Args:
            principal: who asks.
            on_behalf_of: the person an agent acts for, or None.
            action: the action's id.
            resource: what it asks for.
            kinds: the kinds the verdict named (``KINDS``), at least one.
            decision_qid: the decision's qid (up to 64 characters).
            approver: the approver a policy names (``approval`` only); empty: the manager.

        Returns:
            The challenge, whether this call opened it, and whether its grant is live (the
            decision point then answers ``allow``).

        Raises:
            ChallengeError: ``invalid_argument`` naming every bad field; ``failed_precondition``
                when nobody can answer (no owner, no manager, a self-approval) or the decision
                point does not allow the approver (the manager or the named approver; not a
                lone agent's owner) to ``approve`` the resource ("approver may not approve");
                ``unavailable`` when the directory or the decision point does not answer.

        """
        bad: list[Violation] = []
        _check_ref(principal, "principal", bad)
        if on_behalf_of is not None:
            _check_ref(on_behalf_of, "on_behalf_of", bad)
        _check_text(action, "action", bad)
        _check_ref(resource, "resource", bad)
        if not kinds:
            bad.append(Violation("challenges", "at least one kind is required"))
        for i, k in enumerate(kinds):
            if k not in KINDS:
                bad.append(
                    Violation(f"challenges[{i}]", f"`{k}`: expected one of {', '.join(KINDS)}")
                )
        if len(decision_qid) > 64 or _CONTROL.search(decision_qid):
            bad.append(Violation("decision_qid", "up to 64 printable characters"))
        if approver:
            _check_text(approver, "approver", bad)
        _refuse(bad, "bad resolve request")
        kinds = sorted(set(kinds))
        fp = fingerprint(principal, on_behalf_of, action, resource, kinds)
        answerers: tuple[str, str] | None = None
        expired: dict[str, Any] | None = None
        for _ in range(5):
            now = self.clock()
            with Session(self.db) as s:
                row = s.exec(select(ChallengeRow).where(ChallengeRow.active_key == fp)).first()
                if row is not None:
                    state = effective_state(row, now)
                    grant = _utc(row.grant_expires_at)
                    live = (
                        state == "pending"
                        or (state == "passed" and grant is not None and now < grant)
                        or (state == "rejected" and now < _must_utc(row.expires_at))
                    )
                    if live:
                        if decision_qid and decision_qid != row.last_decision_qid:
                            row.last_decision_qid = decision_qid
                            s.add(row)
                            s.commit()
                            s.refresh(row)
                        return _info(row, now), False, state == "passed"
                    row.active_key = None  # retired: a retry opens a new challenge
                    s.add(row)
                    if state == "expired":
                        expired = self._outcome_event(
                            row, "challenge.expired", _must_utc(row.expires_at)
                        )
                if answerers is None:
                    answerers = self._answerers(principal, on_behalf_of, kinds, approver)
                    # A lone agent's owner answers as its person, unchecked
                    # (docs/challenges.md#who-answers).
                    owner_approves = not approver and _lone_agent(principal, on_behalf_of)
                    if (
                        answerers[1]
                        and not owner_approves
                        and not self._may_approve(answerers[1], resource)
                    ):
                        raise ChallengeError(
                            "failed_precondition",
                            f"approver may not approve: the decision point does not allow "
                            f"`{answerers[1]}` to approve {resource}",
                        )
                person, chosen = answerers
                new = ChallengeRow(
                    qid=str(uuid_utils.uuid7()),
                    fingerprint=fp,
                    active_key=fp,
                    state="pending",
                    principal_type=principal.type,
                    principal_id=principal.id,
                    obo_type=on_behalf_of.type if on_behalf_of else None,
                    obo_id=on_behalf_of.id if on_behalf_of else None,
                    action=action,
                    resource_type=resource.type,
                    resource_id=resource.id,
                    kinds=kinds,
                    satisfied=[],
                    decision_qid=decision_qid,
                    last_decision_qid=decision_qid,
                    person=person,
                    approver=chosen,
                    created_at=now,
                    updated_at=now,
                    expires_at=now + timedelta(seconds=self.settings.challenge_ttl_secs),
                )
                s.add(new)
                self._outbox(s, new, "opened", now)
                try:
                    s.commit()
                except IntegrityError:  # another replica opened it meanwhile: find that one
                    s.rollback()
                    continue
                s.refresh(new)
                info = _info(new, now)
            log.info("challenge %s opened for %s (%s)", info.qid, principal, ", ".join(kinds))
            self._emit(expired)
            self._notify()
            return info, True, False
        raise ChallengeError("unavailable", "could not open the challenge; try again")

    def _row(self, s: Session, qid: str) -> ChallengeRow:
        row = s.get(ChallengeRow, qid) if _findable(qid, 36) else None
        if row is None:
            raise ChallengeError("not_found", f"no challenge `{qid}`")
        return row

    def get_challenge(self, qid: str, principal: Ref, on_behalf_of: Ref | None) -> ChallengeInfo:
        """One challenge, for the principal and on_behalf_of of the check that opened it.

        Raises:
            ChallengeError: ``not_found`` for an unknown qid, and for any other principal or
                on_behalf_of (another agent or person learns nothing of it).

        """
        with Session(self.db) as s:
            row = self._row(s, qid)
            obo = (row.obo_type, row.obo_id) if row.obo_id is not None else None
            asked = (on_behalf_of.type, on_behalf_of.id) if on_behalf_of else None
            if (row.principal_type, row.principal_id) != (principal.type, principal.id) or (
                obo != asked
            ):
                raise ChallengeError("not_found", f"no challenge `{qid}`")
            return _info(row, self.clock())

    def list_challenges(
        self,
        principal: Ref | None = None,
        person: str = "",
        state: str = "",
        limit: int = 100,
    ) -> list[ChallengeInfo]:
        """Challenges newest first, filtered.

        Args:
            principal: only this principal's.
            person: only those this person answers or approves.
            state: only those in this (effective) state, one of ``STATES``.
            limit: 1 to 1,000; 0 means 100.

        Raises:
            ChallengeError: ``invalid_argument`` for a bad state or limit.

        """
        bad: list[Violation] = []
        if principal is not None:
            _check_ref(principal, "principal", bad)
        if person:
            _check_text(person, "person", bad)
        _refuse(bad, "bad filter")
        if state and state not in STATES:
            raise ChallengeError(
                "invalid_argument",
                f"state `{state}`",
                [Violation("state", f"expected one of {', '.join(STATES)}")],
            )
        if limit < 0 or limit > _MAX_LIST:
            raise ChallengeError(
                "invalid_argument", f"limit {limit}", [Violation("limit", "0 to 1000")]
            )
        limit = limit or 100
        now = self.clock()
        q = select(ChallengeRow)
        if principal is not None:
            q = q.where(
                ChallengeRow.principal_type == principal.type,
                ChallengeRow.principal_id == principal.id,
            )
        if person:
            q = q.where(
                or_(col(ChallengeRow.person) == person, col(ChallengeRow.approver) == person)
            )
        if state in ("pending", "expired"):
            q = q.where(ChallengeRow.state == "pending")
            expires = col(ChallengeRow.expires_at)
            q = q.where(expires > now if state == "pending" else expires <= now)
        elif state:
            q = q.where(ChallengeRow.state == state)
        q = q.order_by(col(ChallengeRow.created_at).desc(), col(ChallengeRow.qid).desc())
        with Session(self.db) as s:
            return [_info(r, now) for r in s.exec(q.limit(limit)).all()]

    def _answer(
        self,
        qid: str,
        check: Callable[[ChallengeRow, datetime], None],
        change: Callable[[ChallengeRow, datetime], str],
        proof: Callable[[Session, datetime], None] | None = None,
    ) -> ChallengeInfo:
        """Applies one answer to a pending challenge, in one transaction with its notification.

        ``check`` raises for a refused answer; ``proof`` (optional) checks and records a proof
        in the same transaction (a security key's assertion), after the challenge is found
        pending; ``change`` updates the row and returns the outbox event (``answered``,
        ``forwarded``, ``passed``, ``rejected``).
        """
        with Session(self.db) as s:
            # Serialise answers to one challenge across replicas (PostgreSQL row lock); the row
            # is read only once the lock is held, so the check sees the latest answer.
            row = (
                s.exec(
                    select(ChallengeRow).where(ChallengeRow.qid == qid).with_for_update()
                ).first()
                if _findable(qid, 36)
                else None
            )
            if row is None:
                raise ChallengeError("not_found", f"no challenge `{qid}`")
            now = self.clock()
            check(row, now)
            state = effective_state(row, now)
            if state != "pending":
                raise ChallengeError("failed_precondition", f"challenge `{qid}` is {state}")
            if proof is not None:
                proof(s, now)
            event = change(row, now)
            row.version += 1
            row.updated_at = now
            s.add(row)
            self._outbox(s, row, event, now)
            s.commit()
            s.refresh(row)
            info = _info(row, now)
            rejected = (
                self._outcome_event(row, "challenge.rejected", now) if event == "rejected" else None
            )
        log.info("challenge %s: %s", qid, event)
        self._emit(rejected)
        self._notify()
        return info

    def _satisfy(self, row: ChallengeRow, kind: str, now: datetime) -> str:
        """Marks ``kind`` answered; passes the challenge when every kind is; returns the event."""
        row.satisfied = sorted({*row.satisfied, kind})
        if set(row.satisfied) >= set(row.kinds):
            row.state = "passed"
            row.decided_at = now
            row.grant_expires_at = now + timedelta(seconds=self.settings.grant_ttl_secs)
            return "passed"
        if kind == "justification" and "approval" in row.kinds:
            return "forwarded"
        return "answered"

    def justify(self, qid: str, person: str, text: str) -> ChallengeInfo:
        """The person states a reason: records it and answers the ``justification`` kind.

        With ``approval`` among the kinds too, the challenge is forwarded to the approver (the
        notification carries the reason) and passes only once approved.

        Raises:
            ChallengeError: ``invalid_argument`` for an empty or too long text or no person;
                ``not_found`` for an unknown qid; ``permission_denied`` when ``person`` is not
                the challenge's; ``failed_precondition`` when the challenge needs no
                justification, has one already, or is not pending.

        """
        bad: list[Violation] = []
        _check_text(person, "person", bad)
        limit = self.settings.max_justification_chars
        if not text.strip():
            bad.append(Violation("text", "required"))
        else:
            _check_free_text(text, "text", limit, bad)
        _refuse(bad, "bad justification")

        def check(row: ChallengeRow, now: datetime) -> None:
            if person != row.person:
                raise ChallengeError(
                    "permission_denied", f"`{person}` does not answer challenge `{qid}`"
                )
            if "justification" not in row.kinds:
                raise ChallengeError(
                    "failed_precondition", f"challenge `{qid}` needs no justification"
                )
            if "justification" in row.satisfied:
                raise ChallengeError("failed_precondition", f"challenge `{qid}` is justified")

        def change(row: ChallengeRow, now: datetime) -> str:
            row.justification = text
            return self._satisfy(row, "justification", now)

        return self._answer(qid, check, change)

    def decide(self, qid: str, approver: str, approve: bool, reason: str = "") -> ChallengeInfo:
        """The approver passes (``approve``) or rejects a challenge's ``approval``.

        A rejection ends the challenge: its fingerprint is denied until ``expires_at``. When the
        challenge also needs a justification, the approver decides only once it is given.

        Raises:
            ChallengeError: ``invalid_argument`` for no approver or a too long reason;
                ``not_found`` for an unknown qid; ``permission_denied`` for anyone but the
                challenge's approver (and for a challenge without ``approval``);
                ``failed_precondition`` while the justification is missing or when the
                challenge is not pending; ``permission_denied`` too when the decision point
                no longer allows the approver to ``approve`` the resource, ``unavailable`` when
                it does not answer (docs/challenges.md#who-answers).

        """
        bad: list[Violation] = []
        _check_text(approver, "approver", bad)
        _check_free_text(reason, "reason", self.settings.max_justification_chars, bad)
        _refuse(bad, "bad decision")
        if self.approvers is not None:
            with Session(self.db) as s:
                row = self._row(s, qid)
                mine = "approval" in row.kinds and approver == row.approver
                resource = Ref(row.resource_type, row.resource_id)
                # A lone agent's owner approves as its person, unchecked (as at Resolve).
                owner = approver == row.person and _lone_agent(
                    Ref(row.principal_type, row.principal_id),
                    Ref(row.obo_type, row.obo_id) if row.obo_type and row.obo_id else None,
                )
            # Only the challenge's approver is asked about; anyone else is refused below.
            if mine and not owner and not self._may_approve(approver, resource):
                raise ChallengeError(
                    "permission_denied",
                    f"`{approver}` may not approve {resource}: the decision point does not "
                    "allow it",
                )

        def check(row: ChallengeRow, now: datetime) -> None:
            if "approval" not in row.kinds or approver != row.approver:
                raise ChallengeError(
                    "permission_denied", f"`{approver}` does not approve challenge `{qid}`"
                )
            if "justification" in row.kinds and "justification" not in row.satisfied:
                raise ChallengeError(
                    "failed_precondition", f"challenge `{qid}` waits for its justification"
                )

        def change(row: ChallengeRow, now: datetime) -> str:
            row.decided_by = approver
            row.reason = reason
            if approve:
                return self._satisfy(row, "approval", now)
            row.state = "rejected"
            row.decided_at = now
            return "rejected"

        return self._answer(qid, check, change)

    # -- containments

    def contain(self, principal: Ref, reason: str, author: str) -> tuple[Containment, bool]:
        """Contains a principal (recorded with the reason and author); watchers are told.

        Returns:
            The containment, and whether it is new (False: it was contained already, and the
            first containment's reason and author stand).

        Raises:
            ChallengeError: ``invalid_argument`` for a bad principal, no author or a reason over
                4,000 characters.

        """
        bad: list[Violation] = []
        _check_ref(principal, "principal", bad)
        _check_text(author, "author", bad)
        _check_free_text(reason, "reason", 4000, bad)
        _refuse(bad, "bad containment")
        now = self.clock()
        with Session(self.db) as s:
            row = s.get(ContainmentRow, (principal.type, principal.id))
            if row is not None:
                return _containment(row), False
            row = ContainmentRow(
                principal_type=principal.type,
                principal_id=principal.id,
                reason=reason,
                author=author,
                contained_at=now,
            )
            s.add(row)
            s.add(
                ContainmentEventRow(
                    at=now,
                    principal_type=principal.type,
                    principal_id=principal.id,
                    contained=True,
                    reason=reason,
                    author=author,
                )
            )
            try:
                s.commit()
            except IntegrityError:  # contained by another call meanwhile
                s.rollback()
                existing = s.get(ContainmentRow, (principal.type, principal.id))
                if existing is None:
                    raise ChallengeError("unavailable", "containment raced; try again") from None
                return _containment(existing), False
            s.refresh(row)
            out = _containment(row)
        log.warning("contained %s by %s: %s", principal, author, reason)
        self._notify()
        return out, True

    def lift(self, principal: Ref, reason: str, author: str) -> bool:
        """Lifts a containment (recorded); watchers are told.

        Returns:
            Whether the principal was contained.

        Raises:
            ChallengeError: ``invalid_argument`` for a bad principal or no author.

        """
        bad: list[Violation] = []
        _check_ref(principal, "principal", bad)
        _check_text(author, "author", bad)
        _check_free_text(reason, "reason", 4000, bad)
        _refuse(bad, "bad lift")
        now = self.clock()
        with Session(self.db) as s:
            row = s.get(ContainmentRow, (principal.type, principal.id))
            if row is None:
                return False
            s.delete(row)
            s.add(
                ContainmentEventRow(
                    at=now,
                    principal_type=principal.type,
                    principal_id=principal.id,
                    contained=False,
                    reason=reason,
                    author=author,
                )
            )
            s.commit()
        log.warning("lifted the containment of %s by %s: %s", principal, author, reason)
        self._notify()
        return True

    def containments(self) -> list[Containment]:
        """Every contained principal, by type and id."""
        with Session(self.db) as s:
            rows = s.exec(
                select(ContainmentRow).order_by(
                    col(ContainmentRow.principal_type), col(ContainmentRow.principal_id)
                )
            ).all()
            return [_containment(r) for r in rows]

    # -- security keys (WebAuthn)

    def _ceremony(
        self,
        s: Session,
        kind: str,
        person: str,
        qid: str | None,
        name: str,
        replaces: str | None = None,
    ) -> CeremonyRow:
        now = self.clock()
        row = CeremonyRow(
            id=str(uuid_utils.uuid7()),
            kind=kind,
            person=person,
            challenge_qid=qid,
            challenge=secrets.token_bytes(32),
            name=name,
            created_at=now,
            expires_at=now + timedelta(seconds=self.settings.ceremony_ttl_secs),
            replaces=replaces,
            proof_challenge=secrets.token_bytes(32) if replaces is not None else None,
        )
        s.add(row)
        return row

    def _finish_ceremony(
        self, s: Session, ceremony_id: str, kinds: tuple[str, ...], person: str
    ) -> CeremonyRow:
        row = s.get(CeremonyRow, ceremony_id) if _findable(ceremony_id, 36) else None
        if row is None or row.kind not in kinds:
            raise ChallengeError("not_found", f"no {kinds[0]} ceremony `{ceremony_id}`")
        if row.person != person:
            raise ChallengeError(
                "permission_denied", f"ceremony `{ceremony_id}` is not `{person}`'s"
            )
        if row.used_at is not None:
            raise ChallengeError("failed_precondition", f"ceremony `{ceremony_id}` is finished")
        if self.clock() >= _must_utc(row.expires_at):
            raise ChallengeError("failed_precondition", f"ceremony `{ceremony_id}` has expired")
        return row

    def _creation_options(
        self, s: Session, person: str, ceremony: CeremonyRow, keep_out: Sequence[str]
    ) -> str:
        """``PublicKeyCredentialCreationOptions`` JSON of a registration ceremony."""
        options = webauthn.generate_registration_options(
            rp_id=self.settings.rp_id,
            rp_name=self.settings.rp_name,
            user_id=_user_handle(person),
            user_name=person,
            user_display_name=person,
            challenge=ceremony.challenge,
            timeout=self.settings.ceremony_ttl_secs * 1000,
            authenticator_selection=AuthenticatorSelectionCriteria(
                resident_key=ResidentKeyRequirement.DISCOURAGED,
                user_verification=UserVerificationRequirement.REQUIRED,
            ),
            exclude_credentials=[
                PublicKeyCredentialDescriptor(id=webauthn.base64url_to_bytes(k)) for k in keep_out
            ],
        )
        return webauthn.options_to_json(options)

    def _request_options(self, challenge: bytes, credential_ids: Sequence[str]) -> str:
        """``PublicKeyCredentialRequestOptions`` JSON allowing ``credential_ids`` only."""
        options = webauthn.generate_authentication_options(
            rp_id=self.settings.rp_id,
            challenge=challenge,
            timeout=self.settings.ceremony_ttl_secs * 1000,
            allow_credentials=[
                PublicKeyCredentialDescriptor(id=webauthn.base64url_to_bytes(k))
                for k in credential_ids
            ],
            user_verification=UserVerificationRequirement.REQUIRED,
        )
        return webauthn.options_to_json(options)

    @staticmethod
    def _check_key_name(person: str, name: str) -> None:
        bad: list[Violation] = []
        _check_text(person, "person", bad)
        if len(name) > 256 or _CONTROL.search(name):
            bad.append(Violation("name", "up to 256 printable characters"))
        _refuse(bad, "bad registration")

    def begin_key_registration(self, person: str, name: str = "") -> tuple[str, str]:
        """Starts registering a security key for ``person`` (``BeginKeyRegistration``).

        Args:
            person: the user name the key is registered to.
            name: a label for the key, up to 256 printable characters.

        Returns:
            The ceremony id and the WebAuthn ``PublicKeyCredentialCreationOptions`` as JSON
            (``webauthn.options_to_json``: bytes in base64url), asking for user verification
            and excluding the person's registered keys.

        Raises:
            ChallengeError: ``invalid_argument`` for no person or a name over 256 characters.

        """
        self._check_key_name(person, name)
        with Session(self.db) as s:
            existing = s.exec(select(SecurityKeyRow).where(SecurityKeyRow.person == person)).all()
            ceremony = self._ceremony(s, "registration", person, None, name)
            options = self._creation_options(
                s, person, ceremony, [k.credential_id for k in existing]
            )
            s.commit()
            return ceremony.id, options

    def begin_key_change(self, person: str, credential_id: str, name: str = "") -> KeyChange:
        """Starts replacing one of ``person``'s keys (``BeginKeyChange``).

        The change is finished by ``finish_key_registration`` with two responses: an assertion
        of the key being replaced over ``assertion_options_json`` (proving the person holds it),
        and the new key's registration over ``options_json``.

        Args:
            person: the key's person.
            credential_id: the key to replace (base64url).
            name: the new key's label; empty keeps the old key's.

        Returns:
            The ceremony id, the request options allowing only the old key, and the creation
            options for the new one (excluding the person's other keys; the old key's
            authenticator may make the new credential).

        Raises:
            ChallengeError: ``invalid_argument`` for no person or a bad name; ``not_found``
                when the person has no such key.

        """
        self._check_key_name(person, name)
        with Session(self.db) as s:
            old = s.get(SecurityKeyRow, credential_id) if _findable(credential_id, 1400) else None
            if old is None or old.person != person:
                raise ChallengeError("not_found", f"`{person}` has no key `{credential_id}`")
            existing = s.exec(select(SecurityKeyRow).where(SecurityKeyRow.person == person)).all()
            ceremony = self._ceremony(
                s, "change", person, None, name or old.name, replaces=credential_id
            )
            assert ceremony.proof_challenge is not None
            out = KeyChange(
                ceremony_id=ceremony.id,
                assertion_options_json=self._request_options(
                    ceremony.proof_challenge, [credential_id]
                ),
                # The key being replaced is not excluded: a new credential may be made on the
                # same authenticator (one that was reset, or a rotation).
                options_json=self._creation_options(
                    s, person, ceremony, [k.credential_id for k in existing if k != old]
                ),
            )
            s.commit()
        return out

    def _prove_old_key(
        self, s: Session, ceremony: CeremonyRow, person: str, assertion_json: str, now: datetime
    ) -> SecurityKeyRow:
        """Verifies a key change's assertion with the key it replaces; returns that key."""
        if not assertion_json:
            raise ChallengeError(
                "invalid_argument",
                "a key change needs the assertion of the key it replaces",
                [Violation("assertion_json", "required for a key change")],
            )
        try:
            parsed = webauthn.helpers.parse_authentication_credential_json(assertion_json)
        except (WebAuthnException, ValueError, TypeError, KeyError) as e:
            raise ChallengeError(
                "invalid_argument",
                "the assertion does not parse",
                [Violation("assertion_json", str(e) or e.__class__.__name__)],
            ) from None
        old = s.get(SecurityKeyRow, ceremony.replaces) if ceremony.replaces else None
        if old is None or old.person != person:
            raise ChallengeError("failed_precondition", "the key to replace is gone")
        if bytes_to_base64url(parsed.raw_id) != old.credential_id:
            raise ChallengeError(
                "permission_denied", "the assertion is not made with the key being replaced"
            )
        assert ceremony.proof_challenge is not None
        try:
            webauthn.verify_authentication_response(
                credential=parsed,
                expected_challenge=ceremony.proof_challenge,
                expected_rp_id=self.settings.rp_id,
                expected_origin=self.settings.origins,
                credential_public_key=old.public_key,
                credential_current_sign_count=old.sign_count,
                require_user_verification=True,
            )
        except (WebAuthnException, ValueError, TypeError) as e:
            log.warning("key change by %s refused: %s", person, e)
            raise ChallengeError(
                "permission_denied", f"the assertion does not verify: {e}"
            ) from None
        return old

    def finish_key_registration(
        self, ceremony_id: str, person: str, credential_json: str, assertion_json: str = ""
    ) -> tuple[SecurityKey, str]:
        """Verifies the authenticator's attestation and stores the key for ``person``.

        Finishes a ``begin_key_registration`` ceremony, or a ``begin_key_change`` one: then
        ``assertion_json`` must first prove the old key (an assertion over the change's request
        options, user verification and sign counter checked), and the new key replaces it in
        the same transaction. The registration must sign the ceremony's challenge for
        ``settings.rp_id`` from one of ``settings.origins``, with user presence and user
        verification (WebAuthn Level 3, section 7.1).

        Returns:
            The stored key, and the credential id of the key it replaced (empty for a plain
            registration).

        Raises:
            ChallengeError: ``not_found`` for an unknown ceremony; ``permission_denied`` when
                it is another person's or the old key's assertion does not verify;
                ``failed_precondition`` when it is finished or expired, or the old key is
                gone; ``invalid_argument`` (field ``credential_json`` or ``assertion_json``)
                when a response does not verify or parse, or the key is registered already.

        """
        now = self.clock()
        with Session(self.db) as s:
            ceremony = self._finish_ceremony(s, ceremony_id, ("registration", "change"), person)
            old = (
                self._prove_old_key(s, ceremony, person, assertion_json, now)
                if ceremony.kind == "change"
                else None
            )
            try:
                verified = webauthn.verify_registration_response(
                    credential=credential_json,
                    expected_challenge=ceremony.challenge,
                    expected_rp_id=self.settings.rp_id,
                    expected_origin=self.settings.origins,
                    require_user_verification=True,
                )
            except (WebAuthnException, ValueError, TypeError, KeyError) as e:
                raise ChallengeError(
                    "invalid_argument",
                    f"the registration does not verify: {e}",
                    [Violation("credential_json", str(e) or e.__class__.__name__)],
                ) from None
            cred_id = bytes_to_base64url(verified.credential_id)
            if s.get(SecurityKeyRow, cred_id) is not None:
                raise ChallengeError(
                    "invalid_argument",
                    "this key is registered already",
                    [Violation("credential_json", "the credential is registered already")],
                )
            row = SecurityKeyRow(
                credential_id=cred_id,
                person=person,
                name=ceremony.name,
                public_key=verified.credential_public_key,
                sign_count=verified.sign_count,
                created_at=now,
            )
            ceremony.used_at = now
            s.add(ceremony)
            replaced = ""
            if old is not None:
                replaced = old.credential_id
                s.delete(old)
            s.add(row)
            s.commit()
            s.refresh(row)
            key = _key(row)
        if replaced:
            log.info("security key %s of %s replaced by %s", replaced, person, cred_id)
        else:
            log.info("security key %s registered for %s", cred_id, person)
        return key, replaced

    def list_security_keys(self, person: str) -> list[SecurityKey]:
        """A person's registered keys, oldest first (none for a name no key can have)."""
        if not _findable(person, 512):
            return []
        with Session(self.db) as s:
            rows = s.exec(
                select(SecurityKeyRow)
                .where(SecurityKeyRow.person == person)
                .order_by(col(SecurityKeyRow.created_at))
            ).all()
            return [_key(r) for r in rows]

    def remove_security_key(self, person: str, credential_id: str) -> None:
        """Removes one of a person's keys (``RemoveSecurityKey``).

        Raises:
            ChallengeError: ``not_found`` when the person has no such key.

        """
        with Session(self.db) as s:
            row = s.get(SecurityKeyRow, credential_id) if _findable(credential_id, 1400) else None
            if row is None or row.person != person:
                raise ChallengeError("not_found", f"`{person}` has no key `{credential_id}`")
            s.delete(row)
            s.commit()
        log.info("security key %s of %s removed", credential_id, person)

    def reset_security_key(self, person: str, reason: str, author: str) -> int:
        """An administrator removes every key of ``person`` (``ResetSecurityKey``).

        The reset is recorded (``key_resets``: person, reason, author, time, keys removed) in
        the same transaction, also when the person had no key; the person can then register
        again. Who may call it is the service's caller authentication (docs/auth.md).

        Returns:
            How many keys were removed.

        Raises:
            ChallengeError: ``invalid_argument`` for no person, no author or a reason over
                4,000 characters.

        """
        bad: list[Violation] = []
        _check_text(person, "person", bad)
        _check_text(author, "author", bad)
        _check_free_text(reason, "reason", 4000, bad)
        _refuse(bad, "bad reset")
        now = self.clock()
        with Session(self.db) as s:
            rows = s.exec(select(SecurityKeyRow).where(SecurityKeyRow.person == person)).all()
            for r in rows:
                s.delete(r)
            s.add(
                KeyResetRow(at=now, person=person, reason=reason, author=author, removed=len(rows))
            )
            s.commit()
        log.warning(
            "security keys of %s reset by %s (%d removed): %s", person, author, len(rows), reason
        )
        return len(rows)

    # -- the page's links

    def use_link(self, claims: LinkClaims, person: str) -> None:
        """Records that ``person`` opened the page with a verified link token, once.

        Args:
            claims: the token's claims (``LinkTokens.verify``).
            person: the signed-in user opening it.

        Raises:
            ChallengeError: ``permission_denied`` when ``person`` is not the token's recipient
                or the token was used already (docs/challenges.md#link-tokens).

        """
        if person != claims.recipient:
            raise ChallengeError(
                "permission_denied", f"this link is for `{claims.recipient}`, not `{person}`"
            )
        with Session(self.db) as s:
            if s.get(LinkUseRow, claims.jti) is not None:
                raise ChallengeError("permission_denied", "this link was used already")
            s.add(
                LinkUseRow(
                    jti=claims.jti,
                    challenge_qid=claims.qid,
                    recipient=claims.recipient,
                    event=claims.event,
                    used_at=self.clock(),
                )
            )
            try:
                s.commit()
            except IntegrityError:  # used at the same moment through another request
                raise ChallengeError("permission_denied", "this link was used already") from None

    def challenge_for(self, qid: str, person: str) -> ChallengeInfo:
        """A challenge as its person or approver sees it on the page.

        Raises:
            ChallengeError: ``not_found`` for an unknown qid; ``permission_denied`` when
                ``person`` neither answers nor approves it.

        """
        with Session(self.db) as s:
            row = self._row(s, qid)
            if person not in (row.person, row.approver):
                raise ChallengeError(
                    "permission_denied", f"`{person}` does not answer challenge `{qid}`"
                )
            return _info(row, self.clock())

    def begin_verification(self, qid: str, person: str) -> tuple[str, str]:
        """Starts a security-key verification of a challenge by ``person``.

        Returns:
            The ceremony id and the WebAuthn ``PublicKeyCredentialRequestOptions`` as JSON,
            allowing only the person's keys and requiring user verification.

        Raises:
            ChallengeError: ``not_found`` for an unknown qid; ``permission_denied`` when
                ``person`` is not the challenge's; ``failed_precondition`` when it needs no
                verification, is verified already, is not pending, or the person has no key.

        """
        bad: list[Violation] = []
        _check_text(person, "person", bad)
        _refuse(bad, "bad verification")
        with Session(self.db) as s:
            row = self._row(s, qid)
            if person != row.person:
                raise ChallengeError(
                    "permission_denied", f"`{person}` does not answer challenge `{qid}`"
                )
            if "verification" not in row.kinds or "verification" in row.satisfied:
                raise ChallengeError(
                    "failed_precondition", f"challenge `{qid}` needs no verification now"
                )
            state = effective_state(row, self.clock())
            if state != "pending":
                raise ChallengeError("failed_precondition", f"challenge `{qid}` is {state}")
            keys = s.exec(select(SecurityKeyRow).where(SecurityKeyRow.person == person)).all()
            if not keys:
                raise ChallengeError(
                    "failed_precondition", f"`{person}` has no security key registered"
                )
            ceremony = self._ceremony(s, "verification", person, qid, "")
            options = self._request_options(ceremony.challenge, [k.credential_id for k in keys])
            s.commit()
            return ceremony.id, options

    def finish_verification(
        self, ceremony_id: str, person: str, credential_json: str
    ) -> ChallengeInfo:
        """Verifies an assertion and answers the challenge's ``verification`` kind.

        The assertion must come from a key registered to ``person``, sign the ceremony's
        challenge for ``settings.rp_id`` from one of ``settings.origins`` with user presence and
        user verification, and carry a sign counter above the stored one (a counter that does
        not grow suggests a cloned key; WebAuthn Level 3, section 6.1.1). The new counter is
        stored; the ceremony finishes once.

        Raises:
            ChallengeError: ``not_found`` for an unknown ceremony or challenge;
                ``permission_denied`` for another person's ceremony, a key not registered to
                the person, or an assertion that does not verify; ``invalid_argument`` (field
                ``credential_json``) for a response that does not parse;
                ``failed_precondition`` for a finished or expired ceremony or a challenge no
                longer pending.

        """
        try:
            parsed = webauthn.helpers.parse_authentication_credential_json(credential_json)
        except (WebAuthnException, ValueError, TypeError, KeyError) as e:
            raise ChallengeError(
                "invalid_argument",
                "the assertion does not parse",
                [Violation("credential_json", str(e) or e.__class__.__name__)],
            ) from None
        with Session(self.db) as s:
            qid = self._finish_ceremony(s, ceremony_id, ("verification",), person).challenge_qid
        qid = qid or ""

        def proof(s: Session, now: datetime) -> None:
            ceremony = self._finish_ceremony(s, ceremony_id, ("verification",), person)
            cred_id = bytes_to_base64url(parsed.raw_id)
            key = s.get(SecurityKeyRow, cred_id)
            if key is None or key.person != person:
                raise ChallengeError(
                    "permission_denied", f"the key is not registered to `{person}`"
                )
            try:
                verified = webauthn.verify_authentication_response(
                    credential=parsed,
                    expected_challenge=ceremony.challenge,
                    expected_rp_id=self.settings.rp_id,
                    expected_origin=self.settings.origins,
                    credential_public_key=key.public_key,
                    credential_current_sign_count=key.sign_count,
                    require_user_verification=True,
                )
            except (WebAuthnException, ValueError, TypeError) as e:
                log.warning("verification of %s by %s refused: %s", qid, person, e)
                raise ChallengeError(
                    "permission_denied", f"the assertion does not verify: {e}"
                ) from None
            ceremony.used_at = now
            key.sign_count = verified.new_sign_count
            key.last_used_at = now
            s.add(ceremony)
            s.add(key)

        def check(row: ChallengeRow, now: datetime) -> None:
            if "verification" in row.satisfied:
                raise ChallengeError("failed_precondition", f"challenge `{qid}` is verified")

        try:
            return self._answer(
                qid, check, lambda row, now: self._satisfy(row, "verification", now), proof
            )
        except ChallengeError as e:
            if e.code == "permission_denied" and "does not verify" in str(e):
                with Session(self.db) as s:
                    row = s.get(ChallengeRow, qid) if _findable(qid, 36) else None
                    if row is not None:
                        self._emit(
                            self._outcome_event(row, "challenge.verification_failed", self.clock())
                        )
            raise

    def close(self) -> None:
        """Releases the database connections, the directory's and the decision point's clients."""
        close = getattr(self.directory, "close", None)
        if callable(close):
            close()
        if self.approvers is not None:
            self.approvers.close()
        self.db.dispose()
