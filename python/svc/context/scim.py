"""SCIM 2.0 at ``/scim/v2/`` (RFC 7643, RFC 7644; docs/context.md#scim).

The protocol is scim2-server's (``scim2_server.applications.asgi.ASGIApplication``: routing,
validation of requests against the scim2-models schemas, PUT and PATCH applied to the stored
resource, filters parsed, discovery endpoints, errors as SCIM ``Error`` documents). This
module adds what is svc's:

* ``SqlStorage``, the ``ScimStorage`` that keeps users and groups in the context service's
  database. Every write brings the principals snapshot in line in the same transaction
  (``svc.context.service.refresh_human``/``refresh_group``), so a deactivation or a
  membership change reaches the decision points' watch with its own ``principals_version``.
  A deleted user is kept as removed (``removed_at``), leaves its groups, and answers 404.
* ``ScimApp``, the ASGI application checking the identity provider's bearer token
  (RFC 6750; compared in constant time) before anything but ``/ServiceProviderConfig``.
* ``provider()``, what the service announces: ``User`` with the enterprise extension,
  ``Group``, PATCH and filters (``maxResults`` from the settings), no bulk, no sort, no
  ETags, no password change; index pagination (``startIndex``/``count``).

Filters are evaluated by scim2-models (``ScimFilter.match``) over the stored documents of the
resource type, after two narrowings that leave the answer as it is: ``userName``,
``displayName``, ``externalId`` and ``id`` compared with ``eq`` (the lookups identity providers
make before a create) go through an index, and ``co``/``sw``/``ew`` of ``userName``,
``displayName`` and ``externalId`` (alone or in an ``and``) are first tested on their column
alone, the way scim2-models compares them. A list without a filter is counted and paged by the
database. Figures: docs/benchmarks.md#context-service.
"""

from __future__ import annotations

import hmac
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import anyio.to_thread
from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    EnterpriseUser,
    ETag,
    External,
    Filter,
    Group,
    InvalidValueException,
    Meta,
    NotFoundException,
    NotImplementedException,
    Patch,
    Reference,
    Resource,
    ResourceType,
    ResponseParameters,
    ScimFilter,
    ScimPolicy,
    ScimProvider,
    SearchRequest,
    ServiceProviderConfig,
    Sort,
    UnauthorizedException,
    UniquenessException,
    User,
)
from scim2_models.path import CompareOperator, Comparison, LogicalExpr, LogicalOperator
from scim2_server.applications.asgi import ASGIApplication
from scim2_server.requests import ScimRequest
from scim2_server.service import ScimService
from scim2_server.storage import AsyncScimStorage, ScimStorage, SearchPage
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from svc.context.models import MemberRow, ScimGroupRow, ScimUserRow, utc
from svc.context.service import (
    ContextService,
    _Tx,
    refresh_group,
    refresh_human,
    refresh_members,
    rows_by_id,
)
from svc.identifiers import identifier_problem

__all__ = ["AsyncSqlStorage", "ScimApp", "SqlStorage", "provider"]

#: The resource of ``/Users``: the core user with the enterprise extension (RFC 7643 section 4.3).
UserModel = User[EnterpriseUser]

BEARER = AuthenticationScheme(
    type=AuthenticationScheme.Type.oauthbearertoken,
    name="OAuth Bearer Token",
    description="The identity provider's bearer token (RFC 6750)",
    spec_uri=Reference[External]("https://datatracker.ietf.org/doc/html/rfc6750"),
    primary=True,
)


def provider(max_results: int = 200) -> ScimProvider:
    """What ``/scim/v2/`` serves and announces (module docs).

    Args:
        max_results: ``filter.maxResults``, the most resources of one list response.

    Returns:
        A scim2-models ``ScimProvider`` of ``Users`` (with the enterprise extension) and
        ``Groups``.

    """
    config = ServiceProviderConfig(
        patch=Patch(supported=True),
        bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
        filter=Filter(supported=True, max_results=max_results),
        change_password=ChangePassword(supported=False),
        sort=Sort(supported=False),
        etag=ETag(supported=False),
        authentication_schemes=[BEARER],
    )
    return ScimProvider(
        models=[User, EnterpriseUser, Group],
        resource_types=[
            ResourceType.from_resource(UserModel),
            ResourceType.from_resource(Group),
        ],
        config=config,
        # Microsoft Entra ID removes members by a value array, and replaces entries a path
        # filter does not match yet (docs/context.md#identity-providers).
        policy=ScimPolicy(
            remove_value_as_filter=ScimPolicy.RemoveValue.apply,
            unmatched_path_filter=ScimPolicy.UnmatchedPathFilter.create,
        ),
    )


_ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
_MANAGER_PATH = f"{_ENTERPRISE}:manager".casefold()


def _manager(value: Any, base_url: str) -> Any:
    """A manager value with its ``$ref`` filled in from its ``value``.

    Okta and Entra send the manager as ``{"value": id}``, and Entra's PATCH by path as the bare
    id; RFC 7643 section 4.3's schema requires ``$ref``, which scim2-models enforces.
    """
    if isinstance(value, str) and value:
        value = {"value": value}
    if isinstance(value, dict) and value.get("value") and not value.get("$ref"):
        return {**value, "$ref": f"{base_url}/Users/{value['value']}"}
    return value


def _with_manager_refs(body: Any, method: str, base_url: str) -> Any:
    """A SCIM request body whose enterprise ``manager`` values all carry ``$ref``."""
    if not isinstance(body, dict):
        return body
    if method in ("POST", "PUT"):
        ext = body.get(_ENTERPRISE)
        if isinstance(ext, dict) and "manager" in ext:
            body[_ENTERPRISE] = {**ext, "manager": _manager(ext["manager"], base_url)}
        return body
    for op in body.get("Operations") or []:
        if not isinstance(op, dict):
            continue
        path = str(op.get("path") or "").casefold()
        if path == _MANAGER_PATH:
            op["value"] = _manager(op.get("value"), base_url)
        elif not path and isinstance(op.get("value"), dict):
            value = op["value"]
            for key in list(value):
                if key.casefold() == _MANAGER_PATH:
                    value[key] = _manager(value[key], base_url)
                elif (
                    key == _ENTERPRISE and isinstance(value[key], dict) and "manager" in value[key]
                ):
                    value[key] = {
                        **value[key],
                        "manager": _manager(value[key]["manager"], base_url),
                    }
    return body


def _meta(row: ScimUserRow | ScimGroupRow, resource_type: str) -> Meta:
    return Meta(
        resource_type=resource_type,
        created=utc(row.created_at),
        last_modified=utc(row.updated_at),
        version=f'W/"{row.version}"',
    )


def _user(row: ScimUserRow) -> Resource[Any]:
    res = UserModel.model_validate(row.doc)
    res.id = row.id
    res.meta = _meta(row, "User")
    return cast(Resource[Any], res)


def _group(row: ScimGroupRow) -> Resource[Any]:
    res = Group.model_validate(row.doc)
    res.id = row.id
    res.meta = _meta(row, "Group")
    return cast(Resource[Any], res)


def _doc(resource: Resource[Any]) -> dict[str, Any]:
    """The stored form of a resource: its JSON without ``id`` and ``meta`` (kept in columns)."""
    doc = resource.model_dump(mode="json")
    doc.pop("id", None)
    doc.pop("meta", None)
    return doc


#: Attributes compared with ``eq`` that an index answers: SCIM name to column (user, group).
_INDEXED = {
    "username": (col(ScimUserRow.user_name_key), None),
    "externalid": (col(ScimUserRow.external_id), col(ScimGroupRow.external_id)),
    "id": (col(ScimUserRow.id), col(ScimGroupRow.id)),
    "displayname": (None, col(ScimGroupRow.display_name_key)),
}


#: Attributes whose ``co``, ``sw`` and ``ew`` comparisons are first tried on their column alone
#: (``_scan_column``): the attribute's URN, lowercase, to its column (users, groups).
_SCANNED: tuple[dict[str, Any], dict[str, Any]] = (
    {
        "urn:ietf:params:scim:schemas:core:2.0:user:username": col(ScimUserRow.user_name),
        "urn:ietf:params:scim:schemas:core:2.0:user:externalid": col(ScimUserRow.external_id),
    },
    {
        "urn:ietf:params:scim:schemas:core:2.0:group:displayname": col(ScimGroupRow.display_name),
        "urn:ietf:params:scim:schemas:core:2.0:group:externalid": col(ScimGroupRow.external_id),
    },
)
_STRING_OPS = (CompareOperator.co, CompareOperator.sw, CompareOperator.ew)


def _string_test(binding: Any, op: CompareOperator, value: str) -> Callable[[Any], bool] | None:
    """A test of one stored value: whether ``<attribute> <op> value`` holds for it.

    The comparison is scim2-models' own for ``co``, ``sw`` and ``ew``: both sides in the
    attribute's comparison form (``AttributeBinding.comparable``: NFC, lowercase unless
    ``caseExact``), a missing or unpreparable stored value matching nothing. None when
    ``value`` itself cannot be prepared.
    """
    try:
        right = binding.comparable(value)
    except ValueError:
        return None
    if not isinstance(right, str):
        return None

    def test(actual: Any) -> bool:
        if not isinstance(actual, str):
            return False
        try:
            left = binding.comparable(actual)
        except ValueError:
            return False
        if not isinstance(left, str):
            return False
        if op == CompareOperator.co:
            return right in left
        if op == CompareOperator.sw:
            return bool(left.startswith(right))
        return bool(left.endswith(right))

    return test


def _scan_column(
    s: Session, q: Any, order: tuple[Any, ...], scim_filter: ScimFilter[Any], is_user: bool
) -> list[str] | None:
    """The ids, in ``order``, of the rows of ``q`` that can match ``scim_filter``, or None.

    For a filter that is, or is a conjunction (``and``) holding, a comparison ``co``, ``sw`` or
    ``ew`` of ``userName``, ``externalId`` or ``displayName`` with a string: that comparison is
    tested on the column alone (only ids and the column are read), as scim2-models tests it
    (``_string_test``). The rows left are read whole and matched against the whole filter by
    scim2-models, so the answer is the one matching every row gives; only the work shrinks.
    None for any other filter: every row is matched.
    """
    node = scim_filter.ast
    terms = (
        node.terms if isinstance(node, LogicalExpr) and node.op == LogicalOperator.and_ else (node,)
    )
    for term in terms:
        if not (
            isinstance(term, Comparison) and term.op in _STRING_OPS and isinstance(term.value, str)
        ):
            continue
        binding = scim_filter.resolve_comparison(term.attr_path)
        if binding is None or binding.sub_field_name:
            continue
        column = _SCANNED[0 if is_user else 1].get(str(binding.urn).lower())
        test = None if column is None else _string_test(binding, term.op, term.value)
        if column is None or test is None:
            continue
        row_id = col(ScimUserRow.id) if is_user else col(ScimGroupRow.id)
        narrowed = q.with_only_columns(row_id, column).order_by(*order)
        return [rid for rid, value in s.connection().execute(narrowed) if test(value)]
    return None


class SqlStorage(ScimStorage):
    """The SCIM resources in the context service's database (module docs).

    Args:
        service: the context service whose database and transactions it uses.

    """

    def __init__(self, service: ContextService) -> None:
        self.service = service

    # -- reads -----------------------------------------------------------------

    def get(
        self,
        resource_type: ResourceType,
        resource_id: str,
        *,
        response_parameters: ResponseParameters[Any] | None = None,
    ) -> Resource[Any]:
        """The resource of that type and id.

        Raises:
            NotFoundException: no such resource (a removed user included).

        """
        with self.service.read() as s:
            return self._get(s, resource_type, resource_id)

    def _get(self, s: Session, resource_type: ResourceType, resource_id: str) -> Resource[Any]:
        if resource_type.name == "User":
            row = s.get(ScimUserRow, resource_id)
            if row is not None and row.removed_at is None:
                return _user(row)
        else:
            grow = s.get(ScimGroupRow, resource_id)
            if grow is not None:
                return _group(grow)
        raise NotFoundException(detail=f"{resource_type.name} {resource_id!r} not found")

    def search(
        self,
        resource_types: list[ResourceType],
        search_request: SearchRequest[Any],
        *,
        position: Any = None,
    ) -> SearchPage:
        """One page of the resources matching the request's filter, oldest first.

        Without a filter, the database counts and pages (``OFFSET``/``LIMIT`` over the index of
        creation order), so only the page's rows are read. A filter ``<indexed attribute> eq
        "value"`` is narrowed by an index, and one holding ``co``/``sw``/``ew`` of a column by
        that column (``_scan_column``), then matched by scim2-models over the rows left; any
        other filter is matched by scim2-models over every row of the type
        (docs/context.md#scim).

        Raises:
            NotImplementedException: a search across resource types (at the root).

        """
        if len(resource_types) != 1:
            raise NotImplementedException(detail="search one resource type at a time")
        rt = resource_types[0]
        is_user = rt.name == "User"
        scim_filter = search_request.filter
        start = search_request.start_index_0 or 0
        count = search_request.count
        stop = None if count is None else start + count
        with self.service.read() as s:
            if is_user:
                q: Any = select(ScimUserRow).where(col(ScimUserRow.removed_at).is_(None))
            else:
                q = select(ScimGroupRow)
            order = (
                (col(ScimUserRow.created_at), col(ScimUserRow.id))
                if is_user
                else (col(ScimGroupRow.created_at), col(ScimGroupRow.id))
            )
            if scim_filter is None:
                total = s.exec(select(func.count()).select_from(q.subquery())).one()
                page = q.order_by(*order).offset(start)
                if count is not None:
                    page = page.limit(count)
                rows = s.exec(page).all()
                return SearchPage(int(total), [_user(r) if is_user else _group(r) for r in rows])
            if not scim_filter.models:
                model = UserModel if is_user else Group
                scim_filter = ScimFilter[model](str(scim_filter))  # type: ignore[valid-type]
            ids = _scan_column(s, q, order, scim_filter, is_user)
            if ids is None:
                rows = s.exec(self._narrow(q, scim_filter, is_user).order_by(*order)).all()
            else:
                found: dict[str, Any] = rows_by_id(s, ScimUserRow if is_user else ScimGroupRow, ids)
                rows = [found[i] for i in ids if i in found]
            resources = [_user(r) if is_user else _group(r) for r in rows]
        resources = [r for r in resources if scim_filter.match(r)]
        return SearchPage(len(resources), resources[start:stop])

    @staticmethod
    def _narrow(q: Any, scim_filter: ScimFilter[Any] | None, is_user: bool) -> Any:
        """``q`` narrowed by an index when the filter is ``<indexed attribute> eq "value"``."""
        if scim_filter is None:
            return q
        node = scim_filter.ast
        if not isinstance(node, Comparison) or node.op != CompareOperator.eq:
            return q
        if not isinstance(node.value, str):
            return q
        name = str(node.attr_path).rsplit(":", 1)[-1].casefold()
        column = _INDEXED.get(name, (None, None))[0 if is_user else 1]
        if column is None:
            return q
        value = node.value.casefold() if name in ("username", "displayname") else node.value
        return q.where(column == value)

    # -- writes ----------------------------------------------------------------

    def create(self, resource_type: ResourceType, resource: Resource[Any]) -> Resource[Any]:
        """Stores a new user or group (with a new id) and refreshes the principals it touches.

        Raises:
            UniquenessException: the ``userName`` or ``displayName`` (case-insensitive) is
                taken.
            InvalidValueException: a group member names no user or group.

        """
        now = datetime.now(UTC)
        rid = uuid.uuid4().hex
        # The documents are made before the write lock is taken and the answer after it is
        # let go: writes run one at a time, so whatever is done inside delays every writer.
        doc = _doc(resource)
        is_user = resource_type.name == "User"
        try:
            with self.service.write() as tx:
                if is_user:
                    row: Any = self._write_user(tx, rid, doc, now, None)
                else:
                    row = self._write_group(tx, rid, doc, now, None)
        except IntegrityError:
            raise UniquenessException() from None
        return _user(row) if is_user else _group(row)

    def update(
        self,
        resource_type: ResourceType,
        resource: Resource[Any],
        *,
        expected_version: str | None = None,
    ) -> Resource[Any]:
        """Replaces a user or group with ``resource`` (PUT, or PATCH already applied).

        Raises:
            NotFoundException: no such resource.
            UniquenessException: the new ``userName`` or ``displayName`` is taken.
            InvalidValueException: a group member names no user or group.

        """
        now = datetime.now(UTC)
        rid = cast(str, resource.id)
        doc = _doc(resource)
        is_user = resource_type.name == "User"
        try:
            with self.service.write() as tx:
                if is_user:
                    old = tx.session.get(ScimUserRow, rid, with_for_update=True)
                    if old is None or old.removed_at is not None:
                        raise NotFoundException(detail=f"User {rid!r} not found")
                    row: Any = self._write_user(tx, rid, doc, now, old)
                else:
                    gold = tx.session.get(ScimGroupRow, rid, with_for_update=True)
                    if gold is None:
                        raise NotFoundException(detail=f"Group {rid!r} not found")
                    row = self._write_group(tx, rid, doc, now, gold)
        except IntegrityError:
            raise UniquenessException() from None
        return _user(row) if is_user else _group(row)

    def delete(
        self,
        resource_type: ResourceType,
        resource_id: str,
        *,
        expected_version: str | None = None,
    ) -> None:
        """Deletes a group, or marks a user removed (kept for the history; it leaves its groups).

        Raises:
            NotFoundException: no such resource.

        """
        now = datetime.now(UTC)
        with self.service.write() as tx:
            s = tx.session
            if resource_type.name == "User":
                row = s.get(ScimUserRow, resource_id, with_for_update=True)
                if row is None or row.removed_at is not None:
                    raise NotFoundException(detail=f"User {resource_id!r} not found")
                row.removed_at = now
                row.updated_at = now
                row.version += 1
                s.add(row)
                self._leave_groups(tx, resource_id, now)
                s.flush()
                refresh_human(tx, row.user_name)
                self._refresh_reports(tx, resource_id)
                return
            grow = s.get(ScimGroupRow, resource_id, with_for_update=True)
            if grow is None:
                raise NotFoundException(detail=f"Group {resource_id!r} not found")
            members = [
                m.member_id
                for m in s.exec(select(MemberRow).where(MemberRow.group_id == resource_id)).all()
            ]
            for m in s.exec(select(MemberRow).where(MemberRow.group_id == resource_id)).all():
                s.delete(m)
            self._leave_groups(tx, resource_id, now)
            s.delete(grow)
            s.flush()
            refresh_group(tx, grow.display_name)
            refresh_members(tx, members)

    # -- helpers ---------------------------------------------------------------

    def _write_user(
        self,
        tx: _Tx,
        rid: str,
        doc: dict[str, Any],
        now: datetime,
        old: ScimUserRow | None,
    ) -> ScimUserRow:
        """Writes user ``rid`` and refreshes the records it touches; returns its row.

        ``doc`` is its stored form (``_doc``); ``old`` its row before (None for a new user).
        """
        s = tx.session
        user_name = str(doc.get("userName") or "")
        if not user_name:
            raise InvalidValueException(detail="userName is required")
        _check_name("userName", user_name)
        active = doc.get("active")
        manager = _enterprise_manager(doc)
        if manager is not None and manager != rid:
            mrow = s.get(ScimUserRow, manager)
            if mrow is None or mrow.removed_at is not None:
                raise InvalidValueException(detail=f"manager {manager!r} names no user")
        old_name = old.user_name if old is not None else None
        row = old or ScimUserRow(
            id=rid,
            user_name=user_name,
            user_name_key=user_name.casefold(),
            active=True,
            doc=doc,
            version=0,
            created_at=now,
            updated_at=now,
        )
        if old is not None and old.doc == doc:
            return old
        row.user_name = user_name
        row.user_name_key = user_name.casefold()
        row.external_id = doc.get("externalId")
        row.active = True if active is None else bool(active)
        row.manager_id = manager
        row.doc = doc
        row.version += 1
        row.updated_at = now
        s.add(row)
        s.flush()
        refresh_human(tx, user_name, row, groups=[] if old is None else None)
        if old_name is not None and old_name != user_name:
            refresh_human(tx, old_name)
            self._refresh_reports(tx, rid)
        return row

    @staticmethod
    def _refresh_reports(tx: _Tx, manager_id: str) -> None:
        for r in tx.session.exec(
            select(ScimUserRow).where(
                ScimUserRow.manager_id == manager_id, col(ScimUserRow.removed_at).is_(None)
            )
        ).all():
            refresh_human(tx, r.user_name)

    def _members(
        self, s: Session, doc: dict[str, Any]
    ) -> tuple[list[tuple[str, str]], list[ScimUserRow | ScimGroupRow]]:
        """``(member id, "User"|"Group")`` of each member of a group document, and their rows.

        The type is looked up, since Okta sends only ``value`` and ``display``: the users and
        groups named are read with one query each. The caller keeps the rows while its
        transaction lasts, so that refreshing the members finds them in the session.

        Raises:
            InvalidValueException: a member names no present user and no group.

        """
        ids = sorted({str(m.get("value") or "") for m in doc.get("members") or []})
        if not ids:
            return [], []
        users = {k: u for k, u in rows_by_id(s, ScimUserRow, ids).items() if u.removed_at is None}
        groups = rows_by_id(s, ScimGroupRow, [mid for mid in ids if mid not in users])
        out: list[tuple[str, str]] = []
        for mid in ids:
            if mid in users:
                out.append((mid, "User"))
            elif mid in groups:
                out.append((mid, "Group"))
            else:
                raise InvalidValueException(detail=f"member {mid!r} names no user or group")
        return out, [*users.values(), *groups.values()]

    def _write_group(
        self,
        tx: _Tx,
        rid: str,
        doc: dict[str, Any],
        now: datetime,
        old: ScimGroupRow | None,
    ) -> ScimGroupRow:
        """Writes group ``rid`` and refreshes the records it touches; returns its row.

        ``doc`` is its stored form (``_doc``; its members get their ``type`` here); ``old`` its
        row before (None for a new group).
        """
        s = tx.session
        name = str(doc.get("displayName") or "")
        if not name:
            raise InvalidValueException(detail="displayName is required")
        _check_name("displayName", name)
        members, _rows = self._members(s, doc)
        if any(mid == rid for mid, _ in members):
            raise InvalidValueException(detail="a group cannot be its own member")
        # Store members with their type, as RFC 7643 section 4.2 describes them.
        types = dict(members)
        doc["members"] = [
            {**m, "type": types[str(m.get("value"))]}
            for m in {str(m.get("value")): m for m in doc.get("members") or []}.values()
        ] or None
        if doc["members"] is None:
            doc.pop("members")
        old_name = old.display_name if old is not None else None
        before = (
            [m.member_id for m in s.exec(select(MemberRow).where(MemberRow.group_id == rid)).all()]
            if old is not None
            else []
        )
        if old is not None and old.doc == doc:
            return old
        row = old or ScimGroupRow(
            id=rid,
            display_name=name,
            display_name_key=name.casefold(),
            doc=doc,
            version=0,
            created_at=now,
            updated_at=now,
        )
        row.display_name = name
        row.display_name_key = name.casefold()
        row.external_id = doc.get("externalId")
        row.doc = doc
        row.version += 1
        row.updated_at = now
        s.add(row)
        s.flush()
        for m in s.exec(select(MemberRow).where(MemberRow.group_id == rid)).all():
            s.delete(m)
        s.flush()
        for mid, mtype in members:
            s.add(MemberRow(group_id=rid, member_id=mid, member_type=mtype))
        s.flush()
        refresh_group(tx, name)
        if old_name is not None and old_name != name:
            refresh_group(tx, old_name)
            refresh_members(tx, [*before, *(mid for mid, _ in members)])
        else:
            changed = set(before) ^ {mid for mid, _ in members}
            refresh_members(tx, changed)
        return row

    def _leave_groups(self, tx: _Tx, member_id: str, now: datetime) -> None:
        s = tx.session
        rows = s.exec(select(MemberRow).where(MemberRow.member_id == member_id)).all()
        groups = [m.group_id for m in rows]
        for m in rows:
            s.delete(m)
        self._drop_from_group_docs(tx, member_id, groups, now)

    @staticmethod
    def _drop_from_group_docs(tx: _Tx, member_id: str, group_ids: list[str], now: datetime) -> None:
        """Removes ``member_id`` from the ``members`` of the documents of these groups."""
        s = tx.session
        for gid in group_ids:
            g = s.get(ScimGroupRow, gid)
            if g is None:
                continue
            members = g.doc.get("members") or []
            kept = [m for m in members if str(m.get("value")) != member_id]
            if len(kept) != len(members):
                doc = dict(g.doc)
                if kept:
                    doc["members"] = kept
                else:
                    doc.pop("members", None)
                g.doc = doc
                g.version += 1
                g.updated_at = now
                s.add(g)


#: The longest ``userName`` or group ``displayName``: it becomes a principal's id, and the
#: resources' ids have the same bound (docs/context.md#limits).
MAX_NAME_CHARS = 512


def _check_name(attr: str, value: str) -> None:
    """Refuses a user or group name that cannot be a principal's id (docs/context.md#limits).

    Raises:
        InvalidValueException: ``value`` is longer than ``MAX_NAME_CHARS`` or holds a control
            character or a lone surrogate (``svc.identifiers.identifier_problem``); scim2-server
            answers 400 ``invalidValue``.

    """
    if len(value) > MAX_NAME_CHARS:
        raise InvalidValueException(
            detail=f"{attr} has {len(value)} characters; at most {MAX_NAME_CHARS}"
        )
    why = identifier_problem(value)
    if why is not None:
        raise InvalidValueException(detail=f"{attr} {why}")


def _enterprise_manager(doc: dict[str, Any]) -> str | None:
    ext = doc.get("urn:ietf:params:scim:schemas:extension:enterprise:2.0:User")
    if not isinstance(ext, dict):
        return None
    mgr = ext.get("manager")
    if isinstance(mgr, dict) and mgr.get("value"):
        return str(mgr["value"])
    return None


class AsyncSqlStorage(AsyncScimStorage):
    """``SqlStorage`` for the ASGI application: each call runs in a worker thread (anyio).

    Args:
        storage: the storage it serves.

    """

    def __init__(self, storage: SqlStorage) -> None:
        self.storage = storage

    async def get(
        self,
        resource_type: ResourceType,
        resource_id: str,
        *,
        response_parameters: ResponseParameters[Any] | None = None,
    ) -> Resource[Any]:
        """See ``SqlStorage.get``."""
        return await anyio.to_thread.run_sync(self.storage.get, resource_type, resource_id)

    async def search(
        self,
        resource_types: list[ResourceType],
        search_request: SearchRequest[Any],
        *,
        position: Any = None,
    ) -> SearchPage:
        """See ``SqlStorage.search``."""
        return await anyio.to_thread.run_sync(self.storage.search, resource_types, search_request)

    async def create(self, resource_type: ResourceType, resource: Resource[Any]) -> Resource[Any]:
        """See ``SqlStorage.create``."""
        return await anyio.to_thread.run_sync(self.storage.create, resource_type, resource)

    async def update(
        self,
        resource_type: ResourceType,
        resource: Resource[Any],
        *,
        expected_version: str | None = None,
    ) -> Resource[Any]:
        """See ``SqlStorage.update``."""
        return await anyio.to_thread.run_sync(self.storage.update, resource_type, resource)

    async def delete(
        self,
        resource_type: ResourceType,
        resource_id: str,
        *,
        expected_version: str | None = None,
    ) -> None:
        """See ``SqlStorage.delete``."""
        await anyio.to_thread.run_sync(self.storage.delete, resource_type, resource_id)


class ScimApp(ASGIApplication):
    """scim2-server's ASGI application with the identity provider's bearer token checked.

    Args:
        service: the context service.
        token: the token the identity provider sends (None: every request but
            ``/ServiceProviderConfig`` is refused with 401).
        max_results: ``filter.maxResults``.

    """

    def __init__(
        self, service: ContextService, token: Callable[[], str | None], max_results: int = 200
    ) -> None:
        prov = provider(max_results)
        super().__init__(AsyncSqlStorage(SqlStorage(service)), prov, ScimService(prov))
        self._token = token

    async def dispatch_request(self, request: ScimRequest) -> Any:
        """Serves a request as scim2-server does, enterprise managers given their ``$ref``.

        ``_with_manager_refs`` fills them in; a body that is not JSON is left to scim2-server.
        """
        if request.body and request.method.upper() in ("POST", "PUT", "PATCH"):
            try:
                body = json.loads(request.body)
            except ValueError:
                body = None
            if isinstance(body, dict):
                fixed = _with_manager_refs(body, request.method.upper(), request.base_url)
                request.body = json.dumps(fixed).encode()
        return await super().dispatch_request(request)

    def check_auth(self, request: ScimRequest) -> None:
        """Refuses a request without ``Authorization: Bearer <the token>`` (RFC 6750).

        Raises:
            UnauthorizedException: the header is missing, of another scheme, or holds another
                token; scim2-server answers 401 with ``WWW-Authenticate: Bearer``.

        """
        expected = self._token()
        scheme, _, sent = (request.header("Authorization") or "").partition(" ")
        if (
            not expected
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(sent.strip().encode(), expected.encode())
        ):
            raise UnauthorizedException
