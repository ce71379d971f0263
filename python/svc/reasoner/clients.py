"""The reasoner's clients of the context, challenge and policy services (docs/reasoner.md).

Each takes a base URL, a callable giving the bearer token of the next call (a token file read
at each call, or ``svc up``'s local issuer), and a timeout. A failure of any kind (the service
unreachable, an answer other than the documented one) raises ``Unavailable`` naming the service
and the call, so a cycle fails cleanly before it writes anything
(docs/reasoner.md#failures).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import grpc
import httpx

__all__ = [
    "ChallengeClient",
    "Containment",
    "ContextClient",
    "PolicyClient",
    "TokenSource",
    "Unavailable",
]

#: Returns the bearer token of the next call, or None to send none.
TokenSource = Callable[[], str | None]


class Unavailable(Exception):
    """A service the cycle needs did not answer as documented.

    Attributes:
        service: ``history``, ``context``, ``challenge``, ``policy`` or ``model``.

    """

    def __init__(self, service: str, what: str) -> None:
        super().__init__(f"{service}: {what}")
        self.service = service


def _none() -> str | None:
    return None


class ContextClient:
    """The context service's ``/v1`` routes the reasoner uses (docs/context.md).

    Args:
        url: ``http://host:port``.
        token: the bearer token source (audience ``svc-context``).
        timeout: seconds per request.

    """

    def __init__(self, url: str, token: TokenSource = _none, timeout: float = 30.0) -> None:
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self._token = token

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        t = self._token()
        headers = {"Authorization": f"Bearer {t}"} if t else {}
        try:
            r = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as e:
            raise Unavailable("context", f"{method} {path}: {type(e).__name__}: {e}") from e
        if r.status_code >= 300:
            raise Unavailable("context", f"{method} {path}: {r.status_code} {r.text[:500]}")
        try:
            return r.json()
        except ValueError as e:
            raise Unavailable("context", f"{method} {path}: not JSON") from e

    def principals(self) -> dict[str, Any]:
        """``GET /v1/principals``: the snapshot (peers come from it)."""
        return dict(self._call("GET", "/v1/principals"))

    def risk_scores(self) -> list[dict[str, Any]]:
        """``GET /v1/risk``: every stored score with its factors."""
        return list(self._call("GET", "/v1/risk")["scores"])

    def put_risk_scores(self, scores: list[dict[str, Any]]) -> dict[str, Any]:
        """``POST /v1/risk``: one cycle's scores, all or nothing."""
        return dict(self._call("POST", "/v1/risk", json={"scores": scores}))

    def investigations(self, kind: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/investigations[?kind=]``, newest first."""
        params = {"kind": kind} if kind else {}
        return list(self._call("GET", "/v1/investigations", params=params)["investigations"])

    def open_investigation(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/investigations``."""
        return dict(self._call("POST", "/v1/investigations", json=body))

    def close_investigation(self, inv_id: str, closed_by: str, resolution: str) -> dict[str, Any]:
        """``POST /v1/investigations/{id}/close``."""
        body = {"closed_by": closed_by, "resolution": resolution}
        return dict(self._call("POST", f"/v1/investigations/{inv_id}/close", json=body))

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()


def _target(url: str) -> str:
    return re.sub(r"^https?://", "", url).rstrip("/")


def _metadata(token: TokenSource) -> list[tuple[str, str]]:
    t = token()
    return [("authorization", f"Bearer {t}")] if t else []


class Containment:
    """One containment: ``principal`` ``(type, id)``, ``reason``, ``author``, ``since``."""

    __slots__ = ("author", "principal", "reason", "since")

    def __init__(
        self, principal: tuple[str, str], reason: str, author: str, since: datetime | None
    ) -> None:
        self.principal = principal
        self.reason = reason
        self.author = author
        self.since = since


class ChallengeClient:
    """The challenge service's ``ListContainments`` and ``Contain`` (docs/challenges.md).

    Args:
        url: ``http://host:port`` (gRPC over h2c).
        token: the bearer token source (audience ``svc-challenge``).
        timeout: seconds per call.

    """

    def __init__(self, url: str, token: TokenSource = _none, timeout: float = 30.0) -> None:
        from svc.challenge.v1 import challenge_pb2 as pb
        from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc

        self._pb = pb
        self._channel = grpc.insecure_channel(_target(url))
        self._stub = pb_grpc.ChallengeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._token = token
        self._timeout = timeout

    def containments(self) -> dict[tuple[str, str], Containment]:
        """Who is contained now, by ``(type, id)``."""
        try:
            r = self._stub.ListContainments(
                self._pb.ListContainmentsRequest(),
                metadata=_metadata(self._token),
                timeout=self._timeout,
            )
        except grpc.RpcError as e:
            raise Unavailable("challenge", f"ListContainments: {_rpc(e)}") from e
        out = {}
        for c in r.containments:
            key = (c.principal.type, c.principal.id)
            since = c.contained_at.ToDatetime() if c.HasField("contained_at") else None
            out[key] = Containment(key, c.reason, c.author, since)
        return out

    def contain(self, principal: tuple[str, str], reason: str, author: str) -> bool:
        """``Contain``; returns whether the principal was newly contained."""
        try:
            r = self._stub.Contain(
                self._pb.ContainRequest(
                    principal=self._pb.EntityRef(type=principal[0], id=principal[1]),
                    reason=reason,
                    author=author,
                ),
                metadata=_metadata(self._token),
                timeout=self._timeout,
            )
        except grpc.RpcError as e:
            raise Unavailable("challenge", f"Contain: {_rpc(e)}") from e
        return bool(r.changed)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()


class PolicyClient:
    """The policy service's ``GetEnforcement`` (docs/policy.md#modes).

    Args:
        url: ``http://host:port`` (gRPC over h2c).
        token: the bearer token source (audience ``svc-policy``).
        timeout: seconds per call.

    """

    def __init__(self, url: str, token: TokenSource = _none, timeout: float = 30.0) -> None:
        from svc.policy.v1 import policy_pb2 as pb
        from svc.policy.v1 import policy_pb2_grpc as pb_grpc

        self._pb = pb
        self._channel = grpc.insecure_channel(_target(url))
        self._stub = pb_grpc.PolicyServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._token = token
        self._timeout = timeout

    def containment_mode(self) -> str:
        """``enforce`` or ``monitor``: the mode for automated containments."""
        try:
            r = self._stub.GetEnforcement(
                self._pb.GetEnforcementRequest(),
                metadata=_metadata(self._token),
                timeout=self._timeout,
            )
        except grpc.RpcError as e:
            raise Unavailable("policy", f"GetEnforcement: {_rpc(e)}") from e
        mode = r.enforcement.containment_mode
        if mode == self._pb.MODE_MONITOR:
            return "monitor"
        if mode == self._pb.MODE_ENFORCE:
            return "enforce"
        raise Unavailable("policy", f"GetEnforcement: containment mode {mode} unknown")

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()


def _rpc(e: grpc.RpcError) -> str:
    if isinstance(e, grpc.Call):
        return f"{e.code().name}: {e.details()}"
    return str(e)
