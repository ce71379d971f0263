"""A decision point following the context service's principals and feeds (docs/context.md).

``ContextFollower`` fills the engine's entity store from the context service
(docs/context.md#principals) and keeps it in line:

* **Principals.** It loads the snapshot (``GET /v1/principals``), then long-polls the watch
  (``GET /v1/principals/watch?after=V``) and applies each answer's changes in order. People
  and groups are Cedar entities upserted into the store (``Engine.upsert_entities``); a group
  or name that is gone (``value: null``) is removed (``Engine.remove_entities``). A person
  deactivated or deleted over SCIM arrives as the entity with ``active: false`` (and, once
  deleted, without groups): the record stays, so decisions still name the person and the base
  schema's ``active`` lets policies deny it (the demo company's ``inactive-people-denied``,
  docs/demo.md); a group membership change arrives as the person's (or group's) new parents.
  Service accounts are registered (``Engine.register_service_accounts``) or, when the record
  is gone, unregistered (``Engine.unregister_service_accounts``): a service account the
  snapshot does not name is denied ``svc:unregistered`` (docs/architecture.md#built-in-denials).
  Risk scores go to ``Engine.set_risk_scores``; every rescore raises the engine's
  ``principals_version`` (docs/architecture.md#versioning), so pinned plans of that principal
  are remade (docs/plans.md).
* **Resources and work items, fetched on a miss.** The resources' and work items' change
  feeds (``GET /v1/resources/changes?after=C``, ``/v1/work-items/changes``) are followed from
  their head at start (``GET /v1/feeds``), not from 0: the store holds only what checks asked
  for. ``fetch`` is installed on the listener
  (``Server.set_resource_source``): before a check whose resource (or work item) the engine
  does not hold is decided, the listener calls it with every miss of the request; it reads
  them by id (``POST /v1/resources/get``, ``/v1/work-items/get``), upserts what the service
  holds and answers what it does not, which the listener remembers as absent until the feed
  names it (``Server.forget_absent``). A fetched resource stays in the store ("cached") and
  the feed keeps it current: a change it names is applied, a deletion removes it; a change
  naming something not held only forgets it as absent. A feed change applied while a fetch is
  in flight wins over that fetch's answer for what it names (the answer may be older): the
  feed's state is stored and held from then on.
* **Readiness.** ``loaded`` is set once the first snapshot is in the store; then
  ``on_loaded`` is called (``follow_context`` makes it ``Server.set_ready(principals=True)``:
  the listener's third readiness flag, unset at start for a server made with
  ``await_principals=True``).
* **Failures.** A request that fails (connection refused or lost, a status other than 200, a
  body that is not the documented shape) leaves what is loaded serving; the feed is asked again
  after the shared reconnect policy's delay (``svc.common.retry.Reconnect``: full jitter under a
  ceiling that doubles from ``backoff_secs`` up to ``max_backoff_secs``, one log line per
  failure). After such a gap, the principals are reloaded from a fresh snapshot (people and
  groups the new snapshot no longer holds are removed, service accounts it no longer names
  unregistered, risk scores replaced); the resource and work-item feeds carry on from their
  cursor, or, when the service answers a version below it (a database restored from a
  backup), drop what they fetched and start again from the head. A fetch that fails lets the
  check be decided without the resource (the listener counts it,
  ``svc_pdp_resource_fetches_total``).
* **Saying so.** With ``feeds`` (``svc.pdp.feeds``; ``follow_context`` is given the
  listener's), the ``principals``, ``resources`` and ``work_items`` feeds report every answer
  applied as a sync (with the version it reached) and every failure with the change it could
  not apply (the changes after the version applied, or the ids of those in an answer that
  could not be applied): past ``feed_max_staleness_secs`` without a sync, ``/readyz`` answers
  503 naming the feed, and one ERROR line names each distinct failure
  (docs/api.md#readiness-and-feeds). The last good state keeps serving meanwhile.
* **Entities the schema refuses.** A batch the engine refuses is applied one record at a time;
  a record still refused is left out of the store (a person then has no attributes and no
  groups, docs/architecture.md#entities-and-the-base-schema), counted in ``status.refused``
  and logged.
* **Callers' tokens.** Every request carries ``Authorization: Bearer <JWT>`` when ``auth`` is
  given (docs/auth.md, audience ``svc-context``): ``BearerToken.from_file`` sends a token
  file's current content (a Kubernetes projected service-account token, which the kubelet
  renews), ``BearerToken.from_issuer`` tokens minted by ``svc up``'s local issuer.

Callers wait on what was applied with ``wait_for(predicate)`` over ``ContextStatus``, whose
``principals_version``, ``resources_version`` and ``work_items_version`` are the context
service's versions (cursors) applied so far.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from svc._pdp_core import Engine, RequestError, Server
from svc.common.auth import LocalIssuer
from svc.common.limits import bounded
from svc.common.logbounds import MAX_LOG_FIELD_CHARS
from svc.common.retry import Reconnect
from svc.pdp.feeds import FeedReporter, RepeatedRetries

__all__ = ["BearerToken", "ContextFollower", "ContextStatus", "follow_context"]

log = logging.getLogger("svc.pdp.context")
#: A feed failing the same way logs its reconnects once per window (``svc.pdp.feeds``).
log.addFilter(RepeatedRetries())

#: The principal kinds of the snapshot that are Cedar entities of the store.
ENTITY_KINDS = ("Human", "Group")


def _decode(body: bytes) -> Any:
    """``json.loads(body)`` with Python's cyclic garbage collector paused.

    A snapshot of 100,000 people is about a million new containers; the collector, triggered
    by the allocations, walks them again and again although none can be cyclic garbage, and
    took two thirds of the decode (docs/benchmarks.md, "Context service").

    Raises:
        ValueError: the body is not JSON (``json.JSONDecodeError``, or ``UnicodeDecodeError``).

    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return json.loads(body)
    finally:
        if paused:
            gc.enable()


class BearerToken(httpx.Auth):
    """Sends ``Authorization: Bearer <token>`` with every request (RFC 6750 section 2.1).

    Args:
        token: called before each request; returns the compact JWT to send (docs/auth.md: a
            token of the configured issuer whose ``aud`` names ``svc-context`` and whose
            ``sub`` the context service lists among its callers).

    The token is never logged. ``httpx.Auth`` is httpx's hook for request authentication
    (<https://www.python-httpx.org/advanced/authentication/#custom-authentication-schemes>).

    """

    def __init__(self, token: Callable[[], str]) -> None:
        self.token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Adds the header to ``request`` (httpx calls it for every request)."""
        request.headers["Authorization"] = f"Bearer {self.token()}"
        yield request

    @classmethod
    def from_file(cls, path: Path) -> BearerToken:
        """Sends the current content of a token file, read again for every request.

        A Kubernetes projected service-account token is renewed in place by the kubelet, and
        the caller sends the file's current content (docs/auth.md, "In Kubernetes").

        Raises (from each request):
            OSError: the file cannot be read; the request is not sent and the follower retries.

        """
        return cls(lambda: path.read_text(encoding="utf-8").strip())

    @classmethod
    def from_issuer(cls, issuer: LocalIssuer, sub: str, lifetime_secs: int = 3600) -> BearerToken:
        """Sends tokens minted by ``svc up``'s local issuer (docs/auth.md, "svc up").

        Args:
            issuer: the local issuer.
            sub: the caller the context service lists (``auth_callers``).
            lifetime_secs: lifetime of each minted token; a new one is minted once half of it
                has passed.

        """
        lock = threading.Lock()
        held: list[tuple[str, float]] = []

        def token() -> str:
            with lock:
                now = time.time()
                if not held or now >= held[0][1]:
                    minted = issuer.mint(sub, "svc-context", lifetime_secs, now=now)
                    held[:] = [(minted, now + lifetime_secs / 2)]
                return held[0][0]

        return cls(token)


@dataclass
class ContextStatus:
    """What the follower has applied, and its last error.

    ``principals_version``, ``resources_version``, ``work_items_version``: the context
    service's versions (feed cursors) applied to the engine, 0 before any; ``loaded``: a
    snapshot is in the store; ``snapshots``: snapshots loaded (1 plus one per gap);
    ``applied``: changes applied; ``refused``: records the engine refused (left out);
    ``reconnects``: failed requests followed by a retry; ``error``: the last failure, empty
    once the feed that failed answers again; ``fetches``: calls of ``fetch`` (one per request
    with misses); ``fetched``: resources and work items they upserted; ``fetch_errors``:
    calls that failed (the checks were decided without what they asked for).
    """

    principals_version: int = 0
    resources_version: int = 0
    work_items_version: int = 0
    loaded: bool = False
    snapshots: int = 0
    applied: int = 0
    refused: int = 0
    reconnects: int = 0
    error: str = ""
    fetches: int = 0
    fetched: int = 0
    fetch_errors: int = 0
    history: list[str] = field(default_factory=list)


class _FeedError(Exception):
    """A feed request that failed (transport, status, shape); the message says which."""


#: What a failed step of a follower thread raises: retried with the reconnect policy.
_RETRIED = (_FeedError, KeyError, TypeError, ValueError)


def _ref(kind: str, pid: str) -> dict[str, str]:
    return {"type": kind, "id": pid}


def _parse_key(key: str) -> tuple[str, str]:
    """``(type, id)`` of a feed key ``Type::"id"`` (the service writes it unescaped)."""
    ty, sep, rest = key.partition('::"')
    if not sep or not rest.endswith('"'):
        raise ValueError(f'{key!r} is not a Type::"id" key')
    return ty, rest[:-1]


def _change_named(
    feed: str, started: bool, status: ContextStatus, answer: Mapping[str, Any] | None
) -> str:
    """Which change of `feed` could not be applied, for the log line and ``/readyz``.

    The ids of the changes in `answer` when one came and was not applied (at most five), else
    the changes after the version applied (the service did not answer them), or the feed's
    head when it was not read yet.
    """
    if not started:
        return f"the head of the {feed} feed (GET /v1/feeds)"
    after = getattr(status, f"{feed}_version")
    changes = answer.get("changes") if isinstance(answer, Mapping) else None
    if isinstance(changes, list) and changes:
        ids = [
            f"{c.get('version', '?')} ({c.get('id', '?')})" if isinstance(c, Mapping) else "?"
            for c in changes[:5]
        ]
        more = f" and {len(changes) - 5} more" if len(changes) > 5 else ""
        return f"the {feed} changes after version {after}: {', '.join(ids)}{more}"
    return f"the {feed} changes after version {after}"


#: Most references one by-id read carries (the service's default ``max_batch_items`` is 1000).
FETCH_CHUNK = 500


class ContextFollower:
    """Follows the context service into an engine (module docs).

    Args:
        engine: the decision point's engine; its entity store, service accounts, work items
            and risk scores are written (its bundle must declare the base schema's types:
            ``Human`` with ``active``, ``department``, ``title`` and ``manager?``, ``Group``,
            ``ServiceAccount``, ``WorkItem``, and the resource types written to the service).
        url: the context service's base URL (``http://host:port``).
        auth: how requests authenticate (``BearerToken``); ``None`` sends no token (a service
            with auth off, loopback only: docs/auth.md).
        wait_secs: how long one long poll may wait for a change (the service caps it at its
            ``max_wait_secs``); also the longest ``stop`` waits for a thread to notice.
        backoff_secs: the longest first delay after a failed request, seconds; the ceiling
            doubles per failure up to ``max_backoff_secs`` (full jitter below it,
            ``svc.common.retry.Reconnect``).
        max_backoff_secs: the largest such ceiling, seconds.
        timeout_secs: connect and write timeout of a request; its read timeout is this plus
            ``wait_secs``.
        on_loaded: called (from a follower thread) once, when the first snapshot is in the
            store and before ``loaded`` and ``status.loaded`` are set, so that whoever waits for
            those sees its effect (``follow_context`` marks the listener ready with it).
        follow_resources: also follow the resources' and work items' change feeds (from their
            head) and serve ``fetch``.
        server: the listener whose absent set ``fetch`` fills; the feeds tell it what they name
            (``Server.forget_absent``). ``None``: no listener.
        fetch_timeout_secs: the connect, read and write timeout of ``fetch``'s reads (the
            listener gives up waiting sooner, after its own ``timeout_ms``; a late answer still
            lands in the store).
        feeds: where the feeds' syncs and failures are reported (``svc.pdp.feeds``), or None.
            Keep ``wait_secs`` well under its bound: a healthy feed syncs once per long poll.

    """

    def __init__(
        self,
        engine: Engine,
        url: str,
        auth: httpx.Auth | None = None,
        *,
        wait_secs: float = 10.0,
        backoff_secs: float = 0.2,
        max_backoff_secs: float = 10.0,
        timeout_secs: float = 10.0,
        on_loaded: Callable[[], None] | None = None,
        follow_resources: bool = True,
        server: Server | None = None,
        fetch_timeout_secs: float = 2.0,
        feeds: FeedReporter | None = None,
    ) -> None:
        self.engine = engine
        self.url = url.rstrip("/")
        self.auth = auth
        self.wait_secs = wait_secs
        self.backoff_secs = backoff_secs
        self.max_backoff_secs = max_backoff_secs
        self.timeout = httpx.Timeout(timeout_secs, read=timeout_secs + wait_secs)
        self.on_loaded = on_loaded
        self.status = ContextStatus()
        self.loaded = threading.Event()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._engine_lock = threading.Lock()
        # What this follower put in the store, to remove what a later snapshot lacks.
        self._entities: set[tuple[str, str]] = set()
        self._accounts: set[str] = set()
        self._scores: dict[str, dict[str, Any]] = {}
        self.server = server
        # Resources and work items fetched into the store (kept current by the feeds).
        self._held: set[tuple[str, str]] = set()
        self._held_items: set[str] = set()
        # Fetches in flight, and what the feeds named meanwhile (their answers may be older).
        self._fetching = 0
        self._touched: set[tuple[str, str]] = set()
        self._touched_items: set[str] = set()
        # Resource types held whole (``load_type``): every change of one is applied.
        self._loaded_types: set[str] = set()
        self._type_locks: dict[str, threading.Lock] = {}
        self._installed: int | None = None  # the timeout_ms it was installed with
        # Readiness needs the snapshot and, when following them, both feeds' heads: a fetch
        # before a head is known could miss a change between its read and that head.
        self._ready_lock = threading.Lock()
        self._snapshot_in = False
        self._heads_needed = 2 if follow_resources else 0
        self._heads = threading.Event()
        if not follow_resources:
            self._heads.set()
        self.follows_resources = follow_resources
        self._fetch_timeout_secs = fetch_timeout_secs
        self.feeds = feeds
        self._fetch_client = httpx.Client(
            base_url=self.url, auth=auth, timeout=httpx.Timeout(fetch_timeout_secs)
        )
        self._threads = [
            threading.Thread(target=self._follow_principals, name="svc-ctx-principals", daemon=True)
        ]
        if follow_resources:
            self._threads += [
                threading.Thread(
                    target=self._follow_feed,
                    args=("resources", "/v1/resources/changes"),
                    name="svc-ctx-resources",
                    daemon=True,
                ),
                threading.Thread(
                    target=self._follow_feed,
                    args=("work_items", "/v1/work-items/changes"),
                    name="svc-ctx-work-items",
                    daemon=True,
                ),
            ]

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> ContextFollower:
        """Starts following in daemon threads; returns self."""
        if self.feeds is not None:
            for feed in ("principals", "resources", "work_items")[: len(self._threads)]:
                self.feeds.started(feed)
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stops following and waits for the threads (up to ``wait_secs`` plus a request)."""
        self._stop.set()
        if self._installed is not None and self.server is not None and self.server.running:
            self.server.set_resource_source(None)
            self._installed = None
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join()
        self._fetch_client.close()

    def install(self, timeout_ms: int = 200) -> None:
        """Installs ``fetch`` as the listener's resource source (``Server.set_resource_source``).

        Installing again (a restored database) starts a new absent set; ``stop`` removes it.
        No effect without a running ``server`` or with ``follow_resources=False`` (nothing
        would keep fetched resources current).

        Args:
            timeout_ms: how long a check waits for what it lacks before it is decided without.

        """
        if self.server is None or not self.server.running or not self.follows_resources:
            return
        self.server.set_resource_source(self.fetch, timeout_ms=timeout_ms, load_type=self.load_type)
        self._installed = timeout_ms

    def wait_for(self, predicate: Callable[[ContextStatus], bool]) -> ContextStatus:
        """Blocks until ``predicate(status)`` holds (checked after every change) or ``stop``.

        Returns the status. There is no time limit: callers decide what to wait for.
        """
        with self._cond:
            self._cond.wait_for(lambda: predicate(self.status) or self._stop.is_set())
            return self.status

    def _changed(self, note: str) -> None:
        with self._cond:
            self.status.history.append(note)
            self._cond.notify_all()

    # -- HTTP ------------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, auth=self.auth, timeout=self.timeout)

    def _get(self, client: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
        """``GET path`` as JSON; raises ``_FeedError`` naming what went wrong."""
        try:
            r = client.get(path, params=params)
        except (httpx.HTTPError, OSError) as e:
            raise _FeedError(f"GET {path}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise _FeedError(f"GET {path}: HTTP {r.status_code}: {r.text[:300]}")
        try:
            body = _decode(r.content)
        except ValueError as e:
            raise _FeedError(f"GET {path}: the answer is not JSON") from e
        if not isinstance(body, dict):
            raise _FeedError(f"GET {path}: the answer is not an object")
        return body

    def _failed(self, e: Exception, feed: str, change: str) -> None:
        """Records a failed request or a change not applied (``status``, ``feeds``).

        The reconnect policy logs the attempt and waits; ``feeds`` logs the failure once.
        """
        error = str(e) or type(e).__name__
        if isinstance(e, KeyError | TypeError | ValueError):
            error = f"the answer is not the documented shape: {type(e).__name__}: {error}"
        with self._cond:
            self.status.error = error
            self.status.reconnects += 1
        if self.feeds is not None:
            self.feeds.failed(feed, error, change)
        self._changed("failed")

    def _synced(self, feed: str, version: int) -> None:
        """Tells ``feeds`` that `feed` synced up to `version`."""
        if self.feeds is not None:
            self.feeds.synced(feed, version)

    def _reconnect(self) -> Reconnect:
        """The shared reconnect policy for one of the follower's threads."""
        return Reconnect(
            "context service",
            log,
            initial_secs=self.backoff_secs,
            max_secs=self.max_backoff_secs,
            retry_on=_RETRIED,
        )

    # -- principals ------------------------------------------------------------------------

    def _follow_principals(self) -> None:
        """Loads the snapshot, then long-polls the watch until ``stop`` (module docs).

        Each step is one attempt of ``svc.common.retry.Reconnect``: a step that fails is
        logged and waited for, and the next loads a fresh snapshot.
        """
        need_snapshot = True
        with self._client() as client:

            def step() -> None:
                nonlocal need_snapshot
                try:
                    if need_snapshot:
                        snap = self._get(client, "/v1/principals")
                        self._load_snapshot(snap)
                        need_snapshot = False
                        self._synced("principals", self.status.principals_version)
                    answer = self._get(
                        client,
                        "/v1/principals/watch",
                        after=self.status.principals_version,
                        wait_secs=self.wait_secs,
                    )
                    version = int(answer["principals_version"])
                    if version < self.status.principals_version:
                        raise _FeedError(
                            f"the service is at principals_version {version}, below the "
                            f"{self.status.principals_version} applied"
                        )
                    self._apply_principals(answer["changes"], version)
                    self._synced("principals", version)
                except _RETRIED as e:
                    if not self._stop.is_set():
                        change = (
                            "the principals snapshot"
                            if need_snapshot
                            else "the principal changes after version "
                            f"{self.status.principals_version}"
                        )
                        need_snapshot = True
                        self._failed(e, "principals", change)
                    raise

            self._reconnect().forever(step, self._stop)

    def _load_snapshot(self, snap: Mapping[str, Any]) -> None:
        """Loads a principals snapshot over what the store holds (module docs)."""
        version = int(snap["principals_version"])
        records = snap["principals"]
        entities: dict[tuple[str, str], dict[str, Any]] = {}
        accounts: dict[str, dict[str, Any]] = {}
        scores: dict[str, dict[str, Any]] = {}
        for p in records:
            kind, pid, value = p["kind"], p["id"], p["value"]
            if value is None:
                continue
            if kind in ENTITY_KINDS:
                entities[(kind, pid)] = value
            elif kind == "ServiceAccount":
                accounts[pid] = value
            elif kind == "RiskScore":
                scores[pid] = value
        with self._engine_lock:
            self._upsert(list(entities.values()))
            stale = self._entities - set(entities)
            if stale:
                self.engine.remove_entities([_ref(k, i) for k, i in sorted(stale)])
            self._entities = set(entities)
            self._register(list(accounts.values()))
            gone = sorted(self._accounts - set(accounts))
            if gone:
                self.engine.unregister_service_accounts(gone)
            self._accounts = set(accounts)
            self._scores = scores
            self._set_scores(replace=True)
        with self._cond:
            self.status.principals_version = version
            self.status.snapshots += 1
            self.status.error = ""
        log.info(
            "principals snapshot at version %d loaded: %d entities, %d service accounts, "
            "%d risk scores",
            version,
            len(entities),
            len(accounts),
            len(scores),
        )
        self._snapshot_in = True
        self._maybe_loaded()
        self._changed(f"snapshot {version}")

    def _maybe_loaded(self) -> None:
        """Marks the follower loaded once the snapshot and the feeds' heads are in."""
        with self._ready_lock:
            if self.loaded.is_set() or not self._snapshot_in or not self._heads.is_set():
                return
            if self.on_loaded is not None:
                # Before ``loaded`` is set: whoever waits for it sees the listener marked ready.
                self.on_loaded()
            with self._cond:
                self.status.loaded = True
            self.loaded.set()

    def _apply_principals(self, changes: Sequence[Mapping[str, Any]], version: int) -> None:
        """Applies one watch answer: the last state of each record, grouped by operation."""
        last: dict[tuple[str, str], Any] = {}
        for c in changes:
            last[(c["kind"], c["id"])] = c["value"]
        upserts: list[dict[str, Any]] = []
        removals: list[dict[str, str]] = []
        register: list[dict[str, Any]] = []
        unregister: list[str] = []
        rescored = False
        for (kind, pid), value in last.items():
            if kind in ENTITY_KINDS:
                if value is None:
                    removals.append(_ref(kind, pid))
                    self._entities.discard((kind, pid))
                else:
                    upserts.append(value)
                    self._entities.add((kind, pid))
            elif kind == "ServiceAccount":
                if value is None:
                    unregister.append(pid)
                    self._accounts.discard(pid)
                else:
                    register.append(value)
                    self._accounts.add(pid)
            elif kind == "RiskScore":
                rescored = True
                if value is None:
                    self._scores.pop(pid, None)
                else:
                    self._scores[pid] = value
        with self._engine_lock:
            if upserts:
                self._upsert(upserts)
            if removals:
                self.engine.remove_entities(removals)
            if register:
                self._register(register)
            if unregister:
                self.engine.unregister_service_accounts(unregister)
            if rescored:
                removed = any(v is None for (k, _), v in last.items() if k == "RiskScore")
                self._set_scores(replace=removed, only=None if removed else last)
        with self._cond:
            self.status.principals_version = version
            self.status.applied += len(changes)
            self.status.error = ""
        if changes:
            log.debug("applied %d principal changes up to version %d", len(changes), version)
            self._changed(f"principals {version}")

    def _set_scores(self, replace: bool, only: Mapping[tuple[str, str], Any] | None = None) -> None:
        """Hands the risk scores to the engine: all of them (``replace``) or those changed."""
        if only is None:
            entries = list(self._scores.values())
        else:
            entries = [v for (k, _), v in only.items() if k == "RiskScore" and v is not None]
        if not entries and not replace:
            return
        try:
            self.engine.set_risk_scores(entries, replace=replace)
        except RequestError as e:
            self._refused(f"risk scores refused: {e}")

    def _refused(self, why: str) -> None:
        with self._cond:
            self.status.refused += 1
        log.error("context service: %s", why)

    def _upsert(self, entities: list[dict[str, Any]]) -> list[Any]:
        """Upserts entities; a refused batch is retried one by one, refused ones removed.

        Returns the ``uid`` of each entity refused.
        """
        if not entities:
            return []
        try:
            self.engine.upsert_entities(entities)
            return []
        except RequestError:
            pass
        refused = []
        for e in entities:
            try:
                self.engine.upsert_entities([e])
            except RequestError as err:
                self._refused(f"entity {e.get('uid')} refused and left out: {err}")
                uid = e.get("uid")
                refused.append(uid)
                if isinstance(uid, dict):
                    try:
                        self.engine.remove_entities([uid])
                    except RequestError:
                        pass
        return refused

    def _register(self, records: list[dict[str, Any]]) -> None:
        """Registers service accounts; a refused batch is retried one by one."""
        if not records:
            return
        try:
            self.engine.register_service_accounts(records)
            return
        except RequestError:
            pass
        for r in records:
            try:
                self.engine.register_service_accounts([r])
            except RequestError as err:
                self._refused(f"service account {r.get('id')} refused, stays unregistered: {err}")
                if isinstance(r.get("id"), str):
                    self.engine.unregister_service_accounts([r["id"]])

    # -- resources and work items --------------------------------------------------------

    def _head(self, client: httpx.Client, feed: str) -> int:
        """The feed's current version (``GET /v1/feeds``, docs/context.md#versions-and-feeds)."""
        version = self._get(client, "/v1/feeds").get(feed)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise _FeedError(f"GET /v1/feeds: no version of the {feed} feed: {version!r}")
        return version

    def _drop_fetched(self, feed: str) -> None:
        """Removes what was fetched for `feed` from the store (it is fetched again on a miss)."""
        with self._engine_lock:
            if feed == "resources":
                held = sorted(self._held)
                self._held.clear()
                self._loaded_types.clear()
                if held:
                    self.engine.remove_entities([_ref(t, i) for t, i in held])
            else:
                items = sorted(self._held_items)
                self._held_items.clear()
                if items:
                    self.engine.remove_work_items(items)
        if self._installed is not None:
            self.install(self._installed)  # what was absent may exist in the restored data

    def _follow_feed(self, feed: str, path: str) -> None:
        """Follows one change feed from its head until ``stop`` (module docs).

        Each step is one attempt of ``svc.common.retry.Reconnect``: a step that fails is
        logged and waited for, and the feed carries on from its cursor.
        """
        attr = f"{feed}_version"
        started = False
        with self._client() as client:

            def step() -> None:
                nonlocal started
                answer: dict[str, Any] | None = None
                try:
                    if not started:
                        head = self._head(client, feed)
                        with self._cond:
                            setattr(self.status, attr, head)
                        started = True
                        with self._ready_lock:
                            self._heads_needed -= 1
                            if self._heads_needed <= 0:
                                self._heads.set()
                        self._maybe_loaded()
                        self._synced(feed, head)
                        self._changed(f"{feed} head {head}")
                    after = getattr(self.status, attr)
                    answer = self._get(client, path, after=after, wait_secs=self.wait_secs)
                    version = int(answer["version"])
                    if version < after:
                        log.warning(
                            "context service: the %s feed is at %d, below the %d applied; "
                            "dropping what was fetched and starting again from the head",
                            feed,
                            version,
                            after,
                        )
                        self._drop_fetched(feed)
                        started = False
                        return
                    changes = answer["changes"]
                    with self._engine_lock:
                        if feed == "resources":
                            self._apply_resources(changes)
                        else:
                            self._apply_work_items(changes)
                    with self._cond:
                        setattr(self.status, attr, version)
                        self.status.applied += len(changes)
                        self.status.error = ""
                    self._synced(feed, version)
                    if changes:
                        self._changed(f"{feed} {version}")
                except _RETRIED as e:
                    if not self._stop.is_set():
                        self._failed(e, feed, _change_named(feed, started, self.status, answer))
                    raise

            self._reconnect().forever(step, self._stop)

    def _apply_resources(self, changes: Sequence[Mapping[str, Any]]) -> None:
        """Applies resource changes (the last state of each) to what is held.

        What is not held is only forgotten as absent (module docs). Called with the engine
        lock held.
        """
        last: dict[tuple[str, str], Any] = {}
        for c in changes:
            last[_parse_key(c["id"])] = c["value"]
        upserts: list[dict[str, Any]] = []
        removals: list[dict[str, str]] = []
        forget: list[tuple[str, str]] = []
        adopted: list[tuple[str, str]] = []
        for ref, value in last.items():
            if self._fetching:
                self._touched.add(ref)
            if ref not in self._held and ref[0] in self._loaded_types and value is not None:
                # A type held whole: a resource new to it is held from now on.
                upserts.append(value)
                adopted.append(ref)
            elif ref not in self._held:
                forget.append(ref)
                if self._fetching and value is not None:
                    # A fetch in flight may be reading it, and will drop its (maybe older)
                    # answer: the feed's state is stored instead, or the check would be
                    # decided without a resource that exists.
                    upserts.append(value)
                    adopted.append(ref)
            elif value is None:
                removals.append(_ref(*ref))
                self._held.discard(ref)
            else:
                upserts.append(value)
        refused = self._upsert(upserts)
        self._held.update(r for r in adopted if _ref(*r) not in refused)
        if removals:
            self.engine.remove_entities(removals)
        if forget and self.server is not None and self.server.running:
            self.server.forget_absent(forget)

    def _apply_work_items(self, changes: Sequence[Mapping[str, Any]]) -> None:
        """Applies work-item changes (the last state of each) to what is held.

        What is not held is only forgotten as absent. Called with the engine lock held.
        """
        last: dict[str, Any] = {}
        for c in changes:
            last[c["id"]] = c["value"]
        items: list[dict[str, Any]] = []
        gone: list[str] = []
        forget: list[str] = []
        adopted: list[str] = []
        for wid, value in last.items():
            if self._fetching:
                self._touched_items.add(wid)
            if wid not in self._held_items:
                forget.append(wid)
                if self._fetching and value is not None:
                    items.append(value)  # as for resources: a fetch in flight drops its answer
                    adopted.append(wid)
            elif value is None:
                gone.append(wid)
                self._held_items.discard(wid)
            else:
                items.append(value)
        refused_items = self._upsert_work_items(items)
        self._held_items.update(w for w in adopted if w not in refused_items)
        if gone:
            self.engine.remove_work_items(gone)
        if forget and self.server is not None and self.server.running:
            self.server.forget_absent([], forget)

    def _upsert_work_items(self, items: list[dict[str, Any]]) -> list[str]:
        """Upserts work items; a refused batch is retried one by one. Returns the refused ids."""
        if not items:
            return []
        try:
            self.engine.upsert_work_items(items)
            return []
        except RequestError:
            pass
        refused = []
        for item in items:
            try:
                self.engine.upsert_work_items([item])
            except RequestError as err:
                self._refused(f"work item {item.get('id')} refused: {err}")
                refused.append(str(item.get("id")))
        return refused

    # -- fetched on a miss -----------------------------------------------------------------

    def _post(self, client: httpx.Client, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST path`` with a JSON body, answered as JSON; raises ``_FeedError``."""
        try:
            r = client.post(path, json=body)
        except (httpx.HTTPError, OSError) as e:
            raise _FeedError(f"POST {path}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise _FeedError(f"POST {path}: HTTP {r.status_code}: {r.text[:300]}")
        try:
            answer = r.json()
        except ValueError as e:
            raise _FeedError(f"POST {path}: the answer is not JSON") from e
        if not isinstance(answer, dict):
            raise _FeedError(f"POST {path}: the answer is not an object")
        return answer

    def load_type(self, resource_type: str) -> None:
        """Reads every resource of ``resource_type`` the service holds into the store, once.

        The listener calls it (``Server.set_resource_source``'s ``load_type``) before an
        AuthZEN resource search, whose candidates must be all the resources of the type
        (docs/search.md). The pages come from ``GET /v1/resources?type=`` in id order; from the
        start of the load on, the resources feed applies every change of the type (a new
        resource is held too), so the type stays whole. A second call returns at once; a call
        while another loads the type waits for it. Feed changes that came during the load win
        over the pages (theirs is the newer state), as for ``fetch``.

        Args:
            resource_type: the Cedar entity type (``Document``).

        Raises:
            RuntimeError: a read failed (transport, status, shape); the type is not marked
                whole (what was read stays held and followed), and the next call starts again.

        """
        if not self._heads.wait(self._fetch_timeout_secs):
            raise RuntimeError("the context service's feeds are not followed yet")
        with self._engine_lock:
            lock = self._type_locks.setdefault(resource_type, threading.Lock())
        with lock:
            with self._engine_lock:
                if resource_type in self._loaded_types:
                    return
                # Changes from now on are applied as held; the pages fill in the rest.
                self._loaded_types.add(resource_type)
                self._fetching += 1
            done = False
            try:
                after = ""
                while True:
                    try:
                        body = self._get(
                            self._fetch_client,
                            "/v1/resources",
                            type=resource_type,
                            after=after,
                            limit=FETCH_CHUNK,
                        )
                        page = body["resources"]
                        after = str(body["next"])
                        if not isinstance(page, list):
                            raise TypeError("`resources` is not a list")
                    except (_FeedError, KeyError, TypeError, ValueError) as e:
                        with self._cond:
                            self.status.fetch_errors += 1
                        log.warning("context service: loading %s failed: %s", resource_type, e)
                        raise RuntimeError(str(e) or type(e).__name__) from e
                    with self._engine_lock:
                        fresh = [
                            f
                            for f in page
                            if (f["uid"]["type"], f["uid"]["id"]) not in self._touched
                        ]
                        refused = self._upsert(fresh)
                        self._held.update(
                            (f["uid"]["type"], f["uid"]["id"])
                            for f in fresh
                            if f["uid"] not in refused
                        )
                    with self._cond:
                        self.status.fetched += len(fresh)
                    if not after:
                        break
                done = True
            finally:
                with self._engine_lock:
                    if not done:
                        self._loaded_types.discard(resource_type)
                    self._fetching -= 1
                    if not self._fetching:
                        self._touched.clear()
                        self._touched_items.clear()
            self._changed(f"loaded {resource_type}")

    def fetch(
        self, resources: list[tuple[str, str]], work_items: list[str]
    ) -> tuple[list[tuple[str, str]], list[str]]:
        """Reads missing resources and work items by id into the store.

        The listener calls it (``Server.set_resource_source``) before deciding checks whose
        resource or work item the engine lacks.

        Args:
            resources: ``(type, id)`` of each resource a request's checks name and the engine
                lacks.
            work_items: ids of the work items they name and the engine lacks.

        Returns:
            ``(resources, work_items)`` the service does not hold, or whose record the engine
            refuses (the listener remembers them as absent until the feed names them). What
            a feed change named while this call was in flight is left out of both: the feed's
            state is the newer.

        Raises:
            RuntimeError: a read failed (transport, status, shape); the listener counts it and
                decides without them. Nothing read is applied then.

        """
        if not self._heads.wait(self._fetch_timeout_secs):
            raise RuntimeError("the context service's feeds are not followed yet")
        with self._engine_lock:
            self._fetching += 1
        with self._cond:
            self.status.fetches += 1
        try:
            found: list[dict[str, Any]] = []
            missing: list[tuple[str, str]] = []
            found_items: list[dict[str, Any]] = []
            missing_items: list[str] = []
            try:
                for i in range(0, len(resources), FETCH_CHUNK):
                    part = resources[i : i + FETCH_CHUNK]
                    body = self._post(
                        self._fetch_client,
                        "/v1/resources/get",
                        {"resources": [_ref(t, r) for t, r in part]},
                    )
                    found += body["resources"]
                    missing += [(m["type"], m["id"]) for m in body["missing"]]
                for i in range(0, len(work_items), FETCH_CHUNK):
                    body = self._post(
                        self._fetch_client,
                        "/v1/work-items/get",
                        {"ids": work_items[i : i + FETCH_CHUNK]},
                    )
                    found_items += body["work_items"]
                    missing_items += [str(m) for m in body["missing"]]
            except (_FeedError, KeyError, TypeError, ValueError) as e:
                with self._cond:
                    self.status.fetch_errors += 1
                # The ids are a check's, as long as its caller made them: named cut (issue 43).
                first = resources[0] if resources else work_items[0] if work_items else ""
                log.warning(
                    "context service: fetching %d resources and %d work items (first %s) "
                    "failed: %s",
                    len(resources),
                    len(work_items),
                    bounded(first),
                    bounded(e, MAX_LOG_FIELD_CHARS),
                )
                raise RuntimeError(bounded(str(e) or type(e).__name__, MAX_LOG_FIELD_CHARS)) from e
            with self._engine_lock:
                fresh = [
                    f for f in found if (f["uid"]["type"], f["uid"]["id"]) not in self._touched
                ]
                absent = [m for m in missing if m not in self._touched]
                refused = self._upsert(fresh)
                for f in fresh:
                    ref = (f["uid"]["type"], f["uid"]["id"])
                    if f["uid"] in refused:
                        absent.append(ref)
                    else:
                        self._held.add(ref)
                fresh_items = [w for w in found_items if w.get("id") not in self._touched_items]
                absent_items = [w for w in missing_items if w not in self._touched_items]
                refused_items = self._upsert_work_items(fresh_items)
                self._held_items.update(
                    str(w.get("id")) for w in fresh_items if w.get("id") not in refused_items
                )
                absent_items += refused_items
            with self._cond:
                self.status.fetched += len(fresh) + len(fresh_items)
            self._changed("fetched")
            return absent, absent_items
        finally:
            with self._engine_lock:
                self._fetching -= 1
                if not self._fetching:
                    self._touched.clear()
                    self._touched_items.clear()


def follow_context(
    engine: Engine,
    server: Server | None,
    url: str,
    auth: httpx.Auth | None = None,
    *,
    fetch_timeout_ms: int = 200,
    **options: Any,
) -> ContextFollower:
    """Starts a ``ContextFollower`` for a decision point; what ``svc pdp --context URL`` calls.

    Args:
        engine: the decision point's engine.
        server: its listener, started, made with ``await_principals=True``: the follower marks
            its principals flag ready once the snapshot (and the feeds' heads) are loaded
            (``Server.set_ready(principals=True)``), and is installed as its resource source
            (``Server.set_resource_source(follower.fetch)``; removed by ``stop``). ``None``:
            no listener.
        url: the context service's base URL.
        auth: the bearer token to send (``BearerToken``), or ``None`` (docs/auth.md).
        fetch_timeout_ms: how long a check waits for the resources it lacks before it is
            decided without them (``Server.set_resource_source``'s ``timeout_ms``).
        options: more ``ContextFollower`` keyword arguments (``wait_secs``, backoff,
            ``follow_resources``).

    Returns:
        The started follower; ``stop()`` it on shutdown.

    """

    def ready() -> None:
        if server is not None and server.running:
            server.set_ready(principals=True)

    follower = ContextFollower(engine, url, auth, on_loaded=ready, server=server, **options)
    follower.install(fetch_timeout_ms)
    return follower.start()
