"""How challenges end, as audit events at the intake (docs/reasoner.md#challenges-that-failed).

``ChallengeService`` calls its ``audit`` hook with one intake event (docs/intake.md) when a
challenge is rejected, is found expired unanswered, or a security-key verification of it fails:
``system`` ``svc-challenge``, the challenged principal (and the person an agent acted for),
``action`` ``challenge.rejected`` / ``challenge.expired`` / ``challenge.verification_failed``,
the resource, ``outcome`` ``failure`` and ``attributes`` ``challenge_qid``, ``decision_qid``
and ``kinds``. The history stores them as events and its daily rollups count them per
principal (``principal_daily.challenges_failed``), which the reasoner scores in family (c).

``IntakeAudit`` is that hook for a running service: ``put`` queues the event (never blocks the
answer), a thread posts batches to ``POST /v1/events`` with the intake token, tries again with
a doubling wait (up to 30 s) while the intake is down, refuses the token or answers 5xx, and
drops a batch the intake refuses for good (another 4xx, logged). At most ``bound`` events
wait; past it new ones are dropped (counted, logged).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["IntakeAudit"]

log = logging.getLogger("svc.challenge.audit")


class IntakeAudit:
    """Posts the challenge service's audit events to the intake from a thread of its own.

    Args:
        url: the intake (``http://host:port``).
        token: returns the intake token (read at each post), or None to send none.
        bound: most events waiting; past it new ones are dropped.
        batch_max: most events per request.
        timeout_secs: one request's timeout.

    """

    def __init__(
        self,
        url: str,
        token: Callable[[], str | None],
        bound: int = 10_000,
        batch_max: int = 500,
        timeout_secs: float = 10.0,
    ) -> None:
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_secs)
        self._token = token
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(bound)
        self.batch_max = batch_max
        self.sent = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="svc-challenge-audit", daemon=True)

    def start(self) -> IntakeAudit:
        """Starts the sending thread; returns self."""
        self._thread.start()
        return self

    def put(self, event: dict[str, Any]) -> None:
        """Queues one intake event; drops it (counted, logged) when the queue is full."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            log.warning("audit queue full: a challenge's outcome event is dropped")

    def close(self, timeout: float = 5.0) -> None:
        """Sends what is queued (for up to `timeout` seconds), then stops."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._http.close()

    def _post(self, batch: list[dict[str, Any]]) -> bool:
        """True when the batch is done with (stored, or refused for good)."""
        try:
            token = self._token()
        except OSError as e:  # the token file not there yet, or unreadable: try again later
            log.warning("cannot read the intake token: %s", e)
            return False
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            r = self._http.post("/v1/events", json={"events": batch}, headers=headers)
        except httpx.HTTPError as e:
            log.warning("the intake does not answer: %s", e)
            return False
        if r.status_code == 202:
            self.sent += len(batch)
            return True
        # 401/403: a token not accepted yet (renewed, the intake still starting): try again.
        if 400 <= r.status_code < 500 and r.status_code not in (401, 403, 408, 429):
            self.dropped += len(batch)
            log.error("the intake refused %d audit events: %s", len(batch), r.text[:500])
            return True
        return False

    def _run(self) -> None:
        wait = 0.2
        batch: list[dict[str, Any]] = []
        while not (self._stop.is_set() and not batch and self._queue.empty()):
            if not batch:
                try:
                    batch.append(self._queue.get(timeout=0.2))
                except queue.Empty:
                    continue
            while len(batch) < self.batch_max:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._post(batch):
                batch, wait = [], 0.2
            elif self._stop.wait(wait):
                log.warning("stopping with %d audit events unsent", len(batch))
                return
            else:
                wait = min(wait * 2, 30.0)
