"""The intake's event (docs/intake.md), its validation, its normalized record, and problem details.

Validation has two steps, both reporting every problem of every event ("validate all,
report all", docs/architecture.md#code-layout-and-conventions), each as a ``FieldError`` naming the
event's index and the field:

1. **Shape** (pydantic v2, strict, in Rust): the batch is parsed and checked against the
   ``Event`` TypedDict in one ``validate_json`` call: mandatory fields, types, enumerations,
   lengths, unknown fields, and no control characters in identifiers (``svc.identifiers``).
2. **Meaning** (``check_event``, Python): ``at`` is RFC 3339 with an offset and not more than
   five minutes ahead (docs/intake.md#limits), ``count`` requires ``access``, ``on_behalf_of`` only
   for a ``ServiceAccount``, ``source_ip`` is an IP address, ``attributes`` hold no document
   contents.

TypedDicts rather than models: the validated events stay plain dicts, which keeps a
1,000-event batch at a few milliseconds (docs/benchmarks.md, "Audit intake").

Mandatory fields: ``at``, ``system``, ``principal``, ``action``, ``resource``; the rest are
optional, absent or ``null`` meaning unknown. docs/intake.md has what each may hold.

The normalized record (``to_record``, docs/intake.md#the-record-on-svceventsv1) is the event with
``at`` in UTC (RFC 3339, milliseconds, ``Z``) plus ``received_at``, ``ingest_id`` (UUIDv7) and
``role_arn`` (cloud records; ``null`` otherwise). Every field is present, ``null`` when the event
did not say.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError, with_config
from pydantic_core import to_json
from typing_extensions import TypedDict  # pydantic needs it before Python 3.12

from svc.common.problems import FieldError, Problem
from svc.identifiers import IDENTIFIER_PATTERN, identifier_problem

__all__ = [
    "ATTRIBUTES_MAX_BYTES",
    "ATTRIBUTES_MAX_DEPTH",
    "ATTRIBUTE_STRING_MAX_CHARS",
    "MAX_EVENTS",
    "CloudEvent",
    "Entity",
    "Event",
    "FieldError",
    "Person",
    "Principal",
    "Problem",
    "canonical_ip",
    "check_event",
    "field_errors",
    "format_utc",
    "parse_rfc3339",
    "principal_key",
    "to_record",
    "validate_shapes",
]

#: Events per request (docs/intake.md#limits).
MAX_EVENTS = 1000
#: ``attributes`` serialized as compact JSON (UTF-8) may take at most this many bytes.
ATTRIBUTES_MAX_BYTES = 4096
#: No string inside ``attributes`` (value or key) may be longer than this many characters.
ATTRIBUTE_STRING_MAX_CHARS = 1024
#: Objects and arrays inside ``attributes`` nest at most this deep (``attributes`` itself is 1).
ATTRIBUTES_MAX_DEPTH = 4
#: The earliest ``at`` accepted (the history store's time range starts here).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)

Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=IDENTIFIER_PATTERN)]
"""A short word: a system, an action, a type name, a tool; no control characters."""
Id = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=IDENTIFIER_PATTERN)]
"""A principal's id (SCIM user name, service-account id, cloud ARN); no control characters."""
ResourceId = Annotated[str, StringConstraints(max_length=2048, pattern=IDENTIFIER_PATTERN)]
"""A resource id; empty for a list or search; ARNs run to 2,048 characters."""
Arn = Annotated[str, StringConstraints(max_length=2048, pattern=IDENTIFIER_PATTERN)]
"""A cloud ARN (``role_arn``); no control characters."""

_STRICT = ConfigDict(strict=True, extra="forbid")


@with_config(_STRICT)
class Principal(TypedDict):
    """The acting principal: a ``Human`` or a ``ServiceAccount``."""

    type: Literal["Human", "ServiceAccount"]
    id: Id


@with_config(_STRICT)
class Person(TypedDict):
    """The person a service account acted for (``on_behalf_of``): a ``Human``."""

    type: Literal["Human"]
    id: Id


@with_config(_STRICT)
class Entity(TypedDict):
    """A resource: its own type name; ``id`` may be empty for a list or search."""

    type: Name
    id: ResourceId


@with_config(_STRICT)
class Event(TypedDict):
    """One event as apps send it to ``POST /v1/events`` (docs/intake.md); see the module docs."""

    at: Annotated[
        str, StringConstraints(max_length=64), Field(json_schema_extra={"format": "date-time"})
    ]
    system: Name
    principal: Principal
    action: Name
    resource: Entity
    on_behalf_of: NotRequired[Person | None]
    outcome: NotRequired[Literal["success", "failure"] | None]
    source_ip: NotRequired[Annotated[str, StringConstraints(max_length=64)] | None]
    attributes: NotRequired[dict[str, Any] | None]
    access: NotRequired[Literal["listed", "read", "written", "exported"] | None]
    count: NotRequired[Annotated[int, Field(ge=0, le=2**63 - 1)] | None]
    tool: NotRequired[Name | None]
    action_class: NotRequired[Name | None]


@with_config(_STRICT)
class CloudEvent(Event):
    """An event mapped from a cloud audit record: an ``Event`` plus ``role_arn``."""

    role_arn: NotRequired[Arn | None]


@with_config(_STRICT)
class EventBatch(TypedDict):
    """The body of ``POST /v1/events`` (docs/intake.md#routes): 1 to 1,000 events."""

    events: Annotated[list[Event], Field(min_length=1, max_length=MAX_EVENTS)]


EVENT_BATCH: TypeAdapter[EventBatch] = TypeAdapter(EventBatch)
EVENT: TypeAdapter[Event] = TypeAdapter(Event)
CLOUD_EVENT: TypeAdapter[CloudEvent] = TypeAdapter(CloudEvent)
CLOUD_EVENTS: TypeAdapter[list[CloudEvent]] = TypeAdapter(list[CloudEvent])


# -- step 1: shape


def _path(loc: Iterable[int | str]) -> str:
    """``("attributes", "tags", 2)`` -> ``attributes.tags[2]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(err: Any) -> str:
    """Pydantic's message in the project's style (lowercase start, no final period)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch" and isinstance(err.get("input"), str):
        # The one pattern the event uses is the identifier rule (svc.identifiers).
        why = identifier_problem(err["input"])
        if why is not None:
            return why
    msg = str(err["msg"])
    return (msg[:1].lower() + msg[1:]).rstrip(".")


def field_errors(e: ValidationError, index: int | None = None) -> list[FieldError]:
    """The errors of one ``ValidationError`` as ``FieldError``s.

    Args:
        e: a validation error of one event (``index`` given) or of a whole request.
        index: the event's index in its batch; ``None`` for request-level errors.

    """
    return [
        FieldError(index, _path(err["loc"]), _message(err))
        for err in e.errors(include_url=False, include_context=False, include_input=True)
    ]


def validate_shapes(
    items: Sequence[Any], adapter: TypeAdapter[Any], indexes: Sequence[int] | None = None
) -> tuple[list[Any], list[FieldError]]:
    """Step 1 for each item on its own, so every bad item is named (the slow path).

    Args:
        items: decoded JSON values, one per event.
        adapter: ``EVENT`` or ``CLOUD_EVENT``.
        indexes: the index to report for each item (default: its position).

    Returns:
        The valid items (``None`` where invalid) and the errors, in batch order.

    """
    ok: list[Any] = []
    errors: list[FieldError] = []
    for pos, item in enumerate(items):
        index = indexes[pos] if indexes is not None else pos
        try:
            ok.append(adapter.validate_python(item))
        except ValidationError as e:
            ok.append(None)
            errors += field_errors(e, index)
    return ok, errors


# -- step 2: meaning

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z"
)


def parse_rfc3339(value: str) -> datetime:
    """Parses an RFC 3339 timestamp with any offset (the event's ``at``, RFC 3339 section 5.6).

    Args:
        value: like ``2025-03-06T02:25:06.5+01:00``: ``T``, ``t`` or a space between date and
            time; ``Z``, ``z`` or ``+hh:mm``; up to nine fraction digits, kept to the
            microsecond; a leap second ``:60`` becomes ``:59.999999``.

    Returns:
        An aware datetime (with the offset as given).

    Raises:
        ValueError: not RFC 3339 (a date alone, no offset, Unix seconds...) or not a real
            date and time; the message says which.

    """
    m = _RFC3339.match(value)
    if m is None:
        raise ValueError(
            f"`{value}` is not an RFC 3339 timestamp with an offset, like "
            "2025-03-06T02:25:06Z or 2025-03-06T03:25:06+01:00"
        )
    text = value.upper().replace(" ", "T")
    leap = m.group(3) == "60"
    if leap:
        text = text[:17] + "59" + text[19:]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as e:
        raise ValueError(f"`{value}` is not a valid date and time: {e}") from None
    if leap:
        dt = dt.replace(microsecond=999_999)
    return dt


def format_utc(dt: datetime) -> str:
    """``dt`` in UTC as RFC 3339 with milliseconds and ``Z`` (docs/intake.md).

    For example ``2025-03-06T03:25:06.5+01:00`` gives ``2025-03-06T02:25:06.500Z``.
    """
    return dt.astimezone(UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def canonical_ip(text: str) -> str | None:
    """``text`` in canonical form when it is an IPv4 or IPv6 address, else ``None``.

    Anything else gives ``None``, including text ``inet_pton`` refuses with ``ValueError``
    rather than ``OSError`` (a NUL inside, characters outside Latin-1).
    """
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            return socket.inet_ntop(family, socket.inet_pton(family, text))
        except (OSError, ValueError):
            continue
    return None


def _attributes_problem(attrs: dict[str, Any]) -> str | None:
    """Why ``attributes`` look like document contents, or ``None`` (docs/intake.md, Limits).

    Refused: a string (key or value) over 1,024 characters, nesting deeper than 4, or more
    than 4,096 bytes as compact JSON.
    """
    encoded = to_json(attrs)
    size = len(encoded)
    if size > ATTRIBUTES_MAX_BYTES:
        return f"attributes take {size} bytes as JSON (at most {ATTRIBUTES_MAX_BYTES})"
    # Fast path: no string can be longer than the whole JSON, and nesting deeper than the
    # limit needs more than that many `{` / `[` (counting those inside strings too).
    if (
        size <= ATTRIBUTE_STRING_MAX_CHARS
        and encoded.count(b"{") + encoded.count(b"[") <= ATTRIBUTES_MAX_DEPTH
    ):
        return None
    stack: list[tuple[Any, str, int]] = [(attrs, "attributes", 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            if depth > ATTRIBUTES_MAX_DEPTH:
                return f"`{path}` nests deeper than {ATTRIBUTES_MAX_DEPTH} levels"
            for k, v in node.items():
                if len(k) > ATTRIBUTE_STRING_MAX_CHARS:
                    return f"a key in `{path}` is longer than {ATTRIBUTE_STRING_MAX_CHARS} chars"
                if isinstance(v, str):
                    if len(v) > ATTRIBUTE_STRING_MAX_CHARS:
                        return (
                            f"`{path}.{k}` is {len(v)} characters long "
                            f"(at most {ATTRIBUTE_STRING_MAX_CHARS})"
                        )
                elif isinstance(v, dict | list):
                    stack.append((v, f"{path}.{k}", depth + 1))
        elif isinstance(node, list):
            if depth > ATTRIBUTES_MAX_DEPTH:
                return f"`{path}` nests deeper than {ATTRIBUTES_MAX_DEPTH} levels"
            for i, v in enumerate(node):
                if isinstance(v, str):
                    if len(v) > ATTRIBUTE_STRING_MAX_CHARS:
                        return (
                            f"`{path}[{i}]` is {len(v)} characters long "
                            f"(at most {ATTRIBUTE_STRING_MAX_CHARS})"
                        )
                elif isinstance(v, dict | list):
                    stack.append((v, f"{path}[{i}]", depth + 1))
    return None


def check_event(
    event: Event, index: int, now: datetime, max_skew: timedelta, errors: list[FieldError]
) -> datetime | None:
    """Step 2 (meaning) for one event whose shape is valid; appends its problems to ``errors``.

    Args:
        event: the event (after ``validate_shapes`` or ``EVENT_BATCH``); ``source_ip`` is
            replaced by its canonical form.
        index: the event's index, for the errors.
        now: server time (the clock check, docs/intake.md#limits).
        max_skew: how far ahead of ``now`` an event may be (5 minutes by default,
            docs/intake.md#limits).
        errors: where problems go.

    Returns:
        ``at`` as an aware datetime, or ``None`` when ``at`` is wrong.

    """
    at: datetime | None
    try:
        at = parse_rfc3339(event["at"])
    except ValueError as e:
        errors.append(FieldError(index, "at", str(e)))
        at = None
    else:
        if at > now + max_skew:
            ahead = (at - now).total_seconds()
            errors.append(
                FieldError(
                    index,
                    "at",
                    f"bad clock: the event's time is {ahead:.0f} s ahead of the server's time "
                    f"(at most {max_skew.total_seconds():.0f} s allowed)",
                )
            )
            at = None
        elif at < EARLIEST:
            errors.append(FieldError(index, "at", "the event's time is before 1970-01-01"))
            at = None
    if event.get("count") is not None and event.get("access") is None:
        errors.append(FieldError(index, "count", "`count` requires `access` (kind of rows)"))
    if event.get("on_behalf_of") is not None and event["principal"]["type"] != "ServiceAccount":
        errors.append(
            FieldError(
                index,
                "on_behalf_of",
                "`on_behalf_of` names the person a service account acted for; "
                f"the principal is a `{event['principal']['type']}`",
            )
        )
    ip = event.get("source_ip")
    if ip is not None:
        canonical = canonical_ip(ip)
        if canonical is None:
            errors.append(FieldError(index, "source_ip", f"`{ip}` is not an IP address"))
        else:
            event["source_ip"] = canonical
    attrs = event.get("attributes")
    if attrs:
        why = _attributes_problem(attrs)
        if why is not None:
            errors.append(
                FieldError(
                    index,
                    "attributes",
                    f"{why}: attributes are small facts, never document contents",
                )
            )
        plan_qid = attrs.get("plan_qid")
        if plan_qid is not None and not (isinstance(plan_qid, str) and plan_qid):
            errors.append(
                FieldError(index, "attributes.plan_qid", "`plan_qid` must be a non-empty string")
            )
    return at


def principal_key(event: Event) -> bytes:
    """The broker key: the principal as ``Type::id``, as the decision log's.

    One principal's records stay in order on one partition (docs/architecture.md#how-records-flow).
    """
    p = event["principal"]
    return f"{p['type']}::{p['id']}".encode()


def to_record(event: Event, at: datetime, received_at: str, ingest_id: str) -> bytes:
    """The normalized record of one valid event for ``svc.events.v1``, as JSON.

    The record is in docs/intake.md#the-record-on-svceventsv1.

    Args:
        event: a valid event (``Event`` or ``CloudEvent``).
        at: its time (``check_event``'s result).
        received_at: when the intake received the batch (``format_utc``).
        ingest_id: this event's UUIDv7.

    Returns:
        Compact UTF-8 JSON of every field, in the order of docs/intake.md, ``null`` when
        unknown; ``attributes`` is ``{}`` when absent.

    """
    get = event.get
    return to_json(
        {
            "at": format_utc(at),
            "system": event["system"],
            "principal": event["principal"],
            "on_behalf_of": get("on_behalf_of"),
            "action": event["action"],
            "resource": event["resource"],
            "outcome": get("outcome"),
            "source_ip": get("source_ip"),
            "attributes": get("attributes") or {},
            "access": get("access"),
            "count": get("count"),
            "tool": get("tool"),
            "action_class": get("action_class"),
            "received_at": received_at,
            "ingest_id": ingest_id,
            "role_arn": get("role_arn"),
        }
    )
