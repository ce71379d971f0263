"""The reporter: a heartbeat of fixed-schema health numbers to the vendor's corp portal.

Once a minute (``interval_secs``) ``Reporter.tick`` reads each watched component's
``/version``, ``/readyz`` and ``/metrics`` (docs/architecture.md#what-every-component-serves),
makes one heartbeat of the numbers the schema allows (``heartbeat.schema.json``, beside this
module; docs/reporter.md), checks it against that schema, appends it to a bounded backlog and
sends the backlog oldest first to ``<portal_url>/v1/heartbeat``. A send is tried ``attempts``
times (tenacity, doubling waits) on a connection error, a 5xx or a 429; what is still not taken
waits for the next minute, and when the backlog is full the oldest heartbeat is dropped
(counted). A heartbeat the portal refuses with another 4xx is dropped too (logged), so one bad
heartbeat cannot hold the others back.

What leaves is what the schema allows and nothing else: the body is built member by member
from numbers, booleans and strings of release form, and a body the schema refuses is never
sent. Nothing about people, groups, service accounts, resources, policies or decisions is read
into it: from ``/metrics`` only the sums of a few named series are taken (docs/reporter.md).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from svc import __version__
from svc.reporter.settings import ReporterSettings

__all__ = ["SCHEMA", "SCHEMA_NAME", "Reporter", "read_install_id"]

log = logging.getLogger("svc.reporter")

Json = dict[str, Any]

#: The heartbeat's JSON Schema (draft 2020-12), package data of svc.reporter.
SCHEMA: Json = json.loads(
    resources.files("svc.reporter").joinpath("heartbeat.schema.json").read_text("utf-8")
)
#: The schema's name and version, the heartbeat's ``schema`` member.
SCHEMA_NAME = "svc.heartbeat.v1"
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
_RELEASE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_VERDICTS = ("allow", "deny", "challenge")


def read_install_id(settings: ReporterSettings) -> str:
    """The install's id: ``install_id``, or the one kept in ``install_id_file`` (made there once).

    Raises:
        ValueError: the id given or kept is not a lowercase UUID.
        OSError: the file cannot be read or written.

    """
    if settings.install_id is not None:
        value = settings.install_id
    else:
        path = Path(settings.install_id_file)
        if path.exists():
            value = path.read_text("utf-8").strip()
        else:
            value = str(uuid.uuid4())
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value + "\n", "utf-8")
    if not _UUID.match(value):
        raise ValueError("the install id must be a lowercase UUID")
    return value


@dataclass
class _Probe:
    """What one component answered."""

    reachable: bool = False
    ready: bool | None = None
    release: str | None = None
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)


class _Retry(Exception):
    """A send worth another try."""


class Reporter:
    """The heartbeat loop (module docs).

    Args:
        settings: the component's settings.
        client: the HTTP client (default: one of its own, closed by ``aclose``).
        clock: POSIX time now (tests may move it).

    Raises:
        ValueError, OSError: as ``read_install_id``.

    """

    def __init__(
        self,
        settings: ReporterSettings,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.install_id = read_install_id(settings)
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(timeout=settings.timeout_secs)
        self.clock = clock
        self.sequence = 0
        self.backlog: collections.deque[Json] = collections.deque()
        self._previous: tuple[float, dict[str, float], float] | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.heartbeats = Counter(
            "svc_reporter_heartbeats",
            "Heartbeats by outcome (sent, refused by the portal, dropped from a full backlog)",
            ["outcome"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "svc_reporter_backlog", "Heartbeats waiting to be sent", registry=self.registry
        )
        self.last_sent_at: float | None = None

    # -- reading the components -----------------------------------------------------------

    async def _probe(self, base: str) -> _Probe:
        p = _Probe()
        try:
            version = await self.client.get(f"{base}/version")
            ready = await self.client.get(f"{base}/readyz")
            metrics = await self.client.get(f"{base}/metrics")
        except httpx.HTTPError:
            return p
        p.reachable = True
        p.ready = ready.status_code == 200
        try:
            release = version.json().get("version") if version.status_code == 200 else None
        except ValueError:
            release = None
        p.release = release if isinstance(release, str) and _RELEASE.match(release) else None
        if metrics.status_code == 200:
            try:
                for family in text_string_to_metric_families(metrics.text):
                    for s in family.samples:
                        p.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
            except ValueError:
                log.warning("reporter: %s/metrics is not the Prometheus text format", base)
        return p

    def heartbeat_from(self, probes: dict[str, _Probe], now: float) -> Json:
        """The heartbeat of what the components answered (``schema``'s members only).

        Args:
            probes: per component name, what it answered.
            now: the POSIX time of the heartbeat.

        Returns:
            The body, valid against ``SCHEMA``.

        """

        def total(name: str, **match: str) -> float | None:
            found = [
                v
                for p in probes.values()
                for labels, v in p.samples.get(name, [])
                if all(labels.get(k) == x for k, x in match.items())
            ]
            return sum(found) if found else None

        def most(name: str) -> float | None:
            found = [v for p in probes.values() for _, v in p.samples.get(name, [])]
            return max(found) if found else None

        counters: dict[str, float] = {}
        for verdict in _VERDICTS:
            v = total("svc_pdp_decisions_total", verdict=verdict)
            if v is not None:
                counters[verdict] = v
        events = total("svc_intake_events_total")
        decisions: Json | None = None
        events_rate: float | None = None
        if self._previous is not None:
            then, before, events_before = self._previous
            minutes = max(now - then, 1e-3) / 60

            def rate(cur: float, old: float) -> float:
                delta = cur - old if cur >= old else cur  # a restarted counter starts at 0
                return round(max(delta, 0.0) / minutes, 3)

            if counters:
                decisions = {v: rate(counters.get(v, 0.0), before.get(v, 0.0)) for v in _VERDICTS}
            if events is not None:
                events_rate = rate(events, events_before)
        self._previous = (now, counters, events or 0.0)
        lag = most("svc_history_loader_oldest_unstored_age_seconds")
        open_challenges = most("svc_challenge_open")
        contained = most("svc_challenge_contained")
        self.sequence += 1
        return {
            "schema": SCHEMA_NAME,
            "install_id": self.install_id,
            "sequence": self.sequence,
            "sent_at": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "interval_seconds": self.settings.interval_secs,
            "reporter_release": __version__ if _RELEASE.match(__version__) else "unknown",
            "components": {
                name: {"reachable": p.reachable, "ready": p.ready, "release": p.release}
                for name, p in sorted(probes.items())
            },
            "decisions_per_minute": decisions,
            "events_accepted_per_minute": events_rate,
            "history_lag_seconds": round(max(lag, 0.0), 3) if lag is not None else None,
            "open_challenges": int(open_challenges) if open_challenges is not None else None,
            "containments": int(contained) if contained is not None else None,
        }

    async def make(self) -> Json:
        """Reads every component and makes the next heartbeat.

        Raises:
            jsonschema.ValidationError: the body does not match the schema (a bug; never sent).

        """
        names = sorted(self.settings.components)
        found = await asyncio.gather(*(self._probe(self.settings.components[n]) for n in names))
        body = self.heartbeat_from(dict(zip(names, found, strict=True)), self.clock())
        _VALIDATOR.validate(body)
        return body

    # -- sending ------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        path = self.settings.portal_token_file
        if path is None:
            return {}
        return {"Authorization": f"Bearer {Path(path).read_text('utf-8').strip()}"}

    async def _send_one(self, body: Json) -> bool:
        """Sends one heartbeat; True when taken or refused for good, False to keep it."""
        url = f"{str(self.settings.portal_url).rstrip('/')}/v1/heartbeat"
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.attempts),
            wait=wait_exponential(multiplier=self.settings.backoff_secs, max=60),
            retry=retry_if_exception_type(_Retry),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    try:
                        r = await self.client.post(url, json=body, headers=self._headers())
                    except httpx.HTTPError as e:
                        raise _Retry(type(e).__name__) from e
                    if r.status_code >= 500 or r.status_code == 429:
                        raise _Retry(str(r.status_code))
                    if r.status_code >= 400:
                        log.warning(
                            "reporter: the portal refused heartbeat %s: %s",
                            body["sequence"],
                            r.status_code,
                        )
                        self.heartbeats.labels("refused").inc()
                        return True
                    self.heartbeats.labels("sent").inc()
                    self.last_sent_at = self.clock()
                    return True
        except _Retry as e:
            log.warning(
                "reporter: the portal did not take heartbeat %s (%s); kept", body["sequence"], e
            )
        return False

    async def flush(self) -> int:
        """Sends the backlog, oldest first, until one is not taken; returns how many left it."""
        n = 0
        while self.backlog:
            if not await self._send_one(self.backlog[0]):
                break
            self.backlog.popleft()
            n += 1
        self.pending.set(len(self.backlog))
        return n

    async def tick(self) -> Json:
        """One heartbeat: made, queued, and the backlog sent.

        A full backlog drops its oldest first; with no ``portal_url`` the heartbeat is made and
        discarded.

        Returns:
            The heartbeat made.

        """
        body = await self.make()
        if not self.settings.portal_url:
            return body
        if len(self.backlog) >= self.settings.backlog:
            self.backlog.popleft()
            self.heartbeats.labels("dropped").inc()
        self.backlog.append(body)
        await self.flush()
        return body

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeats every ``interval_secs`` until ``stop`` is set (none without a portal)."""
        if not self.settings.portal_url:
            log.info("reporter: SVC_REPORTER_PORTAL_URL is not set; no heartbeat is sent")
            await stop.wait()
            return
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
            except Exception as e:  # the loop goes on; a failed heartbeat is logged
                log.warning("reporter: heartbeat failed: %s: %s", type(e).__name__, e)
            left = self.settings.interval_secs - (time.monotonic() - started)
            try:
                await asyncio.wait_for(stop.wait(), max(left, 0.0))
            except TimeoutError:
                pass

    async def aclose(self) -> None:
        """Closes the HTTP client it made."""
        if self._own_client:
            await self.client.aclose()
