"""Cloud audit log files (AWS CloudTrail) to intake events (docs/intake.md).

A file is ``{"Records": [...]}`` as the cloud writes it (decompressed). Each record becomes one
``CloudEvent``:

* ``eventSource`` -> ``system``; ``eventName`` -> ``action``; ``eventTime`` -> ``at``;
* the first entry of ``resources`` -> ``resource`` (``type`` and ``ARN``); a record that lists
  no resource acted on the account: ``{"type": "AWS::Account", "id": recipientAccountId}``;
* ``errorCode`` present -> ``outcome: failure``, else ``success``;
* ``sourceIPAddress`` -> ``source_ip`` when it is an IP address; a service name there
  (``cloudtrail.amazonaws.com``, ``AWS Internal``) goes to ``attributes.source_host``;
* the caller -> ``principal`` by ``userIdentity.type`` (table in docs/intake.md): a session of
  an ``AWSReservedSSO_*`` role, or of a role listed in ``intake.humanRoles``, is the ``Human``
  the session names; every other caller is a ``ServiceAccount`` named as the cloud names it
  (its ARN; an AWS service by its host name);
* the role ARN of a role session -> ``role_arn``, in both cases;
* ``eventID`` -> ``attributes.cloud_event_id`` (a retried file's records are recognisable), plus
  a few more small facts under ``attributes`` (docs/intake.md).

Not every record is an event of a principal in the account (handled on purpose; see
docs/intake.md#records-and-files-that-are-not-activity-of-the-account):

* CloudTrail Insights records (``eventCategory: Insight``, ``eventType: AwsCloudTrailInsight``)
  are CloudTrail's own statistics about unusual call rates, with no caller: skipped, and
  reported as skipped in the answer.
* A digest file (``CloudTrail-Digest/``: ``digestStartTime``, ``logFiles``, no ``Records``)
  is the trail's integrity chain, not activity: accepted with nothing produced, reported as
  ``skipped_file: digest``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from svc.intake.models import MAX_EVENTS, FieldError, Problem, canonical_ip

__all__ = ["CloudFile", "cloud_field", "map_file", "map_record"]

#: Role-name prefix of the cloud's single-sign-on roles (IAM Identity Center).
SSO_ROLE_PREFIX = "AWSReservedSSO_"

#: Event field -> the record field it came from, for error messages.
_CLOUD_FIELDS = {
    "at": "eventTime",
    "system": "eventSource",
    "action": "eventName",
    "resource": "resources[0]",
    "resource.type": "resources[0].type",
    "resource.id": "resources[0].ARN",
    "principal": "userIdentity",
    "principal.id": "userIdentity",
    "role_arn": "userIdentity.sessionContext.sessionIssuer.arn",
}


def cloud_field(event_field: str) -> str:
    """The record field an event field was mapped from (``at`` -> ``eventTime``)."""
    return _CLOUD_FIELDS.get(event_field, event_field)


@dataclass
class CloudFile:
    """What a file maps to.

    ``events`` pairs each record's index in ``Records`` with its event; ``skipped`` lists
    records left out on purpose (``{"index", "reason"}``); ``errors`` the records that cannot
    be mapped; ``skipped_file`` names a whole file left out (``digest``).
    """

    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    skipped_file: str | None = None


def _s(value: Any, limit: int) -> str | None:
    """``value`` when it is a non-empty string, cut to ``limit`` characters; else ``None``."""
    if isinstance(value, str) and value:
        return value[:limit]
    return None


def _role_from_session_arn(arn: str) -> tuple[str, str] | None:
    """``arn:aws:sts::ACCT:assumed-role/ROLE/SESSION`` -> (role name, session name)."""
    _, sep, rest = arn.partition(":assumed-role/")
    if not sep:
        return None
    role, slash, session = rest.partition("/")
    return (role, session) if slash and role and session else None


def _principal(
    rec: dict[str, Any], is_human_role: Callable[[str, str], bool]
) -> tuple[dict[str, str], str | None]:
    """The caller as a principal, and the role ARN of a role session (docs/intake.md table).

    Args:
        rec: one record.
        is_human_role: ``intake.humanRoles`` (role name, role ARN) -> whether a person.

    Returns:
        ``({"type", "id"}, role_arn or None)``. ``id`` may be empty when the record names no
        caller at all; validation then reports ``userIdentity``.

    """
    ui = rec.get("userIdentity")
    if not isinstance(ui, dict):
        ui = {}
    kind = ui.get("type")
    arn = _s(ui.get("arn"), 2048)
    ctx = ui.get("sessionContext")
    issuer = ctx.get("sessionIssuer") if isinstance(ctx, dict) else None
    if not isinstance(issuer, dict):
        issuer = {}

    if kind == "AssumedRole" or (arn and ":assumed-role/" in arn):
        parsed = _role_from_session_arn(arn) if arn else None
        role_name = _s(issuer.get("userName"), 256) or (parsed[0] if parsed else "")
        session = parsed[1] if parsed else ""
        if not session:
            # principalId of a role session is ROLEID:SESSION.
            session = (_s(ui.get("principalId"), 512) or "").partition(":")[2]
        role_arn = _s(issuer.get("arn"), 2048) if issuer.get("type", "Role") == "Role" else None
        if role_arn is None and arn and parsed:
            account = arn.split(":")[4] if arn.count(":") >= 5 else ""
            role_arn = f"arn:aws:iam::{account}:role/{parsed[0]}"
        if session and (
            role_name.startswith(SSO_ROLE_PREFIX) or is_human_role(role_name, role_arn or "")
        ):
            return {"type": "Human", "id": session}, role_arn
        name = arn or _s(ui.get("principalId"), 256) or role_arn or ""
        return {"type": "ServiceAccount", "id": name}, role_arn

    if kind == "AWSService":
        name = _s(ui.get("invokedBy"), 256) or _s(rec.get("eventSource"), 256) or ""
        return {"type": "ServiceAccount", "id": name}, None

    # IAMUser, Root, FederatedUser, AWSAccount, IdentityCenterUser, SAMLUser,
    # WebIdentityUser, Directory, Unknown, and types to come: as the cloud names the caller.
    on_behalf = ui.get("onBehalfOf")
    name = (
        arn
        or _s(ui.get("invokedBy"), 256)
        or (_s(on_behalf.get("userId"), 256) if isinstance(on_behalf, dict) else None)
        or _s(ui.get("userName"), 256)
        or _s(ui.get("principalId"), 256)
        or _s(ui.get("accountId"), 256)
        or _s(rec.get("eventSource"), 256)
        or ""
    )
    return {"type": "ServiceAccount", "id": name[:256]}, None


def _resource(rec: dict[str, Any]) -> Any:
    """The first resource the record lists, or the account it acted on."""
    resources = rec.get("resources")
    if isinstance(resources, list) and resources and isinstance(resources[0], dict):
        first = resources[0]
        rid = first.get("ARN", first.get("arn", first.get("ARNPrefix", "")))
        return {"type": first.get("type") or "AWS::Resource", "id": rid}
    account = rec.get("recipientAccountId")
    if not isinstance(account, str):
        ui = rec.get("userIdentity")
        account = ui.get("accountId") if isinstance(ui, dict) else None
    return {"type": "AWS::Account", "id": account if isinstance(account, str) else ""}


def _attributes(rec: dict[str, Any], source_host: str | None) -> dict[str, Any]:
    """The small facts kept from a record (docs/intake.md), each cut to a bounded length."""
    ui = rec.get("userIdentity")
    ui = ui if isinstance(ui, dict) else {}
    ctx = ui.get("sessionContext")
    session_attrs = ctx.get("attributes") if isinstance(ctx, dict) else None
    mfa = session_attrs.get("mfaAuthenticated") if isinstance(session_attrs, dict) else None
    read_only = rec.get("readOnly")
    out: dict[str, Any] = {
        "cloud_event_id": _s(rec.get("eventID"), 128),
        "cloud_account_id": _s(rec.get("recipientAccountId"), 64),
        "cloud_region": _s(rec.get("awsRegion"), 64),
        "cloud_event_type": _s(rec.get("eventType"), 64),
        "cloud_event_category": _s(rec.get("eventCategory"), 64),
        "cloud_identity_type": _s(ui.get("type"), 64),
        "cloud_error_code": _s(rec.get("errorCode"), 128),
        "cloud_error_message": _s(rec.get("errorMessage"), 512),
        "invoked_by": _s(ui.get("invokedBy"), 128),
        "source_host": source_host,
        "user_agent": _s(rec.get("userAgent"), 256),
    }
    if isinstance(read_only, bool):
        out["read_only"] = read_only
    elif read_only in ("true", "false"):
        out["read_only"] = read_only == "true"
    if mfa in ("true", "false", True, False):
        out["mfa_authenticated"] = mfa in ("true", True)
    return {k: v for k, v in out.items() if v is not None}


def map_record(
    rec: dict[str, Any], is_human_role: Callable[[str, str], bool]
) -> dict[str, Any] | None:
    """One record as a ``CloudEvent`` dict (docs/intake.md), or ``None`` for an Insights record.

    The result is not validated yet: a record lacking ``eventTime`` maps to an event lacking
    ``at``, reported by validation under the record's field name (``cloud_field``).

    Args:
        rec: one element of ``Records``.
        is_human_role: ``intake.humanRoles`` (role name, role ARN) -> whether a person.

    """
    if rec.get("eventCategory") == "Insight" or rec.get("eventType") == "AwsCloudTrailInsight":
        return None
    principal, role_arn = _principal(rec, is_human_role)
    source = rec.get("sourceIPAddress")
    source_ip = canonical_ip(source) if isinstance(source, str) else None
    source_host = _s(source, 128) if source_ip is None else None
    event: dict[str, Any] = {
        "principal": principal,
        "resource": _resource(rec),
        "outcome": "failure" if rec.get("errorCode") else "success",
        "source_ip": source_ip,
        "attributes": _attributes(rec, source_host),
        "role_arn": role_arn,
    }
    # Absent fields stay absent, so validation says `required field is missing`.
    for key, name in (("at", "eventTime"), ("system", "eventSource"), ("action", "eventName")):
        if name in rec:
            event[key] = rec[name]
    return event


def map_file(doc: Any, is_human_role: Callable[[str, str], bool]) -> CloudFile:
    """A decoded cloud audit log file as events (docs/intake.md#the-cloud-audit-log-file).

    Args:
        doc: the decoded JSON body.
        is_human_role: ``intake.humanRoles`` (role name, role ARN) -> whether a person.

    Returns:
        The events with their record indexes, the records skipped and why, and the records
        that cannot be mapped (not an object).

    Raises:
        Problem: 400 when the body is not a log file (no ``Records`` array); 413 when it holds
            more than 1,000 records (docs/intake.md#limits; split the file).

    """
    out = CloudFile()
    if not isinstance(doc, dict):
        raise Problem(
            400, "invalid-request", "The request is not valid", 'expected {"Records": [...]}'
        )
    if "Records" not in doc and "digestStartTime" in doc and "logFiles" in doc:
        out.skipped_file = "digest"
        return out
    records = doc.get("Records")
    if not isinstance(records, list):
        raise Problem(
            400,
            "invalid-request",
            "The request is not valid",
            'a cloud audit log file is {"Records": [...]}; `Records` is missing or not a list',
            [FieldError(None, "Records", "required array is missing")],
        )
    if len(records) > MAX_EVENTS:
        raise Problem(
            413,
            "too-many-events",
            "Too many events",
            f"the file holds {len(records)} records; at most {MAX_EVENTS} per request "
            "(split the file into several requests)",
        )
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            out.errors.append(FieldError(i, "", "a record must be a JSON object"))
            continue
        event = map_record(rec, is_human_role)
        if event is None:
            out.skipped.append({"index": i, "reason": "insight"})
        else:
            out.events.append((i, event))
    return out
