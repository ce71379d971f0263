"""The demo company provisioned through the context service, as a real install is (docs/demo.md).

An identity provider creates people and groups over SCIM 2.0 (RFC 7644), connectors write
resources and work items through the batch routes, agents are registered through the
service-account route and the reasoner posts risk scores (docs/context.md). ``provision_context``
does each of these for a ``Company`` against a running context service, over HTTP with the same
requests, so ``svc up`` exercises the paths a real install uses. The containment list is not the
context service's: ``provision_containments`` writes it to the challenge service with
``Contain``, as the reasoner or the portal would (docs/challenges.md#containments), and every
decision point following that service denies the contained (``company.provision`` loads it
straight into an engine for the tests without services).
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from svc.demo.company import Company, Person

__all__ = ["ContextProvisioned", "ProvisionError", "provision_containments", "provision_context"]

#: SCIM schema URNs (RFC 7643 sections 4.1, 4.2 and 4.3; RFC 7644 section 3.5.2).
USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
ENTERPRISE_SCHEMA = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:PatchOp"

#: Items per batch write; the context service takes up to ``max_batch_items`` (1,000 by default).
BATCH = 500

Json = dict[str, Any]


class ProvisionError(RuntimeError):
    """The context service refused a provisioning request.

    The message names the request, the status and the problem's ``detail``.
    """


@dataclass(frozen=True)
class ContextProvisioned:
    """What ``provision_context`` wrote: counts of each kind, and the SCIM id of each person."""

    people: int
    groups: int
    resources: int
    work_items: int
    service_accounts: int
    risk_scores: int
    principals_version: int


def _check(r: httpx.Response, what: str) -> Json:
    """The JSON body of a 2xx answer.

    Raises:
        ProvisionError: any other status (the message has the problem's ``detail``).

    """
    if r.is_success:
        return r.json() if r.content else {}
    try:
        detail = r.json().get("detail") or r.text
    except ValueError:
        detail = r.text
    raise ProvisionError(f"{what}: {r.status_code} {str(detail)[:500]}")


def _user_doc(p: Person, manager_id: str | None) -> Json:
    """The SCIM User an identity provider sends for ``p`` (RFC 7643 sections 4.1 and 4.3)."""
    enterprise: Json = {"department": p.department}
    if manager_id is not None:
        enterprise["manager"] = {"value": manager_id}
    return {
        "schemas": [USER_SCHEMA, ENTERPRISE_SCHEMA],
        "userName": p.user_name,
        "displayName": p.name,
        "name": {"formatted": p.name},
        "title": p.title,
        "active": p.active,
        ENTERPRISE_SCHEMA: enterprise,
    }


def _group_order(groups: dict[str, tuple[str, ...]]) -> list[str]:
    """Group names, every group before the groups that contain it.

    SCIM members must exist when a group naming them is created (RFC 7643 section 4.2).
    """
    contains: dict[str, set[str]] = {g: set() for g in groups}
    for g, parents in groups.items():
        for p in parents:
            contains.setdefault(p, set()).add(g)
    return list(graphlib.TopologicalSorter(contains).static_order())


def _chunks(items: Sequence[Json], size: int = BATCH) -> Iterator[Sequence[Json]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def provision_context(
    base_url: str,
    company: Company,
    *,
    scim_token: str,
    token: Callable[[], str | None] = lambda: None,
    timeout: float = 30.0,
    connected: bool = False,
) -> ContextProvisioned:
    """Writes ``company`` into a running context service with the requests a real install sends.

    1. People: ``POST /scim/v2/Users`` each (core and enterprise schemas: ``title``, ``active``,
       ``department``, ``manager`` by SCIM id), in the company's order (the CEO first, every
       manager before their reports; a manager created later is set by ``PATCH``).
    2. Groups: ``POST /scim/v2/Groups`` each, contained groups first, members being the people
       and groups directly in it (RFC 7643 section 4.2).
    3. Folders and the documents, tickets and customers: ``POST /v1/resources`` in batches.
    4. Work items: ``POST /v1/work-items``; registered service accounts:
       ``POST /v1/service-accounts``; the reasoner's scores: ``POST /v1/risk``.

    Args:
        base_url: the context service, e.g. ``http://127.0.0.1:8084``.
        company: from ``svc.demo.company.generate``.
        scim_token: the identity provider's bearer token (``SVC_CONTEXT_SCIM_TOKEN``).
        token: returns the bearer JWT for the ``/v1`` routes (docs/auth.md, audience
            ``svc-context``), or None when the service runs without auth.
        timeout: seconds per request.
        connected: the demo's connectors bring the folders, documents and work items (from
            the Drive and Jira fakes, ``svc.demo.sources``; docs/connectors.md#the-local-fakes),
            so they are left out here; tickets and customers are still written.

    Returns:
        The counts written and the ``principals_version`` after the last write.

    Raises:
        ProvisionError: a request was refused (the directory is then partly provisioned: start
            from an empty database again).
        httpx.HTTPError: the service could not be reached.

    """
    scim_headers = {
        "Authorization": f"Bearer {scim_token}",
        "Content-Type": "application/scim+json",
    }
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout) as http:

        def v1(path: str, body: Json) -> Json:
            t = token()
            headers = {"Authorization": f"Bearer {t}"} if t else {}
            return _check(http.post(path, json=body, headers=headers), f"POST {path}")

        ids: dict[str, str] = {}
        late: list[Person] = []
        for p in company.people:
            mgr = ids.get(p.manager) if p.manager else None
            if p.manager and mgr is None:
                late.append(p)
            r = http.post("/scim/v2/Users", json=_user_doc(p, mgr), headers=scim_headers)
            ids[p.user_name] = str(_check(r, f"POST /scim/v2/Users {p.user_name}")["id"])
        for p in late:
            assert p.manager is not None
            patch = {
                "schemas": [PATCH_SCHEMA],
                "Operations": [
                    {
                        "op": "replace",
                        "path": f"{ENTERPRISE_SCHEMA}:manager",
                        "value": {"value": ids[p.manager]},
                    }
                ],
            }
            r = http.patch(f"/scim/v2/Users/{ids[p.user_name]}", json=patch, headers=scim_headers)
            _check(r, f"PATCH /scim/v2/Users {p.user_name}")

        group_ids: dict[str, str] = {}
        members: dict[str, list[Json]] = {g: [] for g in company.groups}
        for g, parents in company.groups.items():
            for parent in parents:
                members.setdefault(parent, []).append({"_group": g})
        for p in company.people:
            for g in p.groups:
                members.setdefault(g, []).append({"value": ids[p.user_name], "type": "User"})
        for g in _group_order(company.groups):
            listed = [
                {"value": group_ids[m["_group"]], "type": "Group"} if "_group" in m else m
                for m in members.get(g, [])
            ]
            doc = {"schemas": [GROUP_SCHEMA], "displayName": g, "members": listed}
            r = http.post("/scim/v2/Groups", json=doc, headers=scim_headers)
            group_ids[g] = str(_check(r, f"POST /scim/v2/Groups {g}")["id"])

        folders = [{"type": "Folder", "id": d, "attrs": {}} for d in company.departments()]
        resources: list[Json] = [] if connected else [*folders]
        documents = () if connected else company.documents
        for res in (*documents, *company.tickets, *company.customers):
            resources.append(
                {
                    "type": res.type,
                    "id": res.id,
                    "attrs": res.attrs,
                    "parents": [{"type": "Folder", "id": f} for f in res.parents],
                }
            )
        for chunk in _chunks(resources):
            v1("/v1/resources", {"resources": list(chunk)})
        items = [] if connected else [w.record() for w in company.work_items]
        for chunk in _chunks(items):
            v1("/v1/work-items", {"work_items": list(chunk)})
        accounts = [sa.record() for sa in company.service_accounts if sa.registered]
        v1("/v1/service-accounts", {"service_accounts": accounts})
        scores = [
            {"principal": {"type": "Human", "id": u}, "score": s}
            for u, s in company.risk_scores.items()
        ]
        v1("/v1/risk", {"scores": scores})
        t = token()
        headers = {"Authorization": f"Bearer {t}"} if t else {}
        snap = _check(http.get("/v1/principals", headers=headers), "GET /v1/principals")
    return ContextProvisioned(
        people=len(ids),
        groups=len(group_ids),
        resources=len(resources),
        work_items=len(items),
        service_accounts=len(accounts),
        risk_scores=len(scores),
        principals_version=int(snap["principals_version"]),
    )


#: ``author`` the demo's ``Contain`` requests name; the challenge service records the caller
#: instead when it checks tokens (svc up's operator, ``svc-local``; docs/auth.md).
CONTAIN_AUTHOR = "svc-up-demo"


def provision_containments(
    url: str, company: Company, token: Callable[[], str | None] = lambda: None
) -> int:
    """Contains the demo company's contained people through the challenge service (``Contain``).

    Args:
        url: the challenge service (``http://host:port``; gRPC over h2c).
        company: the demo company; ``company.contained`` names the people (``Human``).
        token: returns the bearer token for each call (audience ``svc-challenge``), or None.

    Returns:
        How many were newly contained (one already contained keeps its first containment).

    Raises:
        ProvisionError: the service refused a call, or could not be reached (the message names
            the person and the gRPC status).

    """
    import grpc

    from svc.challenge.v1 import challenge_pb2 as pb
    from svc.challenge.v1 import challenge_pb2_grpc as pb_grpc

    target = url.removeprefix("http://").rstrip("/")
    new = 0
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.ChallengeServiceStub(channel)  # type: ignore[no-untyped-call]
        for user in company.contained:
            bearer = token()
            metadata = [("authorization", f"Bearer {bearer}")] if bearer else []
            try:
                r = stub.Contain(
                    pb.ContainRequest(
                        principal=pb.EntityRef(type="Human", id=user),
                        reason="demo: the reasoner saw odd downloads",
                        author=CONTAIN_AUTHOR,
                    ),
                    metadata=metadata,
                    timeout=30,
                )
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                details = e.details() if isinstance(e, grpc.Call) else str(e)
                raise ProvisionError(f"Contain Human::{user}: {code}: {details}") from e
            new += int(r.changed)
    return new
