"""The context service's logic, free of any transport (docs/context.md).

``ContextService`` keeps the directory (SCIM users and groups), service accounts, risk scores,
resources, work items, trusted apps and investigations in its relational database
(``svc.context.models``, migrated on start), and keeps three change feeds in one order:

* ``principals``: the records of ``GET /v1/principals`` (people and groups as Cedar entities,
  service-account registrations, risk scores); ``principals_version`` is the ``seq`` of the
  latest change of this feed;
* ``resources``: resources as Cedar entities;
* ``work_items``: work items ``{id, status, links, attrs}``.

Every write runs in one transaction that starts by locking the ``changes`` counter row and
ends by numbering its changes from it; the lock is held until the commit, so writes run one at
a time, commit in ``seq`` order, and a reader that has seen ``seq`` N has seen every change
before it
(docs/context.md#versions-and-feeds). After each commit the service calls its listeners
(``add_listener``), which wake the waiting watches.

Refusals are ``svc.common.problems.Problem`` (RFC 9457): a bad batch names every bad item in
``errors`` and stores nothing (docs/architecture.md#code-layout-and-conventions).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine, Text, bindparam, case, create_engine, func, text
from sqlalchemy import cast as sql_cast
from sqlalchemy import delete as sa_delete
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlmodel import Session, col, select

from svc.common.files import private_sqlite
from svc.common.problems import FieldError, Problem
from svc.context.migrate import migrate
from svc.context.models import (
    ChangeRow,
    InvestigationRow,
    MemberRow,
    PrincipalRow,
    ResourceRow,
    RiskScoreDayRow,
    RiskScoreRow,
    ScimGroupRow,
    ScimUserRow,
    ServiceAccountChangeRow,
    ServiceAccountRow,
    TrustedAppRow,
    WorkItemRow,
    utc,
)
from svc.context.settings import ContextSettings
from svc.identifiers import identifier_problem

__all__ = [
    "FEEDS",
    "Change",
    "ContextService",
    "FactorIn",
    "Feed",
    "Ref",
    "ResourceIn",
    "RiskScoreIn",
    "ServiceAccountIn",
    "TrustedAppIn",
    "WorkItemIn",
    "group_entity",
    "human_entity",
    "principal_key",
]

log = logging.getLogger("svc.context")

Feed = Literal["principals", "resources", "work_items"]
FEEDS: tuple[Feed, ...] = ("principals", "resources", "work_items")

_WORK_ITEM_ID = re.compile(r"^[A-Za-z0-9._-]+:\S+$")
_APP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


_LOCK_COUNTER = text("UPDATE counters SET value = value WHERE name = 'changes'")


def _now() -> datetime:
    return datetime.now(UTC)


#: A JSON string literal of a ``str``, escaped as ``json.dumps`` does (ASCII only).
_json_str: Callable[[str], str] = json.encoder.encode_basestring_ascii


def _compact_json(value: Any) -> str:
    """JSON columns' serializer: ``json.dumps`` without the spaces after separators."""
    return json.dumps(value, separators=(",", ":"))


def principal_key(type_: str, id_: str) -> str:
    """The key of an entity in feeds and maps: ``Type::"id"`` (Cedar's entity literal form)."""
    return f'{type_}::"{id_}"'


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ref(_Strict):
    """An entity reference ``{"type", "id"}`` (docs/architecture.md, entities)."""

    type: str = Field(min_length=1, max_length=256)
    id: str = Field(min_length=1, max_length=512)


class ResourceIn(_Strict):
    """A resource of a batch write: its type, id, attributes (Cedar JSON) and parents."""

    type: str = Field(min_length=1, max_length=256)
    id: str = Field(min_length=1, max_length=512)
    attrs: dict[str, Any] = Field(default_factory=dict)
    parents: list[Ref] = Field(default_factory=list, max_length=256)


class WorkItemIn(_Strict):
    """A work item: ``<tracker>:<key>``, ``open`` or ``closed``, the resources it links."""

    id: str = Field(min_length=3, max_length=512, pattern=_WORK_ITEM_ID.pattern)
    status: Literal["open", "closed"]
    links: list[Ref] = Field(default_factory=list, max_length=1000)
    attrs: dict[str, Any] = Field(default_factory=dict)


class ServiceAccountIn(_Strict):
    """A service-account registration (docs/architecture.md, "Service-account records")."""

    id: str = Field(min_length=1, max_length=512)
    owner: str = Field(min_length=1, max_length=512, description="the owner's user name")
    ai: bool = False
    groups: list[str] = Field(default_factory=list, max_length=256)
    description: str = Field(default="", max_length=4096)


class FactorIn(_Strict):
    """One factor of a score (docs/reasoner.md#factors).

    What was seen, what is usual, and the points it added; ``family``, ``peers`` and ``day``
    as the reasoner gives them.
    """

    name: str = Field(min_length=1, max_length=128)
    observed: Any = None
    baseline: Any = None
    contribution: float = Field(ge=0, le=100)
    family: str | None = Field(default=None, max_length=16)
    peers: Any = None
    day: str | None = Field(default=None, max_length=32)


#: The most factors one score keeps, and the largest JSON of a score's details or an
#: investigation's evidence.
MAX_FACTORS = 20
MAX_EVIDENCE_BYTES = 256 * 1024


class RiskScoreIn(_Strict):
    """One score of the reasoner: a principal, 0 to 100, and optionally its factors."""

    principal: Ref
    score: int = Field(ge=0, le=100)
    reason: str = Field(default="", max_length=4096)
    factors: list[FactorIn] = Field(default_factory=list, max_length=MAX_FACTORS)
    details: dict[str, Any] = Field(default_factory=dict)


class TrustedAppIn(_Strict):
    """An app trusted to sign agent tokens (docs/architecture.md#trusted-app-issuers)."""

    name: str = Field(pattern=_APP_NAME.pattern)
    iss: str = Field(min_length=1, max_length=1024)
    jwks_url: str = Field(min_length=9, max_length=2048, pattern=r"^https://\S+$")
    aud: str = Field(min_length=1, max_length=1024)


class InvestigationIn(_Strict):
    """A new investigation of a principal; the reasoner's carry a kind, evidence and summary."""

    principal: Ref
    reason: str = Field(min_length=1, max_length=4096)
    opened_by: str = Field(min_length=1, max_length=512)
    kind: Literal["manual", "contain", "would_contain", "score"] = "manual"
    evidence: dict[str, Any] = Field(default_factory=dict)
    summary: str = Field(default="", max_length=16384)
    summary_by: str = Field(default="", max_length=256)


class InvestigationClose(_Strict):
    """The closing of an investigation."""

    closed_by: str = Field(min_length=1, max_length=512)
    resolution: str = Field(default="", max_length=4096)


@dataclass(frozen=True)
class Change:
    """One change of a feed: the new state of ``key`` after change ``seq``.

    ``value`` is the record (None: the record is gone); ``removed`` marks a removed person.
    """

    seq: int
    feed: str
    kind: str
    key: str
    value: dict[str, Any] | None
    removed: bool

    def as_json(self) -> dict[str, Any]:
        """``{"version", "kind", "id", "value", "removed"}`` as the feeds serve it."""
        return {
            "version": self.seq,
            "kind": self.kind,
            "id": self.key,
            "value": self.value,
            "removed": self.removed,
        }


_M = TypeVar("_M", bound=BaseModel)
_Row = TypeVar("_Row", ScimUserRow, ScimGroupRow)


def _bad_batch(what: str, errors: list[FieldError]) -> Problem:
    return Problem(
        400,
        "invalid-batch",
        f"Invalid {what}",
        f"{len(errors)} problem{'s' if len(errors) != 1 else ''} in the batch; nothing was stored",
        errors,
    )


def _validate(model: type[_M], raw: Any, index: int | None, errors: list[FieldError]) -> _M | None:
    """``model`` validated from ``raw``, or None with every problem appended to ``errors``."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            msg = str(err.get("msg", "invalid"))
            errors.append(FieldError(index, loc, msg[:1].lower() + msg[1:]))
        return None


def _check_size(value: Any, index: int | None, field: str, errors: list[FieldError]) -> None:
    n = len(_compact_json(value).encode())
    if n > MAX_EVIDENCE_BYTES:
        errors.append(FieldError(index, field, f"{n} bytes of JSON; at most {MAX_EVIDENCE_BYTES}"))


def _check_ident(text_: str, index: int | None, field: str, errors: list[FieldError]) -> None:
    why = identifier_problem(text_)
    if why is not None:
        errors.append(FieldError(index, field, f"the id {why}"))


def _entity_ref(ref: Ref) -> dict[str, Any]:
    return {"type": ref.type, "id": ref.id}


class ContextService:
    """The context service (module docs).

    Args:
        settings: the component's settings (``database_url`` and the limits).
        engine: a SQLAlchemy engine to use instead of one made from ``database_url`` (which
            is made with ``pool_pre_ping`` and writes JSON columns without spaces).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or migrated.

    """

    def __init__(self, settings: ContextSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        if engine is None:
            url = settings.database_url
            kwargs: dict[str, Any] = {"pool_pre_ping": True, "json_serializer": _compact_json}
            if url.startswith("sqlite"):
                kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            private_sqlite(url)  # 0600 in 0700 (svc.common.files)
            engine = create_engine(url, **kwargs)
        self.engine = engine
        self.revision = migrate(engine)
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._risk_pruned: date | None = None  # the UTC day risk_score_days was last pruned

    # -- Transactions and the change feeds --------------------------------

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Calls ``callback()`` (from the writing thread) after every commit that changed a feed."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        """Stops calling ``callback``; unknown callbacks are ignored."""
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for cb in listeners:
            try:
                cb()
            except Exception:  # a listener's failure must not undo a committed write
                log.exception("change listener failed")

    @contextmanager
    def write(self) -> Iterator[_Tx]:
        """One write transaction; its changes are numbered and committed on leaving.

        Yields:
            a ``_Tx`` whose ``session`` the caller writes through and whose ``emit`` records
            changes. On an exception nothing is stored.

        """
        with Session(self.engine, expire_on_commit=False) as session:
            # Writers take the counter row first: they run one at a time, so two of them
            # never wait on each other's rows (no deadlock), and on SQLite the write lock is
            # taken up front instead of being upgraded from a read lock.
            session.connection().execute(_LOCK_COUNTER)
            tx = _Tx(session)
            yield tx
            changed = tx.flush_changes()
            session.commit()
        if changed:
            self._notify()

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session on one consistent snapshot (REPEATABLE READ on PostgreSQL)."""
        with Session(self.engine) as session:
            if self.engine.dialect.name == "postgresql":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield session
            session.rollback()

    @staticmethod
    def _feed_version(session: Session, feed: Feed) -> int:
        v = session.exec(select(func.max(ChangeRow.seq)).where(ChangeRow.feed == feed)).one()
        return int(v or 0)

    def feed_versions(self) -> dict[Feed, int]:
        """Each feed's current version (its latest change's number; 0 before any change).

        A follower that starts a feed here misses nothing written after this read
        (docs/context.md#versions-and-feeds).
        """
        with self.read() as s:
            rows = s.exec(
                select(ChangeRow.feed, func.max(ChangeRow.seq)).group_by(col(ChangeRow.feed))
            ).all()
        found = {str(f): int(v or 0) for f, v in rows}
        return {feed: found.get(feed, 0) for feed in FEEDS}

    def changes_after(
        self, feed: Feed, after: int, limit: int | None = None
    ) -> tuple[list[Change], int, bool]:
        """The changes of ``feed`` after ``after``, oldest first.

        Args:
            feed: ``principals``, ``resources`` or ``work_items``.
            after: a version (cursor) a snapshot or an earlier answer gave; 0 for all.
            limit: most changes (default ``max_changes``).

        Returns:
            ``(changes, version, more)``: ``version`` is the last change's ``seq`` (or the
            feed's current version when there is none, never less than ``after``); ``more``
            whether changes beyond ``limit`` wait.

        """
        limit = limit or self.settings.max_changes
        with self.read() as s:
            rows = s.exec(
                select(ChangeRow)
                .where(ChangeRow.feed == feed, ChangeRow.seq > after)
                .order_by(col(ChangeRow.seq))
                .limit(limit + 1)
            ).all()
            current = self._feed_version(s, feed)
            changes = [
                Change(r.seq, r.feed, r.kind, r.key, r.value, r.removed) for r in rows[:limit]
            ]
        more = len(rows) > limit
        version = changes[-1].seq if changes else max(after, current)
        return changes, version, more

    # -- Principals -------------------------------------------------------

    def principals_snapshot(self) -> dict[str, Any]:
        """The snapshot of ``GET /v1/principals`` (docs/context.md#principals), as objects.

        Returns:
            ``{"principals_version": int, "principals": [{"kind", "id", "value",
            "removed"}]}``, sorted by kind and id, read in one consistent snapshot together
            with its version; a watch after that version gives every later change. The same
            content as ``principals_snapshot_json``.

        """
        return cast(dict[str, Any], json.loads(self.principals_snapshot_json()))

    def principals_snapshot_json(self) -> bytes:
        """The body of ``GET /v1/principals``: ``principals_snapshot`` as compact UTF-8 JSON.

        One query per snapshot: the records' values are read as the JSON text the database
        holds and written into the body as they are, without being decoded and encoded again
        (a 100,000-person snapshot is tens of megabytes; docs/benchmarks.md#context-service).
        Strings are escaped as ``json.dumps`` escapes them (ASCII only).

        Returns:
            ``{"principals_version": int, "principals": [...]}`` (module docs), encoded.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database cannot be read.

        """
        value = sql_cast(col(PrincipalRow.value), Text)
        query = select(
            col(PrincipalRow.kind), col(PrincipalRow.id), value, col(PrincipalRow.removed)
        ).order_by(col(PrincipalRow.kind), col(PrincipalRow.id))
        with self.read() as s:
            version = self._feed_version(s, "principals")
            rows = s.connection().execute(query)
            parts = [f'{{"principals_version":{version},"principals":[']
            sep = ""
            for kind, pid, text_, removed in rows:
                parts.append(
                    f'{sep}{{"kind":{_json_str(kind)},"id":{_json_str(pid)},"value":{text_},'
                    f'"removed":{"true" if removed else "false"}}}'
                )
                sep = ","
        parts.append("]}")
        return "".join(parts).encode()

    # -- Resources --------------------------------------------------------

    def _max_items(self, items: Sequence[Any], what: str) -> None:
        if not isinstance(items, list):
            raise _bad_batch(what, [FieldError(None, what, "must be a list")])
        if not 1 <= len(items) <= self.settings.max_batch_items:
            raise _bad_batch(
                what,
                [
                    FieldError(
                        None,
                        what,
                        f"holds {len(items)} items; 1 to {self.settings.max_batch_items} "
                        "are accepted",
                    )
                ],
            )

    def _refs(self, raw: Any, what: str) -> list[Ref]:
        self._max_items(raw, what)
        errors: list[FieldError] = []
        refs = [_validate(Ref, r, i, errors) for i, r in enumerate(raw)]
        if errors:
            raise _bad_batch(what, errors)
        return [r for r in refs if r is not None]

    def put_resources(self, raw: Any) -> dict[str, Any]:
        """Stores a batch of resources, all or nothing.

        Args:
            raw: a list of ``ResourceIn`` objects (1 to ``max_batch_items``).

        Returns:
            ``{"stored": n, "version": seq}`` (``version``: the resources feed's version after
            the write).

        Raises:
            Problem: 400 ``invalid-batch`` naming every bad item (index and field): a malformed
                item, a bad id, a repeated ``(type, id)``.

        """
        self._max_items(raw, "resources")
        errors: list[FieldError] = []
        items: list[ResourceIn] = []
        seen: dict[tuple[str, str], int] = {}
        for i, r in enumerate(raw):
            item = _validate(ResourceIn, r, i, errors)
            if item is None:
                continue
            _check_ident(item.type, i, "type", errors)
            _check_ident(item.id, i, "id", errors)
            for j, p in enumerate(item.parents):
                _check_ident(p.type, i, f"parents.{j}.type", errors)
                _check_ident(p.id, i, f"parents.{j}.id", errors)
            _check_size(item.attrs, i, "attrs", errors)
            if (item.type, item.id) in seen:
                errors.append(FieldError(i, "id", f"repeats item {seen[(item.type, item.id)]}"))
            seen[(item.type, item.id)] = i
            items.append(item)
        if errors:
            raise _bad_batch("resources", errors)
        now = _now()
        with self.write() as tx:
            # The rows held, read with one query per type (not one get, and an autoflush of
            # the row added before it, per item).
            held: dict[tuple[str, str], ResourceRow] = {}
            for t in {item.type for item in items}:
                ids = [item.id for item in items if item.type == t]
                for part in _chunks(ids):
                    for r in tx.session.exec(
                        select(ResourceRow).where(
                            col(ResourceRow.type) == t, col(ResourceRow.id).in_(part)
                        )
                    ):
                        held[(r.type, r.id)] = r
            for item in items:
                entity = {
                    "uid": {"type": item.type, "id": item.id},
                    "attrs": item.attrs,
                    "parents": [_entity_ref(p) for p in item.parents],
                }
                row = held.get((item.type, item.id))
                if row is not None and row.entity == entity:
                    continue
                if row is None:
                    row = ResourceRow(type=item.type, id=item.id, entity=entity, updated_at=now)
                else:
                    row.entity = entity
                    row.updated_at = now
                tx.session.add(row)
                tx.emit("resources", item.type, principal_key(item.type, item.id), entity)
        return {"stored": len(items), "version": tx.last_seq}

    def delete_resources(self, raw: Any) -> dict[str, Any]:
        """Deletes resources by reference; unknown ones are ignored.

        Returns:
            ``{"deleted": n}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every malformed reference.

        """
        refs = self._refs(raw, "resources")
        n = 0
        with self.write() as tx:
            for ref in refs:
                row = tx.session.get(ResourceRow, (ref.type, ref.id))
                if row is None:
                    continue
                tx.session.delete(row)
                tx.emit("resources", ref.type, principal_key(ref.type, ref.id), None)
                n += 1
        return {"deleted": n}

    def get_resources(self, raw: Any) -> dict[str, Any]:
        """Reads resources by reference, in one batch.

        Returns:
            ``{"resources": [entity], "missing": [ref], "version": seq}``, in the order asked;
            ``version`` is the resources feed's version the read saw (a cursor for the change
            feed).

        Raises:
            Problem: 400 ``invalid-batch`` naming every malformed reference.

        """
        refs = self._refs(raw, "resources")
        with self.read() as s:
            version = self._feed_version(s, "resources")
            found, missing = [], []
            for ref in refs:
                row = s.get(ResourceRow, (ref.type, ref.id))
                if row is None:
                    missing.append(_entity_ref(ref))
                else:
                    found.append(row.entity)
        return {"resources": found, "missing": missing, "version": version}

    def list_resources(self, resource_type: str, after: str, limit: int) -> dict[str, Any]:
        """One page of the resources of a type, in ascending order of id.

        What a decision point reads to hold every resource of a type, for an AuthZEN resource
        search (docs/context.md#resources-and-work-items).

        Args:
            resource_type: the Cedar entity type (``Document``).
            after: the last id of the previous page (``""``: from the first).
            limit: most resources on the page (1 to ``max_batch_items``).

        Returns:
            ``{"resources": [entity], "next": id, "version": seq}``: ``next`` is the last id
            of the page when more may follow, ``""`` on the last page; ``version`` is the
            resources feed's version the read saw (follow the feed from it to stay current).

        Raises:
            Problem: 400 ``invalid-request`` naming ``type`` (not an identifier) or ``limit``
                (out of range).

        """
        errors: list[FieldError] = []
        _check_ident(resource_type, None, "type", errors)
        if not 1 <= limit <= self.settings.max_batch_items:
            errors.append(
                FieldError(None, "limit", f"1 to {self.settings.max_batch_items}, not {limit}")
            )
        if errors:
            raise Problem(
                400,
                "invalid-request",
                "Invalid request",
                "; ".join(e.message for e in errors),
                errors,
            )
        with self.read() as s:
            version = self._feed_version(s, "resources")
            rows = s.exec(
                select(ResourceRow)
                .where(col(ResourceRow.type) == resource_type, col(ResourceRow.id) > after)
                .order_by(col(ResourceRow.id))
                .limit(limit)
            ).all()
            found = [r.entity for r in rows]
            nxt = rows[-1].id if len(rows) == limit else ""
        return {"resources": found, "next": nxt, "version": version}

    # -- Work items -------------------------------------------------------

    def put_work_items(self, raw: Any) -> dict[str, Any]:
        """Stores a batch of work items, all or nothing.

        Returns:
            ``{"stored": n, "version": seq}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every bad item: malformed, an id not of the
                form ``<tracker>:<key>``, a status other than ``open``/``closed``, a bad link,
                a repeated id.

        """
        self._max_items(raw, "work_items")
        errors: list[FieldError] = []
        items: list[WorkItemIn] = []
        seen: dict[str, int] = {}
        for i, r in enumerate(raw):
            item = _validate(WorkItemIn, r, i, errors)
            if item is None:
                continue
            _check_ident(item.id, i, "id", errors)
            for j, link in enumerate(item.links):
                _check_ident(link.type, i, f"links.{j}.type", errors)
                _check_ident(link.id, i, f"links.{j}.id", errors)
            _check_size(item.attrs, i, "attrs", errors)
            if item.id in seen:
                errors.append(FieldError(i, "id", f"repeats item {seen[item.id]}"))
            seen[item.id] = i
            items.append(item)
        if errors:
            raise _bad_batch("work items", errors)
        now = _now()
        with self.write() as tx:
            held = {  # as in put_resources
                r.id: r
                for part in _chunks([item.id for item in items])
                for r in tx.session.exec(select(WorkItemRow).where(col(WorkItemRow.id).in_(part)))
            }
            for item in items:
                record = {
                    "id": item.id,
                    "status": item.status,
                    "links": [_entity_ref(li) for li in item.links],
                    "attrs": item.attrs,
                }
                row = held.get(item.id)
                if row is not None and row.item == record:
                    continue
                if row is None:
                    row = WorkItemRow(id=item.id, item=record, updated_at=now)
                else:
                    row.item = record
                    row.updated_at = now
                tx.session.add(row)
                tx.emit("work_items", "WorkItem", item.id, record)
        return {"stored": len(items), "version": tx.last_seq}

    def _ids(self, raw: Any, what: str) -> list[str]:
        self._max_items(raw, what)
        errors = [
            FieldError(i, "", "must be a non-empty string")
            for i, x in enumerate(raw)
            if not isinstance(x, str) or not x
        ]
        if errors:
            raise _bad_batch(what, errors)
        return list(raw)

    def delete_work_items(self, raw: Any) -> dict[str, Any]:
        """Deletes work items by id; unknown ids are ignored. Returns ``{"deleted": n}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every id that is not a non-empty string.

        """
        ids = self._ids(raw, "ids")
        n = 0
        with self.write() as tx:
            for wid in ids:
                row = tx.session.get(WorkItemRow, wid)
                if row is None:
                    continue
                tx.session.delete(row)
                tx.emit("work_items", "WorkItem", wid, None)
                n += 1
        return {"deleted": n}

    def get_work_items(self, raw: Any) -> dict[str, Any]:
        """Reads work items by id: ``{"work_items": [...], "missing": [id], "version": seq}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every id that is not a non-empty string.

        """
        ids = self._ids(raw, "ids")
        with self.read() as s:
            version = self._feed_version(s, "work_items")
            found, missing = [], []
            for wid in ids:
                row = s.get(WorkItemRow, wid)
                if row is None:
                    missing.append(wid)
                else:
                    found.append(row.item)
        return {"work_items": found, "missing": missing, "version": version}

    # -- Service accounts ---------------------------------------------------

    def put_service_accounts(self, raw: Any, author: str = "") -> dict[str, Any]:
        """Registers (or updates) service accounts, all or nothing.

        Each record becomes a ``ServiceAccount`` principal record ``{id, owner, ai, groups,
        description, app}`` (``app``: the id up to its first dot). Each new or changed record
        is recorded in ``service_account_changes`` (``registered`` or ``changed``) with
        `author`; a record written again unchanged records nothing.

        Args:
            raw: a list of ``{id, owner, ai?, groups?, description?}``.
            author: who registers them (the portal passes the trusted app's name), up to 512
                characters; ``""`` when the caller names nobody.

        Returns:
            ``{"stored": n, "principals_version": seq}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every bad record or repeated id, or a bad
                `author`.

        """
        self._max_items(raw, "service_accounts")
        errors: list[FieldError] = []
        items: list[ServiceAccountIn] = []
        seen: dict[str, int] = {}
        for i, r in enumerate(raw):
            item = _validate(ServiceAccountIn, r, i, errors)
            if item is None:
                continue
            _check_ident(item.id, i, "id", errors)
            _check_ident(item.owner, i, "owner", errors)
            for j, g in enumerate(item.groups):
                _check_ident(g, i, f"groups.{j}", errors)
            if item.id in seen:
                errors.append(FieldError(i, "id", f"repeats item {seen[item.id]}"))
            seen[item.id] = i
            items.append(item)
        _check_author(author, errors)
        if errors:
            raise _bad_batch("service accounts", errors)
        now = _now()
        with self.write() as tx:
            for item in items:
                record = {**item.model_dump(), "app": item.id.split(".", 1)[0]}
                row = tx.session.get(ServiceAccountRow, item.id)
                change = "registered" if row is None else "changed"
                if row is None:
                    row = ServiceAccountRow(id=item.id, record=record, updated_at=now)
                elif row.record != record:
                    row.record = record
                    row.updated_at = now
                else:
                    continue
                tx.session.add(row)
                tx.session.add(_sa_change(item.id, change, author, now, record))
                tx.set_principal("ServiceAccount", item.id, record)
        return {"stored": len(items), "principals_version": tx.last_principals_seq()}

    def delete_service_account(self, sa_id: str, author: str = "") -> None:
        """Unregisters a service account; it is then denied everything (``svc:unregistered``).

        The retirement is recorded in ``service_account_changes`` (``retired``) with `author`.

        Raises:
            Problem: 404 ``not-found`` when no such service account is registered; 400
                ``invalid-batch`` for a bad `author`.

        """
        errors: list[FieldError] = []
        _check_author(author, errors)
        if errors:
            raise _bad_batch("retirement", errors)
        with self.write() as tx:
            row = tx.session.get(ServiceAccountRow, sa_id)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no service account `{sa_id}`")
            tx.session.delete(row)
            tx.session.add(_sa_change(sa_id, "retired", author, _now(), None))
            tx.set_principal("ServiceAccount", sa_id, None)

    def service_accounts(self, app: str | None = None) -> list[dict[str, Any]]:
        """Every registered service account's record, by id; of one app when `app` is given.

        Args:
            app: an app's name: only ids starting with ``<app>.`` (its agents).

        """
        q = select(ServiceAccountRow)
        if app is not None:
            q = q.where(col(ServiceAccountRow.id).startswith(f"{app}.", autoescape=True))
        with self.read() as s:
            rows = s.exec(q.order_by(col(ServiceAccountRow.id))).all()
            return [r.record for r in rows]

    def service_account_changes(self, sa_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """A service account's registrations, changes and retirements, newest first.

        Args:
            sa_id: the service account's id (it may be retired).
            limit: most changes answered, 1 to 10,000.

        Returns:
            ``[{"service_account", "change", "author", "at", "record"}]``: ``change``
            ``registered``, ``changed`` or ``retired``; ``at`` RFC 3339 UTC; ``record`` the
            record after the change (None once retired).

        """
        limit = max(1, min(limit, 10_000))
        with self.read() as s:
            rows = s.exec(
                select(ServiceAccountChangeRow)
                .where(ServiceAccountChangeRow.service_account == sa_id)
                .order_by(col(ServiceAccountChangeRow.at).desc(), col(ServiceAccountChangeRow.id))
                .limit(limit)
            ).all()
            return [
                {
                    "service_account": r.service_account,
                    "change": r.change,
                    "author": r.author,
                    "at": (utc(r.at) or _now()).isoformat(),
                    "record": r.record,
                }
                for r in rows
            ]

    def service_account(self, sa_id: str) -> dict[str, Any]:
        """One service account's record.

        Raises:
            Problem: 404 ``not-found``.

        """
        with self.read() as s:
            row = s.get(ServiceAccountRow, sa_id)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no service account `{sa_id}`")
            return row.record

    # -- Risk scores --------------------------------------------------------

    def put_risk_scores(self, raw: Any) -> dict[str, Any]:
        """Records the reasoner's scores, all or nothing; each raises ``principals_version``.

        The whole cycle's scores go in one request and one transaction
        (docs/reasoner.md#publishing), so up to ``max_risk_scores`` of them, more than other
        batches take. The factors and details are kept beside the score, for ``GET
        /v1/risk``; the principals snapshot carries the score alone.

        Args:
            raw: a list of ``{"principal": {"type", "id"}, "score": 0..100, "reason"?,
                "factors"?: [{name, observed, baseline, contribution, ...}], "details"?}``.

        Returns:
            ``{"stored": n, "principals_version": seq}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every bad score (outside 0..100, a bad
                reference, a principal scored twice, more than 20 factors, details over
                256 KiB).

        """
        if not isinstance(raw, list) or not 1 <= len(raw) <= self.settings.max_risk_scores:
            n = len(raw) if isinstance(raw, list) else None
            raise _bad_batch(
                "risk scores",
                [
                    FieldError(
                        None,
                        "scores",
                        "must be a list"
                        if n is None
                        else f"holds {n} items; 1 to {self.settings.max_risk_scores} "
                        "(SVC_CONTEXT_MAX_RISK_SCORES) are allowed",
                    )
                ],
            )
        errors: list[FieldError] = []
        items: list[RiskScoreIn] = []
        seen: dict[str, int] = {}
        for i, r in enumerate(raw):
            item = _validate(RiskScoreIn, r, i, errors)
            if item is None:
                continue
            _check_size(item.details, i, "details", errors)
            _check_ident(item.principal.id, i, "principal.id", errors)
            key = principal_key(item.principal.type, item.principal.id)
            if key in seen:
                errors.append(FieldError(i, "principal", f"repeats item {seen[key]}"))
            seen[key] = i
            items.append(item)
        if errors:
            raise _bad_batch("risk scores", errors)
        now = _now()
        with self.write() as tx:
            # A cycle may send 100,000 scores: the keys already stored are found with one query
            # per 1,000, and the rows are written with one multi-row INSERT or UPDATE per
            # table and kind (SQLAlchemy Core; ORM objects cost 0.2 ms each to build).
            keys = [principal_key(i.principal.type, i.principal.id) for i in items]
            have_score: set[str] = set()
            have_record: set[str] = set()
            conn = tx.session.connection()
            scores_t = RiskScoreRow.__table__  # type: ignore[attr-defined]
            records_t = PrincipalRow.__table__  # type: ignore[attr-defined]
            for chunk in _chunks(keys):
                have_score.update(
                    conn.execute(
                        sa_select(scores_t.c.principal).where(scores_t.c.principal.in_(chunk))
                    ).scalars()
                )
                have_record.update(
                    conn.execute(
                        sa_select(records_t.c.id).where(
                            records_t.c.kind == "RiskScore", records_t.c.id.in_(chunk)
                        )
                    ).scalars()
                )
            new_scores: list[dict[str, Any]] = []
            old_scores: list[dict[str, Any]] = []
            new_records: list[dict[str, Any]] = []
            old_records: list[dict[str, Any]] = []
            for item, key in zip(items, keys, strict=True):
                row = {
                    "principal": key,
                    "score": item.score,
                    "reason": item.reason,
                    "updated_at": now,
                    "factors": [f.model_dump() for f in item.factors],
                    "details": item.details,
                }
                (old_scores if key in have_score else new_scores).append(row)
                value = {"principal": _entity_ref(item.principal), "score": item.score}
                record = {"kind": "RiskScore", "id": key, "value": value, "removed": False}
                (old_records if key in have_record else new_records).append(record)
                # as set_principal(force=True): a rescore always moves principals_version
                # (docs/architecture.md#versioning)
                tx.emit("principals", "RiskScore", key, value, False)
            if new_scores:
                conn.execute(sa_insert(scores_t), new_scores)
            if old_scores:
                conn.execute(
                    sa_update(scores_t)
                    .where(scores_t.c.principal == bindparam("b_principal"))
                    .values(
                        score=bindparam("score"),
                        reason=bindparam("reason"),
                        updated_at=bindparam("updated_at"),
                        factors=bindparam("factors"),
                        details=bindparam("details"),
                    ),
                    [{**r, "b_principal": r["principal"]} for r in old_scores],
                )
            if new_records:
                conn.execute(sa_insert(records_t), new_records)
            if old_records:
                conn.execute(
                    sa_update(records_t)
                    .where(records_t.c.kind == "RiskScore", records_t.c.id == bindparam("b_id"))
                    .values(value=bindparam("value"), removed=bindparam("removed")),
                    [{**r, "b_id": r["id"]} for r in old_records],
                )
            self._record_risk_days(conn, keys, [i.score for i in items], now)
        return {"stored": len(items), "principals_version": tx.last_principals_seq()}

    def _record_risk_days(
        self, conn: Any, keys: Sequence[str], scores: Sequence[int], now: datetime
    ) -> None:
        """Records each score in its principal's row of today (UTC) in ``risk_score_days``.

        The day's ``score`` becomes the new one and ``high`` the larger of the two; once a day
        the rows older than ``risk_history_days`` go, but for each principal's newest, which
        holds the score in force before the kept days (docs/context.md#risk-scores).
        """
        days_t = RiskScoreDayRow.__table__  # type: ignore[attr-defined]
        today = now.date()
        have: set[str] = set()
        for chunk in _chunks(keys):
            have.update(
                conn.execute(
                    sa_select(days_t.c.principal).where(
                        days_t.c.day == today, days_t.c.principal.in_(chunk)
                    )
                ).scalars()
            )
        new = [
            {"principal": k, "day": today, "score": v, "high": v, "updated_at": now}
            for k, v in zip(keys, scores, strict=True)
            if k not in have
        ]
        old = [
            {"b_principal": k, "b_day": today, "score": v, "s_high": v, "updated_at": now}
            for k, v in zip(keys, scores, strict=True)
            if k in have
        ]
        if new:
            conn.execute(sa_insert(days_t), new)
        if old:
            conn.execute(
                sa_update(days_t)
                .where(
                    days_t.c.principal == bindparam("b_principal"),
                    days_t.c.day == bindparam("b_day"),
                )
                .values(
                    score=bindparam("score"),
                    high=case(
                        (days_t.c.high > bindparam("s_high"), days_t.c.high),
                        else_=bindparam("s_high"),
                    ),
                    updated_at=bindparam("updated_at"),
                ),
                old,
            )
        if self._risk_pruned != today:
            horizon = today - timedelta(days=self.settings.risk_history_days)
            later = days_t.alias("later")
            gone = conn.execute(
                sa_delete(days_t).where(
                    days_t.c.day < horizon,
                    sa_select(later.c.principal)
                    .where(
                        later.c.principal == days_t.c.principal,
                        later.c.day > days_t.c.day,
                        later.c.day <= horizon,
                    )
                    .exists(),
                )
            ).rowcount
            self._risk_pruned = today
            if gone:
                log.info("risk history: %d days older than %s dropped", gone, horizon)

    def risk_history(
        self, principal: Ref, days: int = 30, *, now: datetime | None = None
    ) -> dict[str, Any]:
        """A principal's risk score per UTC day over the last `days` days, today included.

        From ``risk_score_days`` (docs/context.md#risk-scores): a day without a published score
        kept the score of the day before; days before anything was known have none.

        Args:
            principal: the principal.
            days: how many days, 1 to ``risk_history_days``.
            now: the current time (default: the clock).

        Returns:
            ``{"principal": {type, id}, "days": [{"day": "YYYY-MM-DD", "score", "high",
            "published"}]}``, oldest first, exactly `days` of them: ``score`` the score in force
            at the day's end (now, for today), ``high`` the highest in force during the day,
            both 0..100 or None when nothing is known yet; ``published`` whether the reasoner
            published a score that day.

        Raises:
            Problem: 400 ``invalid-argument`` for `days` out of range.

        """
        if not 1 <= days <= self.settings.risk_history_days:
            raise Problem(
                400,
                "invalid-argument",
                "Invalid argument",
                f"`days` must be 1 to {self.settings.risk_history_days} "
                "(SVC_CONTEXT_RISK_HISTORY_DAYS)",
                [FieldError(None, "days", "out of range")],
            )
        key = principal_key(principal.type, principal.id)
        today = (now or _now()).astimezone(UTC).date()
        first = today - timedelta(days=days - 1)
        with self.read() as s:
            by_day = {
                r.day: (r.score, r.high)
                for r in s.exec(
                    select(RiskScoreDayRow)
                    .where(col(RiskScoreDayRow.principal) == key)
                    .where(col(RiskScoreDayRow.day) >= first)
                    .where(col(RiskScoreDayRow.day) <= today)
                )
            }
            before = s.exec(
                select(RiskScoreDayRow.score)
                .where(col(RiskScoreDayRow.principal) == key)
                .where(col(RiskScoreDayRow.day) < first)
                .order_by(col(RiskScoreDayRow.day).desc())
                .limit(1)
            ).first()
        carry: int | None = before
        out = []
        for n in range(days):
            d = first + timedelta(days=n)
            r = by_day.get(d)
            if r is None:
                score, high = carry, carry
            else:
                score, high = r[0], r[1] if carry is None else max(r[1], carry)
            out.append(
                {"day": d.isoformat(), "score": score, "high": high, "published": r is not None}
            )
            carry = score
        return {"principal": {"type": principal.type, "id": principal.id}, "days": out}

    @staticmethod
    def _risk_json(row: RiskScoreRow) -> dict[str, Any]:
        type_, _, rest = row.principal.partition("::")
        return {
            "principal": {"type": type_, "id": rest[1:-1]},
            "score": row.score,
            "reason": row.reason,
            "factors": row.factors or [],
            "details": row.details or {},
            "updated_at": (utc(row.updated_at) or _now()).isoformat(),
        }

    def risk_scores(self, min_score: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The stored scores with their factors, highest first (docs/context.md#risk-scores).

        Args:
            min_score: only scores of at least this (0..100).
            limit: at most this many (default: all).

        Returns:
            ``[{principal: {type, id}, score, reason, factors, details, updated_at}]``, by
            score descending, then principal.

        """
        q = (
            select(RiskScoreRow)
            .where(col(RiskScoreRow.score) >= min_score)
            .order_by(col(RiskScoreRow.score).desc(), col(RiskScoreRow.principal))
        )
        if limit is not None:
            q = q.limit(limit)
        with self.read() as s:
            return [self._risk_json(r) for r in s.exec(q).all()]

    def risk_score(self, principal: Ref) -> dict[str, Any]:
        """One principal's score with its factors.

        Raises:
            Problem: 404 ``not-found`` when the principal has no score.

        """
        key = principal_key(principal.type, principal.id)
        with self.read() as s:
            row = s.get(RiskScoreRow, key)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no risk score of {key}")
            return self._risk_json(row)

    # -- Trusted apps ---------------------------------------------------------

    def put_trusted_app(self, raw: Any) -> dict[str, Any]:
        """Trusts an app (or replaces its record): ``{name, iss, jwks_url, aud}``.

        Raises:
            Problem: 400 ``invalid-batch`` naming every bad field (a name that is not
                lowercase letters, digits and dashes; a JWKS URL that is not ``https://``; a
                control character or lone surrogate in ``iss``, ``jwks_url`` or ``aud``).

        """
        errors: list[FieldError] = []
        item = _validate(TrustedAppIn, raw, None, errors)
        if item is not None:  # what the gateway compares tokens with: printable text only
            for name in ("iss", "jwks_url", "aud"):
                _check_ident(getattr(item, name), None, name, errors)
        if item is None or errors:
            raise _bad_batch("trusted app", errors)
        with self.write() as tx:
            row = tx.session.get(TrustedAppRow, item.name)
            if row is None:
                row = TrustedAppRow(
                    name=item.name,
                    iss=item.iss,
                    jwks_url=item.jwks_url,
                    aud=item.aud,
                    created_at=_now(),
                )
            row.iss, row.jwks_url, row.aud = item.iss, item.jwks_url, item.aud
            tx.session.add(row)
            return self._app_json(row)

    @staticmethod
    def _app_json(row: TrustedAppRow) -> dict[str, Any]:
        return {
            "name": row.name,
            "iss": row.iss,
            "jwks_url": row.jwks_url,
            "aud": row.aud,
            "created_at": (utc(row.created_at) or _now()).isoformat(),
        }

    def trusted_apps(self) -> list[dict[str, Any]]:
        """Every trusted app, by name."""
        with self.read() as s:
            rows = s.exec(select(TrustedAppRow).order_by(col(TrustedAppRow.name))).all()
            return [self._app_json(r) for r in rows]

    def delete_trusted_app(self, name: str) -> None:
        """Stops trusting an app.

        Raises:
            Problem: 404 ``not-found``.

        """
        with self.write() as tx:
            row = tx.session.get(TrustedAppRow, name)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no trusted app `{name}`")
            tx.session.delete(row)

    # -- Investigations -------------------------------------------------------

    @staticmethod
    def _inv_json(row: InvestigationRow) -> dict[str, Any]:
        closed = utc(row.closed_at)
        return {
            "id": row.id,
            "principal": row.principal,
            "reason": row.reason,
            "opened_by": row.opened_by,
            "opened_at": (utc(row.opened_at) or _now()).isoformat(),
            "status": row.status,
            "closed_by": row.closed_by,
            "closed_at": closed.isoformat() if closed else None,
            "resolution": row.resolution,
            "kind": row.kind,
            "evidence": row.evidence or {},
            "summary": row.summary,
            "summary_by": row.summary_by,
        }

    def open_investigation(self, raw: Any) -> dict[str, Any]:
        """Records an investigation; returns it (``open``).

        Args:
            raw: ``{principal, reason, opened_by, kind?, evidence?, summary?, summary_by?}``;
                ``kind`` is ``manual`` (default), ``contain``, ``would_contain`` or ``score``
                (docs/reasoner.md#investigations); ``evidence`` at most 256 KiB of JSON.

        Raises:
            Problem: 400 ``invalid-batch`` naming every bad field.

        """
        errors: list[FieldError] = []
        item = _validate(InvestigationIn, raw, None, errors)
        if item is not None:
            _check_size(item.evidence, None, "evidence", errors)
        if item is None or errors:
            raise _bad_batch("investigation", errors)
        row = InvestigationRow(
            id=uuid.uuid4().hex,
            principal=principal_key(item.principal.type, item.principal.id),
            reason=item.reason,
            opened_by=item.opened_by,
            opened_at=_now(),
            status="open",
            kind=item.kind,
            evidence=item.evidence,
            summary=item.summary,
            summary_by=item.summary_by,
        )
        with self.write() as tx:
            tx.session.add(row)
        return self._inv_json(row)

    def investigations(
        self, status: str | None = None, principal: Ref | None = None, kind: str | None = None
    ) -> list[dict[str, Any]]:
        """Investigations, newest first, optionally of one status, principal and kind."""
        q = select(InvestigationRow)
        if status is not None:
            q = q.where(InvestigationRow.status == status)
        if kind is not None:
            q = q.where(InvestigationRow.kind == kind)
        if principal is not None:
            q = q.where(InvestigationRow.principal == principal_key(principal.type, principal.id))
        with self.read() as s:
            rows = s.exec(
                q.order_by(col(InvestigationRow.opened_at).desc(), col(InvestigationRow.id))
            ).all()
            return [self._inv_json(r) for r in rows]

    def close_investigation(self, inv_id: str, raw: Any) -> dict[str, Any]:
        """Closes an open investigation ``{closed_by, resolution}``; returns it.

        Raises:
            Problem: 400 naming every bad field; 404 ``not-found``; 409 ``already-closed``.

        """
        errors: list[FieldError] = []
        item = _validate(InvestigationClose, raw, None, errors)
        if item is None:
            raise _bad_batch("closing", errors)
        with self.write() as tx:
            row = tx.session.get(InvestigationRow, inv_id)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no investigation `{inv_id}`")
            if row.status == "closed":
                raise Problem(
                    409, "already-closed", "Already closed", f"investigation `{inv_id}` is closed"
                )
            row.status = "closed"
            row.closed_by = item.closed_by
            row.closed_at = _now()
            row.resolution = item.resolution
            tx.session.add(row)
            return self._inv_json(row)

    # -- Directory --------------------------------------------------------------

    def people(self, include_removed: bool = False) -> list[dict[str, Any]]:
        """The directory's people, by user name; removed people only with ``include_removed``.

        Each is ``{user_name, scim_id, display_name, active, removed, removed_at, department,
        title, manager, groups}``.
        """
        with self.read() as s:
            q = select(ScimUserRow)
            if not include_removed:
                q = q.where(col(ScimUserRow.removed_at).is_(None))
            rows = s.exec(q.order_by(col(ScimUserRow.user_name))).all()
            return [_person_json(s, r) for r in rows]

    def person(self, user_name: str) -> dict[str, Any]:
        """One person by user name (a present one first, else the latest removed one).

        Raises:
            Problem: 404 ``not-found``.

        """
        with self.read() as s:
            row = _user_by_name(s, user_name)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no person `{user_name}`")
            return _person_json(s, row)

    def groups(self) -> list[dict[str, Any]]:
        """The directory's groups: ``{name, scim_id, members: {people, groups}, parents}``."""
        with self.read() as s:
            rows = s.exec(select(ScimGroupRow).order_by(col(ScimGroupRow.display_name))).all()
            return [_group_json(s, r) for r in rows]

    def group(self, name: str) -> dict[str, Any]:
        """One group by name.

        Raises:
            Problem: 404 ``not-found``.

        """
        with self.read() as s:
            row = _group_by_name(s, name)
            if row is None:
                raise Problem(404, "not-found", "Not found", f"no group `{name}`")
            return _group_json(s, row)

    def counts(self) -> dict[str, int]:
        """Rows per kind, for ``/metrics``: people present, removed, groups, resources, ..."""
        with self.read() as s:

            def n(q: Any) -> int:
                return int(s.exec(q).one())

            return {
                "people": n(
                    select(func.count())
                    .select_from(ScimUserRow)
                    .where(col(ScimUserRow.removed_at).is_(None))
                ),
                "removed_people": n(
                    select(func.count())
                    .select_from(ScimUserRow)
                    .where(col(ScimUserRow.removed_at).is_not(None))
                ),
                "groups": n(select(func.count()).select_from(ScimGroupRow)),
                "service_accounts": n(select(func.count()).select_from(ServiceAccountRow)),
                "resources": n(select(func.count()).select_from(ResourceRow)),
                "work_items": n(select(func.count()).select_from(WorkItemRow)),
            }

    def ping(self) -> None:
        """Runs ``SELECT 1``; raises the driver's error when the database is unreachable."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def close(self) -> None:
        """Closes the database connections."""
        self.engine.dispose()


def _check_author(author: str, errors: list[FieldError]) -> None:
    """An author is at most 512 characters without control characters (or empty)."""
    if len(author) > 512:
        errors.append(FieldError(None, "author", "longer than 512 characters"))
    elif author:
        _check_ident(author, None, "author", errors)


def _sa_change(
    sa_id: str, change: str, author: str, at: datetime, record: dict[str, Any] | None
) -> ServiceAccountChangeRow:
    """A ``service_account_changes`` row (a UUIDv7-ordered id would do as well: ``at`` orders)."""
    return ServiceAccountChangeRow(
        id=uuid.uuid4().hex,
        service_account=sa_id,
        change=change,
        author=author,
        at=at,
        record=record,
    )


class _Tx:
    """One write transaction: the session, and the changes it will number on commit."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._pending: list[tuple[str, str, str, dict[str, Any] | None, bool]] = []
        self._seqs: list[tuple[str, int]] = []

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the last change this transaction numbered (0: none)."""
        return self._seqs[-1][1] if self._seqs else 0

    def last_principals_seq(self) -> int:
        """The ``seq`` of the last principals change this transaction numbered (0: none)."""
        seqs = [s for f, s in self._seqs if f == "principals"]
        return seqs[-1] if seqs else 0

    def emit(
        self,
        feed: str,
        kind: str,
        key: str,
        value: dict[str, Any] | None,
        removed: bool = False,
    ) -> None:
        """Records a change to be numbered when the transaction ends."""
        self._pending.append((feed, kind, key, value, removed))

    def set_principal(
        self,
        kind: str,
        pid: str,
        value: dict[str, Any] | None,
        removed: bool = False,
        *,
        force: bool = False,
    ) -> bool:
        """Sets a record of the principals snapshot; emits a change when it differs.

        Args:
            kind: ``Human``, ``Group``, ``ServiceAccount`` or ``RiskScore``.
            pid: its id (the user name, group name, account id or ``Type::"id"``).
            value: the new record, or None when it is gone.
            removed: whether it is a removed person.
            force: emit even when nothing differs (a rescore to the same score still moves
                ``principals_version``, docs/architecture.md#versioning).

        Returns:
            Whether a change was emitted.

        """
        row = self.session.get(PrincipalRow, (kind, pid))
        if value is None:
            if row is None:
                return False
            self.session.delete(row)
        else:
            if row is not None and row.value == value and row.removed == removed and not force:
                return False
            if row is None:
                row = PrincipalRow(kind=kind, id=pid, value=value, removed=removed)
            else:
                row.value = value
                row.removed = removed
            self.session.add(row)
        self.emit("principals", kind, pid, value, removed)
        return True

    def flush_changes(self) -> bool:
        """Numbers the pending changes from the ``changes`` counter and writes them.

        The counter row stays locked until the commit that follows, so the transactions
        commit in the order of their numbers.

        Returns:
            Whether any change was written.

        """
        if not self._pending:
            return False
        self.session.flush()
        n = len(self._pending)
        top = (
            self.session.connection()
            .execute(
                text(
                    "UPDATE counters SET value = value + :n WHERE name = 'changes' RETURNING value"
                ),
                {"n": n},
            )
            .scalar_one()
        )
        first = int(top) - n + 1
        now = _now()
        for i, (feed, kind, key, value, removed) in enumerate(self._pending):
            seq = first + i
            self.session.add(
                ChangeRow(
                    seq=seq, feed=feed, kind=kind, key=key, value=value, removed=removed, at=now
                )
            )
            self._seqs.append((feed, seq))
        self._pending.clear()
        self.session.flush()
        return True


# -- The directory's projection into principals ---------------------------------------------


def _user_by_name(s: Session, user_name: str) -> ScimUserRow | None:
    """The present user of that exact user name, else the latest removed one.

    Looked up through the index of the case-folded name (``user_name_key``), then compared
    exactly.
    """
    key = user_name.casefold()
    present = s.exec(
        select(ScimUserRow).where(
            ScimUserRow.user_name_key == key,
            ScimUserRow.user_name == user_name,
            col(ScimUserRow.removed_at).is_(None),
        )
    ).first()
    if present is not None:
        return present
    return s.exec(
        select(ScimUserRow)
        .where(ScimUserRow.user_name_key == key, ScimUserRow.user_name == user_name)
        .order_by(col(ScimUserRow.removed_at).desc())
    ).first()


def _group_by_name(s: Session, name: str) -> ScimGroupRow | None:
    """The group of that exact display name, found through the unique case-folded key."""
    return s.exec(
        select(ScimGroupRow).where(
            ScimGroupRow.display_name_key == name.casefold(), ScimGroupRow.display_name == name
        )
    ).first()


def _group_names(s: Session, member_id: str) -> list[str]:
    rows = s.exec(
        select(ScimGroupRow.display_name)
        .join(MemberRow, col(MemberRow.group_id) == col(ScimGroupRow.id))
        .where(MemberRow.member_id == member_id)
    ).all()
    return sorted(set(rows))


#: Most ids in one ``IN (...)`` list (PostgreSQL takes at most 65,535 parameters a statement).
_IN_CHUNK = 5_000


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i : i + _IN_CHUNK]


def rows_by_id(s: Session, model: type[_Row], ids: Iterable[str]) -> dict[str, _Row]:
    """The rows of ``model`` (``ScimUserRow`` or ``ScimGroupRow``) with these ids, by id.

    One query per 5,000 ids, instead of one per id; ids without a row are left out.
    """
    wanted = sorted(set(ids))
    out: dict[str, _Row] = {}
    for part in _chunks(wanted):
        for row in s.exec(select(model).where(col(model.id).in_(part))):
            out[row.id] = row
    return out


def _group_names_of(s: Session, member_ids: Sequence[str]) -> dict[str, list[str]]:
    """``_group_names`` of many members: one query per 5,000 members."""
    out: dict[str, set[str]] = {m: set() for m in member_ids}
    for part in _chunks(sorted(set(member_ids))):
        for mid, name in s.exec(
            select(MemberRow.member_id, ScimGroupRow.display_name)
            .join(ScimGroupRow, col(MemberRow.group_id) == col(ScimGroupRow.id))
            .where(col(MemberRow.member_id).in_(part))
        ):
            out[mid].add(name)
    return {m: sorted(names) for m, names in out.items()}


def _enterprise(doc: dict[str, Any]) -> dict[str, Any]:
    ext = doc.get("urn:ietf:params:scim:schemas:extension:enterprise:2.0:User")
    return ext if isinstance(ext, dict) else {}


def human_entity(
    s: Session, row: ScimUserRow, *, groups: Sequence[str] | None = None
) -> dict[str, Any]:
    """The Cedar entity of a SCIM user (docs/context.md#principals).

    ``Human::"<userName>"`` with ``active``, ``department`` and ``title`` (``""`` when unset),
    ``manager`` when the enterprise extension names a present person, and the user's groups as
    parents (none once removed). ``groups``: the names of the user's groups, sorted, when the
    caller has read them already (``[]`` for a user created in this transaction, under a new
    id no group can list yet); None looks them up.
    """
    ext = _enterprise(row.doc)
    attrs: dict[str, Any] = {
        "active": bool(row.active) and row.removed_at is None,
        "department": str(ext.get("department") or ""),
        "title": str(row.doc.get("title") or ""),
    }
    if row.manager_id:
        mgr = s.get(ScimUserRow, row.manager_id)
        if mgr is not None and mgr.removed_at is None:
            attrs["manager"] = {"__entity": {"type": "Human", "id": mgr.user_name}}
    if row.removed_at is not None:
        groups = []
    elif groups is None:
        groups = _group_names(s, row.id)
    parents = [{"type": "Group", "id": g} for g in groups]
    return {"uid": {"type": "Human", "id": row.user_name}, "attrs": attrs, "parents": parents}


def group_entity(s: Session, row: ScimGroupRow) -> dict[str, Any]:
    """The Cedar entity of a SCIM group: ``Group::"<displayName>"``, enclosing groups as parents."""
    return {
        "uid": {"type": "Group", "id": row.display_name},
        "attrs": {},
        "parents": [{"type": "Group", "id": g} for g in _group_names(s, row.id)],
    }


def refresh_human(
    tx: _Tx,
    user_name: str,
    present: ScimUserRow | None = None,
    *,
    groups: Sequence[str] | None = None,
) -> None:
    """Brings the ``Human`` record of ``user_name`` in line with the directory.

    ``present``: the present (not removed) user of that name when the caller holds it, which
    saves looking it up; otherwise it is looked up. ``groups``: ``present``'s group names
    when the caller has read them (``human_entity``); used only with ``present``.
    """
    row = (
        present
        if present is not None and present.removed_at is None and present.user_name == user_name
        else _user_by_name(tx.session, user_name)
    )
    if row is None:
        tx.set_principal("Human", user_name, None)
    else:
        entity = human_entity(tx.session, row, groups=groups if row is present else None)
        tx.set_principal("Human", user_name, entity, removed=row.removed_at is not None)


def refresh_group(tx: _Tx, name: str) -> None:
    """Brings the ``Group`` record of ``name`` in line with the directory."""
    row = _group_by_name(tx.session, name)
    tx.set_principal("Group", name, None if row is None else group_entity(tx.session, row))


def refresh_members(tx: _Tx, member_ids: Iterable[str]) -> None:
    """Refreshes the records of the users and groups with these SCIM ids.

    What the users' records need is read in a few queries for all of them (the users, their
    managers, their groups, their current records), not a few per user, so a group write
    naming many members stays a few round trips.
    """
    ids = sorted(set(member_ids))
    if not ids:
        return
    s = tx.session
    users = rows_by_id(s, ScimUserRow, ids)
    groups = rows_by_id(s, ScimGroupRow, [mid for mid in ids if mid not in users])
    present = [u for u in users.values() if u.removed_at is None]
    # Held while refreshing, so that the session's (weak) identity map answers their gets.
    managers = rows_by_id(s, ScimUserRow, {u.manager_id for u in present if u.manager_id})
    names = _group_names_of(s, [u.id for u in present])
    held = principal_rows(s, "Human", [u.user_name for u in present])
    for mid in ids:
        user = users.get(mid)
        if user is not None:
            refresh_human(tx, user.user_name, user, groups=names.get(user.id))
            continue
        group = groups.get(mid)
        if group is not None:
            refresh_group(tx, group.display_name)
    del managers, held


def principal_rows(s: Session, kind: str, ids: Iterable[str]) -> list[PrincipalRow]:
    """The principal records of ``kind`` with these ids (one query per 5,000 ids)."""
    out: list[PrincipalRow] = []
    for part in _chunks(sorted(set(ids))):
        out += s.exec(
            select(PrincipalRow).where(PrincipalRow.kind == kind, col(PrincipalRow.id).in_(part))
        ).all()
    return out


def _person_json(s: Session, row: ScimUserRow) -> dict[str, Any]:
    ext = _enterprise(row.doc)
    mgr = s.get(ScimUserRow, row.manager_id) if row.manager_id else None
    removed = utc(row.removed_at)
    return {
        "user_name": row.user_name,
        "scim_id": row.id,
        "display_name": row.doc.get("displayName"),
        "active": bool(row.active),
        "removed": removed is not None,
        "removed_at": removed.isoformat() if removed else None,
        "department": ext.get("department"),
        "title": row.doc.get("title"),
        "emails": [str(e["value"]) for e in row.doc.get("emails") or () if e.get("value")],
        "manager": mgr.user_name if mgr is not None else None,
        "groups": _group_names(s, row.id),
    }


def _group_json(s: Session, row: ScimGroupRow) -> dict[str, Any]:
    members = s.exec(select(MemberRow).where(MemberRow.group_id == row.id)).all()
    people, groups = [], []
    for m in members:
        if m.member_type == "User":
            u = s.get(ScimUserRow, m.member_id)
            if u is not None:
                people.append(u.user_name)
        else:
            g = s.get(ScimGroupRow, m.member_id)
            if g is not None:
                groups.append(g.display_name)
    return {
        "name": row.display_name,
        "scim_id": row.id,
        "members": {"people": sorted(people), "groups": sorted(groups)},
        "parents": _group_names(s, row.id),
    }
