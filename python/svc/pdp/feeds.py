"""Whether each feed a follower applies is current: readiness, metrics and one log line per failure.

A decision point (and a gateway) decides from what its followers applied: the policy bundle,
the principals, resources and work items, the containment list, the trusted apps, the outage
tiers. A follower that cannot apply a change keeps the last good state serving and retries
(docs/architecture.md#what-the-decision-point-keeps-in-memory), but it must say so
(docs/api.md#readiness-and-feeds):

* **Staleness.** Each followed feed has a bound, ``max_staleness_secs``: a feed without a
  successful sync for longer than that is *stale*, and the process is **not ready** (``/readyz``
  answers 503 naming each stale feed, its last success and its last error), so that Kubernetes
  stops routing new requests to it while it keeps serving those it has with the last good
  state. A successful sync is a change applied, a long poll answered, a stream's heartbeat
  while nothing is pending: a healthy feed syncs at least once per poll or heartbeat interval,
  so the bound is a few of those. A feed that never synced counts from when it was started;
  until its first sync the component's own readiness flags keep it unready anyway.
* **Metrics.** Per feed: the age of its last success (seconds), whether it is stale, its
  staleness bound, the version it last applied, and its failures (a counter).
* **Logs.** One ERROR line per *distinct* failure of a feed, naming the feed and the change
  (the version after which it could not go on, or the ids of the changes it could not apply),
  and one WARNING line when it syncs again: a feed that fails the same way for hours writes two
  lines, not one per retry.

``FeedReporter`` is what the followers call (``started``, ``synced``, ``failed``). Two kinds:

* ``ServerFeeds``: a decision point's, handing each report to the Rust listener
  (``Server.follow_feed``, ``feed_synced``, ``feed_failed``), which computes ``/readyz`` and
  ``svc_pdp_feed_*`` at request time.
* ``FeedHealth``: a Python component's (the gateway), computing staleness itself
  (``stale()``, ``readiness_reasons()``) and exposing ``<prefix>_feed_*`` through a
  Prometheus collector computed at scrape time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from svc._pdp_core import Server

__all__ = [
    "DEFAULT_MAX_STALENESS_SECS",
    "MAX_ERROR_TEXT",
    "FeedHealth",
    "FeedReporter",
    "FeedState",
    "RepeatedRetries",
    "ServerFeeds",
    "bounded",
]

log = logging.getLogger("svc.feeds")

#: The default staleness bound, seconds: three times the context service's long poll (10 s)
#: and six times the policy and challenge services' heartbeats (5 s).
DEFAULT_MAX_STALENESS_SECS = 30.0

#: Longest error text kept for ``/readyz`` and the log line (characters).
MAX_ERROR_TEXT = 300


def bounded(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """`text` on one line, cut to `limit` characters (``...`` marks a cut)."""
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


class RepeatedRetries(logging.Filter):
    """Drops a reconnect line (``svc.common.retry.Reconnect``'s) that repeats a recent one.

    ``Reconnect`` logs one WARNING per failed attempt, ``<what>: <error>; reconnecting in <s>
    s``; a feed that fails the same way for hours would write one every backoff ceiling (10 s).
    Its ERROR line (``FeedReporter.failed``), ``/readyz`` and the metrics say it already, so
    the same ``<what>: <error>`` on the same logger is let through once per `window_secs`
    (a reminder that it still fails); other lines pass untouched. Thread-safe; the followers'
    loggers carry one (``svc.pdp.context``, ``svc.pdp.follower``, ``svc.pdp.containments``).

    Args:
        window_secs: how long a repeat is dropped after the line it repeats, seconds.
        clock: the monotonic clock (``time.monotonic``; tests).

    """

    def __init__(self, window_secs: float = 300.0, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.window_secs = window_secs
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a reconnect line whose logger, target and error passed within the window."""
        msg = record.msg
        args = record.args
        if not (
            isinstance(msg, str)
            and msg.endswith("; reconnecting in %.1f s")
            and isinstance(args, tuple)
            and len(args) == 3
        ):
            return True
        key = (record.name, f"{args[0]}: {args[1]}")
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self.window_secs:
                return False
            if len(self._seen) >= 1024:  # a bound on distinct failures remembered
                self._seen.clear()
            self._seen[key] = now
        return True


class FeedReporter:
    """What a follower tells about its feeds (module docs); this base only logs.

    Args:
        max_staleness_secs: the bound of every feed started here, seconds (> 0).
        component: the words that start each log line (``svc-pdp``).

    Subclasses record the reports (``_record_*``). Every method is thread-safe and never
    raises: a report that cannot be recorded (a listener already stopped) is dropped.

    """

    def __init__(
        self, max_staleness_secs: float = DEFAULT_MAX_STALENESS_SECS, component: str = "svc"
    ) -> None:
        if not max_staleness_secs > 0:
            raise ValueError(f"max_staleness_secs must be above 0, not {max_staleness_secs}")
        self.max_staleness_secs = float(max_staleness_secs)
        self.component = component
        self._lock = threading.Lock()
        self._failing: dict[str, tuple[str, int]] = {}  # feed -> (failure, failures in a row)
        self._versions: dict[str, int] = {}

    def started(self, feed: str) -> None:
        """Starts following `feed` (``bundle``, ``principals``, ``resources``, ...)."""
        with self._lock:
            self._failing.pop(feed, None)
            self._versions.pop(feed, None)
        self._record_started(feed)

    def synced(self, feed: str, version: int | None = None) -> None:
        """Records a successful sync of `feed`, which applied up to `version` (None: unknown).

        Logs one WARNING line when the feed had been failing.
        """
        with self._lock:
            if version is not None:
                self._versions[feed] = version
            was = self._failing.pop(feed, None)
        self._record_synced(feed, version)
        if was is not None:
            log.warning(
                "%s: feed %s syncs again%s after %d failures (the last: %s)",
                self.component,
                feed,
                f" at version {version}" if version is not None else "",
                was[1],
                was[0],
            )

    def failed(self, feed: str, error: str, change: str | None = None) -> None:
        """Records a failure of `feed`: a request that failed or a change it could not apply.

        Args:
            feed: the feed's name.
            error: what failed (cut to ``MAX_ERROR_TEXT``).
            change: which change could not be applied (``the changes after version 41``,
                ``change 42 (Document::"d1")``); None: the feed's next change.

        Logs one ERROR line per distinct failure (a new error text or change), naming the feed,
        the change and the version that keeps serving.

        """
        what = bounded(f"{change}: {error}" if change else error)
        with self._lock:
            before = self._failing.get(feed)
            self._failing[feed] = (what, (before[1] if before else 0) + 1)
            version = self._versions.get(feed)
        self._record_failed(feed, what)
        if before is None or before[0] != what:
            log.error(
                "%s: feed %s cannot apply %s: %s; the last good state%s keeps serving, and "
                "once no sync succeeds for %g s the process reports the feed stale on /readyz",
                self.component,
                feed,
                change or "its next change",
                bounded(error),
                f" (version {version})" if version is not None else "",
                self.max_staleness_secs,
            )

    def _record_started(self, feed: str) -> None:
        """Records a feed started (subclasses)."""

    def _record_synced(self, feed: str, version: int | None) -> None:
        """Records a successful sync (subclasses)."""

    def _record_failed(self, feed: str, error: str) -> None:
        """Records a failure (subclasses)."""


class ServerFeeds(FeedReporter):
    """A decision point's feeds, kept by its Rust listener (module docs).

    Args:
        server: the listener, started (``Server.follow_feed`` and the feed reports; its
            ``/readyz``, gRPC health and ``svc_pdp_feed_*`` follow them).
        max_staleness_secs: the bound of each feed (``SVC_PDP_FEED_MAX_STALENESS_SECS``).

    """

    def __init__(
        self, server: Server, max_staleness_secs: float = DEFAULT_MAX_STALENESS_SECS
    ) -> None:
        super().__init__(max_staleness_secs, component="svc-pdp")
        self.server = server

    def _record_started(self, feed: str) -> None:
        if self.server.running:
            try:
                self.server.follow_feed(feed, self.max_staleness_secs)
            except RuntimeError:  # stopped meanwhile
                pass

    def _record_synced(self, feed: str, version: int | None) -> None:
        if self.server.running:
            try:
                self.server.feed_synced(
                    feed, version if version is not None and version >= 0 else None
                )
            except RuntimeError:
                pass

    def _record_failed(self, feed: str, error: str) -> None:
        if self.server.running:
            try:
                self.server.feed_failed(feed, error)
            except RuntimeError:
                pass


@dataclass
class FeedState:
    """One feed of a ``FeedHealth``.

    When it started and last synced (``time.monotonic()``), the wall-clock time of that sync,
    its last error, its failures and the version it last applied.
    """

    since: float
    last_ok: float | None = None
    last_ok_at: datetime | None = None
    last_error: str | None = None
    errors: int = 0
    version: int | None = None


class FeedHealth(FeedReporter):
    """A Python component's feeds: staleness for ``/readyz``, a Prometheus collector (module docs).

    Args:
        max_staleness_secs: the bound of each feed, seconds.
        component: the log lines' first words (``svc-gateway``).
        registry: where ``<prefix>_feed_age_seconds``, ``_feed_stale``,
            ``_feed_max_staleness_seconds``, ``_feed_version`` (gauges, label ``feed``) and
            ``_feed_errors_total`` (counter) are registered; None: no metrics.
        prefix: the metric names' prefix (``svc_gateway``).
        clock: the monotonic clock (``time.monotonic``; tests).

    """

    def __init__(
        self,
        max_staleness_secs: float = DEFAULT_MAX_STALENESS_SECS,
        *,
        component: str = "svc",
        registry: CollectorRegistry | None = None,
        prefix: str = "svc",
        clock: Any = time.monotonic,
    ) -> None:
        super().__init__(max_staleness_secs, component)
        self.prefix = prefix
        self._clock = clock
        self._feeds: dict[str, FeedState] = {}
        if registry is not None:
            registry.register(_FeedCollector(self))

    def _record_started(self, feed: str) -> None:
        with self._lock:
            self._feeds[feed] = FeedState(since=self._clock())

    def _record_synced(self, feed: str, version: int | None) -> None:
        with self._lock:
            f = self._feeds.setdefault(feed, FeedState(since=self._clock()))
            f.last_ok = self._clock()
            f.last_ok_at = datetime.now(UTC)
            if version is not None:
                f.version = version

    def _record_failed(self, feed: str, error: str) -> None:
        with self._lock:
            f = self._feeds.setdefault(feed, FeedState(since=self._clock()))
            f.errors += 1
            f.last_error = error

    def report(self) -> list[dict[str, Any]]:
        """Every feed now, sorted by name.

        Returns:
            One dict per feed: ``feed``, ``age_secs``, ``max_staleness_secs``, ``stale``,
            ``last_success`` (RFC 3339 or None), ``last_error``, ``errors``, ``version``.

        """
        now = self._clock()
        with self._lock:
            items = sorted((n, FeedState(**vars(f))) for n, f in self._feeds.items())
        out = []
        for name, f in items:
            age = max(0.0, now - (f.last_ok if f.last_ok is not None else f.since))
            out.append(
                {
                    "feed": name,
                    "age_secs": round(age, 3),
                    "max_staleness_secs": self.max_staleness_secs,
                    "stale": age > self.max_staleness_secs,
                    "last_success": f.last_ok_at.isoformat().replace("+00:00", "Z")
                    if f.last_ok_at
                    else None,
                    "last_error": f.last_error,
                    "errors": f.errors,
                    "version": f.version,
                }
            )
        return out

    def stale(self) -> list[dict[str, Any]]:
        """The stale feeds of ``report()``."""
        return [f for f in self.report() if f["stale"]]

    def readiness_reasons(self) -> list[str]:
        """One sentence per stale feed (its name, age, bound, last success and last error)."""
        return [
            f"feed `{f['feed']}` is stale: no successful sync for {f['age_secs']:.1f} s "
            f"(bound {f['max_staleness_secs']:g} s; last success {f['last_success'] or 'never'}"
            + (f"; last error: {f['last_error']}" if f["last_error"] else "")
            + ")"
            for f in self.stale()
        ]


class _FeedCollector(Collector):
    """``FeedHealth``'s metrics, computed at each scrape.

    prometheus_client's custom collector
    (<https://prometheus.github.io/client_python/collector/custom/>).
    """

    def __init__(self, health: FeedHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Any]:
        """The five families, one series per feed."""
        p = self.health.prefix
        age = GaugeMetricFamily(
            f"{p}_feed_age_seconds",
            "Seconds since each followed feed's last successful sync (since it started, when "
            "it never synced).",
            labels=["feed"],
        )
        bound = GaugeMetricFamily(
            f"{p}_feed_max_staleness_seconds",
            "Each followed feed's staleness bound (feed_max_staleness_secs).",
            labels=["feed"],
        )
        stale = GaugeMetricFamily(
            f"{p}_feed_stale",
            "1 while a followed feed has had no successful sync within its bound (not ready; "
            "the last good state keeps serving).",
            labels=["feed"],
        )
        version = GaugeMetricFamily(
            f"{p}_feed_version",
            "The version each followed feed last applied (feeds that number their changes).",
            labels=["feed"],
        )
        errors = CounterMetricFamily(
            f"{p}_feed_errors",
            "Failures of each followed feed: requests that failed and changes not applied.",
            labels=["feed"],
        )
        for f in self.health.report():
            name = [f["feed"]]
            age.add_metric(name, f["age_secs"])
            bound.add_metric(name, f["max_staleness_secs"])
            stale.add_metric(name, 1.0 if f["stale"] else 0.0)
            errors.add_metric(name, f["errors"])
            if f["version"] is not None:
                version.add_metric(name, f["version"])
        yield from (age, bound, stale, version, errors)
