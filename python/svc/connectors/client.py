"""What both connectors share: retried calls, the context service's batch routes, the directory.

* ``Caller``: one HTTP client of a source (or of the context service) whose calls are retried
  with ``tenacity`` (https://tenacity.readthedocs.io) on what is worth retrying: a connection
  or timeout error, 5xx, 429, and a 403 that is a rate limit (Drive's ``rateLimitExceeded`` /
  ``userRateLimitExceeded`` reasons, or any answer carrying ``Retry-After``). A
  ``Retry-After`` (RFC 9110 section 10.2.3, seconds or an HTTP date) holds back every call of
  that source until it has passed; otherwise the wait doubles from ``retry_backoff_secs``
  with full jitter up to ``retry_max_wait_secs``. Other answers raise ``CallFailed`` at once.
  Every failed attempt is counted in ``svc_connector_errors_total{connector, kind}``.
* ``ContextWriter``: the context service's batch routes (docs/context.md#resources-and-work-
  items), in chunks of ``batch_items``; a batch the service refuses as ``invalid-batch`` is
  sent again without the items it names, which are logged and counted
  (``kind="refused_item"``), so one bad file cannot stop a connector.
* ``Directory``: people by email and groups by name, read from ``/v1/directory/people`` and
  ``/groups`` and refreshed every ``directory_refresh_secs``.
* ``Metrics``: the connectors' Prometheus registry.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

__all__ = [
    "CallFailed",
    "Caller",
    "ContextWriter",
    "Directory",
    "Metrics",
    "Person",
    "Retryable",
    "retry_after_secs",
]

log = logging.getLogger("svc.connectors")

Json = dict[str, Any]

#: Drive's reasons of a 403 that is a rate limit, not a refusal
#: (https://developers.google.com/workspace/drive/api/guides/limits).
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
#: Longest Retry-After honoured; a longer one is taken as this.
MAX_RETRY_AFTER_SECS = 3600.0


class Metrics:
    """The connectors' metrics, in their own registry (docs/connectors.md#metrics).

    Attributes:
        items: ``svc_connector_items_total{connector, kind}``: items written (``upserted``) or
            deleted (``deleted``) at the context service.
        lag: ``svc_connector_lag_seconds{connector}``: seconds since the connector last reached
            the head of its source (set on each scrape).
        errors: ``svc_connector_errors_total{connector, kind}``: failed attempts by kind
            (``rate_limited``, ``server``, ``network``, ``client``, ``cursor_refused``,
            ``refused_item``, ``poll``).
        resyncs: ``svc_connector_resyncs_total{connector}``: full crawls after a refused
            cursor.

    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.items = Counter(
            "svc_connector_items",
            "Items written to or deleted from the context service",
            ["connector", "kind"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "svc_connector_lag_seconds",
            "Seconds since the connector last reached the head of its source",
            ["connector"],
            registry=self.registry,
        )
        self.errors = Counter(
            "svc_connector_errors",
            "Failed attempts by kind",
            ["connector", "kind"],
            registry=self.registry,
        )
        self.resyncs = Counter(
            "svc_connector_resyncs",
            "Full crawls after the source refused a cursor",
            ["connector"],
            registry=self.registry,
        )


class Retryable(Exception):
    """A failed attempt worth another: ``kind`` names why, ``retry_after`` the asked wait."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


class CallFailed(Exception):
    """A call answered with a status not worth retrying (the body is kept, credentials never)."""

    def __init__(self, method: str, url: str, status: int, body: Any) -> None:
        detail = json.dumps(body)[:300] if not isinstance(body, str) else body[:300]
        super().__init__(f"{method} {url}: {status} {detail}")
        self.status = status
        self.body = body


def retry_after_secs(value: str | None, now: float | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for, in seconds (RFC 9110 section 10.2.3).

    Args:
        value: the header: a number of seconds or an HTTP date; None when absent.
        now: the current POSIX time (default: the clock).

    Returns:
        Seconds, 0 to ``MAX_RETRY_AFTER_SECS``; None when absent or unreadable.

    """
    if value is None:
        return None
    text = value.strip()
    try:
        secs = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        secs = when.timestamp() - (time.time() if now is None else now)
    if secs != secs:  # NaN
        return None
    return max(0.0, min(secs, MAX_RETRY_AFTER_SECS))


def _body(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text[:500]


def _is_rate_limit(r: httpx.Response) -> bool:
    if r.status_code == 429:
        return True
    if r.status_code != 403:
        return False
    if "retry-after" in r.headers:
        return True
    body = _body(r)
    errors = body.get("error", {}).get("errors", []) if isinstance(body, dict) else []
    return any(isinstance(e, dict) and e.get("reason") in RATE_LIMIT_REASONS for e in errors)


class Caller:
    """Calls of one source with retries (module docs).

    Args:
        connector: the metrics label (``drive``, ``jira``, ``context``).
        client: the httpx client (base URL, auth, timeout).
        metrics: where failed attempts are counted.
        attempts: tries of one call.
        backoff_secs: first wait without ``Retry-After``.
        max_wait_secs: longest wait without ``Retry-After``.
        sleep: the sleep function (tests may record it).

    """

    def __init__(
        self,
        connector: str,
        client: httpx.AsyncClient,
        metrics: Metrics,
        *,
        attempts: int = 6,
        backoff_secs: float = 0.5,
        max_wait_secs: float = 60.0,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.connector = connector
        self.client = client
        self.metrics = metrics
        self.attempts = attempts
        self.backoff_secs = backoff_secs
        self.max_wait_secs = max_wait_secs
        self.sleep = sleep
        self.not_before = 0.0  # monotonic time before which no call is sent (Retry-After)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Retryable) and exc.retry_after is not None:
            return 0.0  # the next attempt itself waits until not_before
        window = min(self.max_wait_secs, self.backoff_secs * 2 ** (state.attempt_number - 1))
        return random.uniform(window / 2, window)  # jitter, not a secret

    async def _once(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        pause = self.not_before - time.monotonic()
        if pause > 0:
            await self.sleep(pause)
        try:
            r = await self.client.request(method, url, **kwargs)
        except httpx.TransportError as e:
            self.metrics.errors.labels(self.connector, "network").inc()
            raise Retryable("network", f"{method} {url}: {type(e).__name__}") from e
        if r.status_code < 400:
            return r
        after = retry_after_secs(r.headers.get("retry-after"))
        if _is_rate_limit(r) or r.status_code >= 500:
            kind = "server" if r.status_code >= 500 else "rate_limited"
            self.metrics.errors.labels(self.connector, kind).inc()
            if after is not None:
                self.not_before = max(self.not_before, time.monotonic() + after)
            raise Retryable(kind, f"{method} {url}: {r.status_code}", after)
        self.metrics.errors.labels(self.connector, "client").inc()
        raise CallFailed(method, url, r.status_code, _body(r))

    async def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One call, retried (module docs).

        Args:
            method: ``GET``, ``POST``.
            url: a path under the client's base URL, or a whole URL.
            kwargs: httpx request arguments (``params``, ``json``).

        Returns:
            The response (status below 400).

        Raises:
            CallFailed: a status not worth retrying (4xx other than a rate limit).
            Retryable: still failing after ``attempts`` tries.

        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=retry_if_exception(lambda e: isinstance(e, Retryable)),
            sleep=self.sleep,
            reraise=True,
            before_sleep=lambda s: log.warning(
                "%s: %s; trying again", self.connector, s.outcome.exception() if s.outcome else ""
            ),
        )
        async for attempt in retrying:
            with attempt:
                return await self._once(method, url, **kwargs)
        raise AssertionError("unreachable")  # pragma: no cover

    async def json(self, method: str, url: str, **kwargs: Any) -> Any:
        """``call`` and its JSON body.

        Raises:
            CallFailed, Retryable: as ``call``; ``CallFailed`` also for a body that is not JSON.

        """
        r = await self.call(method, url, **kwargs)
        try:
            return r.json()
        except ValueError as e:
            raise CallFailed(method, url, r.status_code, "the body is not JSON") from e


class ContextWriter:
    """The context service's batch routes (module docs).

    Args:
        caller: a ``Caller`` whose client's base URL is the context service.
        connector: the metrics label of the connector writing.
        metrics: where items and refusals are counted.
        batch_items: most items per request.

    """

    def __init__(self, caller: Caller, connector: str, metrics: Metrics, batch_items: int) -> None:
        self.caller = caller
        self.connector = connector
        self.metrics = metrics
        self.batch_items = batch_items

    async def _send(self, path: str, member: str, items: Sequence[Any]) -> list[Any]:
        """Sends ``items`` in chunks; returns the items the service refused by name."""
        refused: list[Any] = []
        for i in range(0, len(items), self.batch_items):
            chunk = list(items[i : i + self.batch_items])
            while chunk:
                try:
                    await self.caller.call("POST", path, json={member: chunk})
                    break
                except CallFailed as e:
                    bad = _refused_indexes(e)
                    if e.status != 400 or not bad:
                        raise
                    for j in sorted(bad):
                        log.warning(
                            "%s: the context service refused %s: %s",
                            self.connector,
                            _item_name(chunk[j]),
                            bad[j],
                        )
                        self.metrics.errors.labels(self.connector, "refused_item").inc()
                        refused.append(chunk[j])
                    chunk = [x for j, x in enumerate(chunk) if j not in bad]
        return refused

    async def put_resources(self, resources: Sequence[Json]) -> list[Json]:
        """Stores resources (``POST /v1/resources``); returns those refused."""
        refused = await self._send("/v1/resources", "resources", resources)
        self.metrics.items.labels(self.connector, "upserted").inc(len(resources) - len(refused))
        return refused

    async def delete_resources(self, refs: Sequence[Json]) -> None:
        """Deletes resources (``POST /v1/resources/delete``); unknown ones are ignored."""
        await self._send("/v1/resources/delete", "resources", refs)
        self.metrics.items.labels(self.connector, "deleted").inc(len(refs))

    async def put_work_items(self, items: Sequence[Json]) -> list[Json]:
        """Stores work items (``POST /v1/work-items``); returns those refused."""
        refused = await self._send("/v1/work-items", "work_items", items)
        self.metrics.items.labels(self.connector, "upserted").inc(len(items) - len(refused))
        return refused

    async def delete_work_items(self, ids: Sequence[str]) -> None:
        """Deletes work items (``POST /v1/work-items/delete``)."""
        await self._send("/v1/work-items/delete", "ids", ids)
        self.metrics.items.labels(self.connector, "deleted").inc(len(ids))


def _refused_indexes(e: CallFailed) -> dict[int, str]:
    body = e.body if isinstance(e.body, dict) else {}
    if not str(body.get("type", "")).endswith("invalid-batch"):
        return {}
    out: dict[int, str] = {}
    for err in body.get("errors") or []:
        if isinstance(err, dict) and isinstance(err.get("index"), int):
            out[err["index"]] = f"{err.get('field', '')}: {err.get('message', '')}"
    return out


def _item_name(item: Any) -> str:
    if isinstance(item, dict):
        if "type" in item:
            return f'{item["type"]}::"{item.get("id")}"'
        return str(item.get("id"))
    return str(item)


@dataclass(frozen=True)
class Person:
    """A person of the directory: the user name (the ``Human`` id) and department."""

    user_name: str
    department: str


class Directory:
    """People by email and groups by name, from the context service (module docs).

    A person matches each of their SCIM emails and their user name when it is an email; one
    without emails matches ``<userName>@<email_domain>`` when that is set. A group matches an
    email whose local part (or the whole email) is its name, regardless of case.

    Args:
        caller: a ``Caller`` of the context service.
        refresh_secs: how long a read is used.
        email_domain: the domain of people without emails.

    """

    def __init__(self, caller: Caller, refresh_secs: float, email_domain: str | None) -> None:
        self.caller = caller
        self.refresh_secs = refresh_secs
        self.email_domain = email_domain.lower() if email_domain else None
        self.people: dict[str, Person] = {}
        self.groups: dict[str, str] = {}
        self.read_at = -1e18
        self._lock = asyncio.Lock()

    async def refresh(self, force: bool = False) -> None:
        """Reads the directory when the last read is older than ``refresh_secs``.

        Raises:
            CallFailed, Retryable: the context service did not answer it.

        """
        async with self._lock:
            if not force and time.monotonic() - self.read_at < self.refresh_secs:
                return
            people = (await self.caller.json("GET", "/v1/directory/people"))["people"]
            groups = (await self.caller.json("GET", "/v1/directory/groups"))["groups"]
            by_email: dict[str, Person] = {}
            for p in people:  # deactivated people too (their files keep their owner)
                person = Person(str(p["user_name"]), str(p.get("department") or ""))
                emails = [str(e).lower() for e in p.get("emails") or []]
                if "@" in person.user_name:
                    emails.append(person.user_name.lower())
                if not emails and self.email_domain:
                    emails.append(f"{person.user_name.lower()}@{self.email_domain}")
                for e in emails:
                    by_email.setdefault(e, person)
            self.people = by_email
            self.groups = {str(g["name"]).lower(): str(g["name"]) for g in groups}
            self.read_at = time.monotonic()

    def person(self, email_address: str | None) -> Person | None:
        """The person an email names, or None."""
        return self.people.get(email_address.lower()) if email_address else None

    def group(self, email_address: str | None) -> str | None:
        """The name of the group an email names, or None."""
        if not email_address:
            return None
        e = email_address.lower()
        return self.groups.get(e) or self.groups.get(e.split("@", 1)[0])
