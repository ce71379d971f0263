"""The outbox worker: sends the challenge notifications to a chat webhook.

``ChallengeService`` writes each notification to the ``outbox`` table in the same transaction as
the challenge change it tells of (the transactional outbox pattern), so a change is never told
without being stored, nor stored without being told. ``OutboxWorker`` sends them in order to a
Slack-compatible incoming webhook (``POST`` of ``{"text": ...}``, <https://api.slack.com/messaging/webhooks>)
with an ``Idempotency-Key`` header holding the notification's key (a UUIDv7), so a receiver that
sees a notification twice (a worker killed between the webhook's answer and its own commit) can
tell; docs/challenges.md#notifications.

Each notification is tried ``webhook_attempts`` times with exponential backoff (tenacity:
``webhook_backoff_secs`` doubling up to ``webhook_backoff_max_secs``). A webhook that still fails
(a connection error, a timeout, 408, 429 or 5xx) keeps the row: it is tried again after a wait
that doubles each round, and the notifications after it wait too, so the receiver sees them in
order. A 4xx other than 408 and 429 is a refusal for good: the row is marked failed, with the
error, and the worker goes on. A row is claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` for as
long as it is being sent, so replicas never send one notification at the same time, and a worker
killed mid-send leaves the row unsent for the next one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import func
from sqlmodel import Session, col, select
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from svc.challenge.models import OutboxRow
from svc.challenge.service import ChallengeService

__all__ = ["IDEMPOTENCY_HEADER", "OutboxWorker"]

log = logging.getLogger("svc.challenge.notify")

#: The header carrying a notification's idempotency key.
IDEMPOTENCY_HEADER = "Idempotency-Key"


class _Retryable(Exception):
    """A send that may succeed later: no answer, a timeout, 408, 429 or 5xx."""


class _Refused(Exception):
    """A send the webhook refuses for good: a 4xx other than 408 and 429."""


class OutboxWorker:
    """Sends the outbox's notifications to ``settings.webhook_url`` (module docs).

    Args:
        service: the challenge service (its database, settings and change callbacks).
        transport: an httpx transport (tests); default: real connections.
        sleep: how the worker waits between tries (tests pass a recorder around
            ``time.sleep``).
        clock: the current time, aware UTC (default: the service's clock).

    """

    def __init__(
        self,
        service: ChallengeService,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.service = service
        self.settings = service.settings
        self.clock = clock or service.clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sleep: Callable[[float], None] = sleep or self._wait
        self._client = httpx.Client(timeout=self.settings.webhook_timeout_secs, transport=transport)
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.sent = 0
        self.failed = 0

    def _wait(self, secs: float) -> None:
        """Waits ``secs`` between tries, or less when the worker is stopped."""
        self._stop.wait(secs)

    # -- one notification

    def _post(self, row: OutboxRow) -> None:
        """One POST; raises ``_Retryable`` or ``_Refused`` unless the webhook answers 2xx."""
        url = self.settings.webhook_url or ""
        try:
            r = self._client.post(url, json=row.payload, headers={IDEMPOTENCY_HEADER: row.key})
        except httpx.HTTPError as e:
            raise _Retryable(f"{e.__class__.__name__}: {e}") from None
        if 200 <= r.status_code < 300:
            return
        text = f"HTTP {r.status_code}: {r.text[:200]}"
        if r.status_code in (408, 429) or r.status_code >= 500:
            raise _Retryable(text)
        raise _Refused(text)

    def _send(self, row: OutboxRow) -> tuple[str, int, str]:
        """Tries one notification up to ``webhook_attempts`` times.

        Returns:
            (``sent``, ``refused`` or ``retry``; the tries made; the last error).

        """
        tries = 0
        retrying = Retrying(
            stop=stop_after_attempt(self.settings.webhook_attempts),
            wait=wait_exponential(
                multiplier=self.settings.webhook_backoff_secs,
                max=self.settings.webhook_backoff_max_secs,
            ),
            retry=retry_if_exception_type(_Retryable),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    tries += 1
                    if self._stop.is_set() and tries > 1:
                        raise _Retryable("the worker is stopping")
                    self._post(row)
        except _Refused as e:
            return "refused", tries, str(e)
        except _Retryable as e:
            return "retry", tries, str(e)
        return "sent", tries, ""

    def run_once(self) -> bool:
        """Sends the oldest unsent notification, if one is due.

        Returns:
            True when a notification was handled (sent or refused for good), so another may be
            due at once; False when none is waiting, the oldest must wait for its next round,
            or the webhook still fails (the row is kept for the next round).

        """
        if not self.settings.webhook_url:
            return False
        with Session(self.service.db) as s:
            row = s.exec(
                select(OutboxRow)
                .where(col(OutboxRow.sent_at).is_(None), col(OutboxRow.failed_at).is_(None))
                .order_by(col(OutboxRow.id))
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return False
            now = self.clock()
            due = row.next_attempt_at
            due = due.replace(tzinfo=UTC) if due.tzinfo is None else due
            if due > now:
                return False
            outcome, tries, error = self._send(row)
            now = self.clock()
            row.attempts += tries
            row.last_error = error
            if outcome == "sent":
                row.sent_at = now
                self.sent += 1
                log.info("notification %s (%s) sent", row.key, row.event)
            elif outcome == "refused":
                row.failed_at = now
                self.failed += 1
                log.error("notification %s refused by the webhook for good: %s", row.key, error)
            else:
                rounds = max(1, row.attempts // self.settings.webhook_attempts)
                wait = min(
                    self.settings.webhook_backoff_max_secs,
                    self.settings.webhook_backoff_secs * 2 ** min(rounds, 30),
                )
                row.next_attempt_at = now + timedelta(seconds=wait)
                log.warning(
                    "notification %s not sent after %d tries (%s); next round in %.1f s",
                    row.key,
                    row.attempts,
                    error,
                    wait,
                )
            s.add(row)
            s.commit()
            return outcome != "retry"

    def pending(self) -> int:
        """How many notifications are neither sent nor failed."""
        with Session(self.service.db) as s:
            n = s.exec(
                select(func.count())
                .select_from(OutboxRow)
                .where(col(OutboxRow.sent_at).is_(None), col(OutboxRow.failed_at).is_(None))
            ).one()
            return int(n)

    # -- the loop

    def run(self) -> None:
        """Sends notifications until ``stop``; wakes on every change and each poll interval.

        A database or webhook error is logged and the loop goes on after the poll interval.
        """
        self._unsubscribe = self.service.subscribe(self._wake.set)
        try:
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    while not self._stop.is_set() and self.run_once():
                        pass
                except Exception:
                    log.exception("the outbox worker failed; trying again")
                self._wake.wait(self.settings.outbox_poll_secs)
        finally:
            if self._unsubscribe is not None:
                self._unsubscribe()

    def start(self) -> OutboxWorker:
        """Runs ``run`` in a daemon thread of its own; returns self."""
        self._thread = threading.Thread(target=self.run, name="svc-challenge-outbox", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the loop (a send in progress ends its current try) and waits for the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._client.close()
