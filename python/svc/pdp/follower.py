"""A decision point following the policy service's active bundle and mode (``WatchActive``).

``Follower`` runs a thread that holds a ``WatchActive`` stream open (docs/policy.md#watchactive).
For each active state it receives, it verifies the bundle's Ed25519 signature with the policy
service's public key (``svc.policy.signing.verify``, docs/bundles.md#signed-bundles), then swaps
the engine's bundle (``Engine.load_bundle``, atomic) and sets the engine's mode
(``Engine.set_mode``). A bundle whose signature does not verify, or that does not load, is never
served: the last verified bundle keeps serving, and ``status`` (and, when a ``Server`` is given,
``/readyz`` and the ``svc_pdp_bundle_error`` metric through ``Server.bundle_reloaded``) says
why. The first verified bundle marks the listener's bundle as loaded (``Server.set_ready``);
the containment list's readiness is its own feed's to set. When the stream drops, the follower
keeps serving what it has and opens a new stream: at once after a stream that had delivered
a message, then, while opening keeps failing, after the shared reconnect policy's delays
(``svc.common.retry.Reconnect``: full jitter under a ceiling that doubles from
``backoff_secs`` up to ``max_backoff_secs``, one log line per failure). The first message of
a new stream is the active state, so it catches up at once. A stream that stays silent
longer than ``stale_secs`` (the service sends a heartbeat every few seconds) counts as lost
too: a connection that died without closing is noticed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from svc._pdp_core import BundleError, Engine, RequestError, Server
from svc.common.retry import Reconnect
from svc.pdp.feeds import FeedReporter, RepeatedRetries
from svc.policy import signing
from svc.policy.v1 import policy_pb2 as pb
from svc.policy.v1 import policy_pb2_grpc as pb_grpc
from svc.policy.wire import CHANNEL_OPTIONS, mode_name

__all__ = ["CHANNEL_OPTIONS", "Follower", "FollowerStatus", "bundle_sources", "fetch_active"]


log = logging.getLogger("svc.pdp.follower")
#: A feed failing the same way logs its reconnects once per window (``svc.pdp.feeds``).
log.addFilter(RepeatedRetries())


class _StreamLost(Exception):
    """A stream that failed or ended before its first message; the message says how."""


def bundle_sources(
    files: dict[str, str],
) -> tuple[dict[str, str], str | None, str | None, str | None]:
    """A bundle's files as ``Engine.load_bundle`` arguments (docs/bundles.md's layout).

    Returns:
        ``(policies, schema, entities, links)``: the ``*.cedar`` files by name; the text of the
        schema file (``*.cedarschema``, ``schema.json`` or ``*.cedarschema.json``) or None; the
        text of ``entities.json`` or None; the text of ``linked`` or None. Other files are
        ignored, as a bundle directory's are.

    """
    policies = {n: t for n, t in files.items() if n.endswith(".cedar")}
    schema = next(
        (
            t
            for n, t in sorted(files.items())
            if n.endswith((".cedarschema", ".cedarschema.json")) or n == "schema.json"
        ),
        None,
    )
    return policies, schema, files.get("entities.json"), files.get("linked")


def fetch_active(
    target: str,
    public_key: Ed25519PublicKey,
    token: str | None = None,
    timeout_secs: float = 10.0,
) -> tuple[int, dict[str, str]] | None:
    """The policy service's active bundle, verified, for a decision point's first engine.

    One ``GetActive`` call, so that a decision point starts with the active bundle (its
    engine's ``policy_version`` 1) rather than swapping it in after start.

    Args:
        target: the policy service's gRPC address (``host:port``).
        public_key: the policy service's signing public key.
        token: the bearer token to send (docs/auth.md), or None.
        timeout_secs: the call's deadline.

    Returns:
        ``(version, files)`` of the active bundle when its signature verifies; None when the
        service cannot be reached, refuses the call, has published nothing, or the signature
        does not verify (the reason is logged; the follower then gets the bundle from
        ``WatchActive`` or keeps refusing it).

    """
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    try:
        stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        metadata = [("authorization", f"Bearer {token}")] if token else []
        b = stub.GetActive(pb.GetActiveRequest(), timeout=timeout_secs, metadata=metadata).bundle
        files = {f.name: f.content for f in b.files}
        signing.verify(public_key, b.version, files, b.signature)
        return b.version, files
    except grpc.RpcError as e:
        details = e.details() if isinstance(e, grpc.Call) else str(e)
        log.warning("no active bundle from the policy service at start: %s", details)
        return None
    except signing.SignatureError as e:
        log.error("the active bundle's signature does not verify: %s", e)
        return None
    finally:
        channel.close()


@dataclass
class FollowerStatus:
    """What the follower has done: the version and mode served, counts, and the last error.

    ``version`` is the bundle version serving (0 before the first verified bundle);
    ``error`` is the last refusal (bad signature, bundle that does not load), empty once a
    later bundle was verified and swapped, or the last stream failure (``policy stream lost:
    ...``), empty once a stream is open again.
    """

    version: int = 0
    mode: str = ""
    swaps: int = 0
    refused: int = 0
    reconnects: int = 0
    stale: int = 0
    heartbeats: int = 0
    connected: bool = False
    error: str = ""
    history: list[str] = field(default_factory=list)


class Follower:
    """Follows ``WatchActive`` into an engine (module docs).

    Args:
        engine: the decision point's engine; its bundle and mode are replaced.
        target: the policy service's gRPC address (``host:port``).
        public_key: the policy service's signing public key.
        server: the running decision point, whose ``/readyz`` and metrics report refusals.
        backoff_secs: the longest first delay after a stream that failed to open, seconds;
            the ceiling doubles per failure up to ``max_backoff_secs`` (full jitter below it,
            ``svc.common.retry.Reconnect``).
        max_backoff_secs: the largest such ceiling, seconds.
        stale_secs: a stream without any message (state or heartbeat) for this long is taken
            as lost and opened again; keep it a few times the service's ``heartbeat_secs``.
        on_change: called (from the follower's thread) after every swap, mode change or
            refusal, with the status (tests, logs).
        token: returns the bearer token to send with each new stream (docs/auth.md), or None
            to send none; called at every (re)connect, so a renewed token is picked up.
        feeds: where the ``bundle`` feed's health is reported (``svc.pdp.feeds``), or None;
            settable later (``serve_bundle`` sets it once the listener runs). Every message
            (state or heartbeat) is a successful sync while no refused bundle is pending; a
            refused bundle and a lost stream are failures: the last verified bundle keeps
            serving, and once no sync succeeded within the bound ``/readyz`` says the feed is
            stale.

    """

    def __init__(
        self,
        engine: Engine,
        target: str,
        public_key: Ed25519PublicKey,
        server: Server | None = None,
        backoff_secs: float = 0.2,
        max_backoff_secs: float = 10.0,
        stale_secs: float = 15.0,
        on_change: Callable[[FollowerStatus], None] | None = None,
        token: Callable[[], str | None] | None = None,
        feeds: FeedReporter | None = None,
    ) -> None:
        self.engine = engine
        self.feeds = feeds
        #: The bundle version refused and not superseded since (None: nothing pending).
        self.pending: int | None = None
        self.target = target
        self.public_key = public_key
        self.server = server
        self.backoff_secs = backoff_secs
        self.max_backoff_secs = max_backoff_secs
        self.stale_secs = stale_secs
        self.on_change = on_change
        self.token = token
        self.status = FollowerStatus()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._channel: grpc.Channel | None = None
        self._reconnect = Reconnect(
            "policy service",
            log,
            initial_secs=backoff_secs,
            max_secs=max_backoff_secs,
            retry_on=_StreamLost,
        )
        self._thread = threading.Thread(target=self._run, name="svc-pdp-follower", daemon=True)

    def start(self) -> Follower:
        """Starts following in a daemon thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops following (cancels the stream) and waits for the thread."""
        self._stop.set()
        with self._cond:
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()
        self._thread.join()

    def wait_for(self, predicate: Callable[[FollowerStatus], bool]) -> FollowerStatus:
        """Blocks until ``predicate(status)`` holds (checked after every change).

        Returns the status. There is no time limit: callers decide how long to wait for their
        test or start-up by what they wait for.
        """
        with self._cond:
            self._cond.wait_for(lambda: predicate(self.status) or self._stop.is_set())
            return self.status

    def _changed(self, note: str) -> None:
        with self._cond:
            self.status.history.append(note)
            self._cond.notify_all()
        if self.on_change is not None:
            self.on_change(self.status)

    def _report(self, error: str | None) -> None:
        """Tells the listener about a swap (``None``) or a refusal (its text).

        A verified swap marks the bundle loaded (``/readyz``); an error shows in ``/readyz``
        and ``svc_pdp_bundle_error`` until the next good swap.
        """
        if self.server is not None and self.server.running:
            if error is None:
                self.server.set_ready(bundle=True)
            self.server.bundle_reloaded(error)

    def _apply(self, state: pb.ActiveState) -> None:
        """Verifies and swaps one active state; a refusal keeps what serves."""
        if state.HasField("bundle"):
            b = state.bundle
            if b.version == self.status.version:
                self.pending = None  # the active bundle is the one serving: nothing pending
            else:
                files = {f.name: f.content for f in b.files}
                try:
                    signing.verify(self.public_key, b.version, files, b.signature)
                    policies, schema, entities, links = bundle_sources(files)
                    self.engine.load_bundle(policies, schema, entities, links)
                except (signing.SignatureError, BundleError) as e:
                    self.status.refused += 1
                    self.status.error = f"bundle version {b.version} refused: {e}"
                    log.error(
                        "%s; version %d keeps serving", self.status.error, self.status.version
                    )
                    self.pending = b.version
                    if self.feeds is not None:
                        self.feeds.failed("bundle", str(e), f"bundle version {b.version}")
                    self._report(self.status.error)
                    self._changed(f"refused {b.version}")
                else:
                    self.status.version = b.version
                    self.status.swaps += 1
                    self.status.error = ""
                    self.pending = None
                    log.info("bundle version %d verified and serving", b.version)
                    self._report(None)
                    self._changed(f"swapped {b.version}")
        mode = mode_name(state.enforcement.mode)
        if mode and mode != self.status.mode:
            try:
                self.engine.set_mode(mode)
            except RequestError as e:  # never: the proto has two modes
                log.error("mode `%s` refused: %s", mode, e)
                return
            self.status.mode = mode
            log.info("mode now %s", mode)
            self._changed(f"mode {mode}")

    def synced(self) -> None:
        """Reports a successful sync of the ``bundle`` feed, unless a refused bundle is pending."""
        if self.feeds is not None and self.pending is None and self.status.version > 0:
            self.feeds.synced("bundle", self.status.version)

    def _watch(self, call: grpc.Future, channel: grpc.Channel) -> threading.Timer:
        """A timer that ends ``call`` when it stays silent for ``stale_secs``.

        The service sends a heartbeat while nothing changes, so silence means a connection that
        died without closing (a host gone, a partition): the stream counts as lost. The call is
        cancelled and its channel closed too (grpc cancels every RPC of a closed channel), so a
        stream still connecting when it is cancelled cannot keep the follower waiting.
        """

        def expire() -> None:
            self.status.stale += 1
            try:
                call.cancel()
                channel.close()
            finally:
                log.warning("no message from the policy service for %.1f s", self.stale_secs)

        timer = threading.Timer(self.stale_secs, expire)
        timer.daemon = True
        timer.start()
        return timer

    def _run(self) -> None:
        """Opens streams until ``stop``, with the shared reconnect policy between them."""
        self._reconnect.forever(self._stream, self._stop)

    def _stream(self) -> None:
        """One ``WatchActive`` stream, applied until it ends.

        Returns when a stream that had delivered a message is lost (the next opens at once);
        raises ``_StreamLost`` when it failed or ended before its first message (the next
        waits, ``svc.common.retry.Reconnect``), or once stopped.
        """
        if self._stop.is_set():
            raise _StreamLost("stopped")
        delivered = False
        error = "policy stream ended"
        watchdog: threading.Timer | None = None
        channel = grpc.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        stub = pb_grpc.PolicyServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            bearer = self.token() if self.token is not None else None
            metadata = [("authorization", f"Bearer {bearer}")] if bearer else []
            call = stub.WatchActive(pb.WatchActiveRequest(), metadata=metadata)
            with self._cond:
                self._call = call
                if self._stop.is_set():
                    call.cancel()
            watchdog = self._watch(call, channel)
            for msg in call:
                watchdog.cancel()
                watchdog = self._watch(call, channel)
                delivered = True
                if not self.status.connected:
                    self.status.connected = True
                    if self.status.error.startswith("policy stream lost"):
                        self.status.error = ""
                    self._changed("connected")
                if msg.HasField("active"):
                    self._apply(msg.active)
                else:
                    self.status.heartbeats += 1
                    self._changed("heartbeat")
                self.synced()
        except grpc.RpcError as e:
            if not self._stop.is_set():
                code = e.code() if isinstance(e, grpc.Call) else None
                details = e.details() if isinstance(e, grpc.Call) else str(e)
                error = self.status.error = f"policy stream lost: {code}: {details}"
        finally:
            if watchdog is not None:
                watchdog.cancel()
            channel.close()
        if self._stop.is_set():
            raise _StreamLost("stopped")
        self.status.connected = False
        self.status.reconnects += 1
        if self.feeds is not None:
            self.feeds.failed("bundle", error, "the active state (WatchActive)")
        self._changed("disconnected")
        if not delivered:
            raise _StreamLost(error)
        log.warning("%s; reconnecting", error)
