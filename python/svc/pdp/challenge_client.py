"""A decision point's client of the challenge service (docs/challenges.md#the-decision-point).

``ChallengeClient`` is the listener's challenge source (``Server.set_challenge_source``):

* **Resolve.** On a ``challenge`` verdict in enforce mode the listener calls ``resolve`` with
  the request's fingerprint fields and the decision's qid; it calls
  ``svc.challenge.v1.ChallengeService/Resolve`` and answers the challenge. The listener turns
  a passed challenge (grant live) into ``allow`` and a rejected one into ``deny``
  (``crates/pdp_server/src/challenges.rs``).
* **Get.** A wait for a challenge the listener does not hold yet (another decision point
  resolved it, or this one restarted) asks ``GetChallenge`` once, as the waiting principal and
  on_behalf_of: the service answers ``NOT_FOUND`` for anyone else, and so does the wait.
* **Follow.** When the first wait of a pending challenge starts, the listener asks to follow
  it: one thread of this client runs an asyncio loop holding a ``WatchChallenges`` stream per
  followed challenge (grpc.aio), and pushes every change into the listener
  (``Server.challenge_changed``), which wakes that challenge's waits. A stream ends when its
  challenge is final or past ``expires_at``; a stream that breaks is opened again: at once
  when it had delivered the challenge, else after the shared reconnect policy's delay
  (``svc.common.retry.Reconnect``: full jitter under a ceiling that doubles from
  ``backoff_secs`` up to ``max_backoff_secs``, one log line per failure). The waits themselves are
  futures in the listener, never threads. (``WatchChallenges`` follows one challenge or one
  person's; a stream of every challenge would let one stream serve the whole decision point.)

Calls carry ``authorization: Bearer <token>`` when ``token`` returns one (docs/auth.md,
audience ``svc-challenge``). ``follow_challenges`` makes the client, starts its thread and
installs it on the listener.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

import grpc
import grpc.aio

from svc._pdp_core import Server
from svc.challenge.v1 import challenge_pb2 as pb
from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc
from svc.common.retry import Reconnect

__all__ = [
    "ChallengeClient",
    "ChallengeSource",
    "ChallengeTuple",
    "challenge_tuple",
    "follow_challenges",
]

log = logging.getLogger("svc.pdp.challenge")

#: A challenge as the listener takes it: ``(qid, state, expires_at_ms, grant_expires_at_ms,
#: pending kinds)``; times are epoch milliseconds or None.
ChallengeTuple = tuple[str, str, int | None, int | None, list[str]]

#: An entity reference as the listener passes it: ``(type, id)``.
Pair = tuple[str, str]


class _WatchBroke(Exception):
    """A challenge's stream that broke before it delivered the challenge; says how."""


class ChallengeSource(Protocol):
    """What ``Server.set_challenge_source`` takes (``ChallengeClient`` is one)."""

    def resolve(
        self,
        principal: Pair,
        on_behalf_of: Pair | None,
        action: str,
        resource: Pair,
        challenges: Sequence[str],
        decision_qid: str,
    ) -> ChallengeTuple:
        """Opens or finds the challenge of a request's fingerprint."""
        ...

    def get(self, qid: str, principal: Pair, on_behalf_of: Pair | None) -> ChallengeTuple | None:
        """One challenge for its principal and on_behalf_of; None when unknown to them."""
        ...

    def follow(self, qid: str, principal: Pair, on_behalf_of: Pair | None) -> None:
        """Starts pushing the challenge's changes (returns at once)."""
        ...


_STATES = {
    pb.CHALLENGE_STATE_PENDING: "pending",
    pb.CHALLENGE_STATE_PASSED: "passed",
    pb.CHALLENGE_STATE_REJECTED: "rejected",
    pb.CHALLENGE_STATE_EXPIRED: "expired",
}


def _target(url: str) -> str:
    """``host:port`` of ``http://host:port`` (or of ``host:port`` itself)."""
    return re.sub(r"^https?://", "", url).rstrip("/")


def _ref(pair: Pair | None) -> pb.EntityRef | None:
    return pb.EntityRef(type=pair[0], id=pair[1]) if pair is not None else None


def challenge_tuple(c: pb.Challenge) -> ChallengeTuple:
    """A ``Challenge`` message as the listener's tuple (``ChallengeTuple``).

    Raises:
        ValueError: the state is unspecified (a service that does not follow the proto).

    """
    state = _STATES.get(c.state)
    if state is None:
        raise ValueError(f"challenge {c.qid} has no state")
    expires = c.expires_at.ToMilliseconds() if c.HasField("expires_at") else None
    grant = c.grant_expires_at.ToMilliseconds() if c.HasField("grant_expires_at") else None
    pending = sorted(set(c.kinds) - set(c.satisfied))
    return (c.qid, state, expires, grant, pending)


class ChallengeClient:
    """The challenge service as the listener's challenge source (module docs).

    Args:
        server: the running listener whose waits the followed challenges wake.
        url: the challenge service (``http://host:port`` or ``host:port``, plaintext gRPC).
        token: returns the bearer token for each call (audience ``svc-challenge``); None or an
            empty answer sends none.
        timeout_secs: deadline of one ``Resolve`` or ``GetChallenge`` (the listener has its
            own, ``Server.set_challenge_source(timeout_ms=...)``).
        backoff_secs: the longest first delay before a stream that broke before delivering
            the challenge is opened again, seconds; the ceiling doubles per failure.
        max_backoff_secs: the largest such ceiling, seconds.

    ``start()`` starts the follow thread; ``stop()`` ends every stream and the thread.

    """

    def __init__(
        self,
        server: Server,
        url: str,
        token: Callable[[], str | None] | None = None,
        *,
        timeout_secs: float = 5.0,
        backoff_secs: float = 0.2,
        max_backoff_secs: float = 5.0,
    ) -> None:
        self.server = server
        self.target = _target(url)
        self.token = token
        self.timeout_secs = timeout_secs
        self.backoff_secs = backoff_secs
        self.max_backoff_secs = max_backoff_secs
        self._channel = grpc.insecure_channel(self.target)
        self._stub = pb_grpc.ChallengeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._loop = asyncio.new_event_loop()
        self._following: dict[str, asyncio.Task[None]] = {}
        self._aio: grpc.aio.Channel | None = None
        self._thread = threading.Thread(target=self._run, name="svc-challenge-follow", daemon=True)
        self.pushed = 0
        """Changes pushed into the listener so far."""

    def _metadata(self) -> list[tuple[str, str]]:
        t = self.token() if self.token is not None else None
        return [("authorization", f"Bearer {t}")] if t else []

    # -- the listener's source

    def resolve(
        self,
        principal: Pair,
        on_behalf_of: Pair | None,
        action: str,
        resource: Pair,
        challenges: Sequence[str],
        decision_qid: str,
    ) -> ChallengeTuple:
        """``Resolve`` of a request's fingerprint (docs/challenges.md#fingerprint).

        Returns:
            The challenge opened or found (``ChallengeTuple``).

        Raises:
            grpc.RpcError: the service refused or did not answer (the listener counts it and
                answers the verdict without a qid).

        """
        req = pb.ResolveRequest(
            principal=_ref(principal),
            on_behalf_of=_ref(on_behalf_of),
            action=action,
            resource=_ref(resource),
            challenges=list(challenges),
            decision_qid=decision_qid,
        )
        resp = self._stub.Resolve(req, timeout=self.timeout_secs, metadata=self._metadata())
        return challenge_tuple(resp.challenge)

    def get(self, qid: str, principal: Pair, on_behalf_of: Pair | None) -> ChallengeTuple | None:
        """``GetChallenge`` as `principal` acting for `on_behalf_of`.

        Returns:
            The challenge, or None when the service answers ``NOT_FOUND`` (unknown qid, or
            not theirs).

        Raises:
            grpc.RpcError: any other failure (the wait answers 503).

        """
        req = pb.GetChallengeRequest(
            qid=qid, principal=_ref(principal), on_behalf_of=_ref(on_behalf_of)
        )
        try:
            resp = self._stub.GetChallenge(
                req, timeout=self.timeout_secs, metadata=self._metadata()
            )
        except grpc.RpcError as e:
            if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return challenge_tuple(resp.challenge)

    def follow(self, qid: str, principal: Pair, on_behalf_of: Pair | None) -> None:
        """Starts following challenge `qid` (returns at once; see the module docs)."""
        self._loop.call_soon_threadsafe(self._start_follow, qid, principal, on_behalf_of)

    # -- the follow thread

    @property
    def following(self) -> int:
        """How many challenges are followed now."""
        return len(self._following)

    def _start_follow(self, qid: str, principal: Pair, on_behalf_of: Pair | None) -> None:
        if qid in self._following:
            return
        task = self._loop.create_task(self._follow(qid, principal, on_behalf_of))
        self._following[qid] = task
        task.add_done_callback(lambda _: self._following.pop(qid, None))

    async def _follow(self, qid: str, principal: Pair, on_behalf_of: Pair | None) -> None:
        """Pushes `qid`'s changes until it is final, past expiry, or unknown.

        Each stream is one attempt of ``svc.common.retry.Reconnect`` (``forever_async``): a
        stream that delivered the challenge and broke is opened again at once, one that broke
        before is waited for; ``done`` ends the attempts, ``stop`` cancels this task.
        """
        assert self._aio is not None
        stub = pb_grpc.ChallengeServiceStub(self._aio)  # type: ignore[no-untyped-call]
        req = pb.WatchChallengesRequest(
            qid=qid, principal=_ref(principal), on_behalf_of=_ref(on_behalf_of)
        )
        expires: int | None = None
        done = asyncio.Event()

        def over() -> bool:
            """Past the challenge's expiry (then nothing more changes it): ``done`` is set."""
            if expires is not None and time.time() * 1000 >= expires:
                done.set()
            return done.is_set()

        async def watch() -> None:
            nonlocal expires
            if over():
                raise _WatchBroke("expired")
            delivered = False
            try:
                async for msg in stub.WatchChallenges(req, metadata=self._metadata()):
                    if msg.HasField("challenge"):
                        c = challenge_tuple(msg.challenge)
                        self.server.challenge_changed(*c)
                        self.pushed += 1
                        expires = c[2]
                        delivered = True
                        if c[1] != "pending":
                            done.set()
                            return
                    if over():
                        return
                error = f"watch of challenge {qid} ended"
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    done.set()
                    return
                error = f"watch of challenge {qid} broke ({e.code()}: {e.details()})"
            except ValueError as e:
                log.error("challenge %s: %s", qid, e)
                done.set()
                return
            if over():
                return
            if not delivered:
                raise _WatchBroke(error)
            log.warning("challenge service: %s; reconnecting", error)

        reconnect = Reconnect(
            "challenge service",
            log,
            initial_secs=self.backoff_secs,
            max_secs=self.max_backoff_secs,
            retry_on=_WatchBroke,
        )
        await reconnect.forever_async(watch, done)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._aio = grpc.aio.insecure_channel(self.target)
        try:
            self._loop.run_forever()
        finally:
            for t in list(self._following.values()):
                t.cancel()
            self._loop.run_until_complete(self._aio.close())
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    def start(self) -> ChallengeClient:
        """Starts the follow thread; returns self."""
        ready: Future[None] = Future()
        self._loop.call_soon_threadsafe(ready.set_result, None)
        self._thread.start()
        ready.result(timeout=10)
        return self

    def stop(self) -> None:
        """Ends every stream and the thread (waits for it), then closes the channel."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._channel.close()


def follow_challenges(
    server: Server,
    url: str,
    token: Callable[[], str | None] | None = None,
    *,
    timeout_ms: int = 2_000,
) -> ChallengeClient:
    """Connects a running listener to the challenge service at `url` (``svc pdp --challenge``).

    Args:
        server: the running listener.
        url: the challenge service (``http://host:port``).
        token: the bearer token for each call (audience ``svc-challenge``), or None.
        timeout_ms: how long a check waits for ``Resolve`` (and a wait for ``GetChallenge``);
            past it the verdict stays ``challenge`` without a qid.

    Returns:
        The started client, installed with ``Server.set_challenge_source``; ``stop()`` it
        after removing it (``set_challenge_source(None)``).

    """
    client = ChallengeClient(
        server, url, token, timeout_secs=max(timeout_ms / 1000, 0.001) + 1.0
    ).start()
    server.set_challenge_source(client, timeout_ms=timeout_ms)
    return client
