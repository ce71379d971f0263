"""Least privilege per method: which caller roles may call each method of each service.

docs/auth.md#roles-and-methods. A caller's token names it (``sub``); each component's settings
give every admitted ``sub`` a role (``SVC_<COMPONENT>_AUTH_ROLES``, ``Role``), and every method
of every API admits only the roles this module's ``METHODS`` table lists for it:

* decision points (``pdp``) and MCP gateways (``gateway``) read the active bundle, the modes,
  the outage tiers, principals and resources, resolve challenges and follow containments;
* the connectors (``connectors``) write resources and work items and read the directory they
  map owners from;
* the reasoner (``reasoner``) reads principals and the mode, writes risk scores and
  investigations, lists and adds containments (``Contain``);
* the challenge service (``challenge``) reads the directory (owners, managers) and asks the
  decision point whether an approver may approve;
* the policy service (``policy``) reads principals and resources by id, as a decision point
  does, to decide a dry run's recorded checks (docs/policy.md#dry-runs);
* enforcement points (``app``) and ``svc demo``'s traffic (``demo``) call the decision point;
* the portal (``portal``) and the admin's command line (``operator``) everything else; the
  portal, which acts for people, not the machine feeds' writes (resources, work items, risk).

The table is the one source: the services check it (``allowed``; ``svc.common.auth``), the chart
and ``svc up``/``svc topology`` give each caller its role, ``tests/test_roles.py`` calls every
method with every role, and docs/auth.md's matrix is checked against it.

Method names: HTTP routes as ``"<METHOD> <path>"`` with the route's path template
(``"GET /v1/directory/people/{user_name}"``); gRPC methods by name (``"GetActive"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from svc.common.component import Role

__all__ = [
    "METHODS",
    "ROLES",
    "SERVICES",
    "admitted",
    "allowed",
    "check_roles",
    "markdown_matrix",
    "roles_of",
]

#: Every role, in the order docs/auth.md's tables list them.
ROLES: tuple[str, ...] = (
    Role.OPERATOR,
    Role.PORTAL,
    Role.PDP,
    Role.GATEWAY,
    Role.CHALLENGE,
    Role.REASONER,
    Role.POLICY,
    Role.CONNECTORS,
    Role.APP,
    Role.DEMO,
)

_ADMIN = frozenset({Role.OPERATOR, Role.PORTAL})
#: Decision points and gateways: what they follow and resolve.
_FOLLOW = _ADMIN | {Role.PDP, Role.GATEWAY}


def _r(*roles: str) -> frozenset[str]:
    return frozenset(roles)


#: The gRPC services' full names, by component (the Connect/gRPC paths' first part).
SERVICES: dict[str, str] = {
    "pdp": "svc.authz.v1.Authorizer",
    "policy": "svc.policy.v1.PolicyService",
    "challenge": "svc.challenge.v1.ChallengeService",
}

_DECIDE = _r(Role.OPERATOR, Role.PORTAL, Role.GATEWAY, Role.CHALLENGE, Role.APP, Role.DEMO)

#: component -> method -> the roles that may call it (module docs).
METHODS: dict[str, dict[str, frozenset[str]]] = {
    "pdp": {
        # Every method of the decision point decides; none changes anything.
        "POST /v1/access/evaluation": _DECIDE,
        "POST /v1/access/plan": _DECIDE,
        "POST /v1/access/challenge": _DECIDE,
        "POST /access/v1/evaluation": _DECIDE,
        "POST /access/v1/evaluations": _DECIDE,
        "POST /access/v1/search/subject": _DECIDE,
        "POST /access/v1/search/resource": _DECIDE,
        "POST /access/v1/search/action": _DECIDE,
        "Check": _DECIDE,
        "BatchCheck": _DECIDE,
        "WaitForChallenge": _DECIDE,
        "Plan": _DECIDE,
    },
    "policy": {
        "CreateDraft": _ADMIN,
        "Publish": _ADMIN,
        "GetActive": _FOLLOW,
        "WatchActive": _FOLLOW,
        "ListBundles": _ADMIN,
        "GetBundle": _ADMIN,
        "GetEnforcement": _FOLLOW | {Role.REASONER},
        "SetEnforcement": _ADMIN,
        "ListEnforcementChanges": _ADMIN,
        "GetOutageFallback": _FOLLOW,
        "SetOutageFallback": _ADMIN,
        "BreakGlassRollback": _ADMIN,
        "DryRun": _ADMIN,
        "SaveTest": _ADMIN,
        "ListTests": _ADMIN,
        "DeleteTest": _ADMIN,
        "RunTests": _ADMIN,
    },
    "challenge": {
        "Resolve": _FOLLOW,
        "GetChallenge": _FOLLOW,
        "WatchChallenges": _FOLLOW,
        "ListChallenges": _ADMIN,
        "Justify": _ADMIN,
        "Decide": _ADMIN,
        "Contain": _ADMIN | {Role.REASONER},
        "Lift": _ADMIN,
        "ListContainments": _FOLLOW | {Role.REASONER},
        "WatchContainments": _FOLLOW,
        "ListSecurityKeys": _ADMIN,
        "BeginKeyRegistration": _ADMIN,
        "FinishKeyRegistration": _ADMIN,
        "BeginKeyChange": _ADMIN,
        "RemoveSecurityKey": _ADMIN,
        "ResetSecurityKey": _ADMIN,
        "BeginVerification": _ADMIN,
        "FinishVerification": _ADMIN,
    },
    "context": {
        "GET /v1/principals": _FOLLOW | {Role.REASONER, Role.POLICY},
        "GET /v1/principals/watch": _FOLLOW,
        "GET /v1/feeds": _FOLLOW,
        "POST /v1/resources": _r(Role.OPERATOR, Role.CONNECTORS),
        "GET /v1/resources": _FOLLOW,
        "POST /v1/resources/get": _FOLLOW | {Role.POLICY},
        "POST /v1/resources/delete": _r(Role.OPERATOR, Role.CONNECTORS),
        "GET /v1/resources/changes": _FOLLOW,
        "POST /v1/work-items": _r(Role.OPERATOR, Role.CONNECTORS),
        "POST /v1/work-items/get": _FOLLOW,
        "POST /v1/work-items/delete": _r(Role.OPERATOR, Role.CONNECTORS),
        "GET /v1/work-items/changes": _FOLLOW,
        "POST /v1/service-accounts": _ADMIN,
        "GET /v1/service-accounts": _ADMIN,
        "GET /v1/service-accounts/{sa_id}/changes": _ADMIN,
        "GET /v1/service-accounts/{sa_id}": _FOLLOW | {Role.CHALLENGE},
        "DELETE /v1/service-accounts/{sa_id}": _ADMIN,
        "POST /v1/risk": _r(Role.OPERATOR, Role.REASONER),
        "GET /v1/risk": _ADMIN | {Role.REASONER},
        "GET /v1/risk/{principal_type}/{principal_id}": _ADMIN | {Role.REASONER},
        "GET /v1/risk-history/{principal_type}/{principal_id}": _ADMIN,
        "GET /v1/directory/people": _ADMIN | {Role.CHALLENGE, Role.CONNECTORS},
        "GET /v1/directory/people/{user_name}": _ADMIN | {Role.CHALLENGE, Role.CONNECTORS},
        "GET /v1/directory/groups": _ADMIN | {Role.CHALLENGE, Role.CONNECTORS},
        "GET /v1/directory/groups/{name}": _ADMIN | {Role.CHALLENGE, Role.CONNECTORS},
        "GET /v1/directory/service-accounts": _ADMIN | {Role.CHALLENGE},
        "GET /v1/directory/trusted-apps": _ADMIN | {Role.GATEWAY},
        "POST /v1/directory/trusted-apps": _ADMIN,
        "DELETE /v1/directory/trusted-apps/{name}": _ADMIN,
        "POST /v1/investigations": _ADMIN | {Role.REASONER},
        "GET /v1/investigations": _ADMIN | {Role.REASONER},
        "POST /v1/investigations/{inv_id}/close": _ADMIN | {Role.REASONER},
    },
    "history": {
        "GET /v1/history/totals": _ADMIN,
        "GET /v1/history/decisions": _ADMIN,
        "GET /v1/history/decisions/search": _ADMIN,
        "GET /v1/history/events": _ADMIN,
        "GET /v1/history/counts": _ADMIN,
        "GET /v1/history/stats": _ADMIN,
    },
    # Run a cycle now (``svc reasoner cycle --data-dir``: svc up's reasoner owns the history's
    # chDB directory, so the command asks it; docs/reasoner.md#commands).
    "reasoner": {
        "POST /v1/cycles": _r(Role.OPERATOR),
    },
}


def allowed(component: str, method: str) -> frozenset[str]:
    """The roles that may call `method` of `component`.

    Args:
        component: ``pdp``, ``policy``, ``challenge``, ``context``, ``history`` or ``reasoner``.
        method: ``"<METHOD> <path template>"`` or a gRPC method's name (module docs).

    Returns:
        The roles (``Role`` values); empty for a method the table does not list, which no one
        may call (a route added without a row is refused, never open).

    """
    return METHODS.get(component, {}).get(method, frozenset())


def roles_of(component: str) -> frozenset[str]:
    """Every role that may call some method of `component` (who its settings need list)."""
    return frozenset().union(*METHODS.get(component, {}).values())


def admitted(component: str, caller_roles: Mapping[str, str]) -> list[str]:
    """The callers of `caller_roles` whose role may call some method of `component`.

    The decision point's Rust listener admits callers by ``sub``, and every one of its
    methods admits the same roles, so the callers whose role it admits are what it is given.

    Args:
        component: ``pdp``, ...
        caller_roles: ``{sub: role}`` (``AuthSettings.caller_roles``).

    Returns:
        Their ``sub`` values, sorted.

    """
    roles = roles_of(component)
    return sorted(sub for sub, role in caller_roles.items() if role in roles)


def check_roles(roles: Mapping[str, str] | Iterable[tuple[str, str]], where: str) -> None:
    """Checks that every role of a ``{sub: role}`` setting is one of ``ROLES``.

    Args:
        roles: the setting's pairs.
        where: the setting's name, for the message (``SVC_POLICY_AUTH_ROLES``).

    Raises:
        ValueError: a role is unknown (each named, with the known ones).

    """
    pairs = roles.items() if isinstance(roles, Mapping) else roles
    bad = sorted({role for _, role in pairs if role not in ROLES})
    if bad:
        raise ValueError(
            f"{where}: unknown role{'s' if len(bad) > 1 else ''} "
            + ", ".join(f"`{b[:64]}`" for b in bad)
            + f"; the roles are {', '.join(ROLES)} (docs/auth.md)"
        )


#: The headings of docs/auth.md's matrix, by component.
TITLES = {
    "pdp": "The decision point",
    "policy": "The policy service",
    "challenge": "The challenge service",
    "context": "The context service",
    "history": "The history",
    "reasoner": "The reasoner",
}


def markdown_matrix() -> str:
    """docs/auth.md's method matrix, made from ``METHODS``: one table per component.

    Returns:
        Markdown: per component a ``### <title> (`<component>`)`` heading and a table of its
        methods (rows) by ``ROLES`` (columns), ``yes`` where the role may call the method.
        ``python -m svc.common.roles`` prints it; ``tests/test_roles.py`` checks the page.

    """
    out: list[str] = []
    for component, methods in METHODS.items():
        out += [f"### {TITLES[component]} (`{component}`)", ""]
        out.append("| Method | " + " | ".join(ROLES) + " |")
        out.append("|---|" + "---|" * len(ROLES))
        for method, roles in methods.items():
            cells = ["yes" if r in roles else "" for r in ROLES]
            out.append(f"| `{method}` | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown_matrix(), end="")
