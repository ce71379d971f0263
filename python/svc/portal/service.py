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

import base64
import binascii
import contextvars
import difflib
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache, partial
from typing import Any, Literal

import anyio.to_thread
from google.protobuf import struct_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from svc._pdp_core import BundleError, outline_policies
from svc.common.problems import FieldError, Problem
from svc.pdp import RequestError
from svc.pdp.outline_shapes import PolicyOutline
from svc.policy.service import bundle_engine
from svc.portal.clients import (
    ChallengeClient,
    ContextClient,
    HistoryClient,
    PdpClient,
    PolicyClient,
    Refused,
    Unavailable,
)
from svc.portal.reads import EntityLookup, bundle_entities, person_entity, read_values
from svc.portal.settings import PortalSettings

__all__ = [
    "ACTING_AGENT",
    "AREAS",
    "LAST_CHECK",
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
#: The agent a person's operation is made through (the MCP endpoint's token exchange callers):
#: ``authorize`` then checks the agent with the person in ``on_behalf_of``. Set around one call.
ACTING_AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "svc_portal_acting_agent", default=None
)
#: The qid of the last allowed check made in this context (the MCP endpoint puts it in the
#: call's event); set by ``authorize``.
LAST_CHECK: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "svc_portal_last_check", default=None
)
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


def _rfc3339(t: datetime) -> str:
    """An aware time as RFC 3339 in UTC with milliseconds."""
    return t.astimezone(UTC).isoformat(timespec="milliseconds")


def _ms(at: Any) -> int:
    """A history row's ``at`` (RFC 3339 text or datetime) as Unix milliseconds."""
    t = datetime.fromisoformat(at) if isinstance(at, str) else at
    return int(t.timestamp() * 1000)


def _encode_cursor(pos: tuple[int, str]) -> str:
    """An opaque cursor (base64url JSON of ``[ms, qid]``)."""
    raw = json.dumps([pos[0], pos[1]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[int, str]:
    """The position a cursor names.

    Raises:
        Problem: 400 ``invalid-argument`` for anything ``_encode_cursor`` did not write.

    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ms, qid = json.loads(raw)
        if not isinstance(ms, int) or not isinstance(qid, str) or len(qid) > 64:
            raise ValueError
    except (ValueError, TypeError, binascii.Error):
        raise Problem(
            400,
            "invalid-argument",
            "Invalid argument",
            "`after` is not a cursor this search gave",
            [FieldError(None, "after", "not a cursor")],
        ) from None
    return ms, qid


def _deciding(
    names: Sequence[str],
    row: Mapping[str, Any],
    outlines: Mapping[str, tuple[str, PolicyOutline]],
    lookup: EntityLookup,
) -> list[dict[str, Any]]:
    """The deciding policies `names` as an explanation shows them (``PortalService.explain``).

    Args:
        names: the policies that decided, as the decision record names them.
        row: the decision record, its ``principal`` the one whose check they decided.
        outlines: the active bundle's outlines by policy name (``_outlines``).
        lookup: the entities as svc holds them now.

    Returns:
        ``{name, file, text, effect, start_line, end_line, entities, reads}`` per name, in
        order; a name the bundle no longer holds (or a built-in such as ``svc:contained``) has
        None and empty values.

    """
    out: list[dict[str, Any]] = []
    for n in names:
        found = outlines.get(n)
        if found is None:
            out.append(
                {"name": n, "file": None, "text": None, "effect": None, "start_line": None,
                 "end_line": None, "entities": [], "reads": []}
            )  # fmt: skip
            continue
        file, o = found
        out.append(
            {"name": n, "file": file, "text": o["text"], "effect": o["effect"],
             "start_line": o["start_line"], "end_line": o["end_line"],
             "entities": list(o["entities"]), "reads": read_values(o["reads"], row, lookup)}
        )  # fmt: skip
    return out


@lru_cache(maxsize=4)
def _outlines(cedar: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, PolicyOutline]]:
    """The policies of a bundle's ``.cedar`` files by name: ``{name: (file, outline)}``.

    `cedar` is the ``(file name, text)`` pairs. Files are outlined in file-name order,
    numbering unnamed policies on across files as the bundle does
    (docs/bundles.md#policy-names). A file that does not parse (an active bundle's always does)
    is left out, logged. Kept for the last few bundles (by their texts): an explanation reads
    the active bundle's, and outlining 1,000 policies takes some 100 ms on a busy machine
    (``benches/bench_policy_outline.py``). Callers must not change what it returns.
    """
    out: dict[str, tuple[str, PolicyOutline]] = {}
    first = 0
    for name, text in sorted(cedar):
        try:
            found = outline_policies(text, name, first)
        except BundleError as e:
            log.warning("explanations: %s does not parse: %s", name, e)
            continue
        first += len(found)
        for o in found:
            out.setdefault(o["name"], (name, o))
    return out


#: A bundle's ``entities.json`` by ``(type, id)``, kept for the last few texts like ``_outlines``.
_bundle_entities = lru_cache(maxsize=4)(bundle_entities)


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
    """A 4xx of another service as the portal's own problem, keeping its named fields.

    400, 403 (the service's own rule, such as "not the approver"), 404 and 409 pass through;
    anything else, and a refusal of the portal itself as a caller, is a 502 ``bad-gateway``
    (logged: the install's settings are wrong, not the request).
    """
    body = e.body
    errors = [
        FieldError(x.get("index"), str(x.get("field", "")), str(x.get("message", "")))
        for x in body.get("errors", [])
        if isinstance(x, dict)
    ]
    caller_refused = "caller-not-allowed" in str(body.get("type", "")) or (
        "is not allowed to call" in str(body.get("detail", ""))
    )
    status = e.status if e.status in (400, 403, 404, 409) and not caller_refused else 502
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

    def __init__(
        self,
        settings: PortalSettings,
        pdp: PdpClient,
        context: ContextClient,
        *,
        challenge: ChallengeClient | None = None,
        policy: PolicyClient | None = None,
        history: HistoryClient | None = None,
    ) -> None:
        self.settings = settings
        self.pdp = pdp
        self.context = context
        self.challenge = challenge
        self.policy = policy
        self.history = history

    # -- authorization ---------------------------------------------------------------

    def authorize(self, person: str, action: Action, area: Area, *, own: bool = False) -> Check:
        """Checks that `person` may `action` the portal's `area` (module docs).

        Args:
            person: the signed-in user name (``Human::"<person>"``).
            action: ``view`` (queries) or ``administer`` (changes).
            area: one of ``AREAS``.
            own: the operation touches only the person's own records (their challenges, their
                security keys): the check carries ``context.own`` true, so a policy can let
                everyone see their own (docs/portal.md#authorization). The bundle's schema
                must declare ``own`` in the context of ``view`` and ``administer``.

        Returns:
            The allowed check, with its decision's qid.

        Raises:
            Denied: the verdict is ``deny`` or ``challenge``, or the decision point refused the
                check (a bundle without ``PortalArea`` or these actions: no qid).
            Unavailable: the decision point does not answer.

        """
        if area not in AREAS:
            raise ValueError(f"unknown portal area `{area}`")
        request: dict[str, Any] = {
            "principal": {"type": PERSON_TYPE, "id": person},
            "action": action,
            "resource": {"type": AREA_TYPE, "id": area},
        }
        agent = ACTING_AGENT.get()
        if agent is not None:
            request["principal"] = {"type": "ServiceAccount", "id": agent}
            request["on_behalf_of"] = {"type": PERSON_TYPE, "id": person}
        if own:
            request["context"] = {"own": True}
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
        LAST_CHECK.set(qid)
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

    # -- people's operations -----------------------------------------------------------
    #
    # Each checks the person first (``authorize``), then calls the service that holds the
    # records. ``Unavailable`` and ``Refused`` of the clients pass through as
    # ``unavailable_problem`` / the service's own refusal (``_refused_problem``).

    def _run(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Unavailable as e:
            raise unavailable_problem(e) from None
        except Refused as e:
            raise _refused_problem(e, what) from None

    def _need(self, client: Any, what: str) -> Any:
        if client is None:
            raise Problem(
                503,
                "service-unavailable",
                "Service unavailable",
                f"the portal is not connected to the {what} (its URL setting is unset)",
            )
        return client

    def _page(self, first: int) -> int:
        if not 1 <= first <= self.settings.max_page_size:
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                f"`first` must be 1 to {self.settings.max_page_size} (SVC_PORTAL_MAX_PAGE_SIZE)",
                [FieldError(None, "first", "out of range")],
            )
        return first

    # decisions

    def decisions(
        self,
        person: str,
        *,
        principal: dict[str, str] | None = None,
        resource: dict[str, str] | None = None,
        action: str | None = None,
        verdict: str | None = None,
        policy: str | None = None,
        mode: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        first: int = 50,
        after: str | None = None,
    ) -> dict[str, Any]:
        """Searches the decision history, oldest first, a page at a time (``view`` decisions).

        One request to the history's search route (docs/history.md#searching-decisions), which
        applies every filter in its query and reads the range in bounded time windows: a page
        whose windows end before the range does comes back with fewer than `first` decisions,
        ``has_next_page`` and a cursor where the windows ended (keyset paging on ``(at, qid)``,
        so pages neither repeat nor skip a decision).

        Args:
            person: the signed-in user.
            principal: ``{type, id}``: the decisions it made (not those made on its behalf).
            resource: ``{type, id}``: the checks on it; at most one of the two.
            action: keep only decisions of that action.
            verdict: keep only that verdict (``allow``, ``deny``, ``challenge``; a plan's
                ``outcome``).
            policy: keep only decisions naming that policy among ``policies``.
            mode: ``monitor`` or ``enforce``: decisions reported in that mode.
            since: the range's first instant (aware); default a day before ``until``.
            until: the first instant past the range; default now.
            first: the page size, 1 to ``max_page_size``.
            after: the previous page's ``end_cursor``.

        Returns:
            ``{"decisions": [row], "end_cursor", "has_next_page", "scanned"}``: rows as the
            history answers them (docs/history.md#queries); ``scanned`` is the history rows
            the page read.

        Raises:
            Problem: 400 for a principal with a resource, a search naming neither and no other
                filter, a bad cursor or range; 503 without a history.

        """
        self.authorize(person, "view", "decisions")
        h = self._need(self.history, "history")
        first = self._page(first)
        if principal is not None and resource is not None:
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                "give `principal` or `resource`, not both",
                [FieldError(None, "principal", "at most one of principal and resource")],
            )
        if (
            principal is None
            and resource is None
            and all(x is None for x in (action, verdict, policy, mode))
        ):
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                "name what to search for: a principal, a resource, an action, a verdict, a "
                "policy or a mode",
                [FieldError(None, "principal", "a search names at least one filter")],
            )
        end = until or datetime.now(UTC)
        start = since or end - timedelta(days=1)
        cursor = _decode_cursor(after) if after else None
        if start >= end or (cursor is not None and cursor[0] >= _ms(end)):
            return {"decisions": [], "end_cursor": after, "has_next_page": False, "scanned": 0}

        def ref(x: dict[str, str] | None) -> str | None:
            return None if x is None else f"{x['type']}::{x['id']}"

        out = self._run(
            "history",
            partial(
                h.search_decisions,
                principal=ref(principal),
                resource=ref(resource),
                action=action,
                verdict=verdict,
                policy=policy,
                mode=mode,
                since=_rfc3339(start),
                until=_rfc3339(end),
                after_at=None if cursor is None else cursor[0],
                after_qid=None if cursor is None else cursor[1],
                limit=first,
            ),
        )
        pos = out.get("end")
        return {
            "decisions": out["decisions"],
            "end_cursor": _encode_cursor((int(pos["at"]), str(pos["qid"]))) if pos else after,
            "has_next_page": bool(out["more"]),
            "scanned": int(out.get("scanned", 0)),
        }

    def decision_stats(
        self,
        person: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: str = "hour",
        top: int = 5,
    ) -> dict[str, Any]:
        """Decisions by verdict and events per bucket, and the most denied (``view`` decisions).

        One request to the history's aggregate route (``GET /v1/history/stats``); the
        overview's charts (docs/portal.md#the-web-app).

        Args:
            person: the signed-in user.
            since: the range's first instant (aware); default a day before ``until``.
            until: the first instant past the range; default now.
            bucket: ``hour`` or ``day``.
            top: how many denied principals and resources to rank, 1 to 100.

        Returns:
            ``{"buckets": [{"at", "allow", "deny", "challenge", "would_deny",
            "would_challenge", "plans", "events"}], "top_denied_principals": [{"type", "id",
            "count"}], "top_denied_resources": [...]}``, buckets oldest first.

        Raises:
            Problem: 400 for an empty range, an unknown bucket or `top` out of range; 503
                without a history.

        """
        self.authorize(person, "view", "decisions")
        h = self._need(self.history, "history")
        bad = []
        if bucket not in ("hour", "day"):
            bad.append(FieldError(None, "bucket", "expected `hour` or `day`"))
        if not 1 <= top <= 100:
            bad.append(FieldError(None, "top", "out of range (1 to 100)"))
        end = until or datetime.now(UTC)
        start = since or end - timedelta(days=1)
        if start >= end:
            bad.append(FieldError(None, "since", "must be before `until`"))
        if bad:
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                "; ".join(f"`{e.field}` {e.message}" for e in bad),
                bad,
            )
        out: dict[str, Any] = self._run(
            "history",
            partial(h.stats, since=_rfc3339(start), until=_rfc3339(end), bucket=bucket, top=top),
        )
        return out

    def explain(self, person: str, qid: str) -> dict[str, Any] | None:
        """A decision and why (``view`` on ``decisions``).

        Returns:
            None for an unknown qid, else ``{"decision": row, "policies": [policy],
            "person_policies": [policy], "challenge": Challenge message or None, "events":
            [event]}``; ``person_policies`` are those of the person's own check when an agent
            acted for one (read with the person as ``principal``), else empty. Each policy that
            decided is ``{name, file, text, effect, start_line, end_line, entities, reads}`` as
            the active bundle has it, outlined by the decision core
            (``svc._pdp_core.outline_policies``: Cedar's parse, not text scanning): its source
            as written with its 1-based lines in ``file``, the entity literals it names, and
            each attribute path it reads or tests with ``has`` with the value svc can know
            (``svc.portal.reads.ReadValue``: from the decision record for the context the
            decision point filled in, else the directory's or the bundle's entity **now**, with
            ``as_of`` saying which; docs/portal.md#explanations). A policy the active bundle no
            longer holds has ``file``, ``text`` and the rest None or empty; a built-in denial
            such as ``svc:contained`` is named only. Then the challenge the decision opened with
            its state now, and the events of its principal within ten minutes after it that
            carry its qid (``attributes.decision_qid``, or ``plan_qid`` for a plan).

        Raises:
            Problem: 503 without a history.

        """
        self.authorize(person, "view", "decisions")
        h = self._need(self.history, "history")
        row = self._run("history", h.decision, qid)
        if row is None:
            return None
        outlines: dict[str, tuple[str, PolicyOutline]] = {}
        entities: dict[tuple[str, str], dict[str, Any]] = {}
        if self.policy is not None:
            p = self.policy
            try:
                active = self._run("policy service", p.call, "GetActive", p.pb.GetActiveRequest())
            except Problem as e:
                if e.status != 404:
                    raise
            else:
                if active.HasField("bundle"):
                    files = {f.name: f.content for f in active.bundle.files}
                    outlines = _outlines(
                        tuple((n, t) for n, t in files.items() if n.endswith(".cedar"))
                    )
                    if "entities.json" in files:
                        entities = _bundle_entities(files["entities.json"])
        lookup = EntityLookup(self.context, entities, datetime.now(UTC))
        policies = _deciding(row.get("policies", []), row, outlines, lookup)
        # The person's own check, when an agent acted for one: the same request with the person
        # as its principal (docs/decisions.md#an-agent-acting-for-a-person).
        person_policies: list[dict[str, Any]] = []
        person_part = row.get("on_behalf_of_outcome")
        if row.get("on_behalf_of") and isinstance(person_part, dict):
            as_person = {**row, "principal": row["on_behalf_of"]}
            names = [str(n) for n in person_part.get("policies") or []]
            person_policies = _deciding(names, as_person, outlines, lookup)
        challenge = None
        if row.get("challenge_qid") and self.challenge is not None:
            c = self.challenge
            req = c.pb.GetChallengeRequest(
                qid=row["challenge_qid"],
                principal=c.pb.EntityRef(**row["principal"]),
                on_behalf_of=c.pb.EntityRef(**row["on_behalf_of"])
                if row.get("on_behalf_of")
                else None,
            )
            try:
                challenge = self._run("challenge service", c.call, "GetChallenge", req).challenge
            except Problem as e:
                if e.status != 404:
                    raise
        events = self._decision_events(h, row)
        return {
            "decision": row,
            "policies": policies,
            "person_policies": person_policies,
            "challenge": challenge,
            "events": events,
        }

    def _decision_events(self, h: HistoryClient, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The events that carry a decision's qid, oldest first.

        Those of the decision's principal within 10 minutes after it whose
        ``attributes.decision_qid`` (or ``plan_qid``, for a plan) is the decision's.
        """
        at = datetime.fromisoformat(row["at"]) if isinstance(row["at"], str) else row["at"]
        p = row["principal"]
        if not p.get("id"):
            return []
        rows = self._run(
            "history",
            partial(
                h.events,
                principal=f"{p['type']}::{p['id']}",
                since=_rfc3339(at - timedelta(seconds=1)),
                until=_rfc3339(at + timedelta(minutes=10)),
                limit=10_000,
            ),
        )
        qid = row["qid"]
        return [
            e
            for e in rows
            if e.get("plan_qid") == qid or (e.get("attributes") or {}).get("decision_qid") == qid
        ]

    def redecide(self, person: str, qid: str, version: int | None = None) -> dict[str, Any] | None:
        """Decides a recorded decision again under a bundle ("what if").

        Checked as ``view`` on ``decisions`` and on ``policies``.

        As the policy service's dry runs do (docs/policy.md#dry-runs), the recorded principal,
        action, resource and ``on_behalf_of`` are decided by the bundle
        (``svc.policy.service.bundle_engine``), and on top of the bundle's own entities with
        the context service's current records of the principal (a person with their groups,
        or a registered service account), the person it acted for and the resource
        (``_directory_records``); the context the caller sent is not recorded, so conditions
        on it see none.

        Args:
            person: the signed-in user.
            qid: the recorded decision.
            version: the bundle version (a draft, usually); None: the active bundle.

        Returns:
            None for an unknown qid, else ``{"qid", "recorded", "version", "verdict",
            "challenges", "policies", "error"}``: ``verdict`` ``error`` (with ``error``) when
            the bundle cannot decide the request (a type or action its schema lacks).

        Raises:
            Problem: 404 for an unknown version or no active bundle; 503 without a history or
                a policy service.

        """
        self.authorize(person, "view", "decisions")
        self.authorize(person, "view", "policies")
        h = self._need(self.history, "history")
        p = self._need(self.policy, "policy service")
        row = self._run("history", h.decision, qid)
        if row is None:
            return None
        if version is None:
            out = self._run("policy service", p.call, "GetActive", p.pb.GetActiveRequest())
        else:
            req = p.pb.GetBundleRequest(version=version)
            out = self._run("policy service", p.call, "GetBundle", req)
        if not out.HasField("bundle"):
            raise Problem(404, "not-found", "Not found", "no active bundle")
        engine = bundle_engine({f.name: f.content for f in out.bundle.files})
        self._directory_records(engine, row)
        request: dict[str, Any] = {
            "principal": row["principal"],
            "action": row["action"],
            "resource": row["resource"],
        }
        if row.get("on_behalf_of"):
            request["on_behalf_of"] = row["on_behalf_of"]
        result: dict[str, Any] = {
            "qid": qid,
            "recorded": row.get("verdict"),
            "version": int(out.bundle.version),
            "verdict": "error",
            "challenges": [],
            "policies": [],
            "error": None,
        }
        try:
            d = engine.evaluate(request)
        except RequestError as e:
            result["error"] = str(e)
            return result
        result.update(
            verdict=d["verdict"], challenges=list(d["challenges"]), policies=list(d["policies"])
        )
        return result

    def _directory_records(self, engine: Any, row: dict[str, Any]) -> None:
        """Loads the context service's records of a decision's parties into `engine`.

        The principal, the person it acted for and the resource; a record the bundle's schema
        refuses is left out (logged).
        """
        people = [r for r in (row.get("principal"), row.get("on_behalf_of")) if r]
        for ref in people:
            try:
                if ref["type"] == "ServiceAccount":
                    sa = self.context.service_account(ref["id"])
                    if sa is not None:
                        engine.register_service_accounts([sa])
                elif ref["type"] == PERSON_TYPE:
                    p = self.context.person(ref["id"])
                    if p is not None and not p.get("removed"):
                        engine.upsert_entities([person_entity(ref, p)])
            except (RequestError, Unavailable, Refused) as e:
                log.warning("what if: %s's record left out: %s", ref, e)
        res = row.get("resource") or {}
        if res.get("id"):
            try:
                found = self.context.resources([res])
                if found:
                    engine.upsert_entities(found)
            except (RequestError, Unavailable, Refused) as e:
                log.warning("what if: resource %s left out: %s", res, e)

    # directory

    def people(self, person: str, include_removed: bool = False) -> list[dict[str, Any]]:
        """The directory's people (``view`` on ``directory``): the context service's records."""
        self.authorize(person, "view", "directory")
        out: list[dict[str, Any]] = self._run(
            "context service", self.context.people, include_removed
        )
        return out

    def service_accounts(self, person: str, app: str | None = None) -> list[dict[str, Any]]:
        """Registered service accounts and agents, by id (``view`` on ``directory``)."""
        self.authorize(person, "view", "directory")
        out: list[dict[str, Any]] = self._run("context service", self.context.service_accounts, app)
        return out

    def trusted_apps(self, person: str) -> list[dict[str, Any]]:
        """The apps trusted to sign agent tokens (``view`` on ``directory``)."""
        self.authorize(person, "view", "directory")
        out: list[dict[str, Any]] = self._run("context service", self.context.trusted_apps)
        return out

    def trust_app(self, person: str, app: dict[str, Any]) -> dict[str, Any]:
        """Trusts (or changes) an app ``{name, iss, jwks_url, aud}`` (``administer`` directory).

        Enforcement points pick it up within about ten seconds.

        Raises:
            Problem: 400 naming every bad field (the context service's checks: a name of
                lowercase letters, digits and dashes; an ``https://`` JWKS URL).

        """
        self.authorize(person, "administer", "directory")
        out: dict[str, Any] = self._run("context service", self.context.put_trusted_app, app)
        log.info("%s trusted app %s", person, app.get("name"))
        return out

    def untrust_app(self, person: str, name: str) -> bool:
        """Stops trusting an app (``administer`` on ``directory``); False when it was not."""
        self.authorize(person, "administer", "directory")
        try:
            self._run("context service", self.context.delete_trusted_app, name)
        except Problem as p:
            if p.status == 404:
                return False
            raise
        log.info("%s removed trusted app %s", person, name)
        return True

    def risk_scores(
        self, person: str, min_score: int = 0, first: int | None = None
    ) -> list[dict[str, Any]]:
        """The reasoner's risk scores with their factors, highest first (``view`` directory).

        Args:
            person: the signed-in user.
            min_score: only scores of at least this, 0 to 100.
            first: at most this many, 1 to ``max_page_size`` (default ``max_page_size``).

        Returns:
            ``[{"principal": {type, id}, "score", "reason", "factors", "details",
            "updated_at"}]`` as the context service keeps them (``GET /v1/risk``).

        """
        self.authorize(person, "view", "directory")
        limit = self._page(first if first is not None else self.settings.max_page_size)
        out: list[dict[str, Any]] = self._run(
            "context service", self.context.risk_scores, min_score, limit
        )
        return out

    def risk_history(
        self, person: str, principal: dict[str, str], days: int = 30
    ) -> dict[str, Any]:
        """A principal's risk score per UTC day (``view`` directory), as ``risk_scores``.

        Args:
            person: the signed-in user.
            principal: ``{type, id}``.
            days: how many UTC days, today included, 1 to 366.

        Returns:
            ``{"principal", "days": [{"day": "YYYY-MM-DD", "score", "high", "published"}]}``
            oldest first, from the context service's per-day history
            (``GET /v1/risk-history``, docs/context.md#risk-scores): ``score`` in force at the
            day's end, ``high`` the highest during it, None before anything is known.

        Raises:
            Problem: 400 for `days` out of range (the context service's own bound too); 503
                when the context service does not answer.

        """
        self.authorize(person, "view", "directory")
        if not 1 <= days <= 366:
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                "`days` must be 1 to 366",
                [FieldError(None, "days", "out of range")],
            )
        out: dict[str, Any] = self._run(
            "context service",
            self.context.risk_history,
            principal["type"],
            principal["id"],
            days,
        )
        return out

    # investigations

    def investigations(self, person: str, status: str | None = None) -> list[dict[str, Any]]:
        """Investigations, newest first, of one status (``view`` on ``investigations``)."""
        self.authorize(person, "view", "investigations")
        out: list[dict[str, Any]] = self._run(
            "context service", self.context.investigations, status
        )
        return out

    def close_investigation(self, person: str, inv_id: str, resolution: str) -> dict[str, Any]:
        """Closes an investigation as `person` (``administer`` on ``investigations``).

        Raises:
            Problem: 404 unknown; 409 already closed; 400 a resolution too long.

        """
        self.authorize(person, "administer", "investigations")
        out: dict[str, Any] = self._run(
            "context service", self.context.close_investigation, inv_id, person, resolution
        )
        return out

    # who can

    def who_can(
        self, person: str, action: str, resource: dict[str, str], principal_type: str, first: int
    ) -> dict[str, Any]:
        """Which principals of a type may take `action` on `resource` (``view`` on policies).

        The decision point's AuthZEN subject search (docs/search.md).

        Returns:
            ``{"results": [{type, id}], "next_token", "qid"}``.

        """
        self.authorize(person, "view", "policies")
        out = self._run(
            "decision point",
            self.pdp.search,
            "subject",
            {
                "subject": {"type": principal_type},
                "action": {"name": action},
                "resource": resource,
                "page": {"limit": self._page(first)},
            },
        )
        return {
            "results": out.get("results", []),
            "next_token": (out.get("page") or {}).get("next_token") or None,
            "qid": (out.get("context") or {}).get("qid"),
        }

    def reachable(
        self, person: str, principal: dict[str, str], action: str, resource_type: str, first: int
    ) -> dict[str, Any]:
        """Which resources of a type `principal` may take `action` on (``view`` on policies).

        The decision point's AuthZEN resource search (docs/search.md); answers as ``who_can``.
        """
        self.authorize(person, "view", "policies")
        out = self._run(
            "decision point",
            self.pdp.search,
            "resource",
            {
                "subject": principal,
                "action": {"name": action},
                "resource": {"type": resource_type},
                "page": {"limit": self._page(first)},
            },
        )
        return {
            "results": out.get("results", []),
            "next_token": (out.get("page") or {}).get("next_token") or None,
            "qid": (out.get("context") or {}).get("qid"),
        }

    # containments

    def containments(self, person: str) -> list[Any]:
        """Every contained principal (``view`` on ``containments``): ``Containment`` messages."""
        self.authorize(person, "view", "containments")
        c = self._need(self.challenge, "challenge service")
        out = self._run(
            "challenge service", c.call, "ListContainments", c.pb.ListContainmentsRequest()
        )
        return list(out.containments)

    def contain(self, person: str, principal: dict[str, str], reason: str) -> tuple[Any, bool]:
        """Contains a principal with `person` as author (``administer`` on containments).

        Every decision point following the containment feed then denies it (``svc:contained``).

        Returns:
            ``(Containment message, changed)``: ``changed`` False when it was contained before.

        """
        self.authorize(person, "administer", "containments")
        c = self._need(self.challenge, "challenge service")
        req = c.pb.ContainRequest(
            principal=c.pb.EntityRef(**principal), reason=reason, author=person
        )
        out = self._run("challenge service", c.call, "Contain", req)
        log.info("%s contained %s: %s", person, principal, reason)
        return out.containment, bool(out.changed)

    def lift(self, person: str, principal: dict[str, str], reason: str) -> bool:
        """Lifts a containment (``administer`` on ``containments``); False when there was none."""
        self.authorize(person, "administer", "containments")
        c = self._need(self.challenge, "challenge service")
        req = c.pb.LiftRequest(principal=c.pb.EntityRef(**principal), reason=reason, author=person)
        out = self._run("challenge service", c.call, "Lift", req)
        log.info("%s lifted %s: %s", person, principal, reason)
        return bool(out.changed)

    async def watch_containments(self, person: str) -> AsyncIterator[tuple[bool, Any]]:
        """Every containment, then each change as it happens (``view`` on ``containments``).

        Yields:
            ``(contained, Containment message)``: first one per contained principal (True),
            then each contain (True) and lift (False), as the challenge service's
            ``WatchContainments`` streams them; heartbeats are not yielded.

        Raises:
            Denied: the check refused (before the stream opens).
            Problem: 503 when the challenge service is not connected or the stream breaks.

        """
        await anyio.to_thread.run_sync(lambda: self.authorize(person, "view", "containments"))
        c = self._need(self.challenge, "challenge service")
        try:
            async for m in c.stream("WatchContainments", c.pb.WatchContainmentsRequest()):
                kind = m.WhichOneof("event")
                if kind == "list":
                    for x in m.list.containments:
                        yield True, x
                elif kind == "change":
                    yield bool(m.change.contained), m.change.containment
        except Unavailable as e:
            raise unavailable_problem(e) from None

    async def watch_my_challenges(self, person: str) -> AsyncIterator[Any]:
        """The person's challenges as they open and change: ``Challenge`` messages.

        Checked as ``view`` on ``challenges`` with ``context.own``; the challenge service's
        ``WatchChallenges(person)`` stream, heartbeats left out.

        Raises:
            Denied: the check refused (before the stream opens).
            Problem: 503 when the challenge service is not connected or the stream breaks.

        """
        await anyio.to_thread.run_sync(
            lambda: self.authorize(person, "view", "challenges", own=True)
        )
        c = self._need(self.challenge, "challenge service")
        try:
            req = c.pb.WatchChallengesRequest(person=person)
            async for m in c.stream("WatchChallenges", req):
                if m.WhichOneof("event") == "challenge":
                    yield m.challenge
        except Unavailable as e:
            raise unavailable_problem(e) from None

    async def watch_challenges(self, person: str, *, mine: bool) -> AsyncIterator[Any]:
        """Challenges as they open and change: the portal's queue, live.

        Args:
            person: the signed-in user.
            mine: only those `person` answers or approves (``view`` on ``challenges`` with
                ``context.own``; ``WatchChallenges(person)``); else everyone's (``view`` on
                ``challenges``; ``WatchChallenges(everyone)``, the newest 1,000).

        Yields:
            ``Challenge`` messages: every matching one first, then each that opens or changes
            state (expiry included); heartbeats are not yielded.

        Raises:
            Denied: the check refused (before the stream opens).
            Problem: 503 when the challenge service is not connected or the stream breaks.

        """
        await anyio.to_thread.run_sync(
            lambda: self.authorize(person, "view", "challenges", own=mine)
        )
        c = self._need(self.challenge, "challenge service")
        req = (
            c.pb.WatchChallengesRequest(person=person)
            if mine
            else c.pb.WatchChallengesRequest(everyone=True)
        )
        try:
            async for m in c.stream("WatchChallenges", req):
                if m.WhichOneof("event") == "challenge":
                    yield m.challenge
        except Unavailable as e:
            raise unavailable_problem(e) from None

    # challenges

    def challenges(
        self,
        person: str,
        *,
        mine: bool,
        state: int = 0,
        first: int = 50,
        principal: dict[str, str] | None = None,
    ) -> list[Any]:
        """Challenges, newest first: ``Challenge`` messages.

        Args:
            person: the signed-in user.
            mine: only those `person` answers or approves (``view`` on ``challenges`` with
                ``context.own``); else everyone's (``view`` on ``challenges``).
            state: a ``ChallengeState`` value (0: any).
            first: most challenges, 1 to ``max_page_size``.
            principal: ``{type, id}``: only the challenges of this principal's requests (the
                challenge service's ``ListChallenges`` filter; a principal's page).

        Raises:
            Problem: 400 for a principal without a type or an id; 503 without a challenge
                service.

        """
        self.authorize(person, "view", "challenges", own=mine)
        c = self._need(self.challenge, "challenge service")
        if principal is not None and not (principal.get("type") and principal.get("id")):
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                "a principal names its type and its id",
                [FieldError(None, "principal", "a type and an id")],
            )
        req = c.pb.ListChallengesRequest(
            principal=c.pb.EntityRef(**principal) if principal is not None else None,
            person=person if mine else "",
            state=state,
            limit=self._page(first),
        )
        out = self._run("challenge service", c.call, "ListChallenges", req)
        return list(out.challenges)

    def decide(self, person: str, qid: str, approve: bool, reason: str) -> Any:
        """Approves or rejects a challenge as its approver.

        Checked as ``administer`` on ``challenges`` with ``context.own``: only the challenge's
        approver may, which the challenge service checks too (it also asks the decision point
        whether the approver may ``approve``).

        Raises:
            Problem: 403 not the approver; 409 not pending or the justification missing; 404.

        """
        self.authorize(person, "administer", "challenges", own=True)
        c = self._need(self.challenge, "challenge service")
        req = c.pb.DecideRequest(qid=qid, approver=person, approve=approve, reason=reason)
        out = self._run("challenge service", c.call, "Decide", req)
        log.info("%s %s challenge %s", person, "approved" if approve else "rejected", qid)
        return out.challenge

    # security keys

    def security_keys(self, person: str, of: str | None = None) -> list[Any]:
        """A person's security keys, oldest first.

        Their own: ``view`` on ``keys`` with ``context.own``; someone else's: ``view`` on
        ``keys``.
        """
        whose = of or person
        self.authorize(person, "view", "keys", own=whose == person)
        c = self._need(self.challenge, "challenge service")
        out = self._run(
            "challenge service",
            c.call,
            "ListSecurityKeys",
            c.pb.ListSecurityKeysRequest(person=whose),
        )
        return list(out.keys)

    def remove_security_key(self, person: str, credential_id: str) -> None:
        """Removes one of the person's own keys (``administer`` on ``keys`` with ``own``)."""
        self.authorize(person, "administer", "keys", own=True)
        c = self._need(self.challenge, "challenge service")
        req = c.pb.RemoveSecurityKeyRequest(person=person, credential_id=credential_id)
        self._run("challenge service", c.call, "RemoveSecurityKey", req)

    def reset_security_keys(self, person: str, of: str, reason: str) -> int:
        """Removes every key of `of` (a lost key; ``administer`` on ``keys``).

        Recorded by the challenge service with `person` as author; returns how many went.
        """
        self.authorize(person, "administer", "keys", own=of == person)
        c = self._need(self.challenge, "challenge service")
        req = c.pb.ResetSecurityKeyRequest(person=of, reason=reason, author=person)
        out = self._run("challenge service", c.call, "ResetSecurityKey", req)
        log.info("%s reset the security keys of %s: %s", person, of, reason)
        return int(getattr(out, "removed", 0))

    # policies and enforcement

    def bundles(self, person: str, first: int = 50) -> list[Any]:
        """Bundle versions, newest first, without files (``view`` on ``policies``)."""
        self.authorize(person, "view", "policies")
        p = self._need(self.policy, "policy service")
        out = self._run(
            "policy service",
            p.call,
            "ListBundles",
            p.pb.ListBundlesRequest(limit=self._page(first)),
        )
        return list(out.bundles)

    def bundle(self, person: str, version: int | None) -> Any | None:
        """One bundle with its files (the active one for None; ``view`` on ``policies``)."""
        self.authorize(person, "view", "policies")
        p = self._need(self.policy, "policy service")
        try:
            if version is None:
                out = self._run("policy service", p.call, "GetActive", p.pb.GetActiveRequest())
            else:
                out = self._run(
                    "policy service", p.call, "GetBundle", p.pb.GetBundleRequest(version=version)
                )
        except Problem as e:
            if e.status == 404:
                return None
            raise
        return out.bundle if out.HasField("bundle") else None

    def create_draft(
        self, person: str, files: list[tuple[str, str]], comment: str
    ) -> tuple[Any | None, list[dict[str, Any]]]:
        """Validates files, stored as a draft by `person` (``administer`` on ``policies``).

        Returns:
            ``(Bundle, [])`` for a stored draft, or ``(None, errors)``: every problem of the
            validation as ``{"field": "file:line:column", "message"}`` (nothing is stored).

        """
        self.authorize(person, "administer", "policies")
        p = self._need(self.policy, "policy service")
        req = p.pb.CreateDraftRequest(
            files=[p.pb.BundleFile(name=n, content=c) for n, c in files],
            author=person,
            comment=comment,
        )
        try:
            out = self._run("policy service", p.call, "CreateDraft", req)
        except Problem as e:
            if e.status == 400 and e.errors:
                return None, [{"field": x.field, "message": x.message} for x in e.errors]
            raise
        return out.bundle, []

    def publish(self, person: str, version: int, accept_failing_tests: Sequence[str] = ()) -> Any:
        """Signs and activates a bundle version (``administer`` on ``policies``).

        The policy service decides the saved policy tests first and refuses (409,
        ``failed-precondition``, a field ``tests[<name>]`` per failing test) unless each failing
        test is named in `accept_failing_tests` (docs/policy.md#policy-tests).
        """
        self.authorize(person, "administer", "policies")
        p = self._need(self.policy, "policy service")
        req = p.pb.PublishRequest(
            version=version, author=person, accept_failing_tests=list(accept_failing_tests)
        )
        out = self._run("policy service", p.call, "Publish", req)
        log.info("%s published bundle version %s", person, version)
        return out.bundle

    def bundle_diff(
        self, person: str, version: int, against: int | None = None
    ) -> list[dict[str, str]]:
        """A bundle's difference from another, file by file (``view`` on ``policies``).

        Args:
            person: the signed-in user.
            version: the bundle (a draft, usually).
            against: the bundle compared with (None: the active one; none active: empty).

        Returns:
            ``[{"file", "change", "diff"}]`` sorted by file: ``change`` ``added``, ``removed``
            or ``changed``; ``diff`` a unified diff (``difflib``, 3 lines of context). Files
            equal in both are left out.

        Raises:
            Problem: 404 when either bundle does not exist.

        """
        self.authorize(person, "view", "policies")
        p = self._need(self.policy, "policy service")
        new = self._run(
            "policy service", p.call, "GetBundle", p.pb.GetBundleRequest(version=version)
        ).bundle
        if against is None:
            try:
                out = self._run("policy service", p.call, "GetActive", p.pb.GetActiveRequest())
                old_files = {f.name: f.content for f in out.bundle.files}
                old_name = f"active (v{out.bundle.version})"
            except Problem as e:
                if e.status != 404:
                    raise
                old_files, old_name = {}, "none active"
        else:
            old = self._run(
                "policy service", p.call, "GetBundle", p.pb.GetBundleRequest(version=against)
            ).bundle
            old_files, old_name = {f.name: f.content for f in old.files}, f"v{against}"
        new_files = {f.name: f.content for f in new.files}
        diffs = []
        for name in sorted(set(old_files) | set(new_files)):
            a, b = old_files.get(name), new_files.get(name)
            if a == b:
                continue
            change = "added" if a is None else "removed" if b is None else "changed"
            text = "".join(
                difflib.unified_diff(
                    (a or "").splitlines(keepends=True),
                    (b or "").splitlines(keepends=True),
                    fromfile=f"{old_name}/{name}",
                    tofile=f"v{version}/{name}",
                )
            )
            diffs.append({"file": name, "change": change, "diff": text})
        return diffs

    def dry_run(
        self, person: str, version: int, since: datetime, until: datetime | None, sample: int
    ) -> Any:
        """Decides a time range's recorded checks again under a bundle (``view`` on policies).

        The policy service's ``DryRun`` (docs/policy.md#dry-runs); `sample` (0 to 1,000)
        changed decisions are listed.

        Returns:
            The ``DryRunResponse`` message: counts of changes and a sample of changed decisions.

        Raises:
            Problem: 404 unknown version; 503 when the policy service has no history.

        """
        self.authorize(person, "view", "policies")
        p = self._need(self.policy, "policy service")
        req = p.pb.DryRunRequest(version=version, sample=max(0, min(sample, 1000)))
        req.since.FromDatetime(since.astimezone(UTC))
        if until is not None:
            req.until.FromDatetime(until.astimezone(UTC))
        return self._run("policy service", p.call, "DryRun", req)

    # policy tests (docs/portal.md#policy-tests)

    def save_decision_as_test(
        self, person: str, qid: str, name: str, expect: str | None = None
    ) -> Any:
        """Saves a recorded decision as a policy test (``administer`` on ``policies``).

        The test's request is the decision's principal, action, resource and ``on_behalf_of``
        (the context a caller sent is not recorded: none); its entities a snapshot of the
        context service's records now (``_decision_entities``); the principals the decision
        found contained (``svc:contained``) and its risk score; the verdict expected is the
        recorded one unless `expect` says otherwise. The policy service records the test as
        saved by ``<person> via <portal>`` (docs/policy.md#policy-tests).

        Args:
            person: the signed-in user.
            qid: the recorded decision.
            name: the test's name (1 to 128 printable characters, unique).
            expect: ``allow``, ``deny`` or ``challenge``; None: the recorded verdict.

        Returns:
            The ``SaveTestResponse`` message: the stored test and its result under the active
            bundle.

        Raises:
            Problem: 404 for an unknown qid; 400 naming every bad field; 409 for a name in use;
                503 without a history, a policy service or a context service that answers.

        """
        self.authorize(person, "administer", "policies")
        h = self._need(self.history, "history")
        p = self._need(self.policy, "policy service")
        row = self._run("history", h.decision, qid)
        if row is None:
            raise Problem(
                404,
                "not-found",
                "Not found",
                f"no decision `{qid}` in the history",
                [FieldError(None, "qid", "unknown")],
            )
        pb = p.pb
        request = pb.TestRequest(
            principal=pb.EntityRef(**row["principal"]),
            action=str(row.get("action") or ""),
            resource=pb.EntityRef(**(row.get("resource") or {"type": "", "id": ""})),
        )
        if row.get("on_behalf_of"):
            request.on_behalf_of.CopyFrom(pb.EntityRef(**row["on_behalf_of"]))
        contained = []
        if "svc:contained" in (row.get("policies") or []):
            contained.append(pb.EntityRef(**row["principal"]))
        outcome = row.get("on_behalf_of_outcome") or {}
        if row.get("on_behalf_of") and "svc:contained" in (outcome.get("policies") or []):
            contained.append(pb.EntityRef(**row["on_behalf_of"]))
        scores = []
        if row.get("risk_score") is not None:
            scores.append(
                pb.TestRiskScore(
                    principal=pb.EntityRef(**row["principal"]), score=int(row["risk_score"])
                )
            )
        entities = []
        for e in self._decision_entities(row):
            st = struct_pb2.Struct()
            st.update(e)
            entities.append(st)
        test = pb.PolicyTest(
            name=name,
            request=request,
            entities=entities,
            expect=expect if expect is not None else str(row.get("verdict") or ""),
            from_decision=qid,
            contained=contained,
            risk_scores=scores,
        )
        out = self._run(
            "policy service", p.call, "SaveTest", pb.SaveTestRequest(test=test, author=person)
        )
        log.info("%s saved decision %s as the policy test %r", person, qid, name)
        return out

    def _decision_entities(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The context service's records of a decision's parties now, as Cedar entities.

        The principal and the person it acted for (a person with their profile and groups, or
        a registered service account with its owner, as ``Engine.register_service_accounts``
        makes it), a service account's owner, and the resource: what "what if"
        (``_directory_records``) decides with, taken once so a saved test keeps it.

        Raises:
            Problem: 503 when the context service does not answer.

        """
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        people = [r for r in (row.get("principal"), row.get("on_behalf_of")) if r]
        while people:
            ref = people.pop(0)
            key = (ref["type"], ref["id"])
            if key in seen or not ref.get("id"):
                continue
            seen.add(key)
            if ref["type"] == "ServiceAccount":
                sa = self._run("context service", self.context.service_account, ref["id"])
                if sa is None:
                    continue
                owner = str(sa.get("owner") or "")
                out.append(
                    {
                        "uid": ref,
                        "attrs": {
                            "owner": {"__entity": {"type": PERSON_TYPE, "id": owner}},
                            "ai": bool(sa.get("ai")),
                            "registered": True,
                            "app": str(sa.get("app") or ref["id"].split(".", 1)[0]),
                            "description": str(sa.get("description") or ""),
                        },
                        "parents": [{"type": "Group", "id": g} for g in sa.get("groups") or []],
                    }
                )
                if owner:
                    people.append({"type": PERSON_TYPE, "id": owner})
            elif ref["type"] == PERSON_TYPE:
                p = self._run("context service", self.context.person, ref["id"])
                if p is not None and not p.get("removed"):
                    out.append(person_entity(ref, p))  # as "what if" loads it
        res = row.get("resource") or {}
        if res.get("id") and (res["type"], res["id"]) not in seen:
            out.extend(self._run("context service", self.context.resources, [res]))
        return out

    def policy_tests(self, person: str) -> list[Any]:
        """Every saved policy test, by name (``view`` on ``policies``)."""
        self.authorize(person, "view", "policies")
        p = self._need(self.policy, "policy service")
        return list(self._run("policy service", p.call, "ListTests", p.pb.ListTestsRequest()).tests)

    def delete_policy_test(self, person: str, name: str) -> bool:
        """Deletes a policy test (``administer`` on ``policies``); 404 for an unknown name."""
        self.authorize(person, "administer", "policies")
        p = self._need(self.policy, "policy service")
        req = p.pb.DeleteTestRequest(name=name, author=person)
        self._run("policy service", p.call, "DeleteTest", req)
        log.info("%s deleted the policy test %r", person, name)
        return True

    def run_policy_tests(self, person: str, version: int = 0) -> Any:
        """Every saved test decided under a bundle version, 0 the active one (``view``).

        Returns:
            The ``TestRun`` message.

        """
        self.authorize(person, "view", "policies")
        p = self._need(self.policy, "policy service")
        req = p.pb.RunTestsRequest(version=version)
        return self._run("policy service", p.call, "RunTests", req).tests

    def outage_fallbacks(self, person: str) -> list[Any]:
        """Every outage tier entry of the gateway, sorted (``view`` on ``enforcement``)."""
        self.authorize(person, "view", "enforcement")
        p = self._need(self.policy, "policy service")
        req = p.pb.GetOutageFallbackRequest(tool="")
        return list(self._run("policy service", p.call, "GetOutageFallback", req).fallbacks)

    def set_outage_fallback(self, person: str, tool: str, tier: int, reason: str) -> Any:
        """Sets a tool's outage tier with `person` as author (``administer`` on enforcement).

        Args:
            person: the signed-in user.
            tool: ``<upstream>/<tool>``, ``<upstream>/*`` or ``*``.
            tier: an ``OutageTier`` value (1 fail closed, 2 cached, 3 fail open).
            reason: why (recorded).

        """
        self.authorize(person, "administer", "enforcement")
        p = self._need(self.policy, "policy service")
        req = p.pb.SetOutageFallbackRequest(tool=tool, tier=tier, author=person, reason=reason)
        out = self._run("policy service", p.call, "SetOutageFallback", req)
        log.info("%s set the outage tier of %s to %s", person, tool, tier)
        return out.fallback

    def enforcement(self, person: str) -> Any:
        """The install's mode and the containment mode (``view`` on ``enforcement``)."""
        self.authorize(person, "view", "enforcement")
        p = self._need(self.policy, "policy service")
        return self._run(
            "policy service", p.call, "GetEnforcement", p.pb.GetEnforcementRequest()
        ).enforcement

    def enforcement_changes(self, person: str, first: int = 50) -> list[Any]:
        """The modes' change log, newest first (``view`` on ``enforcement``)."""
        self.authorize(person, "view", "enforcement")
        p = self._need(self.policy, "policy service")
        out = self._run(
            "policy service",
            p.call,
            "ListEnforcementChanges",
            p.pb.ListEnforcementChangesRequest(limit=self._page(first)),
        )
        return list(out.changes)

    def set_enforcement(self, person: str, containment: bool, mode: int, reason: str) -> Any:
        """Sets the install's (or the containment) mode (``administer`` on ``enforcement``).

        Recorded with `person` as author; answers both modes.
        """
        self.authorize(person, "administer", "enforcement")
        p = self._need(self.policy, "policy service")
        scope = p.pb.MODE_SCOPE_CONTAINMENT if containment else p.pb.MODE_SCOPE_INSTALL
        req = p.pb.SetEnforcementRequest(scope=scope, mode=mode, author=person, reason=reason)
        out = self._run("policy service", p.call, "SetEnforcement", req)
        log.info(
            "%s set the %s mode to %s", person, "containment" if containment else "install", mode
        )
        return out.enforcement

    def enforcement_impact(
        self, person: str, hours: Sequence[int] = (24, 168), *, now: datetime | None = None
    ) -> list[dict[str, Any]]:
        """What switching each mode scope from monitor to enforce would have turned into denials.

        For each window of the last `hours` (docs/portal.md#the-web-app): the install scope's
        monitor-mode checks and plans that enforcement would have denied or challenged
        (``would_deny``/``would_challenge`` of the history's aggregate, one ``GET
        /v1/history/stats?top=0`` by the hour over the longest window, summed per window), and the
        containment scope's would-contains (the reasoner's ``would_contain`` investigations
        opened in the window, docs/reasoner.md). A window of ``h`` hours is the current hour
        and the ``h - 1`` before it, so it starts at a full hour (``since``).

        Args:
            person: the signed-in user (``view`` on ``enforcement`` and ``decisions``; the
                would-contains need ``view`` on ``investigations``, else they are None).
            hours: the windows, 1 to 24 * 90 hours each, at most 8 of them.
            now: the current time (default: the clock).

        Returns:
            One ``{"hours", "since", "until", "would_deny", "would_challenge",
            "would_contain"}`` per window, in the order given (``since``/``until`` aware
            UTC datetimes; ``would_contain`` None when the person may not view investigations).

        Raises:
            Problem: 400 for a window out of range; 503 without a history or a context service
                that does not answer.

        """
        self.authorize(person, "view", "enforcement")
        self.authorize(person, "view", "decisions")
        h = self._need(self.history, "history")
        if not 1 <= len(hours) <= 8 or any(not 1 <= x <= 24 * 90 for x in hours):
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                "`hours`: 1 to 8 windows of 1 to 2160 hours each",
                [FieldError(None, "hours", "1 to 8 windows of 1 to 2160 hours")],
            )
        end = now or datetime.now(UTC)
        hour = end.replace(minute=0, second=0, microsecond=0)
        starts = {x: hour - timedelta(hours=x - 1) for x in hours}
        stats: dict[str, Any] = self._run(
            "history",
            partial(
                h.stats,
                since=_rfc3339(min(starts.values())),
                until=_rfc3339(end),
                bucket="hour",
                top=0,  # the buckets alone: no ranking of the denied is read
            ),
        )
        buckets = [
            (b["at"] if isinstance(b["at"], datetime) else datetime.fromisoformat(str(b["at"])), b)
            for b in stats["buckets"]
        ]
        contains: list[datetime] | None
        try:
            self.authorize(person, "view", "investigations")
        except Denied:
            contains = None
        else:
            rows = self._run(
                "context service", partial(self.context.investigations, kind="would_contain")
            )
            contains = [datetime.fromisoformat(r["opened_at"]) for r in rows if r.get("opened_at")]
        out = []
        for x in hours:
            since = starts[x]
            inside = [b for at, b in buckets if at >= since]
            out.append(
                {
                    "hours": x,
                    "since": since,
                    "until": end,
                    "would_deny": sum(int(b.get("would_deny", 0)) for b in inside),
                    "would_challenge": sum(int(b.get("would_challenge", 0)) for b in inside),
                    "would_contain": None
                    if contains is None
                    else sum(1 for t in contains if since <= t <= end),
                }
            )
        return out

    def close(self) -> None:
        """Closes the clients' connections."""
        for c in (self.pdp, self.context, self.challenge, self.policy, self.history):
            if c is not None:
                c.close()
