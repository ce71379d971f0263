"""Typed clients of the services the portal calls (docs/portal.md#what-it-calls).

The portal holds no state: every answer comes from another service's API.

* ``PdpClient``: the decision point's HTTP decision API (``POST /v1/access/evaluation``,
  docs/api.md#http-routes) and AuthZEN searches (``/access/v1/search/...``, docs/search.md);
* ``ContextClient``: the context service's ``/v1`` routes (docs/context.md): service accounts,
  the directory, trusted apps, investigations;
* ``ChallengeClient``, ``PolicyClient``: the challenge and policy services' gRPC APIs
  (docs/challenges.md, docs/policy.md), through grpcio stubs;
* ``HistoryClient``: the history's read-only routes (docs/history.md#http-routes).

Each call carries ``Authorization: Bearer <token>`` when its token function returns one (a
token file read at each call: docs/auth.md). A service that does not connect, times out or
answers 5xx raises ``Unavailable``; a 4xx answer raises ``Refused`` with the service's RFC 9457
body, which the service layer turns into the portal's own answer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import grpc
import httpx
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from svc.challenge.v1 import challenge_pb2 as cpb
from svc.challenge.v1 import challenge_pb2_grpc as cpb_grpc
from svc.policy.v1 import policy_pb2 as ppb
from svc.policy.v1 import policy_pb2_grpc as ppb_grpc

__all__ = [
    "ChallengeClient",
    "ContextClient",
    "HistoryClient",
    "PdpClient",
    "PolicyClient",
    "Refused",
    "TokenFn",
    "Unavailable",
    "grpc_target",
    "token_reader",
]

#: The header (gRPC metadata entry) naming who the portal acts for (docs/auth.md#who-made-a-change;
#: ``svc.common.auth.PERSON_HEADER``), percent-encoded UTF-8.
ACTING_FOR = "svc-acting-for"


def _acting_for(request: Any) -> str:
    """The person a gRPC request of the portal is made for: its ``author`` or ``approver``."""
    fields = request.DESCRIPTOR.fields_by_name
    for name in ("author", "approver"):
        if name in fields and getattr(request, name):
            return str(getattr(request, name))
    return ""


log = logging.getLogger("svc.portal.clients")

#: Returns the bearer token to send, or None for none.
TokenFn = Callable[[], str | None]


class Unavailable(Exception):
    """A service did not answer (connection, timeout, 5xx, an answer not JSON).

    Args:
        service: the service's name (``decision point``, ``context service``).
        detail: what happened, for the log (never shown to callers: the portal answers a
            503 naming the service only).

    """

    def __init__(self, service: str, detail: str) -> None:
        super().__init__(f"{service}: {detail}")
        self.service = service
        self.detail = detail


class Refused(Exception):
    """A service refused a request with a 4xx answer.

    Attributes:
        status: the HTTP status.
        body: the answer's JSON (an RFC 9457 problem for svc's services), or ``{}``.

    """

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('detail', '')}")
        self.status = status
        self.body = body


def token_reader(path: str | None, what: str) -> TokenFn:
    """A token function reading `path` at each call (a renewed token is picked up).

    Args:
        path: the token file, or None for no token.
        what: the service's name, for the log.

    Returns:
        A function answering the file's stripped text, or None when `path` is None, the file
        is empty or cannot be read (logged: the call then goes out without a token and the
        service answers 401).

    """

    def token() -> str | None:
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as e:
            log.error("cannot read the %s's token file %s: %s", what, path, e)
            return None

    return token


class _Http:
    """One service's JSON API over a pooled httpx client."""

    name = "service"

    def __init__(
        self,
        base_url: str,
        token: TokenFn = lambda: None,
        timeout_secs: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout_secs, transport=transport
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        acting_for: str | None = None,
    ) -> Any:
        """Sends one request and answers its JSON (None for a 204).

        `acting_for` names who the portal acts for (a person, or a trusted app registering its
        agents): the ``svc-acting-for`` header, which the service records as the change's
        author, ``<acting_for> via <the portal>`` (docs/auth.md#who-made-a-change).

        Raises:
            Unavailable: no connection, a timeout, a 5xx or an answer that is not JSON.
            Refused: a 4xx.

        """
        headers = {}
        token = self._token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        if acting_for:
            headers[ACTING_FOR] = quote(acting_for, safe="")
        try:
            r = self._client.request(method, path, json=json, params=params, headers=headers)
        except httpx.HTTPError as e:
            raise Unavailable(self.name, f"{method} {path}: {e!r}") from None
        if r.status_code >= 500:
            raise Unavailable(self.name, f"{method} {path}: {r.status_code} {r.text[:300]}")
        if r.status_code == 204:
            return None
        try:
            body = r.json()
        except ValueError:
            raise Unavailable(self.name, f"{method} {path}: not JSON: {r.text[:200]}") from None
        if r.status_code >= 400:
            raise Refused(r.status_code, body if isinstance(body, dict) else {})
        return body

    def ping(self, path: str = "/readyz") -> bool:
        """Whether the service answers ``path`` with 200 (no token: the probes take none)."""
        try:
            return self._client.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        """Closes the pooled connections."""
        self._client.close()


class PdpClient(_Http):
    """The decision point (module docs)."""

    name = "decision point"

    def evaluate(self, request: dict[str, Any]) -> dict[str, Any]:
        """One check: ``POST /v1/access/evaluation`` (docs/api.md#http-routes).

        Args:
            request: ``{principal, action, resource, context?, ...}`` (docs/decisions.md).

        Returns:
            ``{qid, verdict, challenges, policies, mode[, challenge_qid]}``.

        Raises:
            Unavailable: as ``request``.
            Refused: the decision point refused the request (a type or action its bundle does
                not declare, 400; the portal's token, 401/403).

        """
        out: dict[str, Any] = self.request("POST", "/v1/access/evaluation", json=request)
        return out

    def search(self, kind: str, request: dict[str, Any]) -> dict[str, Any]:
        """An AuthZEN search: ``POST /access/v1/search/{kind}`` (docs/search.md).

        Args:
            kind: ``subject``, ``resource`` or ``action``.
            request: the AuthZEN search request.

        Returns:
            ``{results, page: {next_token, count}, context}``.

        """
        out: dict[str, Any] = self.request("POST", f"/access/v1/search/{kind}", json=request)
        return out


class ContextClient(_Http):
    """The context service's ``/v1`` routes (module docs, docs/context.md)."""

    name = "context service"

    def trusted_apps(self) -> list[dict[str, Any]]:
        """``GET /v1/directory/trusted-apps``: ``[{name, iss, jwks_url, aud, created_at}]``."""
        out: list[dict[str, Any]] = self.request("GET", "/v1/directory/trusted-apps")[
            "trusted_apps"
        ]
        return out

    def put_trusted_app(self, app: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/directory/trusted-apps``: trusts (or changes) an app; answers its record."""
        out: dict[str, Any] = self.request("POST", "/v1/directory/trusted-apps", json=app)
        return out

    def delete_trusted_app(self, name: str) -> None:
        """``DELETE /v1/directory/trusted-apps/{name}``."""
        self.request("DELETE", f"/v1/directory/trusted-apps/{quote(name, safe='')}")

    def person(self, user_name: str) -> dict[str, Any] | None:
        """``GET /v1/directory/people/{user_name}``, or None when nobody has that name."""
        try:
            out: dict[str, Any] = self.request(
                "GET", f"/v1/directory/people/{quote(user_name, safe='')}"
            )
        except Refused as e:
            if e.status == 404:
                return None
            raise
        return out

    def people(self, include_removed: bool = False) -> list[dict[str, Any]]:
        """``GET /v1/directory/people``."""
        params = {"include_removed": "true"} if include_removed else None
        out: list[dict[str, Any]] = self.request("GET", "/v1/directory/people", params=params)[
            "people"
        ]
        return out

    def principals(self) -> dict[str, Any]:
        """``GET /v1/principals``: the snapshot ``{principals_version, principals}``."""
        out: dict[str, Any] = self.request("GET", "/v1/principals")
        return out

    def risk_scores(self, min_score: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """``GET /v1/risk``: the scores, highest first.

        Returns:
            ``[{principal, score, reason, factors, details, updated_at}]``.

        """
        params: dict[str, Any] = {"min_score": min_score}
        if limit is not None:
            params["limit"] = limit
        out: list[dict[str, Any]] = self.request("GET", "/v1/risk", params=params)["scores"]
        return out

    def risk_history(self, principal_type: str, principal_id: str, days: int) -> dict[str, Any]:
        """``GET /v1/risk-history/{type}/{id}?days=``: the score per UTC day, oldest first.

        Returns:
            ``{"principal", "days": [{"day", "score", "high", "published"}]}``
            (docs/context.md#risk-scores).

        """
        path = f"/v1/risk-history/{quote(principal_type, safe='')}/{quote(principal_id, safe='')}"
        out: dict[str, Any] = self.request("GET", path, params={"days": days})
        return out

    def investigations(
        self, status: str | None = None, kind: str | None = None
    ) -> list[dict[str, Any]]:
        """``GET /v1/investigations[?status=&kind=]``: newest first.

        `kind` is ``manual``, ``contain``, ``would_contain`` or ``score`` (docs/context.md).
        """
        params = {k: v for k, v in (("status", status), ("kind", kind)) if v} or None
        out: list[dict[str, Any]] = self.request("GET", "/v1/investigations", params=params)[
            "investigations"
        ]
        return out

    def close_investigation(self, inv_id: str, closed_by: str, resolution: str) -> dict[str, Any]:
        """``POST /v1/investigations/{id}/close``: the closed investigation."""
        out: dict[str, Any] = self.request(
            "POST",
            f"/v1/investigations/{quote(inv_id, safe='')}/close",
            json={"closed_by": closed_by, "resolution": resolution},
            acting_for=closed_by,
        )
        return out

    def resources(self, refs: list[dict[str, str]]) -> list[dict[str, Any]]:
        """``POST /v1/resources/get``: the Cedar entities of those the service holds."""
        out: list[dict[str, Any]] = self.request(
            "POST", "/v1/resources/get", json={"resources": refs}
        )["resources"]
        return out

    def service_accounts(self, app: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/service-accounts[?app=]``: the records, by id."""
        params = {"app": app} if app is not None else None
        out: list[dict[str, Any]] = self.request("GET", "/v1/service-accounts", params=params)[
            "service_accounts"
        ]
        return out

    def service_account(self, sa_id: str) -> dict[str, Any] | None:
        """``GET /v1/service-accounts/{id}``, or None when it is not registered."""
        try:
            out: dict[str, Any] = self.request(
                "GET", f"/v1/service-accounts/{quote(sa_id, safe='')}"
            )
        except Refused as e:
            if e.status == 404:
                return None
            raise
        return out

    def put_service_account(self, record: dict[str, Any], author: str) -> int:
        """``POST /v1/service-accounts`` of one record with its author.

        Returns:
            The ``principals_version`` after the write.

        """
        out = self.request(
            "POST",
            "/v1/service-accounts",
            json={"service_accounts": [record], "author": author},
            acting_for=author,
        )
        return int(out["principals_version"])

    def delete_service_account(self, sa_id: str, author: str) -> bool:
        """``DELETE /v1/service-accounts/{id}?author=``; False when it was not registered."""
        try:
            self.request(
                "DELETE",
                f"/v1/service-accounts/{quote(sa_id, safe='')}",
                params={"author": author},
                acting_for=author,
            )
        except Refused as e:
            if e.status == 404:
                return False
            raise
        return True

    def service_account_changes(self, sa_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """``GET /v1/service-accounts/{id}/changes``: newest first."""
        out: list[dict[str, Any]] = self.request(
            "GET",
            f"/v1/service-accounts/{quote(sa_id, safe='')}/changes",
            params={"limit": limit},
        )["changes"]
        return out


def grpc_target(url: str) -> str:
    """``host:port`` of ``http://host:port`` (or of ``host:port`` itself): a gRPC target."""
    return re.sub(r"^https?://", "", url).rstrip("/")


#: gRPC status codes that mean the service did not serve the call (``Unavailable``).
_UNAVAILABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.DATA_LOSS,
    }
)
#: gRPC refusals of the request, as the HTTP status the portal answers them with.
_REFUSED_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
}


class _Grpc:
    """One gRPC service over a channel of its own (plain h2c, as svc's services serve it)."""

    name = "service"
    stub: Any

    def __init__(self, url: str, token: TokenFn = lambda: None, timeout_secs: float = 10.0) -> None:
        self.url = url
        self._token = token
        self.timeout_secs = timeout_secs
        self._channel = grpc.insecure_channel(grpc_target(url))

    def call(self, method: str, request: Any) -> Any:
        """Calls `method` of the stub with `request`.

        Raises:
            Unavailable: the service did not serve the call (no connection, a timeout, an
                internal error, the portal's token refused).
            Refused: the service refused the request: ``status`` is the HTTP status the
                portal answers (400, 403, 404, 409) and ``body`` ``{"detail", "errors"}`` with
                each ``google.rpc.BadRequest`` field violation.

        """
        metadata = []
        token = self._token()
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        person = _acting_for(request)
        if person:
            metadata.append((ACTING_FOR, quote(person, safe="")))
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout_secs, metadata=metadata)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = (e.details() if isinstance(e, grpc.Call) else str(e)) or ""
            if code in _UNAVAILABLE_CODES or code not in _REFUSED_STATUS:
                raise Unavailable(self.name, f"{method}: {code.name}: {details}") from None
            errors: list[dict[str, Any]] = []
            status = rpc_status.from_call(e) if isinstance(e, grpc.Call) else None
            for d in status.details if status else []:
                bad = error_details_pb2.BadRequest()
                if d.Unpack(bad):
                    errors.extend(
                        {"index": None, "field": v.field, "message": v.description}
                        for v in bad.field_violations
                    )
            body = {
                "type": f"urn:svc:problem:{code.name.lower().replace('_', '-')}",
                "title": code.name.replace("_", " ").capitalize(),
                "detail": details,
                "errors": errors,
            }
            raise Refused(_REFUSED_STATUS[code], body) from None

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()


class ChallengeClient(_Grpc):
    """The challenge service (gRPC ``svc.challenge.v1.ChallengeService``, docs/challenges.md)."""

    name = "challenge service"

    def __init__(self, url: str, token: TokenFn = lambda: None, timeout_secs: float = 10.0) -> None:
        super().__init__(url, token, timeout_secs)
        self.stub = cpb_grpc.ChallengeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self.pb = cpb

    async def stream(self, method: str, request: Any) -> AsyncIterator[Any]:
        """A server stream of `method` over a ``grpc.aio`` channel of its own, message by message.

        Raises:
            Unavailable: the stream could not be opened or broke.
            Refused: the service refused the request (as ``call``).

        """
        metadata = []
        token = self._token()
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        async with grpc.aio.insecure_channel(grpc_target(self.url)) as channel:
            stub = cpb_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                async for message in getattr(stub, method)(request, metadata=metadata):
                    yield message
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code in _REFUSED_STATUS:
                    raise Refused(
                        _REFUSED_STATUS[code],
                        {
                            "type": f"urn:svc:problem:{code.name.lower().replace('_', '-')}",
                            "title": code.name,
                            "detail": e.details() or "",
                        },
                    ) from None
                raise Unavailable(self.name, f"{method}: {code.name}: {e.details()}") from None


class PolicyClient(_Grpc):
    """The policy service (gRPC ``svc.policy.v1.PolicyService``, docs/policy.md)."""

    name = "policy service"

    def __init__(self, url: str, token: TokenFn = lambda: None, timeout_secs: float = 10.0) -> None:
        super().__init__(url, token, timeout_secs)
        self.stub = ppb_grpc.PolicyServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self.pb = ppb


class HistoryClient(_Http):
    """The history's read-only routes (``/v1/history/...``, docs/history.md#http-routes)."""

    name = "history"

    def decisions(self, **params: Any) -> list[dict[str, Any]]:
        """``GET /v1/history/decisions``: rows oldest first.

        Args:
            params: ``principal`` or ``resource`` (``Type::id``), ``since``, ``until`` (RFC
                3339), ``monitor_only``, ``include_on_behalf_of``, ``limit`` (1 to 10,000).

        """
        out: list[dict[str, Any]] = self.request("GET", "/v1/history/decisions", params=params)
        return out

    def search_decisions(self, **params: Any) -> dict[str, Any]:
        """``GET /v1/history/decisions/search``: one page of a decision search.

        Args:
            params: ``principal`` or ``resource`` (``Type::id``) or neither, ``action``,
                ``verdict``, ``policy``, ``mode``, ``since``, ``until`` (RFC 3339),
                ``after_at`` (Unix ms) with ``after_qid``, ``limit`` (1 to 10,000); None
                values are left out.

        Returns:
            ``{"decisions": [row], "more": bool, "end": {"at", "qid"} | None, "scanned": int}``
            (docs/history.md#searching-decisions).

        """
        out: dict[str, Any] = self.request(
            "GET",
            "/v1/history/decisions/search",
            params={k: v for k, v in params.items() if v is not None},
        )
        return out

    def stats(self, **params: Any) -> dict[str, Any]:
        """``GET /v1/history/stats``: decisions by verdict per bucket and the most denied.

        Args:
            params: ``since``, ``until`` (RFC 3339), ``bucket`` (``hour`` or ``day``), ``top``
                (1 to 100); None values are left out.

        Returns:
            ``{"buckets": [...], "top_denied_principals": [...], "top_denied_resources": [...]}``
            (``svc.history.queries.decision_stats``).

        """
        out: dict[str, Any] = self.request(
            "GET", "/v1/history/stats", params={k: v for k, v in params.items() if v is not None}
        )
        return out

    def decision(self, qid: str) -> dict[str, Any] | None:
        """``GET /v1/history/decisions?qid=``: one decision, or None when unknown."""
        try:
            out: dict[str, Any] = self.request("GET", "/v1/history/decisions", params={"qid": qid})
        except Refused as e:
            if e.status == 404:
                return None
            raise
        return out

    def events(self, **params: Any) -> list[dict[str, Any]]:
        """``GET /v1/history/events``: rows oldest first."""
        out: list[dict[str, Any]] = self.request("GET", "/v1/history/events", params=params)
        return out
