"""The intake's service layer: a decoded body in, a transaction on the broker out (docs/intake.md).

Transport-free (one service layer under thin transports,
docs/architecture.md#code-layout-and-conventions): ``app.py`` authenticates,
reads and decompresses the body, calls ``ingest_events`` / ``ingest_cloud_file`` in a worker
thread and turns a ``Problem`` into an RFC 9457 answer.

Both routes do the same four steps: decode, validate every event (naming every bad one),
normalize each into its record (docs/intake.md#the-record-on-svceventsv1), and send the batch as one
transaction. Nothing is produced unless every event is valid.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Any

import uuid_utils
from pydantic import ValidationError
from pydantic_core import from_json

from svc.intake.cloudtrail import cloud_field, map_file
from svc.intake.metrics import IntakeMetrics
from svc.intake.models import (
    CLOUD_EVENT,
    CLOUD_EVENTS,
    EVENT,
    EVENT_BATCH,
    MAX_EVENTS,
    Event,
    FieldError,
    Problem,
    check_event,
    format_utc,
    principal_key,
    to_record,
    validate_shapes,
)
from svc.intake.producer import BrokerUnavailable, TransactionalPool
from svc.intake.settings import IntakeSettings

__all__ = ["IntakeService", "decode_json", "json_depth"]


_STEP = [0] * 256
for _c in b"[{":
    _STEP[_c] = 1
for _c in b"]}":
    _STEP[_c] = -1
#: Every byte but the two quotes and four brackets that decide nesting (``bytes.translate``).
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
#: A backslash escape inside a JSON string and the character it escapes (RFC 8259 section 7).
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
#: ``line 3 column 14`` at the end of the JSON decoder's messages.
_AT = re.compile(r"^(.*) at line (\d+) column (\d+)$")


def json_depth(body: bytes) -> int:
    """How deep arrays and objects nest in a JSON text, measured without decoding it.

    Brackets inside strings do not count. The text is reduced to its quotes and brackets with
    ``bytes`` operations that run in C, so ``100,000`` ``[`` cost about a millisecond and
    nothing recurses. For text that is not JSON the figure is a bound of no meaning, and
    decoding then fails anyway.

    Args:
        body: the JSON text (UTF-8).

    Returns:
        The nesting depth: 0 for a scalar, 1 for ``[1, 2]``, 2 for ``{"a": [1]}``.

    """
    if b"\\" in body:
        body = _ESCAPE.sub(b"", body)  # an escaped quote does not end a string
    structure = body.translate(None, _NOT_STRUCTURE)
    # After splitting at the quotes, the even parts lie outside strings.
    brackets = b"".join(structure.split(b'"')[::2])
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def decode_json(body: bytes, max_depth: int) -> Any:
    """The JSON value of a body, refusing one nested deeper than ``max_depth`` before decoding.

    Decoded by pydantic-core's JSON parser (jiter, Rust), which refuses lone surrogates in
    strings (RFC 7493 section 2.1: they are not text) and never recurses in Python.

    Args:
        body: the decompressed request body.
        max_depth: ``SVC_INTAKE_MAX_JSON_DEPTH``; the deepest nesting of arrays and objects
            accepted (docs/intake.md, Limits).

    Returns:
        The decoded value (dicts, lists, str, int, float, bool, None).

    Raises:
        Problem: 400 ``json-too-deep`` naming the limit and its setting; 400 ``malformed-json``
            naming line and column (or an empty body, or one that is not UTF-8).

    """
    if not body.strip():
        raise Problem(400, "malformed-json", "The body is not JSON", "the body is empty")
    # More opening brackets than the limit is the only way to nest deeper than it.
    if body.count(b"[") + body.count(b"{") > max_depth:
        depth = json_depth(body)
        if depth > max_depth:
            raise Problem(
                400,
                "json-too-deep",
                "The body nests too deeply",
                f"the body nests {depth} levels deep; at most {max_depth} "
                f"(SVC_INTAKE_MAX_JSON_DEPTH={max_depth})",
            )
    try:
        return from_json(body)
    except ValueError as e:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as u:
            detail = f"the body is not UTF-8: {u.reason} at byte {u.start}"
        else:
            m = _AT.match(str(e))
            detail = f"line {m[2]}, column {m[3]}: {m[1]}" if m else str(e)
            if "hex escape" in detail:
                detail += (
                    " (\\u takes four hex digits, and \\uD800 to \\uDFFF only as a surrogate "
                    "pair: a lone surrogate is not text, RFC 7493 section 2.1)"
                )
        raise Problem(400, "malformed-json", "The body is not JSON", detail) from None


def _invalid(errors: list[FieldError], total: int, what: str) -> Problem:
    """The 400 naming every bad event; nothing of the batch was accepted."""
    errors.sort(key=lambda f: -1 if f.index is None else f.index)
    bad = len({f.index for f in errors if f.index is not None})
    if bad:
        detail = f"{bad} of {total} {what} invalid; nothing was accepted"
    else:
        detail = f"the request is not valid ({errors[0].field}: {errors[0].message})"
    return Problem(400, "invalid-events", "Invalid events", detail, errors)


class IntakeService:
    """Validates, normalizes and sends batches (docs/intake.md).

    Args:
        settings: the intake's settings (clock skew, human roles, Retry-After).
        pool: the transactional producers.
        metrics: where events are counted.

    """

    def __init__(
        self, settings: IntakeSettings, pool: TransactionalPool, metrics: IntakeMetrics
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        self.max_skew = timedelta(seconds=settings.max_clock_skew_secs)

    # -- POST /v1/events

    def ingest_events(self, body: bytes) -> dict[str, Any]:
        """``POST /v1/events``: 1 to 1,000 events (docs/intake.md), all or nothing.

        Args:
            body: the decompressed request body, ``{"events": [...]}``.

        Returns:
            The 202 answer: ``{"accepted": n}``.

        Raises:
            Problem: 400 (malformed JSON, nested deeper than ``max_json_depth``, or every
                invalid event by index and field), 413 (more than 1,000 events), 503 (the
                broker did not take the batch).

        """
        now = datetime.now(UTC)
        errors: list[FieldError] = []
        events: Sequence[Event | None]
        try:
            events = EVENT_BATCH.validate_json(body)["events"]
        except ValidationError as e:
            events, errors = self._events_slow_path(body, e)
        ats = [
            check_event(ev, i, now, self.max_skew, errors) if ev is not None else None
            for i, ev in enumerate(events)
        ]
        if errors:
            self.metrics.rejected_events.labels("events").inc(
                len({f.index for f in errors if f.index is not None})
            )
            raise _invalid(errors, len(events), "events are")
        self._send(events, ats, now)
        self.metrics.events.labels("events").inc(len(events))
        return {"accepted": len(events)}

    def _events_slow_path(
        self, body: bytes, first: ValidationError
    ) -> tuple[list[Event | None], list[FieldError]]:
        """After the whole-batch check failed: name every bad event, one at a time.

        The whole-batch check parses in Rust and stops at 200 levels of nesting; only here,
        after it failed, is the body decoded into Python objects, so only here can nesting
        matter: ``decode_json`` measures it first. A body that passed the check nests at most
        7 levels once ``check_event`` holds ``attributes`` to 4.
        """
        doc = decode_json(body, self.settings.max_json_depth)
        if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
            raise Problem(
                400,
                "invalid-request",
                "The request is not valid",
                'expected {"events": [ <event>, ... ]} with 1 to 1,000 events',
                [FieldError(None, "events", "required array of events is missing")],
            )
        items = doc["events"]
        if len(items) > MAX_EVENTS:
            raise Problem(
                413,
                "too-many-events",
                "Too many events",
                f"{len(items)} events in one request; at most {MAX_EVENTS} (split the batch)",
            )
        errors = [FieldError(None, k, "unknown field") for k in doc if k != "events"]
        if not items:
            errors.append(FieldError(None, "events", "at least one event is required"))
        ok, shape_errors = validate_shapes(items, EVENT)
        if not errors and not shape_errors:  # cannot happen: the batch check failed
            errors.append(FieldError(None, "", str(first)))
        return ok, errors + shape_errors

    # -- POST /v1/events/cloud-audit-trail

    def ingest_cloud_file(self, body: bytes) -> dict[str, Any]:
        """``POST /v1/events/cloud-audit-trail``: a CloudTrail file, all or nothing.

        The mapping is in docs/intake.md#the-cloud-audit-log-file.

        Args:
            body: the decompressed file, ``{"Records": [...]}``.

        Returns:
            The 202 answer: ``{"accepted": n, "skipped": [{"index", "reason"}]}``, or
            ``{"accepted": 0, "skipped_file": "digest"}`` for a digest file.

        Raises:
            Problem: 400 (malformed JSON, nested deeper than ``max_json_depth``, not a log
                file, or every bad record by its index in ``Records`` and its field), 413
                (more than 1,000 records), 503 (broker).

        """
        now = datetime.now(UTC)
        cf = map_file(decode_json(body, self.settings.max_json_depth), self.settings.is_human_role)
        if cf.skipped_file is not None:
            self.metrics.skipped.labels(cf.skipped_file).inc()
            return {"accepted": 0, "skipped": [], "skipped_file": cf.skipped_file}
        indexes = [i for i, _ in cf.events]
        mapped = [e for _, e in cf.events]
        errors = list(cf.errors)
        events: Sequence[Event | None]
        try:
            events = CLOUD_EVENTS.validate_python(mapped)
        except ValidationError:
            events, shape_errors = validate_shapes(mapped, CLOUD_EVENT, indexes)
            errors += shape_errors
        ats: list[Any] = []
        meaning: list[FieldError] = []
        for pos, ev in enumerate(events):
            ats.append(
                check_event(ev, indexes[pos], now, self.max_skew, meaning)
                if ev is not None
                else None
            )
        errors += meaning
        if errors:
            errors = [FieldError(f.index, cloud_field(f.field), f.message) for f in errors]
            self.metrics.rejected_events.labels("cloud").inc(
                len({f.index for f in errors if f.index is not None})
            )
            raise _invalid(errors, len(indexes) + len(cf.errors), "records are")
        if events:
            self._send(events, ats, now)
        for s in cf.skipped:
            self.metrics.skipped.labels(s["reason"]).inc()
        self.metrics.events.labels("cloud").inc(len(events))
        return {"accepted": len(events), "skipped": cf.skipped}

    # -- both

    def _send(self, events: Sequence[Event | None], ats: Sequence[Any], now: datetime) -> None:
        """Normalizes the (all valid) events and sends them as one transaction.

        Raises:
            Problem: 503 with ``Retry-After`` when the broker does not take the batch.

        """
        received_at = format_utc(now)
        uuid7 = uuid_utils.uuid7
        records = []
        for ev, at in zip(events, ats, strict=True):
            assert ev is not None and at is not None
            records.append((principal_key(ev), to_record(ev, at, received_at, str(uuid7()))))
        try:
            self.pool.send(records)
        except BrokerUnavailable as e:
            raise Problem(
                503,
                "broker-unavailable",
                "The broker cannot take the batch",
                f"{e}; nothing of the batch was accepted, retry it",
                headers={"Retry-After": str(self.settings.retry_after_secs)},
            ) from None
