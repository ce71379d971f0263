"""The portal's service layer: every operation, over typed clients of the other services.

The portal stores nothing (docs/architecture.md#components); this layer holds the rules and
calls the services that hold the records (``svc.portal.clients``). Transports only translate:
``svc.portal.app`` (the agents API, sign-in) and the GraphQL schema (``svc.portal.graphql``).

**Every operation of a person is checked first** (``authorize``): the decision point is asked
whether ``Human::"<user name>"`` may ``view`` (queries) or ``administer`` (changes)
``PortalArea::"<area>"``, with the areas of ``AREAS``. The check is a decision like any other:
it has a ``qid`` and is in the decision log. Only ``allow`` lets the operation run; any other
verdict raises ``Denied`` carrying the decision's qid (and, for a ``challenge``, its
``challenge_qid``). The portal applies its own checks whatever the install's enforcement mode
says: the mode lets an install roll out its policies over its apps, while these checks guard
svc itself (docs/portal.md#authorization).

**The agents API** (``put_agent``, ``list_agents``, ``retire_agent``) is for trusted apps, not
people: its caller is the app its own token names (``svc.portal.apptokens``), and the rules are
the trusted-issuer rules of docs/architecture.md: an app writes only ids that start with its
name and a dot, and an agent's owner is a provisioned person.

Errors are RFC 9457 ``Problem``s (``svc.common.problems``) for the HTTP routes; ``Denied`` for a
refused check, which GraphQL answers as an error carrying the qid.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from svc.common.problems import FieldError, Problem
from svc.portal.clients import ContextClient, PdpClient, Refused, Unavailable
from svc.portal.settings import PortalSettings

__all__ = [
    "AREAS",
    "AgentIn",
    "Area",
    "Check",
    "Denied",
    "PortalService",
    "unavailable_problem",
]

log = logging.getLogger("svc.portal")

Area = Literal[
    "decisions",
    "policies",
    "enforcement",
    "directory",
    "challenges",
    "containments",
    "keys",
    "investigations",
    "assistant",
]
#: The portal's areas: ``PortalArea::"<area>"`` (docs/portal.md#authorization).
AREAS: tuple[Area, ...] = (
    "decisions",
    "policies",
    "enforcement",
    "directory",
    "challenges",
    "containments",
    "keys",
    "investigations",
    "assistant",
)
Action = Literal["view", "administer"]
#: The entity type of the portal's areas and the type people are checked as.
AREA_TYPE = "PortalArea"
PERSON_TYPE = "Human"
#: An agent's id under the agents API: ``<app>.<name>``; the name is letters, digits and
#: ``. _ : @ -`` (a path segment without escaping), at most 200 characters.
AGENT_ID = re.compile(r"^(?P<app>[a-z0-9][a-z0-9-]{0,62})\.[A-Za-z0-9._:@-]{1,200}$")


@dataclass(frozen=True)
class Check:
    """An allowed check of a portal operation.

    Attributes:
        qid: the decision's id (UUIDv7), as the decision log has it.
        person: the user name checked.
        action: ``view`` or ``administer``.
        area: the portal area.
        policies: the policies that decided.

    """

    qid: str
    person: str
    action: str
    area: str
    policies: list[str] = field(default_factory=list)


class Denied(Exception):
    """A portal operation the decision point did not allow.

    Attributes:
        qid: the decision's id (empty when the decision point refused the check itself, for
            example a bundle without ``PortalArea``).
        verdict: ``deny`` or ``challenge``.
        person, action, area: what was checked.
        policies: the policies that decided (``svc:contained`` for a contained person).
        challenge_qid: for ``challenge``, the challenge to pass before trying again.
        detail: a sentence saying what was refused.

    """

    def __init__(
        self,
        qid: str,
        verdict: str,
        person: str,
        action: str,
        area: str,
        policies: list[str] | None = None,
        challenge_qid: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.qid = qid
        self.verdict = verdict
        self.person = person
        self.action = action
        self.area = area
        self.policies = policies or []
        self.challenge_qid = challenge_qid
        self.detail = detail or (
            f"`{person}` may not {action} the portal's {area} (verdict {verdict}, decision "
            f"{qid or 'none'})"
        )
        super().__init__(self.detail)

    def extensions(self) -> dict[str, Any]:
        """What a GraphQL error's ``extensions`` carry (docs/portal.md#errors)."""
        out: dict[str, Any] = {
            "code": "FORBIDDEN",
            "decision_qid": self.qid,
            "verdict": self.verdict,
            "action": self.action,
            "area": self.area,
            "policies": self.policies,
        }
        if self.challenge_qid:
            out["challenge_qid"] = self.challenge_qid
        return out


class AgentIn(BaseModel):
    """The body of ``PUT /api/v1/agents/{agent_id}``: the agent record without its id."""

    model_config = ConfigDict(extra="forbid")

    owner: str = Field(min_length=1, max_length=512, description="the owner's user name")
    ai: bool = Field(description="whether the agent is an AI system")
    groups: list[str] = Field(default_factory=list, max_length=256)
    description: str = Field(default="", max_length=4096)


def unavailable_problem(e: Unavailable) -> Problem:
    """A 503 problem naming the service that did not answer (its error goes to the log)."""
    log.error("%s does not answer: %s", e.service, e.detail)
    return Problem(
        503,
        "service-unavailable",
        "Service unavailable",
        f"the {e.service} does not answer; try again shortly",
        headers={"Retry-After": "1"},
    )


def _refused_problem(e: Refused, what: str) -> Problem:
    """A 4xx of another service as the portal's own problem, keeping its named fields."""
    body = e.body
    errors = [
        FieldError(x.get("index"), str(x.get("field", "")), str(x.get("message", "")))
        for x in body.get("errors", [])
        if isinstance(x, dict)
    ]
    status = e.status if e.status in (400, 404, 409) else 502
    if status == 502:
        log.error("the %s refused the portal's call: %s %s", what, e.status, body)
        return Problem(502, "bad-gateway", "Bad gateway", f"the {what} refused the portal's call")
    return Problem(
        status,
        str(body.get("type", "urn:svc:problem:invalid-request")).removeprefix("urn:svc:problem:"),
        str(body.get("title", "Refused")),
        str(body.get("detail", f"the {what} refused the request")),
        errors,
    )


class PortalService:
    """The portal's operations (module docs).

    The clients are taken as arguments so ``svc up`` and tests can hand in their own;
    ``close`` closes them.

    Args:
        settings: the portal's settings (limits).
        pdp: the decision point's client.
        context: the context service's client.

    """

    def __init__(self, settings: PortalSettings, pdp: PdpClient, context: ContextClient) -> None:
        self.settings = settings
        self.pdp = pdp
        self.context = context

    # -- authorization ---------------------------------------------------------------

    def authorize(self, person: str, action: Action, area: Area) -> Check:
        """Checks that `person` may `action` the portal's `area` (module docs).

        Args:
            person: the signed-in user name (``Human::"<person>"``).
            action: ``view`` (queries) or ``administer`` (changes).
            area: one of ``AREAS``.

        Returns:
            The allowed check, with its decision's qid.

        Raises:
            Denied: the verdict is ``deny`` or ``challenge``, or the decision point refused the
                check (a bundle without ``PortalArea`` or these actions: no qid).
            Unavailable: the decision point does not answer.

        """
        if area not in AREAS:
            raise ValueError(f"unknown portal area `{area}`")
        request = {
            "principal": {"type": PERSON_TYPE, "id": person},
            "action": action,
            "resource": {"type": AREA_TYPE, "id": area},
        }
        try:
            d = self.pdp.evaluate(request)
        except Refused as e:
            log.error("the decision point refused the portal's check: %s", e.body)
            raise Denied(
                "",
                "deny",
                person,
                action,
                area,
                detail=(
                    f"the decision point cannot check `{action}` on the portal's {area}: "
                    f"{str(e.body.get('detail', e.status))[:300]}"
                ),
            ) from None
        qid = str(d.get("qid", ""))
        verdict = str(d.get("verdict", "deny"))
        policies = [str(p) for p in d.get("policies", [])]
        if verdict != "allow":
            raise Denied(qid, verdict, person, action, area, policies, d.get("challenge_qid"))
        return Check(qid, person, action, area, policies)

    # -- the agents API (trusted apps) --------------------------------------------------

    def _own_agent(self, app: str, agent_id: str) -> None:
        """Refuses an agent id that is not `app`'s (``<app>.<name>``) or is malformed."""
        m = AGENT_ID.fullmatch(agent_id)
        if m is None:
            raise Problem(
                400,
                "invalid-agent-id",
                "Invalid agent id",
                f"`{agent_id[:200]}` is not an agent id: `<app>.<name>`, the name 1 to 200 "
                "letters, digits and `. _ : @ -`",
                [FieldError(None, "agent_id", "not an agent id")],
            )
        if m.group("app") != app:
            raise Problem(
                403,
                "agent-not-yours",
                "Not this app's agent",
                f"app `{app}` may register only agents `{app}.*`, not `{agent_id}`",
            )

    def put_agent(self, app: str, agent_id: str, raw: Any) -> tuple[dict[str, Any], bool]:
        """Registers or changes one of `app`'s agents, with `app` as author.

        Args:
            app: the calling app's name (from its verified token).
            agent_id: ``<app>.<name>``.
            raw: the request body, ``{owner, ai, groups?, description?}`` (docs/portal.md).

        Returns:
            ``(record, created)``: the agent's record as ``GET`` lists it, and whether it was
            not registered before.

        Raises:
            Problem: 400 ``invalid-agent-id``; 403 ``agent-not-yours`` (another app's prefix);
                400 ``invalid-agent`` naming every bad field, an owner who is not a
                provisioned, present and active person included; 503 when the context service
                does not answer.

        """
        self._own_agent(app, agent_id)
        try:
            item = AgentIn.model_validate(raw)
        except ValidationError as e:
            errors = [
                FieldError(None, ".".join(str(p) for p in err["loc"]) or "body", err["msg"])
                for err in e.errors()
            ]
            raise Problem(
                400,
                "invalid-agent",
                "Invalid agent",
                "; ".join(f"`{x.field}`: {x.message}" for x in errors),
                errors,
            ) from None
        try:
            owner = self.context.person(item.owner)
            if owner is None or owner.get("removed") or not owner.get("active", False):
                why = (
                    "is not a provisioned person"
                    if owner is None
                    else "is removed"
                    if owner.get("removed")
                    else "is deactivated"
                )
                raise Problem(
                    400,
                    "invalid-agent",
                    "Invalid agent",
                    f"`owner`: `{item.owner}` {why}; an agent's owner is a person the identity "
                    "provider provisions",
                    [FieldError(None, "owner", why)],
                )
            before = self.context.service_account(agent_id)
            record = {"id": agent_id, **item.model_dump()}
            version = self.context.put_service_account(record, author=app)
        except Unavailable as e:
            raise unavailable_problem(e) from None
        except Refused as e:
            raise _refused_problem(e, "context service") from None
        log.info("app %s %s agent %s", app, "registered" if before is None else "wrote", agent_id)
        out = {**record, "app": app, "registered": True, "principals_version": version}
        return out, before is None

    def list_agents(self, app: str) -> list[dict[str, Any]]:
        """`app`'s registered agents, by id: each ``{id, owner, ai, groups, description, app}``.

        Raises:
            Problem: 503 when the context service does not answer.

        """
        try:
            return self.context.service_accounts(app)
        except Unavailable as e:
            raise unavailable_problem(e) from None
        except Refused as e:
            raise _refused_problem(e, "context service") from None

    def retire_agent(self, app: str, agent_id: str) -> None:
        """Retires one of `app`'s agents: unregistered, denied everything from then on.

        Decision points deny it (``svc:unregistered``) once their context followers apply the
        change (within about a second).

        Raises:
            Problem: 400 ``invalid-agent-id``; 403 ``agent-not-yours``; 404 ``agent-not-found``
                when it is not registered; 503 when the context service does not answer.

        """
        self._own_agent(app, agent_id)
        try:
            gone = self.context.delete_service_account(agent_id, author=app)
        except Unavailable as e:
            raise unavailable_problem(e) from None
        except Refused as e:
            raise _refused_problem(e, "context service") from None
        if not gone:
            raise Problem(
                404, "agent-not-found", "Agent not found", f"no registered agent `{agent_id}`"
            )
        log.info("app %s retired agent %s", app, agent_id)

    def agent(self, app: str, agent_id: str, limit: int = 100) -> dict[str, Any]:
        """One of `app`'s agents, registered or retired, with its changes.

        Args:
            app: the calling app's name.
            agent_id: ``<app>.<name>``.
            limit: most changes answered (newest first).

        Returns:
            The record (``{id, app}`` only once retired) with ``registered`` and ``changes``:
            ``[{service_account, change, author, at, record}]``, ``change`` ``registered``,
            ``changed`` or ``retired``.

        Raises:
            Problem: 400 ``invalid-agent-id``; 403 ``agent-not-yours``; 404 ``agent-not-found``
                for an id never registered; 503 when the context service does not answer.

        """
        self._own_agent(app, agent_id)
        try:
            record = self.context.service_account(agent_id)
            changes = self.context.service_account_changes(agent_id, limit)
        except Unavailable as e:
            raise unavailable_problem(e) from None
        except Refused as e:
            raise _refused_problem(e, "context service") from None
        if record is None and not changes:
            raise Problem(404, "agent-not-found", "Agent not found", f"no agent `{agent_id}`")
        base = record if record is not None else {"id": agent_id, "app": app}
        return {**base, "registered": record is not None, "changes": changes}

    def close(self) -> None:
        """Closes the clients' connections."""
        self.pdp.close()
        self.context.close()
