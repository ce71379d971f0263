"""Asking the decision point whether an approver may ``approve`` (docs/challenges.md#who-answers).

An ``approval`` challenge is answered by the approver a policy names, else the person's manager
(for an agent acting alone, its owner, who answers as the agent's person and is not asked
about). With ``pdp_url`` set, the challenge service asks the decision point whether the named
approver or the manager may ``approve`` the challenge's resource before recording them
(``Resolve``) and before accepting their decision (``Decide``): ``ApproverCheck.may_approve``
sends ``POST /v1/access/evaluation`` (docs/api.md#http-routes) with the
approver as a ``Human`` principal, the action ``approve`` and the challenge's resource, and takes
only the verdict ``allow`` as yes.

A call that fails to connect, times out or is answered 5xx is tried once more (tenacity); then
``PdpUnavailable`` is raised, which the service answers ``UNAVAILABLE``. Any other answer but 200
(a 400 for a resource type the bundle does not know, a 401 for a missing token) counts as no.
Calls carry ``authorization: Bearer <token>`` when ``token`` returns one (docs/auth.md, audience
``svc-pdp``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

__all__ = ["ApproverCheck", "PdpUnavailable", "token_file_reader"]

log = logging.getLogger("svc.challenge")

#: The action an approver must be allowed (docs/challenges.md#who-answers).
APPROVE = "approve"
#: The principal type an approver is checked as.
APPROVER_TYPE = "Human"


class PdpUnavailable(Exception):
    """The decision point did not answer (connection, timeout, 5xx), after one more try."""


class _Retry(Exception):
    """A failure worth one more try: the text says what happened."""


def token_file_reader(path: str | None) -> Callable[[], str | None]:
    """A token function reading ``path`` at each call (a renewed token is picked up).

    Returns a function answering the file's stripped text, or None when ``path`` is None, the
    file is empty or cannot be read (logged).
    """

    def token() -> str | None:
        if not path:
            return None
        try:
            return Path(path).read_text(encoding="utf-8").strip() or None
        except OSError as e:
            log.error("cannot read the token file %s: %s", path, e)
            return None

    return token


class ApproverCheck:
    """Asks a decision point whether a person may ``approve`` a resource (module docs).

    Args:
        base_url: the decision point, ``http://host:port``.
        token: returns the bearer token to send (audience ``svc-pdp``), or None for none.
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
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout_secs, transport=transport
        )

    def _post(self, body: dict[str, object]) -> httpx.Response:
        headers = {}
        token = self._token()
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            r = self._client.post("/v1/access/evaluation", json=body, headers=headers)
        except httpx.HTTPError as e:
            raise _Retry(f"the decision point does not answer: {e!r}") from None
        if r.status_code >= 500:
            raise _Retry(f"the decision point answered {r.status_code}: {r.text[:200]}")
        return r

    def may_approve(self, approver: str, resource_type: str, resource_id: str) -> bool:
        """Whether the decision point allows ``Human::approver`` to ``approve`` the resource.

        Args:
            approver: the approver's user name.
            resource_type: the challenge's resource type (``Document``).
            resource_id: its id.

        Returns:
            True only for the verdict ``allow``; False for any other verdict and for a 4xx
            answer (logged).

        Raises:
            PdpUnavailable: no answer, a timeout or a 5xx, twice.

        """
        body: dict[str, object] = {
            "principal": {"type": APPROVER_TYPE, "id": approver},
            "action": APPROVE,
            "resource": {"type": resource_type, "id": resource_id},
        }
        retrying = Retrying(
            retry=retry_if_exception_type(_Retry),
            stop=stop_after_attempt(2),
            wait=wait_fixed(0.2),
            reraise=True,
        )
        try:
            r = retrying(self._post, body)
        except _Retry as e:
            raise PdpUnavailable(str(e)) from None
        if r.status_code != 200:
            log.warning(
                "approve check of %s on %s::%s answered %d: %s",
                approver,
                resource_type,
                resource_id,
                r.status_code,
                r.text[:200],
            )
            return False
        try:
            verdict = r.json().get("verdict")
        except (ValueError, AttributeError):
            raise PdpUnavailable("the decision point sent no JSON verdict") from None
        return bool(verdict == "allow")

    def close(self) -> None:
        """Closes the HTTP client."""
        self._client.close()
