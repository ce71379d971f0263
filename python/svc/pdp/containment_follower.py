"""A decision point following the challenge service's containment list (``WatchContainments``).

``ContainmentFollower`` runs a thread that holds a ``WatchContainments`` stream of
``svc.challenge.v1.ChallengeService`` open (docs/challenges.md#containments). The first message
of every stream is the whole list: it replaces the engine's containment list
(``Engine.set_containments``). Each later change contains (``Engine.contain``) or lifts
(``Engine.lift``) one principal; the next check of a contained principal is denied
``svc:contained`` before any policy runs (docs/architecture.md#built-in-denials). A contained
principal is never answered a pinned query plan: the engine checks containment before it looks
a pinned plan up (``crates/pdp_core/src/engine/plan.rs``), and every containment change moves
its ``principals_version`` (docs/architecture.md#versioning).

* **Readiness.** ``loaded`` is set once the first whole list is in the engine; then
  ``on_loaded`` is called (``follow_containments`` makes it
  ``Server.set_ready(containments=True)``: until then the listener's ``/readyz`` answers 503).
* **Failures.** A stream that fails (connection refused or lost, a status such as
  ``UNAVAILABLE`` or ``UNAUTHENTICATED``, a message that is not the documented shape) leaves
  the list in force serving, and is opened again: at once after a stream that had delivered
  its list, then, while opening keeps failing, after the shared reconnect policy's delays
  (``svc.common.retry.Reconnect``: full jitter under a ceiling that doubles from
  ``backoff_secs`` up to ``max_backoff_secs``, one log line per failure). A new stream starts
  with the whole list, so whatever changed during the gap is caught up by replacing the list.
  A stream that stays silent longer than ``stale_secs`` (the service sends a heartbeat every
  ``heartbeat_secs``, 5 s by default) counts as lost: a connection that died without closing is
  noticed.
* **Challenge waits.** After every list or change it applies, the follower calls
  ``on_changed`` (``follow_containments`` makes it ``Server.containments_changed``): the
  listener's held challenge waits look again, and those of a principal now contained answer
  ``rejected`` at once (docs/challenges.md#containment-during-a-wait).
* **Callers' tokens.** Every stream carries ``authorization: Bearer <JWT>`` when ``token``
  returns one (docs/auth.md, audience ``svc-challenge``); it is called again at each
  (re)connect, so a renewed token is picked up.

Callers wait on what was applied with ``wait_for(predicate)`` over ``ContainmentStatus``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from svc._pdp_core import Engine, RequestError, Server
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from svc.common.retry import Reconnect
from svc.pdp.feeds import FeedReporter, RepeatedRetries

__all__ = ["ContainmentFollower", "ContainmentStatus", "follow_containments"]

log = logging.getLogger("svc.pdp.containments")
#: A feed failing the same way logs its reconnects once per window (``svc.pdp.feeds``).
log.addFilter(RepeatedRetries())

#: The feed's name in readiness, metrics and logs (``svc.pdp.feeds``).
FEED = "containments"

#: A principal as the engine's containment list holds it: ``(type, id)``.
Pair = tuple[str, str]


@dataclass
class ContainmentStatus:
    """What the follower has applied, and its last error.

    ``contained``: the principals contained as last applied (``(type, id)``); ``loaded``: a
    whole list is in the engine; ``lists``: whole lists applied (1 plus one per reconnect);
    ``applied``: changes applied (contain or lift); ``changed_at``: ``time.monotonic()`` of the
    last list or change applied (0.0 before any); ``heartbeats``: heartbeats received;
    ``connected``: a stream is open and has delivered its list; ``reconnects``: streams that
    failed or were lost; ``stale``: of those, streams silent past ``stale_secs``; ``refused``:
    references the engine refused (logged, left out); ``error``: the last failure, empty once
    a new stream delivers its list.
    """

    contained: frozenset[Pair] = frozenset()
    loaded: bool = False
    lists: int = 0
    applied: int = 0
    changed_at: float = 0.0
    heartbeats: int = 0
    connected: bool = False
    reconnects: int = 0
    stale: int = 0
    refused: int = 0
    error: str = ""
    history: list[str] = field(default_factory=list)


class _StreamLost(Exception):
    """A stream that failed before it delivered its list; the message says how."""


def _target(url: str) -> str:
    """``host:port`` of ``http://host:port`` (or of ``host:port`` itself)."""
    return re.sub(r"^https?://", "", url).rstrip("/")


def _ref(p: Pair) -> dict[str, str]:
    return {"type": p[0], "id": p[1]}


class ContainmentFollower:
    """Follows ``WatchContainments`` into an engine's containment list (module docs).

    Args:
        engine: the decision point's engine; its containment list is replaced and changed.
        url: the challenge service (``http://host:port`` or ``host:port``; plain gRPC, h2c).
        token: returns the bearer token to send with each new stream (audience
            ``svc-challenge``, docs/auth.md), or None to send none; ``None`` (the default)
            sends none.
        backoff_secs: the longest first delay after a stream that failed to open, seconds;
            the ceiling doubles per failure up to ``max_backoff_secs`` (full jitter below it,
            ``svc.common.retry.Reconnect``).
        stale_secs: a stream without any message (list, change or heartbeat) for this long is
            taken as lost and opened again; keep it a few times the service's
            ``heartbeat_secs``.
        on_loaded: called (from the follower's thread) once, when the first whole list is in
            the engine and before ``loaded`` and ``status.loaded`` are set, so that whoever
            waits for those sees its effect (``follow_containments`` marks the listener ready).
        on_changed: called (from the follower's thread) after every list or change applied to
            the engine, before ``status`` shows it (``follow_containments`` makes it
            ``Server.containments_changed``, which ends the challenge waits of a principal
            now contained).
        feeds: where the ``containments`` feed's health is reported (``svc.pdp.feeds``), or
            None: every list, change and heartbeat is a successful sync, a lost stream a
            failure (the list in force keeps serving; past the bound ``/readyz`` says so).

    """

    def __init__(
        self,
        engine: Engine,
        url: str,
        token: Callable[[], str | None] | None = None,
        *,
        backoff_secs: float = 0.2,
        max_backoff_secs: float = 10.0,
        stale_secs: float = 15.0,
        on_loaded: Callable[[], None] | None = None,
        on_changed: Callable[[], None] | None = None,
        feeds: FeedReporter | None = None,
    ) -> None:
        self.engine = engine
        self.feeds = feeds
        self.target = _target(url)
        self.token = token
        self.backoff_secs = backoff_secs
        self.max_backoff_secs = max_backoff_secs
        self.stale_secs = stale_secs
        self.on_loaded = on_loaded
        self.on_changed = on_changed
        self.status = ContainmentStatus()
        self.loaded = threading.Event()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._call: Any = None
        self._reconnect = Reconnect(
            "challenge service",
            log,
            initial_secs=backoff_secs,
            max_secs=max_backoff_secs,
            retry_on=_StreamLost,
        )
        self._thread = threading.Thread(target=self._run, name="svc-pdp-containments", daemon=True)

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> ContainmentFollower:
        """Starts following in a daemon thread; returns self."""
        if self.feeds is not None:
            self.feeds.started(FEED)
        self._thread.start()
        return self

    def stop(self, timeout_secs: float = 10.0) -> None:
        """Stops following (cancels the stream) and waits for the thread.

        Args:
            timeout_secs: longest wait for the thread. A thread still inside a gRPC call after
                it (the call did not end on ``cancel``) is left running, as the daemon it is,
                and logged, so that stopping a decision point or a gateway never hangs.

        """
        self._stop.set()
        with self._cond:
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout_secs)
            if self._thread.is_alive():
                with self._cond:
                    late = self._call
                if late is not None:
                    late.cancel()
                log.warning(
                    "challenge service: the containment stream did not end within %.0f s of "
                    "stop; leaving its thread",
                    timeout_secs,
                )

    def wait_for(self, predicate: Callable[[ContainmentStatus], bool]) -> ContainmentStatus:
        """Blocks until ``predicate(status)`` holds (checked after every change) or ``stop``.

        Returns the status. There is no time limit: callers decide what to wait for.
        """
        with self._cond:
            self._cond.wait_for(lambda: predicate(self.status) or self._stop.is_set())
            return self.status

    def _changed(self, note: str) -> None:
        if self.feeds is not None and note != "disconnected" and self.status.loaded:
            self.feeds.synced(FEED)  # a list, a change or a heartbeat came and was applied
        with self._cond:
            self.status.history.append(note)
            self._cond.notify_all()

    # -- the stream ------------------------------------------------------------------------

    def _run(self) -> None:
        """Opens streams until ``stop``, with the shared reconnect policy between them."""
        self._reconnect.forever(self._stream, self._stop)

    def _lost(self, error: str) -> None:
        """Records a stream that ended (not by ``stop``)."""
        with self._cond:
            self.status.connected = False
            self.status.reconnects += 1
            self.status.error = error
        if self.feeds is not None:
            self.feeds.failed(FEED, error, "the containment list (WatchContainments)")
        self._changed("disconnected")

    def _stream(self) -> None:
        """One ``WatchContainments`` stream, applied until it ends.

        Returns when a stream that delivered its list is lost (the caller opens the next at
        once); raises ``_StreamLost`` when it failed before its list (the caller backs off).
        """
        if self._stop.is_set():
            raise _StreamLost("stopped")
        delivered = False
        channel = grpc.insecure_channel(self.target)
        watchdog: threading.Timer | None = None
        try:
            stub = pb_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                bearer = self.token() if self.token is not None else None
            except Exception as e:  # a token that cannot be had now: the next attempt retries
                error = f"no bearer token for the challenge service: {e}"
                self._lost(error)
                raise _StreamLost(error) from e
            metadata = [("authorization", f"Bearer {bearer}")] if bearer else []
            call = stub.WatchContainments(pb.WatchContainmentsRequest(), metadata=metadata)
            with self._cond:
                self._call = call
            if self._stop.is_set():
                call.cancel()
            watchdog = self._watch(call, channel)
            for msg in call:
                watchdog.cancel()
                watchdog = self._watch(call, channel)
                event = msg.WhichOneof("event")
                if event == "list":
                    self._apply_list(msg.list)
                    delivered = True
                elif event == "change":
                    if not delivered:
                        raise _StreamLost("the stream's first message is not the whole list")
                    self._apply_change(msg.change)
                elif event == "heartbeat":
                    with self._cond:
                        self.status.heartbeats += 1
                    self._changed("heartbeat")
            error = "containment stream ended"
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            details = e.details() if isinstance(e, grpc.Call) else str(e)
            error = f"containment stream lost: {code}: {details}"
        finally:
            if watchdog is not None:
                watchdog.cancel()
            with self._cond:
                self._call = None
            channel.close()
        if self._stop.is_set():
            raise _StreamLost("stopped")
        self._lost(error)
        if not delivered:
            raise _StreamLost(error)
        log.warning("challenge service: %s; reconnecting", error)

    def _watch(self, call: Any, channel: grpc.Channel) -> threading.Timer:
        """A timer that ends ``call`` when it stays silent for ``stale_secs``.

        The call is cancelled and its channel closed too (grpc cancels every RPC of a closed
        channel), so a stream still connecting when it is cancelled cannot hang the follower.
        """

        def expire() -> None:
            with self._cond:
                self.status.stale += 1
            try:
                call.cancel()
                channel.close()
            finally:
                log.warning("no message from the challenge service for %.1f s", self.stale_secs)

        timer = threading.Timer(self.stale_secs, expire)
        timer.daemon = True
        timer.start()
        return timer

    # -- applying --------------------------------------------------------------------------

    def _apply_list(self, listed: pb.ContainmentList) -> None:
        """Replaces the engine's containment list with a stream's first message."""
        pairs = [(c.principal.type, c.principal.id) for c in listed.containments]
        try:
            self.engine.set_containments([_ref(p) for p in pairs])
        except RequestError:
            # A reference the engine refuses: contain the others one by one (the list only
            # grows meanwhile, so nobody contained is let through), then replace the list.
            valid = []
            for p in pairs:
                try:
                    self.engine.contain([_ref(p)])
                except RequestError as e:
                    self._refused(p, e)
                    continue
                valid.append(p)
            pairs = valid
            self.engine.set_containments([_ref(p) for p in pairs])
        first = not self.status.loaded
        self._engine_changed()
        if first and self.on_loaded is not None:
            self.on_loaded()  # before `loaded`: whoever waits for it sees the listener ready
        with self._cond:
            self.status.contained = frozenset(pairs)
            self.status.lists += 1
            self.status.loaded = True
            self.status.connected = True
            self.status.error = ""
            self.status.changed_at = time.monotonic()
        self.loaded.set()
        log.info("containment list loaded: %d principals contained", len(pairs))
        self._changed(f"list {len(pairs)}")

    def _apply_change(self, change: pb.ContainmentChange) -> None:
        """Contains or lifts one principal."""
        principal = change.containment.principal
        p = (principal.type, principal.id)
        try:
            if change.contained:
                self.engine.contain([_ref(p)])
            else:
                self.engine.lift([_ref(p)])
        except RequestError as e:
            self._refused(p, e)
            return
        self._engine_changed()
        with self._cond:
            held = set(self.status.contained)
            if change.contained:
                held.add(p)
            else:
                held.discard(p)
            self.status.contained = frozenset(held)
            self.status.applied += 1
            self.status.changed_at = time.monotonic()
        verb = "contained" if change.contained else "lifted"
        log.info("%s %s::%s (%s)", verb, p[0], p[1], change.containment.reason or "no reason")
        self._changed(f"{verb} {p[0]}::{p[1]}")

    def _engine_changed(self) -> None:
        """Calls ``on_changed`` after the engine's list changed; its failure is logged."""
        if self.on_changed is None:
            return
        try:
            self.on_changed()
        except Exception as e:  # the listener stopped meanwhile: the list still applies
            log.warning("containment change not passed to the listener: %s", e)

    def _refused(self, p: Pair, e: RequestError) -> None:
        with self._cond:
            self.status.refused += 1
        log.error("challenge service: containment of %r refused by the engine: %s", p, e)


def follow_containments(
    engine: Engine,
    server: Server | None,
    url: str,
    token: Callable[[], str | None] | None = None,
    **options: Any,
) -> ContainmentFollower:
    """Starts a ``ContainmentFollower`` for a decision point; what ``svc pdp --challenge`` runs.

    Args:
        engine: the decision point's engine.
        server: its listener, started, whose ``containments`` readiness flag is left unset
            until the first whole list is loaded, then set (``Server.set_ready``), and which is
            told of every change (``Server.containments_changed``: the challenge waits of a
            principal now contained end); ``None``: no listener.
        url: the challenge service (``http://host:port``).
        token: returns the bearer token for each new stream (audience ``svc-challenge``), or
            None.
        options: more ``ContainmentFollower`` keyword arguments (``backoff_secs``,
            ``max_backoff_secs``, ``stale_secs``).

    Returns:
        The started follower; ``stop()`` it on shutdown.

    """

    def ready() -> None:
        if server is not None and server.running:
            server.set_ready(containments=True)

    def changed() -> None:
        if server is not None and server.running:
            server.containments_changed()

    return ContainmentFollower(
        engine, url, token, on_loaded=ready, on_changed=changed, **options
    ).start()
