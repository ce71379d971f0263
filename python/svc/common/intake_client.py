"""Audit events to the intake, in batches, from a thread of the sending component's own.

Components that record what they do as audit events (docs/intake.md) hand each event to an
``IntakeSender``: the portal's MCP endpoint (each tool call, ``svc.portal.mcp``) and the
challenge service (how a challenge ended, ``svc.challenge.service``, read by the reasoner:
docs/reasoner.md). The MCP gateway's own sender is asynchronous (``svc.gateway.service``).

How it behaves:

* ``put`` never blocks the caller's answer: the event is queued; past ``bound`` waiting events
  a new one is dropped, counted in ``dropped`` and logged.
* A thread takes up to ``batch_max`` events, waiting at most ``flush_secs`` after the first,
  and posts them as one ``POST /v1/events`` (``{"events": [...]}``) with the intake token as
  ``Authorization: Bearer`` (RFC 6750), read at every post so a renewed token is picked up.
* ``202`` counts the batch in ``sent``. No answer, a 5xx, ``408``, ``429``, or ``401``/``403``
  (a token the intake does not take yet: renewed, or the intake still starting), or a token file
  that cannot be read, sends the same batch again under the shared reconnect policy
  (``svc.common.retry.Reconnect``: full-jitter backoff from 0.2 s up to 10 s). Any other 4xx is
  a refusal for good (the intake names the bad events): the batch is dropped, counted and
  logged, since sending it again changes nothing.
* ``close`` gives what is queued one last try, then stops.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from svc.common.retry import Reconnect, Stopped

__all__ = ["IntakeSender"]

log = logging.getLogger("svc.intake_client")

#: Statuses after which the same batch is sent again (besides no answer and 5xx).
_RETRIED = frozenset({401, 403, 408, 429})


class _NotTaken(Exception):
    """The intake did not take a batch this time (it is sent again)."""


class IntakeSender:
    """Posts intake events in batches from a thread of its own (module docs).

    Args:
        url: the intake (``http://host:port``).
        token: returns the intake token (called at each post), or None to send none; an
            ``OSError`` from it (a token file not written yet) is a failed attempt.
        what: what the events are, for the thread's name and the log (``"MCP calls"``).
        bound: most events waiting (>= 1); past it new ones are dropped.
        batch_max: most events per request (1 to the intake's own limit, 10,000).
        flush_secs: longest wait of an event for its batch to fill, seconds (>= 0).
        timeout_secs: one request's timeout, seconds.

    Attributes:
        sent: events the intake took (``202``).
        dropped: events dropped: the queue full, or refused by the intake for good.

    """

    def __init__(
        self,
        url: str,
        token: Callable[[], str | None],
        *,
        what: str,
        bound: int = 10_000,
        batch_max: int = 500,
        flush_secs: float = 1.0,
        timeout_secs: float = 10.0,
    ) -> None:
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_secs)
        self._token = token
        self.what = what
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(bound)
        self.batch_max = batch_max
        self.flush_secs = flush_secs
        self.sent = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._policy = Reconnect(f"intake ({what})", log, retry_on=_NotTaken)
        self._thread = threading.Thread(
            target=self._run, name=f"svc-intake-{what.replace(' ', '-')}", daemon=True
        )

    def start(self) -> IntakeSender:
        """Starts the sending thread (events queue until then); returns self."""
        self._thread.start()
        return self

    def put(self, event: dict[str, Any]) -> None:
        """Queues one event (docs/intake.md's shape); drops it (counted, logged) when full."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            log.warning("intake queue full: an event of %s is dropped", self.what)

    def close(self, timeout: float = 15.0) -> None:
        """Gives what is queued one last try (for up to `timeout` seconds), then stops."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._http.close()

    def _post(self, batch: list[dict[str, Any]]) -> None:
        """Posts `batch` once.

        Raises:
            _NotTaken: the intake did not take it this time (module docs).

        """
        try:
            token = self._token()
        except OSError as e:
            raise _NotTaken(f"cannot read the intake token: {e}") from e
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            r = self._http.post("/v1/events", json={"events": batch}, headers=headers)
        except httpx.HTTPError as e:
            raise _NotTaken(f"the intake does not answer: {e}") from e
        if r.status_code == 202:
            self.sent += len(batch)
            return
        if r.status_code >= 500 or r.status_code in _RETRIED:
            raise _NotTaken(f"the intake answered {r.status_code}")
        self.dropped += len(batch)
        log.error(
            "the intake refused %d events of %s (%d): %s",
            len(batch),
            self.what,
            r.status_code,
            r.text[:500],
        )

    def _next_batch(self) -> list[dict[str, Any]]:
        """Up to ``batch_max`` events: the first waited for (0.2 s), the rest ``flush_secs``."""
        try:
            batch = [self._queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + self.flush_secs
        while len(batch) < self.batch_max:
            left = deadline - time.monotonic()
            try:
                batch.append(
                    self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                )
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        retrying = self._policy.retrying(self._stop)
        while not (self._stop.is_set() and self._queue.empty()):
            batch = self._next_batch()
            if not batch:
                continue
            try:
                retrying(self._post, batch)
            except Stopped:
                unsent = len(batch) + self._queue.qsize()
                self.dropped += unsent
                log.warning("stopped with %d events of %s unsent", unsent, self.what)
                return
