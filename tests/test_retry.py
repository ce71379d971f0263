"""The one reconnect policy (`svc.common.retry.Reconnect`): full-jitter waits within their
bounds, a stop event that ends a wait at once, healthy attempts that start the backoff over,
in threads and in asyncio. No test sleeps: the waits are recorded (``sleep=``) or ended by the
stop event they wait on."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from tenacity import RetryCallState

from svc.common.retry import Reconnect, Stopped

log = logging.getLogger("tests.retry")


class Lost(Exception):
    """A failed attempt."""


def failing(times: int, then: object = None) -> tuple[list[int], object]:
    """An attempt that raises ``Lost`` ``times`` times, then returns ``then``; and its calls."""
    calls: list[int] = []

    def attempt() -> object:
        calls.append(1)
        if len(calls) <= times:
            raise Lost(f"failure {len(calls)}")
        return then

    return calls, attempt


def test_waits_stay_within_the_doubling_ceiling() -> None:
    r = Reconnect("svc", log, initial_secs=0.2, max_secs=10.0, retry_on=Lost)
    assert [r.ceiling(n) for n in range(1, 9)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    state = RetryCallState(retry_object=r.retrying(threading.Event()), fn=None, args=(), kwargs={})
    for n in (1, 2, 3, 6, 7, 50, 5000):
        state.attempt_number = n
        draws = [r.wait(state) for _ in range(500)]
        assert all(0.0 <= d <= r.ceiling(n) for d in draws), (n, max(draws))
        # Full jitter: the draws spread over the window, not stuck at its top or bottom.
        assert min(draws) < r.ceiling(n) / 4 and max(draws) > r.ceiling(n) * 3 / 4


def test_a_run_waits_the_growing_sequence_and_logs_each_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = Reconnect("policy service", log, initial_secs=0.5, max_secs=4.0, retry_on=Lost)
    waits: list[float] = []
    calls, attempt = failing(7, then="up")
    with caplog.at_level(logging.WARNING, logger="tests.retry"):
        assert r.retrying(threading.Event(), sleep=waits.append)(attempt) == "up"
    assert len(calls) == 8 and len(waits) == 7
    assert all(0.0 <= w <= r.ceiling(n) for n, w in enumerate(waits, 1)), waits
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 7
    assert lines[0].startswith("policy service: failure 1; reconnecting in ")
    assert lines[6].startswith("policy service: failure 7; reconnecting in ")


def test_other_exceptions_are_not_retried() -> None:
    r = Reconnect("svc", log, retry_on=Lost)
    waits: list[float] = []

    def broken() -> None:
        raise KeyError("a bug, not a lost connection")

    with pytest.raises(KeyError):
        r.forever(broken, threading.Event(), sleep=waits.append)
    assert waits == []


def test_a_set_stop_ends_a_wait_at_once_and_the_loop() -> None:
    """The wait is on the stop event: once it is set, a wait of a million seconds returns."""
    r = Reconnect("svc", log, initial_secs=1e6, max_secs=1e6, retry_on=Lost)
    stop = threading.Event()
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise Lost("refused")

    waiting = threading.Event()

    class SetStopOnLog(logging.Handler):
        # The log line comes right before the wait; the test thread sets stop after it.
        def emit(self, record: logging.LogRecord) -> None:
            waiting.set()

    handler = SetStopOnLog()
    log.addHandler(handler)
    try:
        t = threading.Thread(target=r.forever, args=(attempt, stop))
        t.start()
        waiting.wait()
        stop.set()
        t.join(timeout=120)  # a guard against a hang, far below the million-second wait
        assert not t.is_alive(), "setting stop did not end the wait"
    finally:
        log.removeHandler(handler)
    assert len(calls) == 1


def test_forever_starts_over_after_a_healthy_attempt() -> None:
    """An attempt that returns was healthy: the next is at once, its waits start over."""
    r = Reconnect("svc", log, initial_secs=1.0, max_secs=64.0, retry_on=Lost)
    stop = threading.Event()
    waits: list[tuple[int, float]] = []
    script = ["fail", "fail", "fail", "up", "fail", "up", "stop"]
    failures_in_row = 0

    def attempt() -> None:
        nonlocal failures_in_row
        step = script.pop(0)
        if step == "stop":
            stop.set()
            raise Lost("stopped")
        if step == "fail":
            failures_in_row += 1
            raise Lost("refused")
        failures_in_row = 0

    def sleep(secs: float) -> None:
        waits.append((failures_in_row, secs))

    r.forever(attempt, stop, sleep=sleep)
    assert script == []
    # Three failures, then (after a healthy attempt, with no wait) one failure again.
    assert [n for n, _ in waits] == [1, 2, 3, 1]
    assert all(0.0 <= s <= r.ceiling(n) for n, s in waits), waits


def test_settings_are_checked() -> None:
    for initial, top in (
        (0.0, 1.0),
        (-1.0, 1.0),
        (float("nan"), 1.0),
        (2.0, 1.0),
        (1, float("inf")),
    ):
        with pytest.raises(ValueError):
            Reconnect("svc", log, initial_secs=initial, max_secs=top)
    with pytest.raises(ValueError):
        Reconnect("svc", log).ceiling(0)


def test_asyncio_retries_until_success_with_bounded_waits() -> None:
    r = Reconnect("upstream", log, initial_secs=0.25, max_secs=2.0, retry_on=Lost)
    waits: list[float] = []

    async def record(secs: float) -> None:
        waits.append(secs)

    async def main() -> str:
        tries = 0

        async def attempt() -> str:
            nonlocal tries
            tries += 1
            if tries <= 6:
                raise Lost("refused")
            return "up"

        return await r.async_retrying(sleep=record)(attempt)

    assert asyncio.run(main()) == "up"
    assert len(waits) == 6
    assert all(0.0 <= w <= r.ceiling(n) for n, w in enumerate(waits, 1)), waits


def test_asyncio_stop_event_ends_a_wait_at_once() -> None:
    r = Reconnect("upstream", log, initial_secs=1e6, max_secs=1e6, retry_on=Lost)

    async def main() -> int:
        stop = asyncio.Event()
        failed = asyncio.Event()
        tries = 0

        async def attempt() -> None:
            nonlocal tries
            tries += 1
            failed.set()
            raise Lost("refused")

        task = asyncio.create_task(r.forever_async(attempt, stop))
        await failed.wait()
        await asyncio.sleep(0)  # into the wait
        stop.set()
        # A guard against a hang, far below the million-second wait.
        await asyncio.wait_for(task, 120)
        return tries

    assert asyncio.run(main()) == 1


def test_asyncio_without_stop_ends_on_cancel() -> None:
    r = Reconnect("upstream", log, initial_secs=1e6, max_secs=1e6, retry_on=Lost)

    async def main() -> None:
        failed = asyncio.Event()

        async def attempt() -> None:
            failed.set()
            raise Lost("refused")

        task = asyncio.create_task(r.forever_async(attempt))
        await failed.wait()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 120)

    asyncio.run(main())


def test_asyncio_forever_starts_over_after_a_healthy_attempt() -> None:
    r = Reconnect("upstream", log, initial_secs=1.0, max_secs=64.0, retry_on=Lost)
    waits: list[float] = []
    script = ["fail", "fail", "up", "fail", "stop"]

    async def main() -> None:
        stop = asyncio.Event()

        async def record(secs: float) -> None:
            waits.append(secs)

        async def attempt() -> None:
            step = script.pop(0)
            if step == "stop":
                stop.set()
                raise Lost("stopped")
            if step == "fail":
                raise Lost("refused")

        await r.forever_async(attempt, stop, sleep=record)

    asyncio.run(main())
    assert script == [] and len(waits) == 3
    assert waits[0] <= 1.0 and waits[1] <= 2.0 and waits[2] <= 1.0, waits


def test_retrying_raises_stopped_from_the_last_failure() -> None:
    r = Reconnect("svc", log, retry_on=Lost)
    stop = threading.Event()

    def attempt() -> None:
        stop.set()  # stopped while this attempt fails: no wait, no next attempt
        raise Lost("refused")

    waits: list[float] = []
    with pytest.raises(Stopped) as caught:
        r.retrying(stop, sleep=waits.append)(attempt)
    assert isinstance(caught.value.__cause__, Lost) and waits == []


def test_the_iteration_forms_retry_a_block() -> None:
    """``for attempt in r.retrying(...)`` and ``async for`` (a POST that must go through)."""
    r = Reconnect("intake", log, initial_secs=0.5, max_secs=4.0, retry_on=Lost)
    waits: list[float] = []
    tries = 0
    for attempt in r.retrying(threading.Event(), sleep=waits.append):
        with attempt:
            tries += 1
            if tries < 4:
                raise Lost("HTTP 503")
    assert tries == 4 and len(waits) == 3

    async def main() -> int:
        stop = asyncio.Event()
        count = 0

        async def record(secs: float) -> None:
            waits.append(secs)
            if count == 3:
                stop.set()  # stopped during the third wait: no fourth try

        with pytest.raises(Stopped):
            async for attempt in r.async_retrying(stop, sleep=record):
                with attempt:
                    count += 1
                    raise Lost("HTTP 503")
        return count

    assert asyncio.run(main()) == 3
    assert all(0.0 <= w <= r.ceiling(4) for w in waits)
