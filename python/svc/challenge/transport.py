"""The gRPC face of the challenge service: ``svc.challenge.v1.ChallengeService`` via connectrpc.

Only translation lives here (docs/architecture.md#code-layout-and-conventions): protobuf messages
to ``ChallengeService`` calls and back, ``ChallengeError`` to a gRPC status with a
``google.rpc.BadRequest`` of field violations, and the two watch streams. The service's blocking
calls run in worker threads, never on the event loop. Callers are checked as in the policy
service (``svc.common.connect.BearerInterceptor``, docs/auth.md).

As for the policy service, the endpoints are made from the service's descriptor
(``svc.common.connect.endpoints``); a method without a handler is an error at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Gauge

from svc.challenge.service import (
    ChallengeError,
    ChallengeInfo,
    ChallengeService,
    Containment,
    Ref,
    SecurityKey,
    Violation,
)
from svc.challenge.v1 import challenge_pb2 as pb
from svc.common.auth import Verifier, author_of, person_of
from svc.common.connect import ServiceApp, ServiceHandlers, status_error, timestamp

__all__ = [
    "SERVICE_NAME",
    "ChallengeConnectApp",
    "ChallengeMetrics",
    "challenge_message",
    "state_name",
]

log = logging.getLogger("svc.challenge")

SERVICE_NAME = "svc.challenge.v1.ChallengeService"

_STATES: dict[str, Any] = {
    "pending": pb.CHALLENGE_STATE_PENDING,
    "passed": pb.CHALLENGE_STATE_PASSED,
    "rejected": pb.CHALLENGE_STATE_REJECTED,
    "expired": pb.CHALLENGE_STATE_EXPIRED,
}


def state_name(value: int) -> str:
    """A ``ChallengeState`` value as ``pending``/``passed``/... (``""`` for unspecified)."""
    return {v: k for k, v in _STATES.items()}.get(value, "")


def _ref(ref: Ref | None) -> pb.EntityRef | None:
    return pb.EntityRef(type=ref.type, id=ref.id) if ref is not None else None


def _in_ref(msg: Any, has: bool) -> Ref | None:
    """A request's EntityRef as a ``Ref``; None when the field is unset."""
    return Ref(msg.type, msg.id) if has else None


def _required_ref(req: Any, name: str) -> Ref:
    """A required EntityRef field (unset reads as empty type and id, which validation names)."""
    msg = getattr(req, name)
    return Ref(msg.type, msg.id)


def challenge_message(c: ChallengeInfo) -> pb.Challenge:
    """A ``ChallengeInfo`` as the ``Challenge`` message."""
    return pb.Challenge(
        qid=c.qid,
        state=_STATES[c.state],
        principal=_ref(c.principal),
        on_behalf_of=_ref(c.on_behalf_of),
        action=c.action,
        resource=_ref(c.resource),
        kinds=c.kinds,
        satisfied=c.satisfied,
        fingerprint=c.fingerprint,
        decision_qid=c.decision_qid,
        last_decision_qid=c.last_decision_qid,
        person=c.person,
        approver=c.approver,
        created_at=timestamp(c.created_at),
        expires_at=timestamp(c.expires_at),
        grant_expires_at=timestamp(c.grant_expires_at),
        decided_at=timestamp(c.decided_at),
        decided_by=c.decided_by,
        justification=c.justification,
        reason=c.reason,
    )


def _containment(c: Containment) -> pb.Containment:
    return pb.Containment(
        principal=_ref(c.principal),
        reason=c.reason,
        author=c.author,
        contained_at=timestamp(c.contained_at),
    )


def _key(k: SecurityKey) -> pb.SecurityKey:
    return pb.SecurityKey(
        credential_id=k.credential_id,
        person=k.person,
        name=k.name,
        sign_count=k.sign_count,
        created_at=timestamp(k.created_at),
        last_used_at=timestamp(k.last_used_at),
    )


class ChallengeMetrics:
    """The service's Prometheus metrics (docs/challenges.md#metrics), on a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "svc_challenge_calls",
            "gRPC calls answered, by method and status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.watchers = Gauge(
            "svc_challenge_watchers",
            "Open watch streams, by kind",
            ["stream"],
            registry=self.registry,
        )
        self.contained = Gauge(
            "svc_challenge_contained",
            "Principals contained, as last read by a list or a containment watch",
            registry=self.registry,
        )


class _Handlers(ServiceHandlers):
    """One coroutine per method of the proto, each calling ``ChallengeService`` in a thread."""

    def __init__(self, service: ChallengeService, metrics: ChallengeMetrics) -> None:
        super().__init__(metrics.calls)
        self.service = service
        self.metrics = metrics

    async def Resolve(self, req: pb.ResolveRequest) -> pb.ResolveResponse:
        info, created, granted = await self._call(
            "Resolve",
            lambda: self.service.resolve(
                _required_ref(req, "principal"),
                _in_ref(req.on_behalf_of, req.HasField("on_behalf_of")),
                req.action,
                _required_ref(req, "resource"),
                list(req.challenges),
                req.decision_qid,
                req.approver,
            ),
        )
        return pb.ResolveResponse(
            challenge=challenge_message(info), created=created, granted=granted
        )

    async def GetChallenge(self, req: pb.GetChallengeRequest) -> pb.GetChallengeResponse:
        info = await self._call(
            "GetChallenge",
            lambda: self.service.get_challenge(
                req.qid,
                _required_ref(req, "principal"),
                _in_ref(req.on_behalf_of, req.HasField("on_behalf_of")),
            ),
        )
        return pb.GetChallengeResponse(challenge=challenge_message(info))

    async def ListChallenges(self, req: pb.ListChallengesRequest) -> pb.ListChallengesResponse:
        state = state_name(req.state) if req.state else ""
        if req.state and not state:
            raise status_error(
                ChallengeError(
                    "invalid_argument", "bad state", [Violation("state", f"#{req.state}")]
                )
            )
        infos = await self._call(
            "ListChallenges",
            lambda: self.service.list_challenges(
                _in_ref(req.principal, req.HasField("principal")), req.person, state, req.limit
            ),
        )
        return pb.ListChallengesResponse(challenges=[challenge_message(i) for i in infos])

    async def Justify(self, req: pb.JustifyRequest) -> pb.JustifyResponse:
        info = await self._call(
            "Justify", lambda: self.service.justify(req.qid, person_of(req.person), req.text)
        )
        return pb.JustifyResponse(challenge=challenge_message(info))

    async def Decide(self, req: pb.DecideRequest) -> pb.DecideResponse:
        info = await self._call(
            "Decide",
            lambda: self.service.decide(req.qid, person_of(req.approver), req.approve, req.reason),
        )
        return pb.DecideResponse(challenge=challenge_message(info))

    async def Contain(self, req: pb.ContainRequest) -> pb.ContainResponse:
        c, changed = await self._call(
            "Contain",
            lambda: self.service.contain(
                _required_ref(req, "principal"), req.reason, author_of(req.author)
            ),
        )
        return pb.ContainResponse(containment=_containment(c), changed=changed)

    async def Lift(self, req: pb.LiftRequest) -> pb.LiftResponse:
        changed = await self._call(
            "Lift",
            lambda: self.service.lift(
                _required_ref(req, "principal"), req.reason, author_of(req.author)
            ),
        )
        return pb.LiftResponse(changed=changed)

    async def ListContainments(
        self, req: pb.ListContainmentsRequest
    ) -> pb.ListContainmentsResponse:
        cs = await self._call("ListContainments", self.service.containments)
        self.metrics.contained.set(len(cs))
        return pb.ListContainmentsResponse(containments=[_containment(c) for c in cs])

    async def ListSecurityKeys(
        self, req: pb.ListSecurityKeysRequest
    ) -> pb.ListSecurityKeysResponse:
        keys = await self._call(
            "ListSecurityKeys", lambda: self.service.list_security_keys(req.person)
        )
        return pb.ListSecurityKeysResponse(keys=[_key(k) for k in keys])

    async def BeginKeyRegistration(
        self, req: pb.BeginKeyRegistrationRequest
    ) -> pb.BeginKeyRegistrationResponse:
        ceremony, options = await self._call(
            "BeginKeyRegistration",
            lambda: self.service.begin_key_registration(req.person, req.name),
        )
        return pb.BeginKeyRegistrationResponse(ceremony_id=ceremony, options_json=options)

    async def FinishKeyRegistration(
        self, req: pb.FinishKeyRegistrationRequest
    ) -> pb.FinishKeyRegistrationResponse:
        key, replaced = await self._call(
            "FinishKeyRegistration",
            lambda: self.service.finish_key_registration(
                req.ceremony_id, req.person, req.credential_json, req.assertion_json
            ),
        )
        return pb.FinishKeyRegistrationResponse(key=_key(key), replaced_credential_id=replaced)

    async def BeginKeyChange(self, req: pb.BeginKeyChangeRequest) -> pb.BeginKeyChangeResponse:
        change = await self._call(
            "BeginKeyChange",
            lambda: self.service.begin_key_change(req.person, req.credential_id, req.name),
        )
        return pb.BeginKeyChangeResponse(
            ceremony_id=change.ceremony_id,
            assertion_options_json=change.assertion_options_json,
            options_json=change.options_json,
        )

    async def RemoveSecurityKey(
        self, req: pb.RemoveSecurityKeyRequest
    ) -> pb.RemoveSecurityKeyResponse:
        await self._call(
            "RemoveSecurityKey",
            lambda: self.service.remove_security_key(req.person, req.credential_id),
        )
        return pb.RemoveSecurityKeyResponse()

    async def ResetSecurityKey(
        self, req: pb.ResetSecurityKeyRequest
    ) -> pb.ResetSecurityKeyResponse:
        removed = await self._call(
            "ResetSecurityKey",
            lambda: self.service.reset_security_key(req.person, req.reason, author_of(req.author)),
        )
        return pb.ResetSecurityKeyResponse(removed=removed)

    async def BeginVerification(
        self, req: pb.BeginVerificationRequest
    ) -> pb.BeginVerificationResponse:
        ceremony, options = await self._call(
            "BeginVerification", lambda: self.service.begin_verification(req.qid, req.person)
        )
        return pb.BeginVerificationResponse(ceremony_id=ceremony, options_json=options)

    async def FinishVerification(
        self, req: pb.FinishVerificationRequest
    ) -> pb.FinishVerificationResponse:
        info = await self._call(
            "FinishVerification",
            lambda: self.service.finish_verification(
                req.ceremony_id, req.person, req.credential_json
            ),
        )
        return pb.FinishVerificationResponse(challenge=challenge_message(info))

    # -- streams

    async def _watch(
        self,
        name: str,
        read: Callable[[], Any],
        emit: Callable[[Any, Any], list[Any]],
        heartbeat: Callable[[Any], Any],
    ) -> AsyncIterator[Any]:
        """The loop both watches share: read, send what changed, heartbeat, wait.

        ``read`` (in a worker thread) returns the current view; ``emit(previous, current)`` the
        messages that tell the change (``previous`` is None on the first read); ``heartbeat``
        the heartbeat message of a view. Wakes on the service's change callbacks and every
        ``watch_poll_secs`` (changes through other replicas).
        """
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        settings = self.service.settings

        def wake() -> None:
            loop.call_soon_threadsafe(changed.set)

        unsubscribe = self.service.subscribe(wake)
        self.metrics.watchers.labels(name).inc()
        self.metrics.calls.labels(name, "ok").inc()
        try:
            previous = None
            next_beat = loop.time() + settings.heartbeat_secs
            while True:
                changed.clear()
                current = await anyio.to_thread.run_sync(read)
                out = emit(previous, current)
                previous = current
                for msg in out:
                    yield msg
                if out:
                    next_beat = loop.time() + settings.heartbeat_secs
                elif loop.time() >= next_beat:
                    yield heartbeat(current)
                    next_beat = loop.time() + settings.heartbeat_secs
                wait = max(0.0, min(settings.watch_poll_secs, next_beat - loop.time()))
                try:
                    await asyncio.wait_for(changed.wait(), wait)
                except TimeoutError:
                    pass
        finally:
            unsubscribe()
            self.metrics.watchers.labels(name).dec()

    async def WatchChallenges(
        self, req: pb.WatchChallengesRequest
    ) -> AsyncIterator[pb.WatchChallengesResponse]:
        """The matching challenges, then each change, with heartbeats (docs/challenges.md)."""
        service = self.service
        if bool(req.qid) + bool(req.person) + bool(req.everyone) != 1:
            raise status_error(
                ChallengeError(
                    "invalid_argument",
                    "name either `qid` (with `principal`), `person` or `everyone`",
                    [Violation("qid", "give one of qid, person and everyone")],
                )
            )
        if req.everyone:

            def read() -> dict[str, ChallengeInfo]:
                return {c.qid: c for c in service.list_challenges(limit=1000)}

        elif req.qid:
            principal = _required_ref(req, "principal")
            obo = _in_ref(req.on_behalf_of, req.HasField("on_behalf_of"))

            def read() -> dict[str, ChallengeInfo]:
                c = service.get_challenge(req.qid, principal, obo)
                return {c.qid: c}

        else:
            person = req.person

            def read() -> dict[str, ChallengeInfo]:
                return {c.qid: c for c in service.list_challenges(person=person, limit=1000)}

        try:
            first = await anyio.to_thread.run_sync(read)
        except ChallengeError as e:
            self.metrics.calls.labels("WatchChallenges", e.code).inc()
            raise status_error(e) from None

        def emit(
            prev: dict[str, ChallengeInfo] | None, cur: dict[str, ChallengeInfo]
        ) -> list[pb.WatchChallengesResponse]:
            out = []
            for qid, c in sorted(cur.items()):
                old = prev.get(qid) if prev is not None else None
                if prev is None or old is None or (old.version, old.state) != (c.version, c.state):
                    out.append(pb.WatchChallengesResponse(challenge=challenge_message(c)))
            return out

        def beat(cur: dict[str, ChallengeInfo]) -> pb.WatchChallengesResponse:
            return pb.WatchChallengesResponse(
                heartbeat=pb.Heartbeat(at=timestamp(datetime.now(UTC)), count=len(cur))
            )

        reads = iter([first])

        def read_next() -> dict[str, ChallengeInfo]:
            return next(reads, None) or read()

        async for msg in self._watch("WatchChallenges", read_next, emit, beat):
            yield msg

    async def WatchContainments(
        self, req: pb.WatchContainmentsRequest
    ) -> AsyncIterator[pb.WatchContainmentsResponse]:
        """The whole list, then each change, with heartbeats (docs/challenges.md)."""
        metrics = self.metrics

        def read() -> dict[tuple[str, str], Containment]:
            return {(c.principal.type, c.principal.id): c for c in self.service.containments()}

        def emit(
            prev: dict[tuple[str, str], Containment] | None,
            cur: dict[tuple[str, str], Containment],
        ) -> list[pb.WatchContainmentsResponse]:
            metrics.contained.set(len(cur))
            if prev is None:
                listed = pb.ContainmentList(containments=[_containment(c) for c in cur.values()])
                return [pb.WatchContainmentsResponse(list=listed)]
            out = []
            for k in sorted(prev.keys() - cur.keys()):
                lifted = pb.Containment(principal=pb.EntityRef(type=k[0], id=k[1]))
                out.append(
                    pb.WatchContainmentsResponse(
                        change=pb.ContainmentChange(contained=False, containment=lifted)
                    )
                )
            for k in sorted(cur.keys() - prev.keys()):
                out.append(
                    pb.WatchContainmentsResponse(
                        change=pb.ContainmentChange(
                            contained=True, containment=_containment(cur[k])
                        )
                    )
                )
            return out

        def beat(cur: dict[tuple[str, str], Containment]) -> pb.WatchContainmentsResponse:
            return pb.WatchContainmentsResponse(
                heartbeat=pb.Heartbeat(at=timestamp(datetime.now(UTC)), count=len(cur))
            )

        async for msg in self._watch("WatchContainments", read, emit, beat):
            yield msg


class ChallengeConnectApp(ServiceApp[_Handlers]):
    """The ASGI app serving ``svc.challenge.v1.ChallengeService`` (gRPC, gRPC-Web, Connect).

    Args:
        service: the service layer.
        metrics: where calls and watchers are counted.
        verifier: checks every call's bearer token (``BearerInterceptor``); None admits every
            caller (a loopback bind only, ``svc.challenge.app.serve``).
        max_message_bytes: largest request message (1 MiB by default).

    """

    def __init__(
        self,
        service: ChallengeService,
        metrics: ChallengeMetrics,
        verifier: Verifier | None = None,
        max_message_bytes: int = 1024 * 1024,
    ) -> None:
        super().__init__(_Handlers(service, metrics), pb, SERVICE_NAME, max_message_bytes, verifier)
