"""Typed clients of the services the portal calls (docs/portal.md#what-it-calls).

The portal holds no state: every answer comes from another service's API.

* ``PdpClient``: the decision point's HTTP decision API (``POST /v1/access/evaluation``,
  docs/api.md#http-routes) and AuthZEN searches (``/access/v1/search/...``, docs/search.md);
* ``ContextClient``: the context service's ``/v1`` routes (docs/context.md): service accounts,
  the directory, trusted apps, investigations.

Each call carries ``Authorization: Bearer <token>`` when its token function returns one (a
token file read at each call: docs/auth.md). A service that does not connect, times out or
answers 5xx raises ``Unavailable``; a 4xx answer raises ``Refused`` with the service's RFC 9457
body, which the service layer turns into the portal's own answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["ContextClient", "PdpClient", "Refused", "TokenFn", "Unavailable", "token_reader"]

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
    ) -> Any:
        """Sends one request and answers its JSON (None for a 204).

        Raises:
            Unavailable: no connection, a timeout, a 5xx or an answer that is not JSON.
            Refused: a 4xx.

        """
        headers = {}
        token = self._token()
        if token:
            headers["authorization"] = f"Bearer {token}"
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
            "POST", "/v1/service-accounts", json={"service_accounts": [record], "author": author}
        )
        return int(out["principals_version"])

    def delete_service_account(self, sa_id: str, author: str) -> bool:
        """``DELETE /v1/service-accounts/{id}?author=``; False when it was not registered."""
        try:
            self.request(
                "DELETE", f"/v1/service-accounts/{quote(sa_id, safe='')}", params={"author": author}
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
