"""The intake's service layer: a decoded body in, a transaction on the broker out (SPEC 4.1).

Transport-free (STYLE "thin transports over one service layer"): ``app.py`` authenticates,
reads and decompresses the body, calls ``ingest_events`` / ``ingest_cloud_file`` in a worker
thread and turns a ``Problem`` into an RFC 9457 answer.

Both routes do the same four steps: decode, validate every event (naming every bad one),
normalize each into its record (DESIGN 6), and send the batch as one transaction. Nothing is
produced unless every event is valid.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import uuid_utils
from pydantic import ValidationError

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

__all__ = ["IntakeService", "decode_json"]


def decode_json(body: bytes) -> Any:
    """The JSON value of a body.

    Raises:
        Problem: 400 ``malformed-json`` naming line and column (or an empty body).

    """
    if not body.strip():
        raise Problem(400, "malformed-json", "The body is not JSON", "the body is empty")
    try:
        return json.loads(body)
    except UnicodeDecodeError as e:
        raise Problem(
            400, "malformed-json", "The body is not JSON", f"the body is not UTF-8: {e.reason}"
        ) from None
    except json.JSONDecodeError as e:
        raise Problem(
            400,
            "malformed-json",
            "The body is not JSON",
            f"line {e.lineno}, column {e.colno}: {e.msg}",
        ) from None


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
    """Validates, normalizes and sends batches (SPEC 2.2, 2.3, 4.1, 7).

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
        """``POST /v1/events``: 1 to 1,000 events of SPEC 2.2, all or nothing.

        Args:
            body: the decompressed request body, ``{"events": [...]}``.

        Returns:
            The 202 answer: ``{"accepted": n}``.

        Raises:
            Problem: 400 (malformed JSON, or every invalid event by index and field), 413
                (more than 1,000 events), 503 (the broker did not take the batch).

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
        """After the whole-batch check failed: name every bad event, one at a time."""
        doc = decode_json(body)
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
        """``POST /v1/events/cloud-audit-trail``: a CloudTrail file, all or nothing (SPEC 2.3).

        Args:
            body: the decompressed file, ``{"Records": [...]}``.

        Returns:
            The 202 answer: ``{"accepted": n, "skipped": [{"index", "reason"}]}``, or
            ``{"accepted": 0, "skipped_file": "digest"}`` for a digest file.

        Raises:
            Problem: 400 (malformed JSON, not a log file, or every bad record by its index in
                ``Records`` and its field), 413 (more than 1,000 records), 503 (broker).

        """
        now = datetime.now(UTC)
        cf = map_file(decode_json(body), self.settings.is_human_role)
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
