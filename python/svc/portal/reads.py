"""What the deciding policies of a decision read, with the values svc can know.

The decision core outlines each policy (``svc._pdp_core.outline_policies``: Cedar's parse, the
attribute paths a policy reads or tests with ``has``, the entity literals it names). This module
puts a value beside each path for one recorded decision (docs/portal.md#explanations):

* ``context.*``: the decision record keeps no request context (docs/history.md#schema), only what
  the decision point filled in itself: ``context.risk_score`` (the reasoner's score the check
  used, when it used one), ``context.assigned`` and ``context.work_item`` (when the record's work
  item was open and linked the resource). Those come from the record (``source`` ``decision``,
  ``as_of`` the decision's time); any other context path is ``unknown``.
* ``principal.*``, ``resource.*`` and paths off an entity literal: the entity as the decision
  point would hold it **now** (``as_of`` the time of reading), not at decision time: a person
  or service account from the context service's directory (the same attributes the decision
  point's follower loads, docs/context.md#principals), any other entity from the context
  service's resources, else from the active bundle's ``entities.json``. Entity-valued attributes
  (``resource.owner.manager``) are followed the same way.
* ``action.*`` and paths read off other expressions: ``unknown``.

Each path's ``status`` is ``value`` (found), ``absent`` (the entity or record holds no such
attribute: a ``has`` test is false) or ``unknown`` (svc cannot tell; ``note`` says why).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypedDict

from svc.pdp.outline_shapes import PolicyRead
from svc.portal.clients import ContextClient, Refused, Unavailable

__all__ = ["EntityLookup", "ReadValue", "bundle_entities", "person_entity", "read_values"]

log = logging.getLogger("svc.portal")

Source = Literal["decision", "directory", "bundle"]
#: The context fields the decision point fills in and the decision record keeps.
_RECORDED_CONTEXT = ("risk_score", "assigned", "work_item")
#: Entity-valued attributes followed at most this deep (Cedar's entity depth limit is larger;
#: a path in a policy is short).
_MAX_HOPS = 16


class ReadValue(TypedDict):
    """One path a deciding policy reads, with its value where svc can know it.

    ``path``, ``read``, ``has`` and ``lines`` (1-based lines of the policy's file) are the
    outline's; ``status`` is ``value``, ``absent`` or ``unknown``; ``value`` the JSON value
    (Cedar's entity JSON: an entity is ``{"__entity": {"type", "id"}}``) when ``status`` is
    ``value``; ``source`` where it came from (``decision``: the decision record; ``directory``:
    the context service now; ``bundle``: the active bundle's entities now); ``as_of`` the RFC
    3339 time the value holds for (the decision's time, or when the portal read it); ``note``
    why a value is absent or unknown.
    """

    path: str
    read: bool
    has: bool
    lines: list[int]
    status: Literal["value", "absent", "unknown"]
    value: Any
    source: Source | None
    as_of: str | None
    note: str | None


def person_entity(ref: Mapping[str, str], p: Mapping[str, Any]) -> dict[str, Any]:
    """A directory person record as the Cedar entity the decision point holds.

    Args:
        ref: the person's ``{"type", "id"}`` (``Human``, or ``NS::Human`` in a namespaced schema).
        p: the context service's record (``GET /v1/directory/people/{user_name}``).

    Returns:
        ``{"uid", "attrs", "parents"}``: ``active``, ``department``, ``title`` (empty when unset)
        and ``manager`` (an entity, when the record names one), the person's groups as parents
        (docs/context.md#principals).

    """
    attrs: dict[str, Any] = {
        "active": bool(p.get("active")),
        "department": p.get("department") or "",
        "title": p.get("title") or "",
    }
    if p.get("manager"):
        attrs["manager"] = {"__entity": {"type": ref["type"], "id": p["manager"]}}
    group = _sibling(ref["type"], "Group")
    return {
        "uid": dict(ref),
        "attrs": attrs,
        "parents": [{"type": group, "id": g} for g in p.get("groups", [])],
    }


def _sibling(type_name: str, base: str) -> str:
    """``base`` in the namespace of ``type_name`` (``Acme::Human`` -> ``Acme::Group``)."""
    ns, sep, _ = type_name.rpartition("::")
    return f"{ns}{sep}{base}"


def _base(type_name: str) -> str:
    return type_name.rpartition("::")[2]


def bundle_entities(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    """A bundle's ``entities.json`` (Cedar's entity JSON, an array) by ``(type, id)``.

    Uids may be ``{"type", "id"}`` or ``{"__entity": {...}}``. The entity-map form of Cedar's
    TinyTodo example, unreadable JSON and malformed entries are left out (logged): their
    values are then ``unknown``.
    """
    try:
        data = json.loads(text)
    except ValueError as e:
        log.warning("explanations: entities.json is not JSON: %s", e)
        return {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    if not isinstance(data, list):
        log.info("explanations: entities.json is not an array; its values are left out")
        return out
    for entity in data:
        uid = entity.get("uid") if isinstance(entity, dict) else None
        if isinstance(uid, dict) and isinstance(uid.get("__entity"), dict):
            uid = uid["__entity"]
        if isinstance(uid, dict) and isinstance(uid.get("type"), str) and "id" in uid:
            out[(uid["type"], str(uid["id"]))] = entity
    return out


class EntityLookup:
    """Entities as the decision point would hold them now, each fetched once.

    Args:
        context: the context service's client, or None when the portal has none.
        bundle: the active bundle's entities (``bundle_entities``).
        now: the time of reading, for ``as_of``.

    """

    def __init__(
        self,
        context: ContextClient | None,
        bundle: Mapping[tuple[str, str], dict[str, Any]],
        now: datetime,
    ) -> None:
        self.context = context
        self.bundle = bundle
        self.now = now
        self._seen: dict[tuple[str, str], tuple[dict[str, Any] | None, Source | None]] = {}

    def get(self, type_name: str, entity_id: str) -> tuple[dict[str, Any] | None, Source | None]:
        """The entity ``{"uid", "attrs", "parents"[, "tags"]}`` and where it came from.

        ``(None, None)`` when neither the directory nor the bundle holds it, or the context
        service does not answer (logged).
        """
        key = (type_name, entity_id)
        if key not in self._seen:
            self._seen[key] = self._fetch(type_name, entity_id)
        return self._seen[key]

    def _fetch(self, type_name: str, entity_id: str) -> tuple[dict[str, Any] | None, Source | None]:
        ref = {"type": type_name, "id": entity_id}
        if self.context is not None:
            try:
                found = self._from_directory(ref)
            except (Unavailable, Refused) as e:
                log.warning("explanations: %s::%r not read: %s", type_name, entity_id, e)
                found = None
            if found is not None:
                return found, "directory"
        if (type_name, entity_id) in self.bundle:
            return self.bundle[(type_name, entity_id)], "bundle"
        return None, None

    def _from_directory(self, ref: dict[str, str]) -> dict[str, Any] | None:
        assert self.context is not None
        base = _base(ref["type"])
        if base == "Human":
            p = self.context.person(ref["id"])
            return None if p is None or p.get("removed") else person_entity(ref, p)
        if base == "ServiceAccount":
            sa = self.context.service_account(ref["id"])
            if sa is None:
                return None
            # The attributes `Engine.register_service_accounts` gives a registered account.
            return {
                "uid": ref,
                "attrs": {
                    "owner": {
                        "__entity": {"type": _sibling(ref["type"], "Human"), "id": sa["owner"]}
                    },
                    "ai": bool(sa.get("ai")),
                    "registered": True,
                    "app": sa.get("app") or ref["id"].split(".", 1)[0],
                    "description": sa.get("description") or "",
                },
                "parents": [
                    {"type": _sibling(ref["type"], "Group"), "id": g}
                    for g in sa.get("groups") or []
                ],
            }
        if base == "Group":
            return None  # groups carry no attributes in the directory; a bundle's may
        found = self.context.resources([ref])
        return found[0] if found else None


def _ref_of(value: Any) -> tuple[str, str] | None:
    """The ``(type, id)`` of an entity value ``{"__entity": {type, id}}``, else None."""
    if isinstance(value, dict) and isinstance(value.get("__entity"), dict):
        e = value["__entity"]
        if isinstance(e.get("type"), str) and isinstance(e.get("id"), str):
            return e["type"], e["id"]
    return None


def _entity(ref: Mapping[str, Any]) -> dict[str, Any]:
    return {"__entity": {"type": ref["type"], "id": ref["id"]}}


def read_values(
    reads: list[PolicyRead], row: Mapping[str, Any], lookup: EntityLookup
) -> list[ReadValue]:
    """Puts a value beside each path a deciding policy reads (see the module docs).

    Args:
        reads: the policy's ``reads`` from ``outline_policies``.
        row: the decision record as the history answers it (``HistoryClient.decision``).
        lookup: the entities as svc holds them now.

    Returns:
        One ``ReadValue`` per read, in the outline's order.

    """
    decided = row.get("at")
    decided_at = decided.isoformat() if isinstance(decided, datetime) else decided
    now = lookup.now.isoformat()
    out: list[ReadValue] = []
    for r in reads:
        item: ReadValue = {
            "path": r["path"],
            "read": r["read"],
            "has": r["has"],
            "lines": list(r["lines"]),
            "status": "unknown",
            "value": None,
            "source": None,
            "as_of": None,
            "note": None,
        }
        attrs = list(r["attrs"])
        start: Any
        source: Source | None = None
        as_of: str | None = None
        if r["root_kind"] == "entity" and r["root_entity"] is not None:
            start = _entity(r["root_entity"])
        elif r["root_kind"] == "variable" and r["root"] in ("principal", "resource"):
            ref = row.get(r["root"])
            if not ref or not ref.get("id"):
                item["note"] = f"the decision names no {r['root']}"
                out.append(item)
                continue
            start = _entity(ref)
        elif r["root_kind"] == "variable" and r["root"] == "context":
            first = attrs[0] if attrs else None
            if first not in _RECORDED_CONTEXT or (
                first == "risk_score" and row.get("risk_score") is None
            ):
                item["note"] = "the decision record keeps no request context"
                out.append(item)
                continue
            if first == "work_item" and not (row.get("work_item") and row.get("assigned")):
                item["note"] = (
                    "the record names no open work item linking the resource"
                    if not row.get("work_item")
                    else "the record cannot tell whether its work item was open"
                )
                out.append(item)
                continue
            recorded = {
                "risk_score": row.get("risk_score"),
                "assigned": bool(row.get("assigned")),
                "work_item": {
                    "__entity": {
                        # The base schema's type, in the namespace of the decision's principal.
                        "type": _sibling((row.get("principal") or {}).get("type", ""), "WorkItem"),
                        "id": row.get("work_item"),
                    }
                },
            }
            start = recorded[first]
            attrs = attrs[1:]
            source, as_of = "decision", decided_at
        elif r["root_kind"] == "variable":
            item["note"] = "the action's attributes are not recorded"
            out.append(item)
            continue
        else:
            item["note"] = "read off an expression; svc does not evaluate it"
            out.append(item)
            continue
        _walk(item, start, attrs, r["tag"], lookup, source, as_of, now)
        out.append(item)
    return out


def _walk(
    item: ReadValue,
    value: Any,
    attrs: list[str],
    tag: str | None,
    lookup: EntityLookup,
    source: Source | None,
    as_of: str | None,
    now: str,
) -> None:
    """Follows ``attrs`` (then ``tag``) from ``value``, filling ``item``'s outcome fields."""
    steps: list[tuple[str, bool]] = [(a, False) for a in attrs]
    if tag is not None:
        steps.append((tag, True))
    for hops, (name, is_tag) in enumerate(steps):
        ref = _ref_of(value)
        if ref is not None:
            if hops >= _MAX_HOPS:
                item["note"] = "the path follows too many entities"
                return
            entity, where = lookup.get(*ref)
            if entity is None:
                item["note"] = f'{ref[0]}::"{ref[1]}" is not in the directory or the active bundle'
                return
            # A value read from the directory or the bundle is today's, whatever came before.
            source, as_of = where, now
            holder = entity.get("tags" if is_tag else "attrs") or {}
        elif isinstance(value, dict) and not is_tag:
            holder = value
        else:
            item["note"] = f"`{name}` is read off a value that is neither an entity nor a record"
            return
        if name not in holder:
            item["status"], item["source"], item["as_of"] = "absent", source, as_of
            item["note"] = f"no `{name}`" + (" tag" if is_tag else " attribute")
            return
        value = holder[name]
    item["status"], item["value"] = "value", value
    item["source"], item["as_of"] = source, as_of
