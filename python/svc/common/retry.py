"""One reconnect policy for every follower and link: exponential backoff with full jitter.

Every component that holds a connection to another service open (the decision point's
followers of the policy, context and challenge services, the gateway's links) opens it again
the same way when it fails, so ``Reconnect`` holds that policy once, built on ``tenacity``
(https://tenacity.readthedocs.io):

* **Waits.** The wait after the n-th failed attempt in a row is drawn uniformly from
  ``[0, min(max_secs, initial_secs * 2 ** (n - 1))]`` ("full jitter",
  https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/; tenacity's
  ``wait_random_exponential``): the first reconnect waits at most ``initial_secs``, the window
  doubles per failure up to ``max_secs``, and many clients of one restarted service do not come
  back in step.
* **Forever, until stopped.** Attempts go on while the stop event (``threading.Event`` or
  ``asyncio.Event``) is not set; the wait is a wait on that event, so setting it ends a wait at
  once. Without a stop event an asyncio wait ends when its task is cancelled.
* **A log line per failed attempt**, at WARNING on the caller's logger:
  ``<what>: <error>; reconnecting in <secs> s``.
* **A healthy connection starts over.** In ``forever`` an attempt that *returns* had its
  connection up (a stream that delivered its first message, a long poll answered) and lost it,
  or finished a step: the next attempt starts at once and the backoff starts over from
  ``initial_secs``. An attempt that *raises* one of ``retry_on`` failed: it is logged and
  waited for. Any other exception propagates.

Threads::

    reconnect = Reconnect("policy service", log, initial_secs=0.2, max_secs=10.0,
                          retry_on=StreamLost)
    reconnect.forever(self._stream, self._stop)        # returns once self._stop is set

asyncio (a gateway link, cancelled on shutdown, or stopped by an ``asyncio.Event``)::

    reconnect = Reconnect("upstream tools", log, retry_on=OSError)
    await reconnect.forever_async(self._session)       # until cancelled
    await reconnect.forever_async(self._session, stop)  # ... or until ``stop.set()``

    # one operation retried until it succeeds (a POST that must go through):
    async for attempt in reconnect.async_retrying(stop):
        with attempt:
            await client.post(...)

``retrying``/``async_retrying`` are plain ``tenacity.Retrying``/``AsyncRetrying`` objects:
callable on a function, or iterated with ``with attempt:`` blocks. Once the stop event is set
they raise ``Stopped`` (chained from the last failure) instead of trying again: after a failed
attempt, or at the end of the wait that the stop cut short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_random_exponential,
)

__all__ = ["Reconnect", "Stopped"]

ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]


class Stopped(Exception):
    """The stop event was set: the retries ended without a successful attempt.

    Raised by ``Reconnect.retrying``/``async_retrying`` objects; ``__cause__`` is the last
    failure when there was one. ``forever``/``forever_async`` catch it and return.
    """


class Reconnect:
    """The reconnect policy (module docs): full-jitter exponential backoff, forever until stop.

    Args:
        what: what is reconnected to, the first words of each log line (``"policy service"``).
        log: the logger the failed attempts are logged on (WARNING).
        initial_secs: the ceiling of the first wait, seconds (> 0, finite); each further failure
            in a row doubles the ceiling.
        max_secs: the largest ceiling, seconds (>= ``initial_secs``, finite).
        retry_on: the exception type(s) that count as a failed attempt; any other exception
            from an attempt propagates at once.

    Raises:
        ValueError: ``initial_secs`` or ``max_secs`` is not a finite positive number, or
            ``max_secs < initial_secs``.

    """

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        initial_secs: float = 0.2,
        max_secs: float = 10.0,
        retry_on: ExceptionTypes = Exception,
    ) -> None:
        if not (math.isfinite(initial_secs) and initial_secs > 0):
            raise ValueError(f"initial_secs must be a finite number above 0, not {initial_secs}")
        if not (math.isfinite(max_secs) and max_secs >= initial_secs):
            raise ValueError(
                f"max_secs must be a finite number at least initial_secs ({initial_secs}), "
                f"not {max_secs}"
            )
        self.what = what
        self.log = log
        self.initial_secs = float(initial_secs)
        self.max_secs = float(max_secs)
        self.retry_on = retry_on
        self.wait = wait_random_exponential(multiplier=self.initial_secs, max=self.max_secs)
        """tenacity's wait strategy: a ``RetryCallState`` -> the seconds to wait after it."""

    def ceiling(self, failures: int) -> float:
        """The largest wait after ``failures`` failed attempts in a row (>= 1), in seconds."""
        if failures < 1:
            raise ValueError(f"failures must be at least 1, not {failures}")
        return min(self.max_secs, self.initial_secs * 2.0 ** min(failures - 1, 1023))

    def _stopper(
        self, stop: threading.Event | asyncio.Event | None
    ) -> Callable[[RetryCallState], bool]:
        """Tenacity's ``stop``: never True; raises ``Stopped`` once ``stop`` is set."""

        def check(state: RetryCallState) -> bool:
            if stop is not None and stop.is_set():
                outcome = state.outcome
                raise Stopped(f"{self.what}: stopped") from (
                    outcome.exception() if outcome is not None else None
                )
            return False

        return check

    def _log(self, state: RetryCallState) -> None:
        """Tenacity's ``before_sleep``: one WARNING line naming the failure and the wait."""
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        text = (str(error) or type(error).__name__) if error is not None else "failed"
        secs = state.upcoming_sleep
        self.log.warning("%s: %s; reconnecting in %.1f s", self.what, text, secs)

    # -- threads ---------------------------------------------------------------------------

    def retrying(
        self,
        stop: threading.Event,
        *,
        sleep: Callable[[float], None] | None = None,
    ) -> Retrying:
        """A ``tenacity.Retrying`` that retries ``retry_on`` failures until ``stop`` is set.

        Args:
            stop: ends the retries; setting it ends a wait at once (the wait is
                ``stop.wait(secs)``).
            sleep: replaces that wait (tests record the waits with it).

        Returns:
            The retrying object: call it on a function, or iterate it with ``with attempt:``.
            A call returns the function's result once an attempt succeeds; it raises
            ``Stopped`` once ``stop`` is set (after a failure or a wait), and an exception
            outside ``retry_on`` at once.

        """

        def wait(secs: float) -> None:
            (sleep or stop.wait)(secs)
            if stop.is_set():
                raise Stopped(f"{self.what}: stopped while waiting")

        return Retrying(
            retry=retry_if_exception_type(self.retry_on),
            wait=self.wait,
            stop=self._stopper(stop),
            sleep=wait,
            before_sleep=self._log,
            reraise=True,
        )

    def forever(
        self,
        attempt: Callable[[], Any],
        stop: threading.Event,
        *,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """Calls ``attempt`` again and again until ``stop`` is set (module docs).

        Args:
            attempt: one connection (or step). Returning means it was healthy: the next starts
                at once with the backoff starting over. Raising one of ``retry_on`` is a failed
                attempt: logged, then waited for.
            stop: ends the loop; set from another thread (the wait ends at once).
            sleep: replaces the wait on ``stop`` (tests).

        Returns:
            None, once ``stop`` is set (an attempt under way finishes first: it is the
            caller's to cancel what it blocks on, for example its gRPC call).

        Raises:
            BaseException: an exception outside ``retry_on`` raised by ``attempt``.

        """
        retrying = self.retrying(stop, sleep=sleep)
        while not stop.is_set():
            try:
                retrying(attempt)
            except Stopped:
                return

    # -- asyncio ---------------------------------------------------------------------------

    def async_retrying(
        self,
        stop: asyncio.Event | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> AsyncRetrying:
        """A ``tenacity.AsyncRetrying`` that retries ``retry_on`` failures until ``stop``.

        Args:
            stop: ends the retries; setting it ends a wait at once. None: retries until the
                task is cancelled (the wait is ``asyncio.sleep``, which a cancel ends).
            sleep: replaces the wait (tests).

        Returns:
            The retrying object: ``await r(fn)`` on a coroutine function, or
            ``async for attempt in r: with attempt: ...``. It raises ``Stopped`` once ``stop``
            is set (after a failure or a wait).

        """

        async def wait(secs: float) -> None:
            if sleep is not None:
                await sleep(secs)
            elif stop is None:
                await asyncio.sleep(secs)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), secs)
            if stop is not None and stop.is_set():
                raise Stopped(f"{self.what}: stopped while waiting")

        return AsyncRetrying(
            retry=retry_if_exception_type(self.retry_on),
            wait=self.wait,
            stop=self._stopper(stop),
            sleep=wait,
            before_sleep=self._log,
            reraise=True,
        )

    async def forever_async(
        self,
        attempt: Callable[[], Awaitable[Any]],
        stop: asyncio.Event | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Awaits ``attempt()`` again and again until ``stop`` is set or the task is cancelled.

        The asyncio form of ``forever``: an attempt that returns was healthy (the next starts
        at once, the backoff starts over), one that raises one of ``retry_on`` failed (logged
        and waited for). Cancelling the task ends it, whether it is in an attempt or a wait
        (``asyncio.CancelledError`` propagates).

        Args:
            attempt: a coroutine function, one connection or step.
            stop: ends the loop when set (a wait ends at once); None: until cancelled.
            sleep: replaces the wait (tests).

        Raises:
            BaseException: an exception outside ``retry_on`` raised by ``attempt``.

        """
        retrying = self.async_retrying(stop, sleep=sleep)
        while stop is None or not stop.is_set():
            try:
                await retrying(attempt)
            except Stopped:
                return
