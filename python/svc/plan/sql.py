"""Compile a plan filter tree to a SQLAlchemy Core WHERE clause (docs/plans.md).

The mapping object (`SqlMapping`) says where each resource attribute lives: a plain column, a
path inside a JSON column, an array column (PostgreSQL) or a join table for a set, and how the
ancestor closure for `in` is stored. `compile_filter` turns a tree into a boolean clause with
exactly the filter contract's semantics on PostgreSQL (psycopg 3) and SQLite: a missing
attribute is SQL NULL and never matches, also under `not`; `has` is never NULL; `like` escapes
SQL's own wildcards. Nodes the SQL cannot decide (`unknown`, `unmappable`, or an attribute the
mapping cannot express) raise `NeedsRowCheck`, or with ``superset=True`` become TRUE/FALSE by
polarity so the clause returns a superset and the caller checks those rows one by one.
See docs/plans.md for a worked example with the generated SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Dialect

from svc.plan.filters import (
    And,
    Compare,
    Const,
    Contains,
    ContainsAll,
    ContainsAny,
    EntityUid,
    Has,
    In,
    Is,
    Like,
    LikePart,
    Node,
    Not,
    Or,
    Residual,
    Value,
    like_parts,
    parse_filter,
)
from svc.plan.filters import NeedsRowCheck as NeedsRowCheck

__all__ = [
    "ArraySet",
    "Closure",
    "JoinSet",
    "JsonAttr",
    "MappingError",
    "ScalarAttr",
    "SqlFilter",
    "SqlMapping",
    "compile_filter",
    "glob_pattern",
    "like_pattern",
]

Kind: TypeAlias = Literal["string", "long", "bool", "entity_id", "entity_uid"]
"""How a scalar (or set element) is stored.

``string``/``long``/``bool``: the Cedar value as is. ``entity_id``: an entity reference stored as
its id only; the type is fixed by the mapping (`entity_type`). ``entity_uid``: an entity
reference stored as Cedar's literal text ``Type::"id"`` (see `EntityUid.__str__`).
"""
Clause: TypeAlias = sa.ColumnElement[Any]
AttrKey: TypeAlias = "str | tuple[str, ...]"


class MappingError(ValueError):
    """The mapping is unusable as given (e.g. an array column on SQLite, a missing entity type)."""


@dataclass(frozen=True)
class ScalarAttr:
    """An attribute stored in one column of the resource table; NULL means missing.

    `kind` is the stored value type; for ``entity_id`` give `entity_type`, the type of the ids.
    """

    column: Clause
    kind: Kind = "string"
    entity_type: str | None = None


@dataclass(frozen=True)
class JsonAttr:
    """Attributes inside a JSON column (JSONB on PostgreSQL, JSON text on SQLite).

    The mapped attribute path is the document at `path` inside `column`; longer filter paths go
    further into the document (``meta`` -> `JsonAttr(doc)`, then ``["meta","level"]`` is
    ``doc.level``). Values are Cedar JSON: strings, integers, booleans, arrays as sets, entity
    references as ``{"__entity": {...}}`` or bare ``{"type","id"}``. An absent key, JSON null or
    a SQL NULL column is a missing attribute. Sets compare as sets (order and duplicates do not
    matter); record values, and sets of records or sets, are not compiled (row check).
    """

    column: Clause
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArraySet:
    """A set attribute in a PostgreSQL ARRAY column of the resource table; NULL is missing.

    `kind` is the element encoding (as `Kind`), `entity_type` the type for ``entity_id``.
    """

    column: Clause
    kind: Kind = "string"
    entity_type: str | None = None


@dataclass(frozen=True)
class JoinSet:
    """A set attribute in a join table: one row ``(owner, value)`` per element.

    `owner` references the resource table's id column; `value` holds elements encoded as
    `kind`. No rows is the empty set. When `present` is given (a boolean expression over the
    resource table), the attribute is missing where it is not TRUE; otherwise always present.
    """

    table: sa.FromClause
    owner: Clause
    value: Clause
    kind: Kind = "string"
    entity_type: str | None = None
    present: Clause | None = None


@dataclass(frozen=True)
class Closure:
    """Transitive ancestor closure of the resources: rows ``(descendant id, ancestor type, id)``.

    `descendant` holds ids of the mapped resource type. Used for `in`; it need not list the
    resource itself (`in` also matches the entity itself).
    """

    table: sa.FromClause
    descendant: Clause
    ancestor_type: Clause
    ancestor_id: Clause


@dataclass(frozen=True)
class SqlMapping:
    """Where the resource type's attributes live in SQL.

    `table` is the resource table, one row per entity of `entity_type`, whose id is in
    `id_column`. `columns`, `json_columns` and `sets` are keyed by attribute name, or by a tuple
    path for nested record attributes; a bare column in `columns` means a ``string`` attribute,
    in `json_columns` a `JsonAttr` at the document root. `sets` takes `ArraySet`, `JoinSet`, or
    a `JsonAttr` holding a JSON array. `closure` enables `in`.
    """

    table: sa.FromClause
    entity_type: str
    id_column: Clause
    columns: Mapping[AttrKey, ScalarAttr | Clause] = field(default_factory=dict)
    json_columns: Mapping[AttrKey, JsonAttr | Clause] = field(default_factory=dict)
    sets: Mapping[AttrKey, ArraySet | JoinSet | JsonAttr] = field(default_factory=dict)
    closure: Closure | None = None

    def lookup(self, attr: Sequence[str]) -> tuple[ScalarAttr | JsonAttr | ArraySet | JoinSet, ...]:
        """The storage of an attribute path: ``()`` when unmapped, else a one-element tuple.

        Exact matches in `columns` and `sets` win; otherwise the longest prefix in
        `json_columns`, with the rest of the path appended inside the document.
        """
        path = tuple(attr)
        for table in (self.columns, self.sets):
            for key, spec in table.items():
                if _key(key) == path:
                    if isinstance(spec, ScalarAttr | ArraySet | JoinSet | JsonAttr):
                        return (spec,)
                    return (ScalarAttr(spec),)
        best: tuple[int, JsonAttr] | None = None
        for key, json_spec in self.json_columns.items():
            k = _key(key)
            if path[: len(k)] == k and (best is None or len(k) > best[0]):
                js = json_spec if isinstance(json_spec, JsonAttr) else JsonAttr(json_spec)
                best = (len(k), JsonAttr(js.column, js.path + path[len(k) :]))
        return () if best is None else (best[1],)


def _key(key: AttrKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


@dataclass(frozen=True)
class SqlFilter:
    """A compiled filter.

    `where` is the boolean clause to put in the query's WHERE. `exact` is False when some node
    was replaced by TRUE/FALSE for a superset; then `row_checks` says why, and every returned
    row must be checked one by one with a decision.
    """

    where: sa.ColumnElement[bool]
    exact: bool
    row_checks: tuple[str, ...] = ()


def compile_filter(
    filter: Node | Mapping[str, Any],
    mapping: SqlMapping,
    *,
    dialect: str | Dialect,
    superset: bool = False,
) -> SqlFilter:
    """Compile a filter tree to a SQLAlchemy Core boolean clause (docs/plans.md).

    Takes a parsed `Node` (or the contract JSON), the `SqlMapping`, and the target dialect
    (``"postgresql"`` or ``"sqlite"``, or a SQLAlchemy `Dialect` such as ``engine.dialect``).
    Returns a `SqlFilter`; ``select(table).where(result.where)`` gives the rows the filter is
    TRUE for, with missing attributes as SQL NULL (never a match, also under `not`).

    Raises `NeedsRowCheck` for an `unknown`/`unmappable` node or an attribute the mapping cannot
    express, unless `superset` is True: then such nodes become TRUE under an even number of NOTs
    and FALSE under an odd number, the clause selects a superset, and ``exact`` is False.
    Raises `FilterError` for a malformed tree and `MappingError` for a mapping unusable on the
    dialect (an `ArraySet` on SQLite, an ``entity_id`` kind without `entity_type`).
    """
    node = filter if not isinstance(filter, Mapping) else parse_filter(filter)
    name = dialect if isinstance(dialect, str) else dialect.name
    if name not in ("postgresql", "sqlite"):
        raise MappingError(f"unsupported dialect {name!r} (postgresql or sqlite)")
    comp = _Compiler(mapping, name == "postgresql", superset)
    where = comp.node(node, True, "")
    return SqlFilter(where, not comp.row_checks, tuple(comp.row_checks))


# --------------------------------------------------------------------------------------------
# Patterns


def like_pattern(parts: Sequence[LikePart] | str, escape: str = "\\") -> str:
    r"""A SQL LIKE pattern for a Cedar pattern, for use with ``ESCAPE '<escape>'``.

    ``*`` becomes ``%``; literal text (including a Cedar ``\*`` star) has ``%``, ``_`` and the
    escape character escaped. Takes the pattern text or its `like_parts`.
    """
    if isinstance(parts, str):
        parts = like_parts(parts)
    out: list[str] = []
    for part in parts:
        if part is None:
            out.append("%")
            continue
        for c in part:
            out.append(escape + c if c in ("%", "_", escape) else c)
    return "".join(out)


def glob_pattern(parts: Sequence[LikePart] | str) -> str:
    """A SQLite GLOB pattern for a Cedar pattern: ``*`` stays, ``*``/``?``/``[`` in text bracketed.

    SQLite's LIKE ignores ASCII case (unless a per-connection pragma says otherwise), Cedar's
    ``like`` does not; GLOB is case-sensitive, so SQLite gets GLOB.
    """
    if isinstance(parts, str):
        parts = like_parts(parts)
    out: list[str] = []
    for part in parts:
        if part is None:
            out.append("*")
            continue
        for c in part:
            out.append(f"[{c}]" if c in ("*", "?", "[") else c)
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Compiler

_PG_DIALECT: Dialect = pg.psycopg.dialect()  # type: ignore[no-untyped-call]
_OPS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _null() -> Clause:
    return sa.cast(sa.null(), sa.Boolean)


def _false_if(present: Clause) -> Clause:
    """FALSE where `present` is TRUE, NULL elsewhere (a type mismatch on a present value)."""
    return sa.case((present, sa.false()))


def _encode(value: Value, kind: Kind, entity_type: str | None) -> str | int | bool | None:
    """The stored form of a value for a column of `kind`, or None when it can never be stored."""
    if kind == "string":
        return value if isinstance(value, str) else None
    if kind == "long":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if not isinstance(value, EntityUid):
        return None
    if kind == "entity_uid":
        return str(value)
    if entity_type is None:
        raise MappingError("an entity_id attribute needs entity_type")
    return value.id if value.type == entity_type else None


class _Compiler:
    def __init__(self, mapping: SqlMapping, postgres: bool, superset: bool) -> None:
        self.m = mapping
        self.pg = postgres
        self.superset = superset
        self.row_checks: list[str] = []

    # -- structure ---------------------------------------------------------------------------

    def residual(self, positive: bool, path: str, why: str) -> Clause:
        where = path or "<root>"
        if not self.superset:
            raise NeedsRowCheck([(path, why)])
        self.row_checks.append(f"{where}: {why}")
        return sa.true() if positive else sa.false()

    def node(self, node: Node, positive: bool, path: str) -> Clause:
        match node:
            case Const(value):
                return sa.true() if value else sa.false()
            case And(args):
                parts = [self.node(a, positive, f"{path}.args[{i}]") for i, a in enumerate(args)]
                return sa.and_(sa.true(), *parts)
            case Or(args):
                parts = [self.node(a, positive, f"{path}.args[{i}]") for i, a in enumerate(args)]
                return sa.or_(sa.false(), *parts)
            case Not(arg):
                return sa.not_(self.node(arg, not positive, f"{path}.arg"))
            case Residual(op, detail):
                why = f"{op} node" + (f" ({detail})" if detail else "")
                return self.residual(positive, path.lstrip("."), why)
            case Is(entity):
                if entity.type != self.m.entity_type:
                    return sa.false()
                return self.m.id_column == entity.id
            case In(entity):
                return self.in_(entity, positive, path.lstrip("."))
        assert isinstance(node, Compare | Has | Contains | ContainsAny | ContainsAll | Like)
        found = self.m.lookup(node.attr)
        p = path.lstrip(".")
        if not found:
            return self.residual(positive, p, f"attribute {list(node.attr)} has no mapping")
        spec = found[0]
        try:
            if isinstance(spec, ScalarAttr):
                return self.scalar(node, spec)
            if isinstance(spec, JsonAttr):
                return self.json(node, spec)
            if isinstance(spec, ArraySet):
                return self.array(node, spec)
            return self.join(node, spec)
        except _CannotExpress as e:
            return self.residual(positive, p, str(e))

    def in_(self, entity: EntityUid, positive: bool, path: str) -> Clause:
        parts: list[Clause] = []
        if entity.type == self.m.entity_type:
            parts.append(self.m.id_column == entity.id)
        c = self.m.closure
        if c is None:
            return self.residual(positive, path, "`in` needs a closure table in the mapping")
        parts.append(
            sa.exists()
            .where(c.descendant == self.m.id_column)
            .where(c.ancestor_type == entity.type)
            .where(c.ancestor_id == entity.id)
        )
        return sa.or_(*parts)

    # -- scalar columns ----------------------------------------------------------------------

    def scalar(self, node: Node, spec: ScalarAttr) -> Clause:
        col = spec.column
        present = col.is_not(None)
        if isinstance(node, Has):
            return present
        if isinstance(node, Compare):
            if node.cmp in ("eq", "ne"):
                enc = _encode(node.value, spec.kind, spec.entity_type)
                eq = _false_if(present) if enc is None else col == enc
                return eq if node.cmp == "eq" else sa.not_(eq)
            if spec.kind != "long":
                return _null()
            return col.op(_OPS[node.cmp], is_comparison=True)(node.value)
        if isinstance(node, Like):
            if spec.kind != "string":
                return _null()
            return self.like(col, node.pattern)
        return _null()  # contains* on a scalar: type error, no match

    def like(self, text: Clause, pattern: str) -> Clause:
        parts = like_parts(pattern)
        if self.pg:
            return text.like(like_pattern(parts), escape="\\")
        return text.op("GLOB", is_comparison=True)(glob_pattern(parts))

    # -- JSON documents ----------------------------------------------------------------------

    def json(self, node: Node, spec: JsonAttr) -> Clause:
        if self.pg:
            return self.json_pg(node, spec)
        return self.json_sqlite(node, spec)

    def json_pg(self, node: Node, spec: JsonAttr) -> Clause:
        col = spec.column
        if isinstance(col.type.dialect_impl(_PG_DIALECT), pg.JSONB):
            col = sa.type_coerce(col, pg.JSONB)  # e.g. JSON().with_variant(JSONB(), "postgresql")
        else:
            col = sa.cast(col, pg.JSONB)  # a `json` column: the operators need jsonb
        raw = col.op("#>", return_type=pg.JSONB)(sa.literal(list(spec.path), pg.ARRAY(sa.Text)))
        x = sa.func.nullif(raw, sa.cast(sa.literal("null"), pg.JSONB), type_=pg.JSONB)
        typeof = sa.func.jsonb_typeof(x)

        def jsonb(v: Any) -> Clause:
            return sa.cast(sa.literal(json.dumps(v)), pg.JSONB)

        if isinstance(node, Has):
            return x.is_not(None)
        if isinstance(node, Compare):
            if node.cmp in ("eq", "ne"):
                eq: Clause
                if isinstance(node.value, tuple):
                    elems = sa.func.jsonb_array_elements(x).table_valued("value").alias("je")
                    member = sa.or_(
                        sa.false(),
                        *(elems.c.value == jsonb(j) for v in node.value for j in _json_forms(v)),
                    )
                    same = sa.and_(
                        *(self.json_pg_has(x, v, jsonb) for v in node.value),
                        ~sa.exists().select_from(elems).where(~member),
                    )
                    eq = sa.case(
                        (x.is_(None), sa.null()), (typeof == "array", same), else_=sa.false()
                    )
                else:
                    eq = sa.or_(*(x == jsonb(j) for j in _json_forms(node.value)))
                return eq if node.cmp == "eq" else sa.not_(eq)
            number = sa.case((typeof == "number", x), else_=sa.null()).op(
                _OPS[node.cmp], is_comparison=True
            )(jsonb(node.value))
            return number
        if isinstance(node, Like):
            whole = sa.literal([], pg.ARRAY(sa.Text))
            text = sa.case(
                (typeof == "string", x.op("#>>", return_type=sa.Text)(whole)),
                else_=sa.null(),
            )
            return self.like(text, node.pattern)
        values, want_all = _set_values(node)
        checks = [self.json_pg_has(x, v, jsonb) for v in values]
        inner = sa.and_(sa.true(), *checks) if want_all else sa.or_(sa.false(), *checks)
        return sa.case((typeof == "array", inner))

    @staticmethod
    def json_pg_has(x: Clause, value: Value, jsonb: Any) -> Clause:
        """PostgreSQL: the JSON array `x` holds `value` (in any of its JSON forms)."""
        return sa.or_(*(x.op("@>", is_comparison=True)(jsonb([j])) for j in _json_forms(value)))

    def json_sqlite(self, node: Node, spec: JsonAttr) -> Clause:
        col = spec.column
        if any('"' in k for k in spec.path):
            raise _CannotExpress('a JSON key with `"` cannot be addressed on SQLite')
        jpath = "$" + "".join(f'."{k}"' for k in spec.path)
        v = sa.func.json_extract(col, jpath)
        t = sa.func.json_type(col, jpath)
        if isinstance(node, Has):
            return v.is_not(None)

        def elems() -> Any:
            return sa.func.json_each(col, jpath).table_valued("type", "value").alias("je")

        def holds(value: Value) -> Clause:
            je = elems()
            return (
                sa.exists()
                .select_from(je)
                .where(_sqlite_eq(None, "$", je.c.type, je.c.value, value))
            )

        if isinstance(node, Compare):
            if node.cmp in ("eq", "ne"):
                if isinstance(node.value, tuple):
                    je = elems()
                    member = sa.or_(
                        sa.false(),
                        *(
                            sa.func.coalesce(
                                _sqlite_eq(None, "$", je.c.type, je.c.value, e), sa.false()
                            )
                            for e in node.value
                        ),
                    )
                    same: Clause = sa.and_(
                        *(holds(e) for e in node.value),
                        ~sa.exists().select_from(je).where(~member),
                    )
                    same = sa.case((t == "array", same), else_=sa.false())
                else:
                    same = _sqlite_eq(col, jpath, t, v, node.value)
                eq = sa.case((v.is_(None), sa.null()), else_=sa.func.coalesce(same, sa.false()))
                return eq if node.cmp == "eq" else sa.not_(eq)
            number = sa.case((t == "integer", v), else_=sa.null())
            return number.op(_OPS[node.cmp], is_comparison=True)(node.value)
        if isinstance(node, Like):
            return self.like(sa.case((t == "text", v), else_=sa.null()), node.pattern)
        values, want_all = _set_values(node)
        checks = [holds(value) for value in values]
        inner = sa.and_(sa.true(), *checks) if want_all else sa.or_(sa.false(), *checks)
        return sa.case((t == "array", inner))

    # -- set columns -------------------------------------------------------------------------

    def array(self, node: Node, spec: ArraySet) -> Clause:
        if not self.pg:
            raise MappingError("ArraySet needs PostgreSQL; use JoinSet or JsonAttr on SQLite")
        col = spec.column
        present = col.is_not(None)
        if isinstance(node, Has):
            return present
        if isinstance(node, Like) or (isinstance(node, Compare) and node.cmp not in ("eq", "ne")):
            return _null()
        if isinstance(node, Compare):
            eq = _false_if(present)
            if isinstance(node.value, tuple):
                encs = [_encode(v, spec.kind, spec.entity_type) for v in node.value]
                if all(e is not None for e in encs):
                    if encs:
                        arr = sa.cast(pg.array(encs), col.type)
                        eq = sa.and_(
                            col.op("@>", is_comparison=True)(arr),
                            col.op("<@", is_comparison=True)(arr),
                        )
                    else:
                        # The empty set. (A "{}" literal bound as an ARRAY parameter would be
                        # taken as the characters `{` and `}`.)
                        eq = sa.func.cardinality(col) == 0
            return eq if node.cmp == "eq" else sa.not_(eq)
        values, want_all = _set_values(node)
        encs = [_encode(v, spec.kind, spec.entity_type) for v in values]
        valid = [e for e in encs if e is not None]
        if want_all:
            if len(valid) < len(encs):
                return _false_if(present)
            if not valid:
                return sa.case((present, sa.true()))
            return col.op("@>", is_comparison=True)(sa.cast(pg.array(valid), col.type))
        if not valid:
            return _false_if(present)
        return col.op("&&", is_comparison=True)(sa.cast(pg.array(valid), col.type))

    def join(self, node: Node, spec: JoinSet) -> Clause:
        def owned() -> sa.Exists:
            return sa.exists().select_from(spec.table).where(spec.owner == self.m.id_column)

        def wrap(expr: Clause) -> Clause:
            return expr if spec.present is None else sa.case((spec.present, expr))

        if isinstance(node, Has):
            if spec.present is None:
                return sa.true()
            return sa.case((spec.present, sa.true()), else_=sa.false())
        if isinstance(node, Like) or (isinstance(node, Compare) and node.cmp not in ("eq", "ne")):
            return _null()
        if isinstance(node, Compare):
            eq: Clause = sa.false()
            if isinstance(node.value, tuple):
                encs = [_encode(v, spec.kind, spec.entity_type) for v in node.value]
                if all(e is not None for e in encs):
                    others = owned().where(spec.value.not_in(encs)) if encs else owned()
                    eq = sa.and_(
                        sa.true(), *(owned().where(spec.value == e) for e in encs), ~others
                    )
            eq = wrap(eq)
            return eq if node.cmp == "eq" else sa.not_(eq)
        values, want_all = _set_values(node)
        encs = [_encode(v, spec.kind, spec.entity_type) for v in values]
        valid = [e for e in encs if e is not None]
        if want_all:
            if len(valid) < len(encs):
                return wrap(sa.false())
            return wrap(sa.and_(sa.true(), *(owned().where(spec.value == e) for e in valid)))
        if not valid:
            return wrap(sa.false())
        return wrap(owned().where(spec.value.in_(valid)))


class _CannotExpress(Exception):
    """Internal: this node cannot be compiled with this mapping (becomes a row check)."""


def _set_values(node: Node) -> tuple[tuple[Value, ...], bool]:
    """The values of a contains* node and whether all of them must be in the set."""
    if isinstance(node, Contains):
        return (node.value,), True
    if isinstance(node, ContainsAll):
        return node.values, True
    if isinstance(node, ContainsAny):
        return node.values, False
    raise TypeError(f"not a set node: {node!r}")  # pragma: no cover


def _json_forms(value: Value) -> list[Any]:
    """The JSON texts a scalar value may be stored as (two for an entity reference)."""
    if isinstance(value, EntityUid):
        return [
            {"__entity": {"type": value.type, "id": value.id}},
            {"type": value.type, "id": value.id},
        ]
    if isinstance(value, tuple | dict):
        raise _CannotExpress("set and record values are not compared inside JSON documents")
    return [value]


def _sqlite_eq(col: Clause | None, jpath: str, t: Clause, v: Clause, value: Value) -> Clause:
    """SQLite: the JSON value at `jpath` (type `t`, SQL value `v`) equals `value`.

    `col` is the document (None when `v` is itself the JSON text of the value, as in
    ``json_each``). May be NULL when `v` is; callers decide what NULL means.
    """
    if isinstance(value, bool):
        return t == ("true" if value else "false")
    if isinstance(value, int):
        return sa.and_(t == "integer", v == value)
    if isinstance(value, str):
        return sa.and_(t == "text", v == value)
    if isinstance(value, EntityUid):
        doc = v if col is None else col

        def field(*keys: str) -> Clause:
            return sa.func.json_extract(doc, jpath + "".join(f'."{k}"' for k in keys))

        wrapped = sa.and_(
            field("__entity", "type") == value.type, field("__entity", "id") == value.id
        )
        bare = sa.and_(field("type") == value.type, field("id") == value.id)
        return sa.and_(
            t == "object",
            sa.or_(sa.func.coalesce(wrapped, sa.false()), sa.func.coalesce(bare, sa.false())),
        )
    raise _CannotExpress("set and record values are not compared inside JSON documents")
