"""Who answers a challenge: a service account's owner and a person's manager.

``Directory`` is the interface ``ChallengeService`` looks them up through
(docs/challenges.md#who-answers). ``ContextDirectory`` asks the context service's directory routes
(``GET /v1/directory/people/{user_name}`` for the manager, ``GET /v1/service-accounts/{id}`` for
the owner; docs/context.md); ``StaticDirectory`` holds fixed maps (tests, and installs without a
context service).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import quote

import httpx

__all__ = ["ContextDirectory", "Directory", "DirectoryUnavailable", "StaticDirectory"]

log = logging.getLogger("svc.challenge")


class DirectoryUnavailable(Exception):
    """The directory could not be asked (its service does not answer, or answers an error)."""


class Directory(Protocol):
    """Looks up who answers for a principal (docs/challenges.md#who-answers)."""

    def owner(self, service_account: str) -> str | None:
        """The user name of a service account's owner, or None when it has none or is unknown.

        Raises:
            DirectoryUnavailable: the directory cannot be asked now.

        """
        ...

    def manager(self, person: str) -> str | None:
        """The user name of a person's manager, or None when none is recorded or unknown.

        Raises:
            DirectoryUnavailable: the directory cannot be asked now.

        """
        ...


class StaticDirectory:
    """A ``Directory`` over fixed maps.

    Args:
        owners: service account id to its owner's user name.
        managers: user name to the manager's user name.

    """

    def __init__(
        self,
        owners: Mapping[str, str] | None = None,
        managers: Mapping[str, str] | None = None,
    ) -> None:
        self.owners = dict(owners or {})
        self.managers = dict(managers or {})

    def owner(self, service_account: str) -> str | None:
        """The owner from ``owners``, else None."""
        return self.owners.get(service_account)

    def manager(self, person: str) -> str | None:
        """The manager from ``managers``, else None."""
        return self.managers.get(person)


class ContextDirectory:
    """A ``Directory`` over the context service's HTTP routes (docs/context.md).

    Args:
        base_url: the context service, ``http://host:port``.
        token: returns the bearer token to send (None sends none: a context service without
            caller authentication).
        timeout_secs: timeout of one request.
        transport: an httpx transport (tests).

    """

    def __init__(
        self,
        base_url: str,
        token: Callable[[], str | None] = lambda: None,
        timeout_secs: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._token = token
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_secs, transport=transport
        )

    def _get(self, path: str) -> dict[str, object] | None:
        headers = {}
        token = self._token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            r = self._client.get(path, headers=headers)
        except httpx.HTTPError as e:
            raise DirectoryUnavailable(f"the context service does not answer: {e}") from None
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise DirectoryUnavailable(f"the context service answered {r.status_code} to {path}")
        try:
            body = r.json()
        except ValueError:
            raise DirectoryUnavailable(f"the context service sent no JSON for {path}") from None
        return body if isinstance(body, dict) else None

    def owner(self, service_account: str) -> str | None:
        """``owner`` of ``GET /v1/service-accounts/{id}`` (None on 404 or no owner).

        Raises:
            DirectoryUnavailable: no answer, or a status other than 200 and 404.

        """
        body = self._get(f"/v1/service-accounts/{quote(service_account, safe='')}")
        owner = body.get("owner") if body else None
        return owner if isinstance(owner, str) and owner else None

    def manager(self, person: str) -> str | None:
        """``manager`` of ``GET /v1/directory/people/{user_name}`` (None on 404 or no manager).

        Raises:
            DirectoryUnavailable: no answer, or a status other than 200 and 404.

        """
        body = self._get(f"/v1/directory/people/{quote(person, safe='')}")
        manager = body.get("manager") if body else None
        return manager if isinstance(manager, str) and manager else None

    def close(self) -> None:
        """Closes the HTTP client."""
        self._client.close()
